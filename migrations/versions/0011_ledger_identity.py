"""The ledger's own identity: one row with a random id, drawn once.

Spool files wait in a folder of their database's own (``ingest.spool.database_folder``),
so that processes sharing a home but not a database never drain each other's deliveries.
The folder was first named after the cluster's system identifier and the database's name;
the identifier changes with a dump and restore into a new cluster and (where the role may
not read it, and the server's address stood in) a failover, and a restart after either left
the deliveries spooled before it in a folder nobody drained. This id travels with the data
instead; the database's name, kept beside it, tells apart the copies made from one database
as a template, which share the row.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-27
"""

from __future__ import annotations

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

UPGRADE = r"""
CREATE TABLE hookledger_private.ledger_identity (
    one boolean DEFAULT true NOT NULL,
    id uuid DEFAULT gen_random_uuid() NOT NULL,
    created_at timestamptz DEFAULT now() NOT NULL,
    CONSTRAINT pk_ledger_identity PRIMARY KEY (one),
    CONSTRAINT ck_ledger_identity_single_row CHECK (one)
);
INSERT INTO hookledger_private.ledger_identity DEFAULT VALUES;
"""

DOWNGRADE = r"""
DROP TABLE hookledger_private.ledger_identity;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
