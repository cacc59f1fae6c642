"""``ledger_event_digest`` names PostgreSQL's own functions and operators, as 0014's trigger.

The documented digest function (0010; the trigger writes the same expression out and no
longer calls it) still named ``convert_to``, ``sha256``, ``round``, ``*`` and ``||`` bare. A
SQL function without a search path of its own looks them up on its caller's, where
PostgreSQL prefers a ``convert_to(text, text)`` or a ``*(numeric, integer)`` in any schema
to its own that needs a cast: one that a role may create in ``public`` (every role, on
PostgreSQL 13 and 14 unless that is revoked) ran with the rights of whoever called the
function, the tables' owner included, and answered the digest it liked.

Each is now named in ``pg_catalog``, with 0014's rewriting of the one template: the values
are the same, bit for bit, so every digest and stored hash stays as it was. Qualified
rather than pinned by ``SET search_path``, which would keep the function from being
inlined into a query that calls it.

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-29
"""

from __future__ import annotations

import importlib

from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

_0010 = importlib.import_module("migrations.versions.0010_chain_digest_inline")
_0014 = importlib.import_module("migrations.versions.0014_append_trigger_qualified")


def _function(digest: str) -> str:
    """The function as 0010 wrote it, around ``digest``."""
    return f"""
CREATE OR REPLACE FUNCTION hookledger_private.ledger_event_digest(
    e hookledger_private.ledger_events)
RETURNS bytea LANGUAGE sql STABLE AS $$
SELECT {digest}
$$;
"""


DIGEST_OF_E = _0014.qualified(_0010.digest_of("e"))
UPGRADE = _function(DIGEST_OF_E)
DOWNGRADE = _function(_0010.digest_of("e"))  # 0010's own


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
