"""Reconciliation: expectations, check bookkeeping, discrepancies, recovered states.

Also the contract views ``hookledger.expectations`` and ``hookledger.discrepancies``, the
``recovered`` column of payments and payouts, and the documented SQL function
``hookledger.expect(reference, kind, amount, initiated_at default now())``.

The ``discrepancies`` projection is new: its checkpoint starts where the other projections
stand, and its table is filled here from the ``discrepancy.detected`` events already in the
ledger up to that point (the same rows its fold makes), so that upgrading an existing
database never replays events into the older projections.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23
"""

from __future__ import annotations

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

UPGRADE = r"""
ALTER TABLE hookledger_private.payments ADD COLUMN recovered boolean NOT NULL DEFAULT false;
ALTER TABLE hookledger_private.payouts ADD COLUMN recovered boolean NOT NULL DEFAULT false;

CREATE TABLE hookledger_private.expectations (
    reference     text        NOT NULL,
    kind          text        NOT NULL,
    amount        numeric     NOT NULL,
    initiated_at  timestamptz NOT NULL,
    registered_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT pk_expectations PRIMARY KEY (reference),
    CONSTRAINT ck_expectations_kind CHECK (kind IN ('collection', 'payout')),
    CONSTRAINT ck_expectations_amount_positive CHECK (amount > 0)
);

CREATE TABLE hookledger_private.reconcile_subjects (
    subject          text        NOT NULL,
    reference        text        NOT NULL,
    last_checked_at  timestamptz NOT NULL,
    checked_position bigint      NOT NULL DEFAULT 0,
    next_check_at    timestamptz,
    last_result      text        NOT NULL,
    checks           integer     NOT NULL DEFAULT 0,
    last_pass        text,
    CONSTRAINT pk_reconcile_subjects PRIMARY KEY (subject, reference)
);
CREATE INDEX ix_reconcile_subjects_next_check_at
    ON hookledger_private.reconcile_subjects (next_check_at);

CREATE TABLE hookledger_private.discrepancies (
    id             text        NOT NULL,
    kind           text        NOT NULL,
    subject        text        NOT NULL,
    service        text        NOT NULL,
    reference      text        NOT NULL,
    detail         text        NOT NULL,
    amount_at_risk numeric,
    status         text        NOT NULL,
    detected_at    timestamptz,
    resolved_at    timestamptz,
    resolution     text,
    detected_by    text,
    facts          jsonb       NOT NULL,
    event_count    integer     NOT NULL,
    last_position  bigint      NOT NULL,
    CONSTRAINT pk_discrepancies PRIMARY KEY (id)
);
CREATE INDEX ix_discrepancies_status_kind ON hookledger_private.discrepancies (status, kind);
CREATE INDEX ix_discrepancies_subject_reference
    ON hookledger_private.discrepancies (subject, reference);

INSERT INTO hookledger_private.projection_checkpoints (name, position)
SELECT 'discrepancies', coalesce(min(position), 0)
FROM hookledger_private.projection_checkpoints;

INSERT INTO hookledger_private.discrepancies
SELECT left(encode(sha256(convert_to(e.dedupe_key, 'UTF8')), 'hex'), 24),
       coalesce(e.facts->>'kind', 'unknown'),
       coalesce(e.facts->>'subject', ''),
       CASE e.facts->>'subject' WHEN 'collection' THEN 'Collection'
            WHEN 'payout' THEN 'Disbursement' WHEN 'invoice' THEN 'Invoicing'
            WHEN 'sms' THEN 'Bulk SMS' WHEN 'chat' THEN 'Chat'
            ELSE coalesce(e.facts->>'subject', '') END,
       coalesce(e.facts->>'reference', ''), coalesce(e.facts->>'detail', ''),
       (e.facts->>'amount_at_risk')::numeric, 'open', e.received_at, NULL, NULL,
       coalesce(e.facts->>'detected_by', e.source),
       e.facts - 'kind' - 'subject' - 'reference' - 'detail' - 'amount_at_risk' - 'evidence',
       1, e.position
FROM hookledger_private.ledger_events e
WHERE e.event_type = 'discrepancy.detected'
  AND e.position <= (SELECT position FROM hookledger_private.projection_checkpoints
                     WHERE name = 'discrepancies')
ON CONFLICT (id) DO NOTHING;

CREATE OR REPLACE VIEW hookledger.payments AS
SELECT reference, status, outcome, code, amount, transaction_id, customer_reference,
       phone_number, mno, last_event, updated_at,
       invoice_no, conflicted, event_count, last_position, recovered
FROM hookledger_private.payments;

CREATE OR REPLACE VIEW hookledger.payouts AS
SELECT reference, status, outcome, code, amount, refunded_to_wallet, updated_at,
       last_event, transaction_id, customer_reference, conflicted, event_count, last_position,
       recovered
FROM hookledger_private.payouts;

CREATE VIEW hookledger.discrepancies AS
SELECT id, kind, subject, reference, detail, amount_at_risk, status, detected_at,
       resolved_at, service, resolution, detected_by
FROM hookledger_private.discrepancies;

-- resolved: a terminal state (success, failure, refund) is known, by webhook or recovery
CREATE VIEW hookledger.expectations AS
SELECT e.reference, e.kind, e.amount, e.initiated_at,
       coalesce(coalesce(p.outcome, o.outcome) IN ('success', 'failure', 'refunded'), false)
           AS resolved,
       coalesce(p.outcome, o.outcome) AS outcome,
       coalesce(p.amount, o.amount) AS amount_seen,
       e.registered_at
FROM hookledger_private.expectations e
LEFT JOIN hookledger_private.payments p ON e.kind = 'collection' AND p.reference = e.reference
LEFT JOIN hookledger_private.payouts o ON e.kind = 'payout' AND o.reference = e.reference;

-- Register an initiated payment. True when new, false when already registered alike;
-- an error when the reference is registered with another kind or amount.
CREATE FUNCTION hookledger.expect(reference text, kind text, amount numeric,
                                  initiated_at timestamptz DEFAULT now())
RETURNS boolean LANGUAGE plpgsql AS $fn$
DECLARE
    held hookledger_private.expectations%ROWTYPE;
BEGIN
    IF reference IS NULL OR btrim(reference) = '' OR length(reference) > 512 THEN
        RAISE EXCEPTION 'reference must be 1 to 512 characters' USING ERRCODE = '22023';
    END IF;
    IF kind IS NULL OR kind NOT IN ('collection', 'payout') THEN
        RAISE EXCEPTION 'kind must be collection or payout' USING ERRCODE = '22023';
    END IF;
    IF amount IS NULL OR amount <= 0 THEN
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
    'never comes is noticed by reconciliation. Idempotent: true when new, false when '
    'already registered with the same kind and amount.';
"""

