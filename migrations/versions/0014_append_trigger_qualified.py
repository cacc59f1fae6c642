"""The append trigger names PostgreSQL's own functions and operators, ``pg_catalog`` and all.

The trigger that gives each event its position and its chain hash (0005, 0010) named
``nextval``, ``convert_to``, ``sha256``, ``round``, ``*`` and ``||`` bare, so each was
looked up on the search path of whichever session appended. ``pg_catalog`` comes first
there, but PostgreSQL prefers a function that takes ``text`` for a quoted literal over its
own that takes ``regclass`` or ``name``, and an operator that takes the arguments' exact
types over its own that needs a cast: a ``nextval(text)``, a ``convert_to(text, text)`` or
a ``*(numeric, integer)`` in any schema on that path was the one called, with the rights
of the role appending, which owns the tables. Whoever may create in such a schema
(``public``, which every role may write to on PostgreSQL 13 and 14 unless that is revoked)
could so switch the immutability guard off and delete or rewrite events, choose every new
event's position (out of commit order, behind the projector's checkpoint) and hash
(``verify`` calling untouched events tampered), read every field, or stop every append.

Each is now named in ``pg_catalog``, which no search path changes. The values are the
same, bit for bit: the expression is 0010's template with only the names qualified, so no
stored hash changes, and ``verify`` (which pins its search path to ``pg_catalog``) computes
the same digests. Qualifying costs nothing per row, where a ``SET search_path`` on the
function would have cost a configuration change on every call under the append lock.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-29
"""

from __future__ import annotations

import importlib
import re

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

_0010 = importlib.import_module("migrations.versions.0010_chain_digest_inline")


def qualified(expression: str) -> str:
    """``expression`` (the digest template) with every function and operator it calls
    named in ``pg_catalog``; ``coalesce`` and ``extract`` are syntax, and casts are found
    by type, not by name."""
    expression = re.sub(r"\b(sha256|convert_to|round)\(", r"pg_catalog.\1(", expression)
    expression = expression.replace("||", "OPERATOR(pg_catalog.||)")
    return expression.replace(" * ", " OPERATOR(pg_catalog.*) ")


DIGEST_OF_NEW = qualified(_0010.digest_of("NEW"))

UPGRADE = f"""
CREATE OR REPLACE FUNCTION hookledger_private.ledger_events_assign_position() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    previous bytea;
BEGIN
    PERFORM pg_catalog.pg_advisory_xact_lock(7525356009530156135);  -- schema.APPEND_LOCK_KEY
    NEW.position := pg_catalog.nextval('hookledger_private.ledger_position_seq');
    -- under the lock, the newest event is the one this one follows (rows written earlier
    -- in the same statement are visible here)
    SELECT chain_hash INTO previous FROM hookledger_private.ledger_events
    ORDER BY position DESC LIMIT 1;
    NEW.chain_hash := pg_catalog.sha256(coalesce(previous, ''::bytea)
                                        OPERATOR(pg_catalog.||) {DIGEST_OF_NEW});
    RETURN NEW;
END
$$;
"""

DOWNGRADE = _0010._trigger(_0010.digest_of("NEW"))  # 0010's own


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
