"""An expectation's ``initiated_at`` is one every reader can hold.

The API and ``hookledger expect`` refused an instant before 1900 or from 9998 on
(``ledger.instants``), but ``hookledger.expect()`` in SQL stored it, and every later read of
the row in Python failed: a reconciliation pass, the reports. The constraint refuses it
wherever it comes from. NOT VALID: a row stored before this migration is left for its owner
to find (``SELECT * FROM hookledger.expectations WHERE initiated_at < '1900-01-01' OR
initiated_at >= '9998-01-01'``) rather than stopping the upgrade.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-27
"""

from __future__ import annotations

from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

UPGRADE = r"""
ALTER TABLE hookledger_private.expectations
    ADD CONSTRAINT ck_expectations_initiated_at_storable
    CHECK (initiated_at >= '1900-01-01 00:00+00' AND initiated_at < '9998-01-01 00:00+00')
    NOT VALID;
"""

DOWNGRADE = r"""
ALTER TABLE hookledger_private.expectations
    DROP CONSTRAINT ck_expectations_initiated_at_storable;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
