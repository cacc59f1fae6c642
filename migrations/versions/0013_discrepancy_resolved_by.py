"""Who resolved a discrepancy: ``resolved_by``, ``admin`` (a person) or ``reconciler``.

A person resolving a finding no webhook can settle (a short payment accepted, an
``unresolved`` collection the customer was told about) saw it opened again by the next
check, every backoff, for ever: nothing told a check that someone had looked. The fold now
keeps the resolving event's source, and a check leaves the same finding resolved when a
person resolved it (a changed one is news). Rows resolved before this migration get theirs
from the ledger, the first resolution of each id as the fold takes it; so does a row whose
resolution an older process, still folding during a rolling upgrade, has yet to reach (it
writes no ``resolved_by``, so the value stays).

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-27
"""

from __future__ import annotations

from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

UPGRADE = r"""
ALTER TABLE hookledger_private.discrepancies ADD COLUMN resolved_by text;

UPDATE hookledger_private.discrepancies d SET resolved_by = r.source
FROM (SELECT DISTINCT ON (facts->>'id') facts->>'id' AS id, source
      FROM hookledger_private.ledger_events
      WHERE event_type = 'discrepancy.resolved'
      ORDER BY facts->>'id', position) r
WHERE r.id = d.id;  -- also a row whose resolution is not folded yet: the fold agrees

CREATE OR REPLACE VIEW hookledger.discrepancies AS
SELECT id, kind, subject, reference, detail, amount_at_risk, status, detected_at,
       resolved_at, service, resolution, detected_by, resolved_by
FROM hookledger_private.discrepancies;
"""

DOWNGRADE = r"""
DROP VIEW hookledger.discrepancies;
CREATE VIEW hookledger.discrepancies AS
SELECT id, kind, subject, reference, detail, amount_at_risk, status, detected_at,
       resolved_at, service, resolution, detected_by
FROM hookledger_private.discrepancies;
ALTER TABLE hookledger_private.discrepancies DROP COLUMN resolved_by;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
