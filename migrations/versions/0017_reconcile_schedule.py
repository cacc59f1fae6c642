"""When the last scheduled reconciliation pass began, shared by every process.

Each process's scheduler (each ``serve``, each of its HTTP workers) fires a pass every
``HOOKLEDGER_RECONCILE_INTERVAL_S``, and the advisory lock only keeps them from running at
once: N processes ran up to N passes an interval, one after another, asking a backlog of
the provider up to N times as fast as one and past the per-pass bounds the README sizes
against the provider's rate limit. A scheduled pass now begins only when none began
within most of an interval (:mod:`reconcile.runner`); one row, its time the database's.

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-29
"""

from __future__ import annotations

from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
CREATE TABLE hookledger_private.reconcile_schedule (
    job        text        NOT NULL,
    began_at   timestamptz NOT NULL,
    CONSTRAINT pk_reconcile_schedule PRIMARY KEY (job)
);
""")


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS hookledger_private.reconcile_schedule")
