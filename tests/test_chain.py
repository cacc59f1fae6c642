"""Tamper evidence: the hash chain over the ledger, checked by ``hookledger verify``."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import psycopg
import pytest

from hookledger import migrate
from ledger.chain import check_chain
from ledger.store import append_in
from tests.projection_events import new_event


def append(url: str, count: int, prefix: str) -> None:
    async def run() -> None:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            for start in range(0, count, 7):  # several statements and transactions
                async with conn.transaction():
                    await append_in(conn, [
                        new_event("payment.confirmed", 91000, reference=f"{prefix}-{i}",
                                  amount=1000 + i)
                        for i in range(start, min(count, start + 7))])
    asyncio.run(run())


def check(url: str) -> object:
    async def run() -> object:
        async with await psycopg.AsyncConnection.connect(url) as conn:
            return await check_chain(conn)
    return asyncio.run(run())


def tamper(url: str, position: int) -> None:
    """What an operator with superuser rights could do: switch the guard off, edit, on."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ALTER TABLE hookledger_private.ledger_events "
                     "DISABLE TRIGGER ledger_events_refuse_update_delete")
        conn.execute("UPDATE hookledger_private.ledger_events SET payload = "
                     "jsonb_set(payload, '{amount}', '1') WHERE position = %s", (position,))
        conn.execute("ALTER TABLE hookledger_private.ledger_events "
                     "ENABLE TRIGGER ledger_events_refuse_update_delete")


def verify_command(url: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOOKLEDGER_")}
    env["HOOKLEDGER_DATABASE_URL"] = url
    return subprocess.run([sys.executable, "-m", "hookledger", "verify"], env=env,
                          capture_output=True, text=True, timeout=120)


def test_an_untouched_ledger_verifies_and_an_edited_event_is_named(db_url: str) -> None:
    append(db_url, 30, "CH")
    result = check(db_url)
    assert result.intact and result.checked == 30  # type: ignore[attr-defined]
    ok = verify_command(db_url)
    assert ok.returncode == 0 and "ledger intact: 30 events" in ok.stdout

    tamper(db_url, 17)
    result = check(db_url)
    assert result.first_mismatch == 17 and result.checked == 16  # type: ignore[attr-defined]
    caught = verify_command(db_url)
    assert caught.returncode == 1 and "position 17" in caught.stdout


@pytest.mark.parametrize("start", ["0001", "0002", "0003", "0004"])
def test_upgrading_a_ledger_with_events_keeps_them_and_chains_them(empty_db_url: str,
                                                                    start: str) -> None:
    migrate.upgrade(empty_db_url, start)
    append(empty_db_url, 20, "OLD")
    with psycopg.connect(empty_db_url) as conn:
        before = conn.execute("SELECT position, event_id, payload FROM "
                              "hookledger_private.ledger_events ORDER BY position").fetchall()
    migrate.upgrade(empty_db_url)
    with psycopg.connect(empty_db_url) as conn:
        after = conn.execute("SELECT position, event_id, payload FROM "
                             "hookledger_private.ledger_events ORDER BY position").fetchall()
    assert after == before
    append(empty_db_url, 5, "NEW")  # the trigger continues the chain the migration made
    result = check(empty_db_url)
    assert result.intact and result.checked == 25  # type: ignore[attr-defined]
