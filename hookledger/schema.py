"""Every declared table, gathered on one metadata (for alembic and the schema diff test)."""

from __future__ import annotations

import ingest.schema  # noqa: F401 - registers ingest's tables
import projections.schema  # noqa: F401 - registers the projection tables
import reconcile.schema  # noqa: F401 - registers reconciliation's tables
from ledger.schema import PRIVATE_SCHEMA, metadata

__all__ = ["PRIVATE_SCHEMA", "metadata"]
