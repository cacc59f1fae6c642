"""The view ``hookledger.money_at_risk`` (an addition to the contract's views): open money at risk, each payment once.

One payment can hold several open discrepancies at once (a conflict, a contradicting code
and a mismatch), each naming the same money; a plain ``sum(amount_at_risk)`` over
``hookledger.discrepancies`` then counts it several times. This view has one row per
(subject, reference) with open discrepancies, at the largest amount any of them names,
which is how the reports count (``reconcile.report.at_risk``): its sum is the reports'
total.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-22
"""

from __future__ import annotations

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

UPGRADE = r"""
CREATE VIEW hookledger.money_at_risk AS
SELECT subject, reference,
       max(amount_at_risk) AS amount_at_risk,  -- NULL when no open discrepancy names one
       count(*) AS open_discrepancies,
       array_agg(DISTINCT kind ORDER BY kind) AS kinds,
       min(detected_at) AS oldest_detected_at
FROM hookledger_private.discrepancies
WHERE status = 'open'
GROUP BY subject, reference;
"""

DOWNGRADE = r"""
DROP VIEW IF EXISTS hookledger.money_at_risk;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