DOWNGRADE = r"""
DROP FUNCTION IF EXISTS hookledger.expect(text, text, numeric, timestamptz);
DROP VIEW IF EXISTS hookledger.expectations;
DROP VIEW IF EXISTS hookledger.discrepancies;
DROP VIEW IF EXISTS hookledger.payments;
DROP VIEW IF EXISTS hookledger.payouts;
CREATE VIEW hookledger.payments AS
SELECT reference, status, outcome, code, amount, transaction_id, customer_reference,
       phone_number, mno, last_event, updated_at,
       invoice_no, conflicted, event_count, last_position
FROM hookledger_private.payments;
CREATE VIEW hookledger.payouts AS
SELECT reference, status, outcome, code, amount, refunded_to_wallet, updated_at,
       last_event, transaction_id, customer_reference, conflicted, event_count, last_position
FROM hookledger_private.payouts;
DELETE FROM hookledger_private.projection_checkpoints WHERE name = 'discrepancies';
DROP TABLE IF EXISTS hookledger_private.discrepancies;
DROP TABLE IF EXISTS hookledger_private.reconcile_subjects;
DROP TABLE IF EXISTS hookledger_private.expectations;
ALTER TABLE hookledger_private.payouts DROP COLUMN IF EXISTS recovered;
ALTER TABLE hookledger_private.payments DROP COLUMN IF EXISTS recovered;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
