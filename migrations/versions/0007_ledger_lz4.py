"""The ledger's large columns compress with lz4 where the server has it.

A delivery's row (raw body, payload, facts, headers) is over PostgreSQL's 2 kB threshold,
so every append compresses it. pglz spent about 13 of the 83 microseconds of server time
per appended event; lz4 compresses to the same size much faster (measured on
PostgreSQL 15: 84 -> 74 microseconds per event, 2,360 bytes per event either way). A
server built without lz4 (the embedded one) keeps pglz: the statement is refused there and
nothing changes; nor on PostgreSQL 13, which has no per-column choice. Only rows written
from now on are affected; values already stored read back either way.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-22
"""

from __future__ import annotations

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

COLUMNS = ("raw_body", "payload", "facts", "headers")


def _set_compression(method: str) -> str:
    columns = ", ".join(f"ALTER COLUMN {c} SET COMPRESSION {method}" for c in COLUMNS)
    return f"ALTER TABLE hookledger_private.ledger_events {columns}"


def _from_14(statement: str, handler: str = "") -> str:
    """Per-column compression exists from PostgreSQL 14; on 13 nothing changes."""
    return f"""
DO $$
BEGIN
    IF current_setting('server_version_num')::int >= 140000 THEN
        EXECUTE '{statement}';
    END IF;
{handler}END
$$;
"""


UPGRADE = _from_14(_set_compression("lz4"), "EXCEPTION WHEN feature_not_supported THEN\n"
                   "    RAISE NOTICE 'this server has no lz4: the ledger keeps pglz';\n")
DOWNGRADE = _from_14(_set_compression("default"))


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
