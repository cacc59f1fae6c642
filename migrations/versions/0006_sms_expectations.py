"""Sent SMS can be registered, and show as ``pending`` until an operator report arrives.

The SMS vocabulary of ``hookledger.sms_messages`` is ``pending``, ``delivered``, ``failed``,
but a webhook only ever reports the last two: hookledger learns that a message was sent
only when told. ``hookledger.expect(message_id, 'sms', 0)`` (or ``hookledger expect ID
--kind sms``) registers one; ``sms_messages`` then shows it ``pending`` until its
``sms.delivered`` or ``sms.failed`` is projected. Some messages never get a terminal
report, so a pending SMS is never a discrepancy and reconciliation never asks about it.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-22
"""

from __future__ import annotations

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

UPGRADE = r"""
ALTER TABLE hookledger_private.expectations DROP CONSTRAINT ck_expectations_kind;
ALTER TABLE hookledger_private.expectations
    ADD CONSTRAINT ck_expectations_kind CHECK (kind IN ('collection', 'payout', 'sms'));
ALTER TABLE hookledger_private.expectations DROP CONSTRAINT ck_expectations_amount_positive;
-- an SMS carries no money (its webhooks say amount 0); a payment always does
ALTER TABLE hookledger_private.expectations
    ADD CONSTRAINT ck_expectations_amount_positive
    CHECK (CASE WHEN kind = 'sms' THEN amount = 0 ELSE amount > 0 END);

CREATE OR REPLACE VIEW hookledger.sms_messages AS
SELECT message_id, recipient, status, code, updated_at,
       conflicted, event_count, last_position
FROM hookledger_private.sms_messages
UNION ALL
SELECT e.reference, NULL::text, 'pending'::text, NULL::integer, e.initiated_at,
       false, 0, 0::bigint
FROM hookledger_private.expectations e
WHERE e.kind = 'sms'
  AND NOT EXISTS (SELECT 1 FROM hookledger_private.sms_messages s
                  WHERE s.message_id = e.reference);

-- resolved: a terminal state is known (a payment's outcome, an SMS's operator report)
CREATE OR REPLACE VIEW hookledger.expectations AS
SELECT e.reference, e.kind, e.amount, e.initiated_at,
       coalesce(coalesce(p.outcome, o.outcome, m.outcome)
                IN ('success', 'failure', 'refunded'), false) AS resolved,
       coalesce(p.outcome, o.outcome, m.outcome) AS outcome,
       coalesce(p.amount, o.amount) AS amount_seen,
       e.registered_at
FROM hookledger_private.expectations e
LEFT JOIN hookledger_private.payments p ON e.kind = 'collection' AND p.reference = e.reference
LEFT JOIN hookledger_private.payouts o ON e.kind = 'payout' AND o.reference = e.reference
LEFT JOIN (SELECT message_id,
                  CASE status WHEN 'delivered' THEN 'success' ELSE 'failure' END AS outcome
           FROM hookledger_private.sms_messages) m
       ON e.kind = 'sms' AND m.message_id = e.reference;

CREATE OR REPLACE FUNCTION hookledger.expect(reference text, kind text, amount numeric,
                                             initiated_at timestamptz DEFAULT now())
RETURNS boolean LANGUAGE plpgsql AS $fn$
DECLARE
    held hookledger_private.expectations%ROWTYPE;
BEGIN
    IF reference IS NULL OR btrim(reference) = '' OR length(reference) > 512 THEN
        RAISE EXCEPTION 'reference must be 1 to 512 characters' USING ERRCODE = '22023';
    END IF;
    IF kind IS NULL OR kind NOT IN ('collection', 'payout', 'sms') THEN
        RAISE EXCEPTION 'kind must be collection, payout or sms' USING ERRCODE = '22023';
    END IF;
    IF kind = 'sms' AND amount IS DISTINCT FROM 0 THEN
        RAISE EXCEPTION 'an sms carries no amount: give 0' USING ERRCODE = '22023';
    END IF;
    IF kind <> 'sms' AND (amount IS NULL OR amount <= 0) THEN
        RAISE EXCEPTION 'amount must be a positive number of TZS' USING ERRCODE = '22023';
    END IF;
    INSERT INTO hookledger_private.expectations AS x (reference, kind, amount, initiated_at)
    VALUES (expect.reference, expect.kind, expect.amount,
            coalesce(expect.initiated_at, now()))
    ON CONFLICT ON CONSTRAINT pk_expectations DO NOTHING;
    IF FOUND THEN
        RETURN true;
    END IF;
    SELECT * INTO held FROM hookledger_private.expectations x WHERE x.reference = expect.reference;
    IF held.kind <> expect.kind OR held.amount <> expect.amount THEN
        RAISE EXCEPTION 'reference % is already expected with another kind or amount',
            expect.reference USING ERRCODE = '23505';
    END IF;
    RETURN false;
END
$fn$;
COMMENT ON FUNCTION hookledger.expect(text, text, numeric, timestamptz) IS
    'Register an initiated collection or payout (amount in TZS), so that a webhook that '
    'never comes is noticed by reconciliation, or a sent SMS (amount 0), shown pending in '
    'sms_messages until its operator report arrives. Idempotent: true when new, false '
    'when already registered with the same kind and amount.';
"""

DOWNGRADE = r"""
CREATE OR REPLACE VIEW hookledger.sms_messages AS
SELECT message_id, recipient, status, code, updated_at,
       conflicted, event_count, last_position
FROM hookledger_private.sms_messages;

CREATE OR REPLACE VIEW hookledger.expectations AS
SELECT e.reference, e.kind, e.amount, e.initiated_at,
       coalesce(coalesce(p.outcome, o.outcome) IN ('success', 'failure', 'refunded'), false)
           AS resolved,
       coalesce(p.outcome, o.outcome) AS outcome,
       coalesce(p.amount, o.amount) AS amount_seen,
       e.registered_at
FROM hookledger_private.expectations e
LEFT JOIN hookledger_private.payments p ON e.kind = 'collection' AND p.reference = e.reference
LEFT JOIN hookledger_private.payouts o ON e.kind = 'payout' AND o.reference = e.reference;

DELETE FROM hookledger_private.expectations WHERE kind = 'sms';
ALTER TABLE hookledger_private.expectations DROP CONSTRAINT ck_expectations_amount_positive;
ALTER TABLE hookledger_private.expectations
    ADD CONSTRAINT ck_expectations_amount_positive CHECK (amount > 0);
ALTER TABLE hookledger_private.expectations DROP CONSTRAINT ck_expectations_kind;
ALTER TABLE hookledger_private.expectations
    ADD CONSTRAINT ck_expectations_kind CHECK (kind IN ('collection', 'payout'));
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
