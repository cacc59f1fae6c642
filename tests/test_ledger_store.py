"""The ledger table: append, dedupe, order, immutability, and gap-safe tailing."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import uuid
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import psycopg
import psycopg.sql
import pytest
from psycopg_pool import AsyncConnectionPool

from ledger import LedgerError, LedgerStore, NewEvent
from ledger.store import time_ordered_uuids

pytestmark = pytest.mark.anyio


def event(key: str, stream: str = "collection:R1", payload: str = '{"amount": 1.10}') -> NewEvent:
    return NewEvent(stream=stream, event_type="payment.confirmed", source="general",
                    dedupe_key=key, payload_json=payload, received_at=datetime.now(UTC),
                    raw_body=payload.encode(), headers={"user-agent": "t"},
                    endpoint="general/main", verified_by="main")


async def test_append_returns_positions_in_order_and_reads_them_back(
        pool: AsyncConnectionPool) -> None:
    store = LedgerStore(pool)
    results = await store.append([event("a"), event("b"), event("c")])
    assert [r.duplicate for r in results] == [False, False, False]
    positions = [r.position for r in results]
    assert positions == sorted(positions) and len(set(positions)) == 3
    read = await store.read(after=0)
    assert [e.dedupe_key for e in read] == ["a", "b", "c"]
    assert read[0].raw_body == b'{"amount": 1.10}'
    assert read[0].headers == {"user-agent": "t"} and read[0].verified_by == "main"
    assert await store.head() == positions[-1]


async def test_event_ids_are_distinct_time_ordered_uuids_from_the_writer(
        pool: AsyncConnectionPool) -> None:
    """Version 7: a later batch's ids sort after an earlier one's in the server's own uuid
    order, so appends land at the right-hand edge of the unique index on event_id."""
    store = LedgerStore(pool)
    before = datetime.now(UTC)
    await store.append([event(f"id-{i}") for i in range(50)])
    await asyncio.sleep(0.005)  # the next batch is at least one millisecond later
    await store.append([event(f"later-{i}") for i in range(50)])
    after = datetime.now(UTC)
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT event_id, dedupe_key FROM hookledger.ledger "
                                 "ORDER BY event_id")
        rows = await cur.fetchall()
    ids = [row[0] for row in rows]
    assert len(set(ids)) == 100
    assert {(i.version, i.variant) for i in ids} == {(7, uuid.RFC_4122)}
    assert [key.split("-")[0] for _, key in rows] == ["id"] * 50 + ["later"] * 50
    for i in ids:  # the first 48 bits are the Unix time in milliseconds
        stamp = datetime.fromtimestamp(int.from_bytes(i.bytes[:6], "big") / 1000, UTC)
        assert before.replace(microsecond=before.microsecond // 1000 * 1000) <= stamp <= after


def test_time_ordered_uuids_keep_74_random_bits() -> None:
    now_ns = 1_780_000_000_123_456_789
    ids = [uuid.UUID(bytes=b) for b in time_ordered_uuids(2_000, now_ns=now_ns)]
    assert len(set(ids)) == 2_000
    assert {(i.version, i.variant) for i in ids} == {(7, uuid.RFC_4122)}
    assert {int.from_bytes(i.bytes[:6], "big") for i in ids} == {now_ns // 1_000_000}
    # every bit outside the time, the version and the variant varies across the batch
    rand_a, rand_b = (1 << 12) - 1 << 64, (1 << 62) - 1  # below the version, the variant
    random_mask = rand_a | rand_b
    assert random_mask.bit_count() == 74
    varying = 0
    for i in ids:
        varying |= i.int ^ ids[0].int
    assert varying == random_mask


async def test_jsonb_payload_keeps_amounts_exact(pool: AsyncConnectionPool) -> None:
    store = LedgerStore(pool)
    await store.append([event("exact", payload='{"amount": 12345678901234.56}')])
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT (payload->>'amount')::numeric FROM hookledger.ledger")
        (amount,) = await cur.fetchone()  # type: ignore[misc]
    assert str(amount) == "12345678901234.56"


async def test_a_payload_that_is_its_raw_body_is_stored_once_and_read_the_same(
        pool: AsyncConnectionPool) -> None:
    """Migration 0009: the raw bytes are kept, and the payload is computed from them."""
    body = '{"amount": 1.10, "name": "Zuhura \u00e9 \U0001f600", "lines": [1, 2.50, null]}'
    as_sent = event("as-sent", payload=body)
    placeholder = replace(event("placeholder", payload='{"unstorable": true}'),
                          raw_body=b'{"a": 1, "a": 2}')
    internal = replace(event("internal", payload='{"kind": "x"}'), raw_body=None)
    store = LedgerStore(pool)
    await store.append([as_sent, placeholder, internal])
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT dedupe_key, payload IS NULL "
                                 "FROM hookledger_private.ledger_events ORDER BY position")
        assert await cur.fetchall() == [("as-sent", True), ("placeholder", False),
                                        ("internal", False)]
        cur = await conn.execute(
            "SELECT l.dedupe_key, l.payload = x.sent::jsonb, l.payload::text "
            "FROM hookledger.ledger l JOIN unnest(%s::text[], %s::text[]) AS x(key, sent) "
            "ON x.key = l.dedupe_key ORDER BY l.position",
            ([e.dedupe_key for e in (as_sent, placeholder, internal)],
             [e.payload_json for e in (as_sent, placeholder, internal)]))
        rows = await cur.fetchall()
    assert [(key, equal) for key, equal, _ in rows] == [
        ("as-sent", True), ("placeholder", True), ("internal", True)]
    assert '"amount": 1.10' in rows[0][2]  # the number as sent, not a float's reading
    read = {e.dedupe_key: e.payload for e in await store.read(after=0)}
    assert read["as-sent"] == json.loads(body)  # what the pool's jsonb loader gives
    assert read["placeholder"] == {"unstorable": True} and read["internal"] == {"kind": "x"}


async def test_a_raw_body_jsonb_cannot_read_is_refused_at_append_as_before(
        pool: AsyncConnectionPool) -> None:
    """More decimals than numeric holds: the append fails (never acknowledged), and the
    ledger stays readable, as when the payload was cast at append time."""
    store = LedgerStore(pool)
    with pytest.raises(LedgerError):
        await store.append([event("huge", payload='{"amount": 1.' + "0" * 16_384 + "}")])
    await store.append([event("fine")])
    assert [e.dedupe_key for e in await store.read(after=0)] == ["fine"]


async def test_a_known_dedupe_key_is_a_duplicate_pointing_at_the_original(
        pool: AsyncConnectionPool) -> None:
    store = LedgerStore(pool)
    (first,) = await store.append([event("k1")])
    again = await store.append([event("k2"), event("k1"), event("k2")])
    assert again[1].duplicate and again[1].position == first.position
    assert not again[0].duplicate
    assert again[2].duplicate and again[2].position == again[0].position
    assert len(await store.read(after=0)) == 2


@pytest.mark.parametrize("statement", [
    "UPDATE hookledger_private.ledger_events SET stream = 'x'",
    "DELETE FROM hookledger_private.ledger_events",
    "TRUNCATE hookledger_private.ledger_events",
])
async def test_the_ledger_refuses_update_delete_and_truncate(
        pool: AsyncConnectionPool, statement: str) -> None:
    await LedgerStore(pool).append([event("immutable")])
    async with pool.connection() as conn:
        with pytest.raises(psycopg.errors.RestrictViolation, match="append-only"):
            await conn.execute(statement)
        cur = await conn.execute("SELECT count(*), min(stream) FROM hookledger.ledger")
        assert await cur.fetchone() == (1, "collection:R1")


async def test_a_writer_cannot_choose_its_position(pool: AsyncConnectionPool) -> None:
    async with pool.connection() as conn:
        await conn.execute(
            "INSERT INTO hookledger_private.ledger_events (position, stream, event_type, source,"
            " dedupe_key, payload, received_at) VALUES (999999, 's', 't', 'x', 'k', '{}', now())")
        cur = await conn.execute("SELECT position FROM hookledger.ledger")
        assert (await cur.fetchone())[0] != 999999  # type: ignore[index]


async def test_tailing_reader_sees_every_event_exactly_once_under_concurrent_writers(
        db_url: str) -> None:
    """Many writers commit out of position order while a reader tails by position."""
    writers, per_writer = 12, 40
    async with AsyncConnectionPool(db_url, min_size=writers + 1, max_size=writers + 2,
                                   kwargs={"autocommit": True}) as pool:
        store = LedgerStore(pool)
        done = asyncio.Event()

        async def write(w: int) -> None:
            rng = random.Random(w)
            for i in range(per_writer):
                async with pool.connection() as conn, conn.transaction():
                    from ledger.store import append_in
                    await append_in(conn, [event(f"w{w}-{i}-{j}", stream=f"s{w}")
                                           for j in range(rng.randint(1, 3))])
                    # hold the transaction open for a random while: commits interleave
                    await asyncio.sleep(rng.random() * 0.004)

        seen: list[int] = []
        keys: list[str] = []

        async def tail() -> None:
            last = 0
            while True:
                finished = done.is_set()
                batch = await store.read(after=last, limit=7)
                for e in batch:
                    seen.append(e.position)
                    keys.append(e.dedupe_key)
                if batch:
                    last = batch[-1].position
                elif finished:
                    return
                else:
                    await asyncio.sleep(0.001)

        reader = asyncio.create_task(tail())
        await asyncio.gather(*(write(w) for w in range(writers)))
        done.set()
        await reader
        async with pool.connection() as conn:
            cur = await conn.execute("SELECT dedupe_key FROM hookledger.ledger")
            committed = [row[0] for row in await cur.fetchall()]
    assert len(keys) == len(set(keys)), "an event was seen twice"
    assert sorted(keys) == sorted(committed), "the tailing reader skipped an event"
    assert seen == sorted(seen)


@pytest.mark.parametrize("bounded", [True, False])
async def test_a_session_cut_off_after_appending_in_a_transaction_stops_appends_until_its_bound(
        db_url: str, pool: AsyncConnectionPool, bounded: bool) -> None:
    """A network blip between a transaction's append and its COMMIT: the server keeps the
    session, idle in that transaction, holding the append lock, and every append waits.
    Bounded, the server ends it and appends go on; the unbounded case shows what the bound
    is for (the append is still waiting when the test gives up on it)."""
    from ledger.store import append_in, end_if_idle_in_transaction, ready_to_append
    from tests.relay import SocketRelay

    relay = SocketRelay(db_url)
    cut = await psycopg.AsyncConnection.connect(relay.url, autocommit=True)
    try:
        await ready_to_append(cut)
        if bounded:
            await end_if_idle_in_transaction(cut, 1.0)
        await cut.execute("BEGIN")
        await append_in(cut, [event("in-the-cut-transaction")])
        relay.cut_clients()
        try:
            results = await asyncio.wait_for(LedgerStore(pool).append([event("after")]), 6)
        except TimeoutError:
            results = None
        if bounded:
            assert results is not None and not results[0].duplicate
            read = await LedgerStore(pool).read(after=0)
            assert [e.dedupe_key for e in read] == ["after"]  # the cut one rolled back
        else:
            assert results is None
    finally:
        relay.close()
        with contextlib.suppress(psycopg.Error):
            await cut.close()
        async with pool.connection() as conn:  # end the lingering session either way
            await conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid <> "
                "pg_backend_pid() AND state = 'idle in transaction' "
                "AND datname = current_database()")


@pytest.mark.parametrize(("default", "pinned"), [
    ("off", "on"), ("local", "local"), ("remote_apply", "remote_apply"), ("on", "on")])
async def test_an_appending_session_commits_durably_whatever_the_database_default(
        db_url: str, default: str, pinned: str) -> None:
    """``synchronous_commit = off`` set on the database (a common tuning) returned from a
    commit before its WAL was flushed: a delivery answered 200 could be lost in a crash.
    Only ``off`` is raised; the levels a standby setup chose are kept."""
    from ledger.store import ready_to_append

    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        await conn.execute(psycopg.sql.SQL("ALTER DATABASE {} SET synchronous_commit = {}")
                           .format(psycopg.sql.Identifier(conn.info.dbname),
                                   psycopg.sql.Literal(default)))
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        assert (await (await conn.execute("SHOW synchronous_commit")).fetchone()) == (default,)
        await ready_to_append(conn)
        shown = await (await conn.execute(
            "SELECT current_setting('synchronous_commit'), "
            "current_setting('default_transaction_isolation')")).fetchone()
    assert shown == (pinned, "read committed")


async def test_the_ingest_pool_commits_durably_on_a_database_whose_default_is_off(
        db_url: str, tmp_path: Any) -> None:
    """The pool ``serve`` answers deliveries from, not only the function it is set up with
    (set up by the app's own start-up, its lifespan)."""
    from hookledger.app import create_app
    from hookledger.settings import Settings

    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        await conn.execute(psycopg.sql.SQL("ALTER DATABASE {} SET synchronous_commit = off")
                           .format(psycopg.sql.Identifier(conn.info.dbname)))
    app = create_app(Settings(database_url=db_url, home=tmp_path), db_url)
    async with app.app.router.lifespan_context(app.app), \
            app.state.runtime.pool.connection() as conn:
        row = await (await conn.execute("SHOW synchronous_commit")).fetchone()
    assert row == ("on",)
