"""Names hookledger's SQL calls are PostgreSQL's own, whatever a session's search path holds.

PostgreSQL prefers a function or operator of the arguments' exact types, found anywhere on
the search path, to its own that needs a cast. A role that may create in ``public`` (every
role on PostgreSQL 13 and 14, unless revoked) can add one, and it then runs with the rights
of the session that calls it: ``serve``'s role, which owns the tables. The append trigger's
case is in ``test_chain.py``.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import psycopg
from psycopg_pool import AsyncConnectionPool

from ingest.chat_secrets import ChatSecretStore, install_in
from tests.dbutil import tenant_in_public

HIJACK = "LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'hijacked'; END $$"


def test_registering_an_expectation_runs_no_operator_of_another_role(db_url: str) -> None:
    """``amount <= 0`` compares numeric with integer: a ``<=(numeric, integer)`` in public
    was the one called, with the registering session's rights."""
    with tenant_in_public(
            db_url,
            f"CREATE FUNCTION public.le(numeric, integer) RETURNS boolean {HIJACK}",
            "CREATE OPERATOR public.<= (LEFTARG = numeric, RIGHTARG = integer, "
            "FUNCTION = public.le)",
            f"CREATE FUNCTION public.eq(numeric, integer) RETURNS boolean {HIJACK}",
            "CREATE OPERATOR public.= (LEFTARG = numeric, RIGHTARG = integer, "
            "FUNCTION = public.eq)"), psycopg.connect(db_url, autocommit=True) as conn:
        for reference, kind, amount in (("SP-1", "collection", 100), ("SP-2", "sms", 0)):
            assert conn.execute("SELECT hookledger.expect(%s, %s, %s, NULL)",
                                (reference, kind, amount)).fetchone() == (True,)


def test_storing_or_rotating_a_chat_secret_runs_no_function_of_another_role(
        db_url: str) -> None:
    """The locks' ``hashtextextended(..., 0)``: one taking (text, integer) in public was the
    one called, with the storing or rotating session's rights."""
    async def install() -> None:
        async with await psycopg.AsyncConnection.connect(db_url) as conn:
            await install_in(conn, "255700000001", "chat-secret-0123456789",
                             datetime.now(UTC), source="bootstrap")
            await conn.commit()
        async with AsyncConnectionPool(db_url, min_size=1, open=False) as pool:
            async with ChatSecretStore(pool, grace_s=600).rotation_lock("255700000001"):
                pass

    with tenant_in_public(
            db_url,
            f"CREATE FUNCTION public.hashtextextended(text, integer) RETURNS bigint {HIJACK}"):
        asyncio.run(install())
    with psycopg.connect(db_url) as conn:
        assert conn.execute("SELECT count(*) FROM hookledger_private.chat_secrets "
                            "WHERE phone_number_id = '255700000001'").fetchone() == (1,)
