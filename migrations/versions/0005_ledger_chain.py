"""Tamper evidence: every ledger event carries a hash chained over the one before it.

``chain_hash = sha256(previous event's chain_hash || digest(this event))``, set by the
BEFORE INSERT trigger under the append lock (so the chain follows the positions), where
``digest`` covers every stored field (``ledger_event_digest``). An event changed behind
the immutability trigger no longer matches its hash, and ``hookledger verify`` names it.
Existing events are chained here, in position order.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-22
"""

from __future__ import annotations

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

UPGRADE = r"""
ALTER TABLE hookledger_private.ledger_events ADD COLUMN chain_hash bytea;

-- Each field is hashed on its own and the hashes concatenated, so no separator inside a
-- field can move content from one field to another. Timestamps as integer microseconds
-- and jsonb as its canonical text: the same value always gives the same bytes, whatever
-- the session's DateStyle or TimeZone.
CREATE FUNCTION hookledger_private.ledger_event_digest(e hookledger_private.ledger_events)
RETURNS bytea LANGUAGE sql STABLE AS $$
SELECT sha256(
    sha256(convert_to(e.position::text, 'UTF8')) ||
    sha256(convert_to(e.event_id::text, 'UTF8')) ||
    sha256(convert_to(e.stream, 'UTF8')) ||
    sha256(convert_to(e.event_type, 'UTF8')) ||
    sha256(convert_to(e.source, 'UTF8')) ||
    sha256(convert_to(e.dedupe_key, 'UTF8')) ||
    sha256(convert_to(coalesce('+' || e.endpoint, '-'), 'UTF8')) ||
    sha256(convert_to(coalesce('+' || e.verified_by, '-'), 'UTF8')) ||
    sha256(coalesce('\x2b'::bytea || e.raw_body, '\x2d'::bytea)) ||
    sha256(convert_to(e.headers::text, 'UTF8')) ||
    sha256(convert_to(e.payload::text, 'UTF8')) ||
    sha256(convert_to(e.facts::text, 'UTF8')) ||
    sha256(convert_to(coalesce(
        '+' || round(extract(epoch FROM e.occurred_at) * 1000000)::bigint::text, '-'),
        'UTF8')) ||
    sha256(convert_to(round(extract(epoch FROM e.received_at) * 1000000)::bigint::text,
                      'UTF8')) ||
    sha256(convert_to(round(extract(epoch FROM e.recorded_at) * 1000000)::bigint::text,
                      'UTF8')))
$$;

ALTER TABLE hookledger_private.ledger_events
    DISABLE TRIGGER ledger_events_refuse_update_delete;
DO $$
DECLARE
    previous bytea := ''::bytea;
    event hookledger_private.ledger_events;
BEGIN
    FOR event IN SELECT * FROM hookledger_private.ledger_events ORDER BY position LOOP
        previous := sha256(previous || hookledger_private.ledger_event_digest(event));
        UPDATE hookledger_private.ledger_events SET chain_hash = previous
        WHERE position = event.position;
    END LOOP;
END
$$;
ALTER TABLE hookledger_private.ledger_events
    ENABLE TRIGGER ledger_events_refuse_update_delete;
ALTER TABLE hookledger_private.ledger_events ALTER COLUMN chain_hash SET NOT NULL;

CREATE OR REPLACE FUNCTION hookledger_private.ledger_events_assign_position() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    previous bytea;
BEGIN
    PERFORM pg_advisory_xact_lock(7525356009530156135);  -- ledger.schema.APPEND_LOCK_KEY
    NEW.position := nextval('hookledger_private.ledger_position_seq');
    -- under the lock, the newest event is the one this one follows (rows written earlier
    -- in the same statement are visible here)
    SELECT chain_hash INTO previous FROM hookledger_private.ledger_events
    ORDER BY position DESC LIMIT 1;
    NEW.chain_hash := sha256(coalesce(previous, ''::bytea)
                             || hookledger_private.ledger_event_digest(NEW));
    RETURN NEW;
END
$$;

CREATE OR REPLACE VIEW hookledger.ledger AS
SELECT position, stream, event_type, source, received_at, payload,
       event_id, dedupe_key, endpoint, verified_by, facts, occurred_at, recorded_at,
       headers, raw_body, chain_hash
FROM hookledger_private.ledger_events
ORDER BY position;
"""

DOWNGRADE = r"""
CREATE OR REPLACE FUNCTION hookledger_private.ledger_events_assign_position() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(7525356009530156135);  -- ledger.schema.APPEND_LOCK_KEY
    NEW.position := nextval('hookledger_private.ledger_position_seq');
    RETURN NEW;
END
$$;
DROP VIEW hookledger.ledger;
CREATE VIEW hookledger.ledger AS
SELECT position, stream, event_type, source, received_at, payload,
       event_id, dedupe_key, endpoint, verified_by, facts, occurred_at, recorded_at,
       headers, raw_body
FROM hookledger_private.ledger_events
ORDER BY position;
DROP FUNCTION hookledger_private.ledger_event_digest(hookledger_private.ledger_events);
ALTER TABLE hookledger_private.ledger_events DROP COLUMN chain_hash;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
