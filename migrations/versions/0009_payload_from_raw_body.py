"""A delivery's payload is kept once: as its raw bytes, read as jsonb when asked for.

Every delivery was stored twice, as ``raw_body`` and as ``payload``, the ``jsonb`` reading
of those same bytes. Together they pushed a 1 kB delivery's row past PostgreSQL's 2 kB
threshold, so every append also compressed it: measured on one backend in batches of 128
(the embedded PostgreSQL 16, pglz), the row without its duplicate cost 24 of 48
microseconds of server time, before the chain digest's second hash of the same content.

From here on the appender leaves ``payload`` NULL when it is exactly the raw body's
reading, and everything that reads the ledger computes it: the view ``hookledger.ledger``
and the ledger's own reads give ``coalesce(payload, convert_from(raw_body,
'UTF8')::jsonb)``, the same value the column would have held (it was that cast, made at
append time). A payload that is not the raw body's reading (events hookledger writes
itself, which have no raw body; the placeholder of a body jsonb cannot hold) is stored as
before. The check constraint makes the cast the append used to make, so a body jsonb cannot
read is refused as it was, and every row stays readable.

The chain digest hashes an absent payload as ``sha256('-')``, which no jsonb text
equals, and a present one exactly as before, so every existing hash still verifies; the
raw body, already in the digest, covers the content. Rows written earlier are not touched.

Downgrading puts the old view and digest back only while no row relies on its raw body for
its payload: filling those payloads in would change their digests and break the chain.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-23
"""

from __future__ import annotations

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

PAYLOAD = "coalesce(payload, convert_from(raw_body, 'UTF8')::jsonb)"
# an absent payload hashes as '-', which no jsonb text is; a present one as before 0009
PAYLOAD_HASH = r"coalesce(sha256(convert_to(e.payload::text, 'UTF8')), sha256('\x2d'::bytea))"
PAYLOAD_HASH_BEFORE = "sha256(convert_to(e.payload::text, 'UTF8'))"


def _digest(payload_hash: str) -> str:
    return rf"""
CREATE OR REPLACE FUNCTION hookledger_private.ledger_event_digest(
    e hookledger_private.ledger_events)
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
    {payload_hash} ||
    sha256(convert_to(e.facts::text, 'UTF8')) ||
    sha256(convert_to(coalesce(
        '+' || round(extract(epoch FROM e.occurred_at) * 1000000)::bigint::text, '-'),
        'UTF8')) ||
    sha256(convert_to(round(extract(epoch FROM e.received_at) * 1000000)::bigint::text,
                      'UTF8')) ||
    sha256(convert_to(round(extract(epoch FROM e.recorded_at) * 1000000)::bigint::text,
                      'UTF8')))
$$;
"""


def _ledger_view(payload: str) -> str:
    return f"""
CREATE OR REPLACE VIEW hookledger.ledger AS
SELECT position, stream, event_type, source, received_at, {payload} AS payload,
       event_id, dedupe_key, endpoint, verified_by, facts, occurred_at, recorded_at,
       headers, raw_body, chain_hash
FROM hookledger_private.ledger_events
ORDER BY position;
"""


UPGRADE = f"""
ALTER TABLE hookledger_private.ledger_events ALTER COLUMN payload DROP NOT NULL;
-- A row without a stored payload must have one to compute: the cast the append used to
-- make is made here, so a body jsonb cannot read (a number with more decimals than
-- numeric holds; a character the database's encoding lacks) is refused at append as
-- before, never acknowledged and then unreadable. CASE, not OR: the cast must not run on
-- a placeholder row's raw bytes. NOT VALID: every existing row has its payload (the
-- column was NOT NULL), so a large ledger is not scanned under lock to learn that.
ALTER TABLE hookledger_private.ledger_events
    ADD CONSTRAINT ck_ledger_events_payload_or_raw_body
    CHECK (CASE WHEN payload IS NOT NULL THEN true
                ELSE convert_from(raw_body, 'UTF8')::jsonb IS NOT NULL END) NOT VALID;
{_digest(PAYLOAD_HASH)}
{_ledger_view(PAYLOAD)}
"""

DOWNGRADE = f"""
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM hookledger_private.ledger_events WHERE payload IS NULL) THEN
        RAISE EXCEPTION 'cannot downgrade below 0009: some events keep their payload only '
                        'as raw bytes, and filling it in would break the hash chain'
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
END
$$;
{_ledger_view("payload")}
{_digest(PAYLOAD_HASH_BEFORE)}
ALTER TABLE hookledger_private.ledger_events
    DROP CONSTRAINT ck_ledger_events_payload_or_raw_body;
ALTER TABLE hookledger_private.ledger_events ALTER COLUMN payload SET NOT NULL;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
