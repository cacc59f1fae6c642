"""The append-only ledger, refused deliveries, and their views.

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

from __future__ import annotations

from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

UPGRADE = r"""
CREATE SCHEMA IF NOT EXISTS hookledger_private;
CREATE SCHEMA IF NOT EXISTS hookledger;

-- CACHE 1 (the default) keeps nextval monotonic across sessions; never raise it.
CREATE SEQUENCE hookledger_private.ledger_position_seq AS bigint;

CREATE TABLE hookledger_private.ledger_events (
    position     bigint      NOT NULL,
    event_id     uuid        NOT NULL DEFAULT gen_random_uuid(),
    stream       text        NOT NULL,
    event_type   text        NOT NULL,
    source       text        NOT NULL,
    dedupe_key   text        NOT NULL,
    endpoint     text,
    verified_by  text,
    raw_body     bytea,
    headers      jsonb       NOT NULL DEFAULT '{}'::jsonb,
    payload      jsonb       NOT NULL,
    facts        jsonb       NOT NULL DEFAULT '{}'::jsonb,
    occurred_at  timestamptz,
    received_at  timestamptz NOT NULL,
    recorded_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    CONSTRAINT pk_ledger_events PRIMARY KEY (position),
    CONSTRAINT uq_ledger_events_event_id UNIQUE (event_id),
    CONSTRAINT uq_ledger_events_dedupe_key UNIQUE (dedupe_key)
);
CREATE INDEX ix_ledger_events_stream_position
    ON hookledger_private.ledger_events (stream, position);
CREATE INDEX ix_ledger_events_event_type_position
    ON hookledger_private.ledger_events (event_type, position);

-- Gap-safe ordering. A sequence alone hands out positions at nextval() time, while rows
-- become visible at commit time: a reader that has seen position 7 could later find a 6
-- committed after it, and a tailing consumer that checkpoints "after 7" would skip 6 for
-- ever. So every append takes one transaction-scoped advisory lock before it draws its
-- positions. PostgreSQL makes a transaction visible before it releases its locks, so the
-- next writer draws larger positions only after the earlier ones are visible: positions
-- become visible in order, and "read after the last position seen" never skips. The lock is
-- taken here, in the database, so no writer can forget it. An advisory lock (not LOCK
-- TABLE) is used because an INSERT already holds ROW EXCLUSIVE on the table and upgrading
-- that to a stronger table lock would deadlock two concurrent writers. Aborted appends leave
-- holes in the positions; readers do not care.
CREATE FUNCTION hookledger_private.ledger_events_assign_position() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(7525356009530156135);  -- ledger.schema.APPEND_LOCK_KEY
    NEW.position := nextval('hookledger_private.ledger_position_seq');
    RETURN NEW;
END
$$;
CREATE TRIGGER ledger_events_assign_position
    BEFORE INSERT ON hookledger_private.ledger_events
    FOR EACH ROW EXECUTE FUNCTION hookledger_private.ledger_events_assign_position();

-- Immutability: the ledger is append-only, for everyone, whatever the client.
CREATE FUNCTION hookledger_private.ledger_events_refuse_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'hookledger ledger is append-only: % refused', TG_OP
        USING ERRCODE = 'restrict_violation';
END
$$;
CREATE TRIGGER ledger_events_refuse_update_delete
    BEFORE UPDATE OR DELETE ON hookledger_private.ledger_events
    FOR EACH ROW EXECUTE FUNCTION hookledger_private.ledger_events_refuse_change();
CREATE TRIGGER ledger_events_refuse_truncate
    BEFORE TRUNCATE ON hookledger_private.ledger_events
    FOR EACH STATEMENT EXECUTE FUNCTION hookledger_private.ledger_events_refuse_change();

-- Wake tailing consumers; PostgreSQL delivers notifications only on commit, folded per
-- transaction, so a batch append costs one notification.
CREATE FUNCTION hookledger_private.ledger_events_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('hookledger_ledger', '');
    RETURN NULL;
END
$$;
CREATE TRIGGER ledger_events_notify
    AFTER INSERT ON hookledger_private.ledger_events
    FOR EACH STATEMENT EXECUTE FUNCTION hookledger_private.ledger_events_notify();

CREATE TABLE hookledger_private.rejected_deliveries (
    id           bigint      GENERATED ALWAYS AS IDENTITY,
    received_at  timestamptz NOT NULL,
    endpoint     text        NOT NULL,
    reason       text        NOT NULL,
    detail       text,
    verified     boolean     NOT NULL,
    http_status  bigint      NOT NULL,
    body_sha256  text        NOT NULL,
    body_size    bigint      NOT NULL,
    body_prefix  bytea,
    headers      jsonb,
    remote_addr  text,
    CONSTRAINT pk_rejected_deliveries PRIMARY KEY (id)
);
CREATE INDEX ix_rejected_deliveries_received_at
    ON hookledger_private.rejected_deliveries (received_at);

CREATE VIEW hookledger.ledger AS
SELECT position, stream, event_type, source, received_at, payload,
       event_id, dedupe_key, endpoint, verified_by, facts, occurred_at, recorded_at,
       headers, raw_body
FROM hookledger_private.ledger_events
ORDER BY position;

CREATE VIEW hookledger.rejected_deliveries AS
SELECT received_at, endpoint, reason, body_sha256,
       id, detail, verified, http_status, body_size, body_prefix, headers, remote_addr
FROM hookledger_private.rejected_deliveries
ORDER BY id;
"""

DOWNGRADE = r"""
DROP VIEW IF EXISTS hookledger.rejected_deliveries;
DROP VIEW IF EXISTS hookledger.ledger;
DROP TABLE IF EXISTS hookledger_private.rejected_deliveries;
DROP TRIGGER IF EXISTS ledger_events_refuse_truncate ON hookledger_private.ledger_events;
DROP TABLE IF EXISTS hookledger_private.ledger_events;
DROP FUNCTION IF EXISTS hookledger_private.ledger_events_notify();
DROP FUNCTION IF EXISTS hookledger_private.ledger_events_refuse_change();
DROP FUNCTION IF EXISTS hookledger_private.ledger_events_assign_position();
DROP SEQUENCE IF EXISTS hookledger_private.ledger_position_seq;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
