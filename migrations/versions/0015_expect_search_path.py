"""``hookledger.expect()`` runs with its search path pinned to ``pg_catalog``.

Its body compares ``amount <= 0`` and ``amount IS DISTINCT FROM 0``, a ``numeric`` against
an ``integer``: PostgreSQL prefers an operator of those exact types on the caller's search
path to its own, which needs a cast. A role that may create in ``public`` (every role, on
PostgreSQL 13 and 14 unless that is revoked) could add one, and it ran with the rights of
whoever registered an expectation next: ``serve``'s role, the tables' owner. Pinned, every
name in the body is PostgreSQL's own or written with its schema. Not done for the append
trigger (0014 names its functions instead): a setting changed on every call costs a few
microseconds, nothing for a registration, a measurable share of an append.

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-29
"""

from __future__ import annotations

from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

SIGNATURE = "hookledger.expect(text, text, numeric, timestamptz)"


def upgrade() -> None:
    op.execute(f"ALTER FUNCTION {SIGNATURE} SET search_path = pg_catalog, pg_temp")


def downgrade() -> None:
    op.execute(f"ALTER FUNCTION {SIGNATURE} RESET search_path")
