"""The projector on a real database: live, exactly once, crash-safe, equal to a rebuild."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from ledger import LedgerStore, NewEvent
from ledger.schema import PRIVATE_SCHEMA
from ledger.store import read_in
from projections.live import LOCK_WAIT_S, LiveProjector, ProjectorThread, leader_query
from projections.projector import (
    PROJECTIONS_BY_TABLE,
    apply_events,
    checkpoint,
    connect,
    lock_checkpoint,
    project_batch,
    store_changed,
)
from projections.rebuild import rebuild, verify
from projections.registry import PROJECTIONS, Projection
from tests.dbutil import create_database, drop_database, unique_name
from tests.general_events import encode, general_body
from tests.live import running_service
from tests.projection_events import new_event, restamped
from tests.relay import SocketRelay
from tests.signing import general_header

ROOT = Path(__file__).resolve().parent.parent


def mixed_events(n_subjects: int, seed: int = 7, prefix: str = "") -> list[NewEvent]:
    rng = random.Random(seed)
    events: list[NewEvent] = []
    for n in range(n_subjects):
        i = f"{prefix}{n}"
        kind = rng.choice(["payment", "payout", "invoice", "sms"])
        if kind == "payment":
            events.append(new_event("payment.confirmed", 91000, reference=f"P{i}",
                                    amount=rng.randint(1, 10**5)))
            if rng.random() < 0.3:
                events.append(new_event("payment.refunded", 91010, reference=f"P{i}",
                                        timestamp="20261122090000"))
        elif kind == "payout":
            events.append(new_event("payout.approved", 92002, reference=f"O{i}",
                                    service="Disbursement"))
            events.append(new_event("payout.failed", 92055, reference=f"O{i}", amount=0,
                                    service="Disbursement", timestamp="20261122090000"))
        elif kind == "invoice":
            block = {"invoiceNo": f"I{i}", "total": 500, "currency": "TZS"}
            events.append(new_event("invoice.created", 93000, reference=f"I{i}", amount=500,
                                    invoice={**block, "amountPaid": 0, "amountDue": 500}))
            events.append(new_event("invoice.paid", 93002, reference=f"I{i}", amount=500,
                                    timestamp="20261122090000",
                                    invoice={**block, "amountPaid": 500, "amountDue": 0}))
        else:
            events.append(new_event("sms.delivered", 94000, reference=f"M{i}", amount=0))
    return events


async def append_all(url: str, events: list[NewEvent], chunk: int = 50) -> None:
    async with AsyncConnectionPool(url, kwargs={"autocommit": True}) as pool:
        store = LedgerStore(pool)
        for start in range(0, len(events), chunk):
            await store.append(events[start:start + chunk])


def snapshot(url: str) -> dict[str, list[tuple[Any, ...]]]:
    with psycopg.connect(url) as conn:
        return {p.table: conn.execute(
            f"SELECT * FROM hookledger_private.{p.table} ORDER BY {p.key_column}").fetchall()
            for p in PROJECTIONS}


def applied_counts(url: str) -> int:
    with psycopg.connect(url) as conn:
        return sum(conn.execute(
            f"SELECT coalesce(sum(event_count), 0) FROM hookledger_private.{p.table}"
        ).fetchone()[0] for p in PROJECTIONS)  # type: ignore[index]


def expected_applications(events: list[NewEvent]) -> int:
    from tests.projection_events import stored
    return sum(len(p.keys(stored(e))) for e in events for p in PROJECTIONS)


async def project_all(url: str) -> None:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        while await project_batch(conn, batch_size=37):
            pass


def test_a_delivery_is_visible_in_the_views_shortly_after_it_is_accepted(db_url: str) -> None:
    with running_service(db_url, general_secrets="main=s3cret") as base:
        raw = encode(general_body("payment.confirmed", 91001, reference="LIVE-1", amount=250,
                                  status="PARTIAL"))
        sent = time.monotonic()
        answer = httpx.post(f"{base}/webhooks/general/main", content=raw,
                            headers={"x-service-signature": general_header("s3cret", raw)})
        assert answer.status_code == 200
        with psycopg.connect(db_url, autocommit=True) as conn:
            while time.monotonic() - sent < 5:
                row = conn.execute("SELECT outcome, amount, status FROM hookledger.payments "
                                   "WHERE reference = 'LIVE-1'").fetchone()
                if row:
                    break
                time.sleep(0.01)
    assert row is not None and (row[0], str(row[1]), row[2]) == ("success", "250", "PARTIAL")
    print(f"accepted to visible: {time.monotonic() - sent:.3f} s")


def test_a_service_with_the_projector_off_stores_a_delivery_but_does_not_fold_it(
        db_url: str) -> None:
    """``HOOKLEDGER_PROJECTOR=off`` in the app itself (one process, no supervisor): the
    delivery is acknowledged and in the ledger, the views do not move, and the service
    says it does not lead the projector."""
    with running_service(db_url, general_secrets="main=s3cret", projector=False,
                         admin_token="t0ken") as base:
        raw = encode(general_body("payment.confirmed", 91000, reference="OFF-1"))
        answer = httpx.post(f"{base}/webhooks/general/main", content=raw,
                            headers={"x-service-signature": general_header("s3cret", raw)})
        assert answer.status_code == 200
        time.sleep(1.0)  # the service's own projector folds within about 0.1 s
        status = httpx.get(f"{base}/api/status", headers={"authorization": "Bearer t0ken"})
        with psycopg.connect(db_url, autocommit=True) as conn:
            stored = conn.execute("SELECT count(*) FROM hookledger.ledger").fetchone()
            folded = conn.execute("SELECT count(*) FROM hookledger.payments").fetchone()
    assert (stored, folded) == ((1,), (0,))
    assert status.status_code == 200 and status.json()["projector_leader"] is False


def test_rebuild_gives_exactly_what_the_live_projector_built(db_url: str) -> None:
    events = mixed_events(120)
    asyncio.run(append_all(db_url, events))
    asyncio.run(project_all(db_url))
    live = snapshot(db_url)
    assert asyncio.run(verify(db_url)).identical
    result = asyncio.run(rebuild(db_url, batch_size=53))
    assert result.events >= len(events)
    assert snapshot(db_url) == live
    assert applied_counts(db_url) == expected_applications(events)


def test_a_connection_in_a_summer_time_zone_folds_what_rebuild_folds(db_url: str) -> None:
    """A reconciliation pass folded on its own connection, in the server's zone. In a zone
    with summer time the driver's datetimes did wall-clock arithmetic: a customer's window
    opened at noon the day before the spring change closed after 23 hours, not 24, and
    ``rebuild --verify`` called the row different."""
    from datetime import UTC, datetime, timedelta

    from ingest.chat_body import DeliveryMeta, read_chat
    from ingest.json_body import parse_object
    from tests.chat_events import PHONE, encode, inbound

    opened = datetime(2026, 3, 28, 11, tzinfo=UTC)  # 12:00 in Berlin; clocks go on that night
    raw = encode(inbound(timestamp=str(int(opened.timestamp()))))
    read = read_chat(parse_object(raw)[0], DeliveryMeta(phone_number_id=PHONE,
                                                        delivery_id="dst-1", attempt=1,
                                                        user_agent=None))
    asyncio.run(append_all(db_url, [NewEvent(
        stream=read.stream, event_type=read.event_type, source="chat",
        dedupe_key=read.dedupe_key, payload_json=raw.decode(), received_at=opened,
        facts=read.facts, occurred_at=read.occurred_at, raw_body=raw)]))

    async def fold_in_berlin() -> None:
        async with await psycopg.AsyncConnection.connect(
                db_url, autocommit=True, options="-c TimeZone=Europe/Berlin") as conn:
            while await project_batch(conn):
                pass

    asyncio.run(fold_in_berlin())
    with psycopg.connect(db_url) as conn:
        [(expires,)] = conn.execute(
            "SELECT window_expires_at FROM hookledger.chat_threads").fetchall()
    assert expires - opened == timedelta(hours=24)
    assert asyncio.run(verify(db_url)).identical


def chat_deliveries(rng: random.Random, n_messages: int = 40) -> list[NewEvent]:
    """Chat deliveries as retries leave them: shuffled, inbound messages to two numbers
    from two customers (some 24 h apart to the second, some untimed and counted from
    their arrival, some delivered twice under two delivery ids) and statuses of sent
    messages in any order, failed ones with a cause."""
    import json
    from datetime import UTC, datetime

    from ingest.chat_body import DeliveryMeta, read_chat

    t0 = 1_795_000_000
    sent: list[tuple[dict[str, Any], datetime]] = []
    for i in range(n_messages):
        contact = rng.choice(["255700000001", "255700000002"])
        at = t0 + rng.choice([0, 1, 86399, 86400, 86401])
        message: dict[str, Any] = {"id": f"wamid.L{i}", "from": contact, "type": "text",
                                   "text": {"body": rng.choice(["habari", "asante \U0001f44b"])}}
        if rng.random() < 0.7:
            message["timestamp"] = str(at)
        body: dict[str, Any] = {"type": "message", "wabaId": "W",
                                "phoneNumberId": rng.choice(["100001", "100002"]),
                                "contactWaId": contact, "message": message}
        if rng.random() < 0.7:
            body["profileName"] = rng.choice(["Asha", "Asha M."])
        for _ in range(rng.randint(1, 2)):
            sent.append((body, datetime.fromtimestamp(
                at + rng.choice([0, 5, 3600]) + rng.random(), UTC)))
    for j in range(n_messages // 2):
        for value in rng.sample(["sent", "delivered", "read", "failed"], rng.randint(1, 4)):
            at = t0 + rng.randint(0, 3)
            status: dict[str, Any] = {"id": f"wamid.O{j}", "status": value,
                                      "recipient_id": "255700000001"}
            if rng.random() < 0.7:
                status["timestamp"] = str(at)
            body = {"type": "status", "phoneNumberId": "100001", "status": status}
            if value == "failed" and rng.random() < 0.5:
                body["errors"] = [{"code": rng.choice([131047, 131026]), "title": "x"}]
            sent.append((body, datetime.fromtimestamp(at + 10 + rng.random(), UTC)))
    rng.shuffle(sent)
    events = []
    for n, (body, received_at) in enumerate(sent):
        read = read_chat(body, DeliveryMeta(phone_number_id=body["phoneNumberId"],
                                            delivery_id=f"live-{n}", attempt=1))
        raw = json.dumps(body)
        events.append(NewEvent(
            stream=read.stream, event_type=read.event_type, source="chat",
            dedupe_key=read.dedupe_key, payload_json=raw, received_at=received_at,
            facts=json.loads(json.dumps(read.facts)), occurred_at=read.occurred_at,
            raw_body=raw.encode()))
    return events


def test_chat_views_folded_live_in_small_batches_equal_a_rebuild(db_url: str) -> None:
    """Threads and messages folded batch by batch as deliveries arrive (each batch reading
    back the rows the last one stored: windows, ranks, provenance) are what one fold of
    the whole ledger gives."""
    rng = random.Random(20261129)
    events = chat_deliveries(rng)
    start = 0
    while start < len(events):
        step = rng.randint(1, 7)
        asyncio.run(append_all(db_url, events[start:start + step]))
        asyncio.run(project_all(db_url))
        start += step
    live = snapshot(db_url)
    assert live["chat_threads"] and live["chat_messages"]
    assert asyncio.run(verify(db_url)).identical
    asyncio.run(rebuild(db_url, batch_size=29))
    assert snapshot(db_url) == live


def chat_views(url: str) -> dict[str, list[dict[str, Any]]]:
    """The chat views as a user reads them, but for the ledger position, which is the
    arrival order's by nature."""
    with psycopg.connect(url, row_factory=dict_row) as conn:
        threads = conn.execute("SELECT * FROM hookledger.chat_threads "
                               "ORDER BY phone_number_id, contact_wa_id").fetchall()
        messages = conn.execute("SELECT * FROM hookledger.chat_messages "
                                "ORDER BY message_id").fetchall()
    for row in messages:
        del row["last_position"]
    return {"chat_threads": threads, "chat_messages": messages}


async def arrive_and_fold(url: str, events: list[NewEvent], rng: random.Random) -> None:
    """Append ``events`` in that order a few at a time, folding live after each few."""
    async with AsyncConnectionPool(url, kwargs={"autocommit": True}) as pool, \
            await connect(url) as conn:
        store = LedgerStore(pool)
        start = 0
        while start < len(events):
            step = rng.randint(1, 9)
            await store.append(events[start:start + step])
            while await project_batch(conn, batch_size=37):
                pass
            start += step


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), rng=st.randoms(use_true_random=False))
def test_chat_views_folded_live_do_not_depend_on_the_order_deliveries_arrived_in(
        pg_admin_url: str, template_database: str, seed: int, rng: random.Random) -> None:
    """The same chat deliveries arriving in two orders, each folded live batch by batch
    (rows read back from the database between batches), show the same threads and
    messages: what one fold of the whole ledger gives is the same whatever the order."""
    events = chat_deliveries(random.Random(seed), n_messages=24)
    seen = []
    for order in (events, rng.sample(events, len(events))):
        name = unique_name("hookledger_test")
        url = create_database(pg_admin_url, name, template=template_database)
        try:
            asyncio.run(arrive_and_fold(url, order, rng))
            seen.append(chat_views(url))
        finally:
            drop_database(pg_admin_url, name)
    assert seen[0]["chat_threads"] and seen[0]["chat_messages"]
    assert seen[0] == seen[1]


def test_a_new_subjects_row_is_copied_in_a_known_one_updated_and_neither_ever_doubled(
        db_url: str) -> None:
    """The live projector copies the row of a subject new to a projection straight into
    the table, and upserts the others (``store_changed``). A row taken for new when one is
    already there fails the write on its key: it never becomes a second row."""
    asyncio.run(append_all(db_url, [
        new_event("payment.confirmed", 91000, reference="FRESH-1", amount=700)]))
    asyncio.run(project_all(db_url))  # new: copied in
    asyncio.run(append_all(db_url, [
        new_event("payment.refunded", 91010, reference="FRESH-1",
                  timestamp="20261122090000")]))
    asyncio.run(project_all(db_url))  # known: upserted, or the copy would fail here

    def stored_rows() -> list[tuple[Any, ...]]:
        with psycopg.connect(db_url) as conn:
            return conn.execute("SELECT outcome, event_count FROM hookledger_private.payments "
                                "WHERE reference = 'FRESH-1'").fetchall()

    assert stored_rows() == [("refunded", 2)]

    async def write_it_again_as_new() -> None:
        async with await connect(db_url) as conn:
            async with conn.cursor(row_factory=dict_row) as cur:
                await cur.execute("SELECT * FROM hookledger_private.payments")
                row = await cur.fetchone()
            assert row is not None
            with pytest.raises(psycopg.errors.UniqueViolation):
                async with conn.transaction():
                    await store_changed(conn, PRIVATE_SCHEMA, PROJECTIONS_BY_TABLE["payments"],
                                        {"FRESH-1": row}, known={})

    asyncio.run(write_it_again_as_new())
    assert stored_rows() == [("refunded", 2)]


def test_a_rebuild_that_spills_rows_and_reads_them_back_still_equals_live(db_url: str) -> None:
    events = mixed_events(150, seed=11)
    asyncio.run(append_all(db_url, events))
    asyncio.run(project_all(db_url))
    live = snapshot(db_url)
    # A few rows in memory and small batches: most rows are written out early, and many
    # are read back and upserted when a later event touches them again.
    assert asyncio.run(verify(db_url, batch_size=7, buffer_rows=3)).identical
    asyncio.run(rebuild(db_url, batch_size=7, buffer_rows=3))
    assert snapshot(db_url) == live
    assert applied_counts(db_url) == expected_applications(events)


def test_a_rebuild_holding_its_rows_in_memory_outlasts_the_idle_in_transaction_bound(
        db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rebuild's writing connection may send nothing for minutes while its buffer fills;
    the server ends a session idle that long in a transaction, which failed the rebuild.
    It speaks to the server after every batch, so only a connection that went quiet ends."""
    import projections.projector as projector_module

    real_bound = projector_module.end_if_idle_in_transaction
    real_fold = projector_module.fold_touched

    async def short_bound(conn: Any, seconds: float = 0.0) -> None:
        await real_bound(conn, 0.4)

    def slow_fold(*args: Any, **kwargs: Any) -> Any:
        time.sleep(0.02)
        return real_fold(*args, **kwargs)

    events = mixed_events(120, seed=5)
    asyncio.run(append_all(db_url, events))
    asyncio.run(project_all(db_url))
    live = snapshot(db_url)
    monkeypatch.setattr(projector_module, "end_if_idle_in_transaction", short_bound)
    monkeypatch.setattr(projector_module, "fold_touched", slow_fold)
    started = time.monotonic()
    asyncio.run(rebuild(db_url, batch_size=5))  # the buffer holds every row until the end
    assert time.monotonic() - started > 1.0  # far longer than the bound
    assert snapshot(db_url) == live
    assert applied_counts(db_url) == expected_applications(events)


def test_verify_names_a_row_that_differs_from_a_rebuild(db_url: str) -> None:
    asyncio.run(append_all(db_url, mixed_events(20)))
    asyncio.run(project_all(db_url))
    with psycopg.connect(db_url, autocommit=True) as conn:
        victim = conn.execute("SELECT reference FROM hookledger_private.payments LIMIT 1"
                              ).fetchone()[0]  # type: ignore[index]
        conn.execute("UPDATE hookledger_private.payments SET amount = amount + 1 "
                     "WHERE reference = %s", (victim,))
    result = asyncio.run(verify(db_url))
    assert [(d.table, d.key, d.kind) for d in result.differences] == [
        ("payments", victim, "differs")]
    with psycopg.connect(db_url) as conn:  # verify touched nothing live
        assert conn.execute("SELECT count(*) FROM hookledger_private.payments WHERE "
                            "reference = %s", (victim,)).fetchone() == (1,)


class PowerCut(BaseException):
    """The process stops mid-batch (not a fold's error, which is reported and skipped)."""


def test_a_crash_mid_batch_applies_nothing_and_a_restart_catches_up(db_url: str) -> None:
    events = mixed_events(60, seed=3)
    asyncio.run(append_all(db_url, events))

    def exploding(p: Projection, after: int) -> Projection:
        calls = {"n": 0}

        def fold(row: Any, event: Any) -> Any:
            calls["n"] += 1
            if calls["n"] > after:
                raise PowerCut("power cut")
            return p.fold(row, event)
        return dataclasses.replace(p, fold=fold)

    async def crash_then_resume() -> None:
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
            await project_batch(conn, batch_size=25)  # one clean batch first
            before = snapshot(db_url)
            broken = [exploding(p, after=5) for p in PROJECTIONS]
            with pytest.raises(PowerCut, match="power cut"):
                await project_batch(conn, batch_size=25, projections=broken)
            assert snapshot(db_url) == before  # nothing of the broken batch remains
        await project_all(db_url)

    asyncio.run(crash_then_resume())
    assert applied_counts(db_url) == expected_applications(events)
    assert asyncio.run(verify(db_url)).identical


def test_a_batch_of_some_projections_moves_only_their_checkpoints(db_url: str) -> None:
    """Folded into some projections only, a batch moved every projection's checkpoint: the
    others then skipped its events for good."""
    from projections.projector import checkpoints

    events = mixed_events(30, seed=4)
    asyncio.run(append_all(db_url, events))
    first, *rest = PROJECTIONS

    async def some_then_all() -> dict[str, int]:
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
            await project_batch(conn, batch_size=10_000, projections=[first])
            moved = await checkpoints(conn)
        await project_all(db_url)
        return moved

    moved = asyncio.run(some_then_all())
    assert moved[first.table] > 0 and all(moved[p.table] == 0 for p in rest)
    assert applied_counts(db_url) == expected_applications(events)
    assert asyncio.run(verify(db_url)).identical


@pytest.mark.slow
def test_kill_9_of_the_projector_process_never_skips_or_doubles_an_event(db_url: str) -> None:
    events = mixed_events(400, seed=11)
    asyncio.run(append_all(db_url, events))
    rng = random.Random(5)
    for _ in range(5):
        victim = subprocess.Popen([sys.executable, str(ROOT / "tests" / "projector_run.py"),
                                   db_url, "13"], cwd=ROOT)
        time.sleep(rng.uniform(0.3, 0.9))
        victim.kill()
        victim.wait()
    asyncio.run(project_all(db_url))
    assert applied_counts(db_url) == expected_applications(events)
    assert asyncio.run(verify(db_url)).identical


def test_two_projectors_on_one_database_apply_each_event_once(db_url: str) -> None:
    events = mixed_events(200, seed=2)

    async def race() -> None:
        feeder = asyncio.create_task(append_all(db_url, events, chunk=7))
        projectors = [LiveProjector(db_url, batch_size=11, poll_s=0.05, standby_retry_s=0.05)
                      for _ in range(2)]
        tasks = [asyncio.create_task(p.run()) for p in projectors]
        await feeder
        deadline = time.monotonic() + 20
        while applied_counts(db_url) < expected_applications(events):
            assert time.monotonic() < deadline, "projectors did not catch up"
            await asyncio.sleep(0.05)
        assert sum(p.is_leader for p in projectors) == 1
        leader = next(p for p in projectors if p.is_leader)
        leader.stop()  # the standby takes over when the leader goes
        await asyncio.sleep(0.5)
        for p in projectors:
            p.stop()
        await asyncio.gather(*tasks)
        assert leader.applied >= 1

    asyncio.run(race())
    assert applied_counts(db_url) == expected_applications(events)

    async def racing_batches() -> None:  # no leader election at all: still exactly once
        await append_all(db_url, mixed_events(100, seed=99, prefix='second-'))

        async def worker() -> None:
            async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
                while await project_batch(conn, batch_size=9):
                    pass
        await asyncio.gather(worker(), worker(), worker())

    asyncio.run(racing_batches())
    all_events = events + mixed_events(100, seed=99, prefix='second-')
    assert applied_counts(db_url) == expected_applications(all_events)
    assert asyncio.run(verify(db_url)).identical


async def waiting_for_a_lock(url: str, projector: LiveProjector) -> None:
    """Return once the projector's session waits for a lock in PostgreSQL."""
    deadline = time.monotonic() + 10
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        while True:
            cur = await conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
                "AND wait_event_type = 'Lock'", (projector.name,))
            if (await cur.fetchone()) == (1,):
                return
            assert time.monotonic() < deadline, "the projector never waited for the lock"
            await asyncio.sleep(0.01)


def test_a_stop_asked_before_the_projector_threads_loop_exists_is_not_lost(
        db_url: str) -> None:
    """SIGTERM while ``serve`` starts its projector thread: ``stop`` found no loop to call
    into yet, so the thread projected on and the stop waited out its whole timeout (30 s).
    Asked before the loop exists (here: before the thread starts), the stop now ends the
    thread as soon as its loop is there, having folded nothing."""
    asyncio.run(append_all(db_url, mixed_events(5, seed=12)))
    thread = ProjectorThread(LiveProjector(db_url, poll_s=0.05))
    thread.stop(timeout=0)
    thread.start()
    try:
        deadline = time.monotonic() + 5
        while thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not thread.is_alive(), "the projector thread went on after the stop"
        assert applied_counts(db_url) == 0 and thread.projector.applied == 0
    finally:
        thread.stop(timeout=10)  # a failing run must not leave it holding the database


def test_a_projector_thread_stopped_mid_catch_up_ends_at_a_batch_and_its_successor_resumes(
        db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``serve`` stopping while its projector thread works through a backlog: the thread
    ends promptly, every batch it counted is committed with the checkpoint past it and no
    half batch is seen, and the next projector folds the rest, each event exactly once."""
    real_batch = project_batch

    async def unhurried_batch(*args: Any, **kwargs: Any) -> int:
        """The real batch, then a pause: the backlog lasts seconds rather than the fraction
        of one a fast machine needs, so the stop always lands in the middle of it."""
        applied = await real_batch(*args, **kwargs)
        await asyncio.sleep(0.05)
        return applied

    monkeypatch.setattr("projections.live.project_batch", unhurried_batch)
    events = mixed_events(600, seed=21)
    asyncio.run(append_all(db_url, events, chunk=200))
    with psycopg.connect(db_url) as conn:
        positions = [position for (position,) in conn.execute(
            "SELECT position FROM hookledger_private.ledger_events ORDER BY position")]
    ledger_end = positions[-1]

    def stored_checkpoint() -> int:
        return asyncio.run(_checkpoint_of(db_url))

    thread = ProjectorThread(LiveProjector(db_url, batch_size=20, poll_s=0.05))
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while thread.projector.applied < 100:  # several batches in, far from the end
            assert time.monotonic() < deadline, "the projector thread never got going"
            time.sleep(0.005)
        began = time.monotonic()
        thread.stop(timeout=10)
        assert not thread.is_alive(), "the projector thread went on after the stop"
        assert time.monotonic() - began < 5
    finally:
        thread.stop(timeout=10)
    applied = thread.projector.applied
    stopped_at = stored_checkpoint()
    assert applied % 20 == 0 and 100 <= applied < len(events), applied
    assert stopped_at < ledger_end  # stopped with a backlog left
    assert stopped_at == positions[applied - 1]  # exactly the batches it counted

    successor = ProjectorThread(LiveProjector(db_url, batch_size=20, poll_s=0.05))
    successor.start()
    try:
        deadline = time.monotonic() + 30
        while stored_checkpoint() < ledger_end:
            assert time.monotonic() < deadline, "the successor never caught up"
            time.sleep(0.02)
    finally:
        successor.stop(timeout=10)
    assert applied + successor.projector.applied == len(events)
    assert applied_counts(db_url) == expected_applications(events)
    assert asyncio.run(verify(db_url)).identical


async def _checkpoint_of(url: str) -> int:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        return await checkpoint(conn)


async def holds_leadership(url: str, projector: LiveProjector) -> bool:
    """Whether PostgreSQL says the projector's session holds the projector lock."""
    sql, params = leader_query(projector.name)
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute(sql, params)
        return bool((await cur.fetchone() or (False,))[0])


def test_a_leader_waiting_behind_a_rebuilds_lock_keeps_leading_and_stops_when_asked(
        db_url: str) -> None:
    """A rebuild holds the checkpoint rows for its whole run. The leader waits behind it
    in bounded steps: it keeps the projector lock throughout (so no standby takes over),
    folds everything once the rows are free, and a stop asked for while it waits ends it
    within about one step, not when the rebuild commits."""
    events = mixed_events(30, seed=5)
    asyncio.run(append_all(db_url, events))

    async def held_up_then_goes_on() -> None:
        projector = LiveProjector(db_url, poll_s=0.05, standby_retry_s=0.05)
        async with await psycopg.AsyncConnection.connect(db_url) as rebuild_like:
            await lock_checkpoint(rebuild_like)  # held until this transaction ends
            task = asyncio.create_task(projector.run())
            await waiting_for_a_lock(db_url, projector)
            held_until = time.monotonic() + 2.5 * LOCK_WAIT_S  # several timed-out waits
            while time.monotonic() < held_until:
                assert await holds_leadership(db_url, projector), "leadership was dropped"
                await asyncio.sleep(0.05)
            assert applied_counts(db_url) == 0
            await rebuild_like.rollback()
        deadline = time.monotonic() + 10
        while applied_counts(db_url) < expected_applications(events):
            assert time.monotonic() < deadline, "the projector did not go on"
            await asyncio.sleep(0.05)
        projector.stop()
        await asyncio.wait_for(task, timeout=5)
        assert projector.applied == len(events)

    async def stop_while_waiting() -> None:
        await append_all(db_url, mixed_events(5, seed=6, prefix="held-"))
        projector = LiveProjector(db_url, poll_s=0.05, standby_retry_s=0.05)
        async with await psycopg.AsyncConnection.connect(db_url) as rebuild_like:
            await lock_checkpoint(rebuild_like)
            task = asyncio.create_task(projector.run())
            await waiting_for_a_lock(db_url, projector)
            asked = time.monotonic()
            projector.stop()
            await asyncio.wait_for(task, timeout=LOCK_WAIT_S + 2)  # the rows are still held
            stopped_after = time.monotonic() - asked
            assert projector.applied == 0
            await rebuild_like.rollback()
        assert stopped_after <= LOCK_WAIT_S + 1

    asyncio.run(held_up_then_goes_on())
    asyncio.run(stop_while_waiting())
    assert applied_counts(db_url) == expected_applications(events)  # the later 5: not folded


def test_discrepancies_found_while_projecting_become_ledger_events_once(db_url: str) -> None:
    block = {"invoiceNo": "INV-X", "total": 900, "currency": "TZS"}
    events = [
        new_event("payment.confirmed", 91000, reference="C1", amount=700),
        new_event("payment.failed", 91055, reference="C1", amount=0, timestamp="20261122090000"),
        new_event("invoice.paid", 93002, reference="INV-X", amount=900,
                  invoice={**block, "amountPaid": 800, "amountDue": 100}),
    ]
    asyncio.run(append_all(db_url, events))
    asyncio.run(project_all(db_url))
    asyncio.run(rebuild(db_url))  # finds them again: the dedupe key keeps them single
    with psycopg.connect(db_url) as conn:
        found = conn.execute(
            "SELECT source, event_type, payload->>'kind', payload->>'reference', "
            "payload->>'amount_at_risk' FROM hookledger.ledger WHERE source = 'projector' "
            "ORDER BY position").fetchall()
        settled = conn.execute("SELECT settled, status FROM hookledger.invoices").fetchone()
    assert found == [
        ("projector", "discrepancy.detected", "conflicting_events", "C1", "700"),
        ("projector", "discrepancy.detected", "unsettled_paid_invoice", "INV-X", "100")]
    assert settled == (False, "partially_paid")
    assert Counter(k for _, _, k, _, _ in found) == {"conflicting_events": 1,
                                                     "unsettled_paid_invoice": 1}


def test_an_event_no_fold_can_apply_is_reported_and_the_projector_goes_on(db_url: str) -> None:
    """A fold that raises leaves that one event out of that projection, records an
    ``unprojectable_event`` discrepancy in the ledger, and every other event still lands."""
    payments = next(p for p in PROJECTIONS if p.table == "payments")

    def brittle(row: Any, event: Any) -> Any:
        if event.facts["reference"] == "BAD":
            raise KeyError("a field no rule foresaw")
        return payments.fold(row, event)

    events = [new_event("payment.confirmed", 91000, reference=ref, amount=100)
              for ref in ("A", "BAD", "C")]
    asyncio.run(append_all(db_url, events))
    projections = [dataclasses.replace(payments, fold=brittle)]

    async def project() -> None:
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
            while await project_batch(conn, batch_size=2, projections=projections):
                pass

    asyncio.run(project())
    with psycopg.connect(db_url) as conn:
        refs = [r for (r,) in conn.execute(
            "SELECT reference FROM hookledger.payments ORDER BY 1").fetchall()]
        head = conn.execute("SELECT max(position) FROM hookledger.ledger "
                            "WHERE source = 'general'").fetchone()
        checkpoint = conn.execute("SELECT position FROM hookledger_private."
                                  "projection_checkpoints WHERE name = 'payments'").fetchone()
    assert refs == ["A", "C"]
    assert head is not None and checkpoint is not None and checkpoint[0] >= head[0]
    with psycopg.connect(db_url) as conn:
        kinds = conn.execute("SELECT payload->>'kind', payload->>'subject', "
                             "payload->>'reference' FROM hookledger.ledger "
                             "WHERE source = 'projector'").fetchall()
    assert kinds == [("unprojectable_event", "payments", "BAD")]


def test_an_event_whose_keys_cannot_be_read_is_reported_not_raised() -> None:
    from projections.projector import touched_keys
    from tests.projection_events import stored

    payments = next(p for p in PROJECTIONS if p.table == "payments")

    def keys(event: Any) -> list[str]:
        if event.facts["reference"] == "BAD":
            raise KeyError("reference")
        return payments.keys(event)

    events = [stored(new_event("payment.confirmed", 91000, reference=r)) for r in ("A", "BAD")]
    touched, findings = touched_keys(dataclasses.replace(payments, keys=keys), events)
    assert [key for key, _ in touched] == ["A"]
    assert [(f.discrepancy.kind, f.discrepancy.reference, f.cause.position)
            for f in findings] == [("unprojectable_event", "?", events[1].position)]


def test_running_out_of_memory_while_folding_is_not_taken_for_a_bad_event() -> None:
    """MemoryError propagates (the batch rolls back and is retried); it never becomes an
    unprojectable_event that a rebuild, with memory to spare, would not find."""
    from projections.projector import fold_touched
    from tests.projection_events import stored

    payments = next(p for p in PROJECTIONS if p.table == "payments")

    def starved(row: Any, event: Any) -> Any:
        raise MemoryError

    event = stored(new_event("payment.confirmed", 91000, reference="M"))
    with pytest.raises(MemoryError):
        fold_touched(dataclasses.replace(payments, fold=starved), [("M", event)], {})


def _provider_verdict_events(reference: str, code: int) -> list[NewEvent]:
    """What a reconciliation pass appends for a provider record carrying ``code``: the
    check itself (the record and the envelope's code, kept as given) and the mismatch."""
    from datetime import UTC, datetime, timedelta
    from decimal import Decimal

    from reconcile.checks import Local, decide
    from reconcile.client import Lookup
    from reconcile.findings import checked_event, detected_event
    from reconcile.records import ProviderRecord

    now = datetime.now(UTC)
    record = ProviderRecord(reference=reference, status="FAILED", amount=Decimal(100),
                            event="payment.failed", code=code, transaction_id=None,
                            customer_reference=None, service=None, timestamp=None)
    lookup = Lookup(reference, "found", record=record, api_code=code)
    local = Local("collection", reference, outcome="success", status="SUCCESSFUL",
                  amount=Decimal(100), since=now - timedelta(hours=1))
    verdict = decide(local, lookup, now=now, window=timedelta(seconds=90))
    assert [d.kind for d in verdict.detect] == ["status_mismatch"]
    return [checked_event("collection", lookup, verdict.result, "p1", now),
            *(detected_event("collection", reference, d, "p1", "p1", now)
              for d in verdict.detect)]


def test_a_provider_code_of_any_size_in_the_ledger_never_stops_the_live_projector(
        db_url: str) -> None:
    """Reconciliation keeps the provider's code as given; one past a double's range (which
    orjson will not read) or past 64 bits (which it will not write) is read and stored
    exactly, the batch commits, and the events after it still land, live and rebuilt."""
    code = 10**400 + 55  # the failure band
    events = [new_event("payment.confirmed", 91000, reference="HUGE", amount=100),
              *_provider_verdict_events("HUGE", code),
              new_event("payment.confirmed", 91000, reference="AFTER", amount=100)]
    asyncio.run(append_all(db_url, events))

    async def project() -> None:
        async with await connect(db_url) as conn:  # the live projector's connection
            while await project_batch(conn, batch_size=3):
                pass

    asyncio.run(project())
    with psycopg.connect(db_url) as conn:
        refs = [r for (r,) in conn.execute(
            "SELECT reference FROM hookledger.payments ORDER BY 1").fetchall()]
        kept = conn.execute("SELECT kind, facts->>'provider_code' FROM "
                            "hookledger_private.discrepancies").fetchall()
    assert refs == ["AFTER", "HUGE"]
    assert kept == [("status_mismatch", str(code))]
    assert asyncio.run(verify(db_url)).identical
    before = snapshot(db_url)
    asyncio.run(rebuild(db_url))
    assert snapshot(db_url) == before


def test_an_event_whose_row_its_table_cannot_hold_is_left_out_and_the_projector_goes_on(
        db_url: str) -> None:
    """A recovered provider state whose code is past ``integer`` (which the binary COPY
    stored wrapped round) is left out of that projection like an event no fold can apply,
    reported as ``unprojectable_event``, and live still equals a rebuild."""
    from datetime import UTC, datetime
    from decimal import Decimal

    from reconcile.findings import recovered_event
    from reconcile.records import ProviderRecord
    from tests.projection_events import EAT

    record = ProviderRecord(reference="BIG", status="FAILED", amount=Decimal(100),
                            event="payment.failed", code=9_100_000_055, transaction_id=None,
                            customer_reference=None, service=None, timestamp=None)
    events = [new_event("payment.confirmed", 91000, reference="A", amount=100),
              recovered_event("collection", record, "p1", datetime.now(UTC), EAT),
              new_event("payment.confirmed", 91000, reference="C", amount=100)]
    asyncio.run(append_all(db_url, events))
    asyncio.run(project_all(db_url))
    with psycopg.connect(db_url) as conn:
        refs = [r for (r,) in conn.execute(
            "SELECT reference FROM hookledger.payments ORDER BY 1").fetchall()]
        kinds = conn.execute("SELECT payload->>'kind', payload->>'subject', "
                             "payload->>'reference' FROM hookledger.ledger "
                             "WHERE source = 'projector'").fetchall()
    assert refs == ["A", "C"]
    assert kinds == [("unprojectable_event", "payments", "BIG")]
    assert asyncio.run(verify(db_url)).identical
    before = snapshot(db_url)
    asyncio.run(rebuild(db_url))
    assert snapshot(db_url) == before


async def folded(url: str, reference: str) -> bool:
    """Whether the payments view has a row for ``reference`` yet."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute("SELECT 1 FROM hookledger.payments WHERE reference = %s",
                                 (reference,))
        return await cur.fetchone() is not None


def test_a_leader_cut_off_while_its_session_lingers_is_replaced_within_seconds(
        db_url: str) -> None:
    """A network blip: the leader's connection goes, but the server keeps its session (and
    with it the projector lock) idle. The server ends that session, so a projector leads
    again and new events are folded within seconds, not when the kernel gives up on it."""
    relay = SocketRelay(db_url)
    cut_off = LiveProjector(relay.url, poll_s=0.2, standby_retry_s=0.2)
    standby = LiveProjector(db_url, poll_s=0.2, standby_retry_s=0.2)

    async def run() -> float | None:
        tasks = [asyncio.create_task(cut_off.run())]
        try:
            deadline = time.monotonic() + 10
            while not cut_off.is_leader:
                assert time.monotonic() < deadline, "the first projector never led"
                await asyncio.sleep(0.05)
            tasks.append(asyncio.create_task(standby.run()))
            await asyncio.sleep(0.6)
            assert not standby.is_leader
            relay.cut_clients()
            await append_all(db_url, [new_event("payment.confirmed", 91000,
                                                reference="AFTER-BLIP", amount=100)])
            cut_at = time.monotonic()
            while time.monotonic() - cut_at < 30:
                if await folded(db_url, "AFTER-BLIP"):
                    return time.monotonic() - cut_at
                await asyncio.sleep(0.2)
            return None
        finally:
            cut_off.stop()
            standby.stop()
            await asyncio.wait_for(asyncio.gather(*tasks), timeout=10)

    try:
        took = asyncio.run(run())
    finally:
        relay.close()
    assert took is not None, "no projector led again while the old session lingered"
    assert took < 15


def _seconds_to_lead_again(db_url: str, monkeypatch: pytest.MonkeyPatch, held: str,
                           reference: str) -> float | None:
    """Seconds from cutting a leader's connection, its thread held inside
    ``projections.projector.<held>`` while folding a delivery of ``reference``, until a
    standby has folded it; None when none has within 30 s."""
    import threading

    from projections import projector as projector_module

    real = getattr(projector_module, held)
    inside = threading.Event()
    release = threading.Event()
    hold = threading.Event()

    def held_once(*args: Any, **kwargs: Any) -> Any:
        """The leader's thread stops here once ``hold`` is set, until the test has cut its
        connection."""
        if hold.is_set() and threading.current_thread().name == "hookledger-projector":
            hold.clear()
            inside.set()
            release.wait(timeout=30)
        return real(*args, **kwargs)

    monkeypatch.setattr(projector_module, held, held_once)
    relay = SocketRelay(db_url)
    cut_off = ProjectorThread(LiveProjector(relay.url, poll_s=0.2, standby_retry_s=0.2))
    standby = LiveProjector(db_url, poll_s=0.2, standby_retry_s=0.2)

    async def run() -> float | None:
        deadline = time.monotonic() + 10
        while not cut_off.projector.is_leader:
            assert time.monotonic() < deadline, "the first projector never led"
            await asyncio.sleep(0.05)
        task = asyncio.create_task(standby.run())
        try:
            hold.set()
            await append_all(db_url, [new_event("payment.confirmed", 91000,
                                                reference=reference, amount=100)])
            assert await asyncio.to_thread(inside.wait, 10), f"the leader never reached {held}"
            relay.cut_clients()
            release.set()
            cut_at = time.monotonic()
            while time.monotonic() - cut_at < 30:
                if await folded(db_url, reference):
                    return time.monotonic() - cut_at
                await asyncio.sleep(0.2)
            return None
        finally:
            standby.stop()
            await asyncio.wait_for(task, timeout=10)

    cut_off.start()
    try:
        return asyncio.run(run())
    finally:
        release.set()
        cut_off.stop(timeout=10)
        relay.close()


def test_a_leader_cut_off_in_the_middle_of_a_batch_is_replaced_within_seconds(
        db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The blip lands inside a batch's transaction: the server keeps the session idle in
    that transaction, holding the projector lock and the checkpoint rows (and, in a batch
    that appends discrepancies, the ledger's append lock, which stops every append).
    ``idle_session_timeout`` does not end a session inside a transaction, so nothing was
    projected again until the kernel gave up on the socket; now the server ends it within
    seconds and the standby leads and folds."""
    took = _seconds_to_lead_again(db_url, monkeypatch, "fold_touched", "IN-THE-BATCH")
    assert took is not None, "no projector led again while the old session sat in its batch"
    assert took < 15


def test_a_leader_cut_off_in_the_middle_of_its_copy_is_replaced_within_seconds(
        db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The blip lands while the batch's rows are being copied in (held as the first row's
    ``Jsonb`` is made: the statement sent, the server waiting for the rows): its session is
    *active* (``ClientRead``) rather than idle, so no idle bound ends it and it does not act
    on a ``statement_timeout`` while it waits. It kept the projector lock and the checkpoint
    rows, and no projector led again until the kernel gave up on the socket (never, behind
    this relay); now a standby ends that session once it has waited on its client longer
    than a batch may, and leads."""
    took = _seconds_to_lead_again(db_url, monkeypatch, "Jsonb", "IN-THE-COPY")
    assert took is not None, "no projector led again while the old session sat in its copy"
    assert took < 15
    assert applied_counts(db_url) == 1  # the stranded batch rolled back: folded once


def test_a_refund_the_invoice_never_heard_of_shows_as_an_open_discrepancy_on_it(
        db_url: str) -> None:
    """End to end: the part payment settles the invoice, the refund carries no block; the
    invoice still says settled, and the discrepancies view says why not to trust it, once,
    also after a rebuild."""
    block = {"invoiceNo": "INV-R", "total": 900, "amountPaid": 900, "amountDue": 0,
             "currency": "TZS"}
    asyncio.run(append_all(db_url, [
        new_event("invoice.created", 93000, reference="INV-R", amount=900,
                  service="Invoicing", timestamp="20261122080000",
                  invoice={**block, "amountPaid": 0, "amountDue": 900}),
        new_event("payment.confirmed", 91000, reference="PAY-R", amount=900,
                  timestamp="20261122081000", invoice=block),
        new_event("payment.refunded", 91010, reference="PAY-R", amount=900,
                  status="REVERSED", timestamp="20261122100000")]))
    asyncio.run(project_all(db_url))
    query = ("SELECT kind, subject, reference, amount_at_risk, status "
             "FROM hookledger.discrepancies WHERE kind = 'refunded_invoice_payment'")
    with psycopg.connect(db_url) as conn:
        assert conn.execute(query).fetchall() == [
            ("refunded_invoice_payment", "invoice", "INV-R", 900, "open")]
        assert conn.execute("SELECT settled FROM hookledger.invoices").fetchall() == [(True,)]
    asyncio.run(rebuild(db_url))
    with psycopg.connect(db_url) as conn:
        assert len(conn.execute(query).fetchall()) == 1


def test_a_repeated_invoice_created_leaves_a_paid_invoice_paid_live_and_rebuilt(
        db_url: str) -> None:
    """End to end: the same ``invoice.created`` sent again stamped after ``invoice.paid`` is
    a second ledger event; the live projector and a rebuild both keep the invoice paid."""
    block = {"invoiceNo": "INV-C", "total": 1000, "currency": "TZS"}
    created = new_event("invoice.created", 93000, reference="INV-C", amount=1000,
                        service="Invoicing", timestamp="20261122080000",
                        invoice={**block, "amountPaid": 0, "amountDue": 1000})
    paid = new_event("invoice.paid", 93002, reference="INV-C", amount=1000,
                     service="Invoicing", timestamp="20261122081000",
                     invoice={**block, "amountPaid": 1000, "amountDue": 0})
    asyncio.run(append_all(db_url, [created, paid, restamped(created, "20261122082000")]))
    asyncio.run(project_all(db_url))
    query = ("SELECT status, amount_paid, amount_due, settled, last_event, event_count "
             "FROM hookledger.invoices")
    expected = [("paid", 1000, 0, True, "invoice.paid", 3)]
    with psycopg.connect(db_url) as conn:
        assert conn.execute(query).fetchall() == expected
    live = snapshot(db_url)
    assert asyncio.run(verify(db_url)).identical
    asyncio.run(rebuild(db_url))
    assert snapshot(db_url) == live


async def project_as_older_code(url: str, known: Sequence[Projection]) -> None:
    """What an older ``serve`` does after a newer one migrated: it folds and moves the
    checkpoints of the projections it knows, from the lowest of those, and no others."""
    names = [p.table for p in known]
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        while True:
            async with conn.transaction():
                cur = await conn.execute(
                    "SELECT min(position) FROM (SELECT position FROM hookledger_private."
                    "projection_checkpoints WHERE name = ANY(%s) ORDER BY name FOR UPDATE) "
                    "AS locked", (names,))
                row = await cur.fetchone()
                events = await read_in(conn, int(row[0]) if row and row[0] else 0, 37,
                                       facts_only=True)
                if not events:
                    return
                await apply_events(conn, events, projections=known)
                await conn.execute(
                    "UPDATE hookledger_private.projection_checkpoints SET position = %s "
                    "WHERE name = ANY(%s)", (events[-1].position, names))


@pytest.mark.parametrize("lagging", ["discrepancies", "payments"])
def test_checkpoints_left_apart_by_an_older_projector_fold_each_event_once(
        db_url: str, lagging: str) -> None:
    """A rolling upgrade: the older code, still leading, moves the checkpoints of the
    projections it knows and never the new one's. The batch read from the lowest
    checkpoint then reached projections already past it, and folded those events a second
    time (event counts doubled, rows that a rebuild calls different). Each projection now
    folds only what is past its own checkpoint, and none is moved back."""
    first = mixed_events(40, seed=3, prefix="a")
    asyncio.run(append_all(db_url, first))
    asyncio.run(project_all(db_url))
    behind = asyncio.run(_checkpoint_of(db_url))
    later = mixed_events(40, seed=4, prefix="b")
    asyncio.run(append_all(db_url, later))
    older = [p for p in PROJECTIONS if p.table != lagging]
    asyncio.run(project_as_older_code(db_url, older))
    assert asyncio.run(_checkpoint_of(db_url)) == behind  # the lagging one held it back
    asyncio.run(project_all(db_url))
    assert applied_counts(db_url) == expected_applications(first + later)
    assert asyncio.run(verify(db_url)).identical
    with psycopg.connect(db_url) as conn:
        positions = {name: position for name, position in conn.execute(
            "SELECT name, position FROM hookledger_private.projection_checkpoints")}
    head = max(positions.values())
    assert set(positions.values()) == {head} and head > behind


@pytest.mark.parametrize("lagging", ["discrepancies", "payments"])
def test_verify_while_an_older_projector_leaves_the_checkpoints_apart(
        db_url: str, lagging: str) -> None:
    """During a rolling upgrade the projections an older leader knows are folded further
    than the one it does not. verify replayed every projection to the lowest checkpoint
    and called each row the others had folded since ``differs`` (exit 1) while the live
    tables were right; each projection is now replayed to its own checkpoint."""
    asyncio.run(append_all(db_url, mixed_events(40, seed=5, prefix="a")))
    asyncio.run(project_all(db_url))
    asyncio.run(append_all(db_url, mixed_events(40, seed=6, prefix="b")))
    asyncio.run(project_as_older_code(db_url, [p for p in PROJECTIONS if p.table != lagging]))
    with psycopg.connect(db_url) as conn:
        positions = dict(conn.execute(
            "SELECT name, position FROM hookledger_private.projection_checkpoints").fetchall())
    assert positions[lagging] < max(positions.values())  # apart, as the upgrade leaves them
    result = asyncio.run(verify(db_url))
    assert result.identical, result.differences[:5]
    assert result.checkpoint == positions[lagging]  # "verified up to" every projection
    # and a row that really differs is still found while they are apart
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("UPDATE hookledger_private.payments SET amount = amount + 1 "
                     "WHERE reference = (SELECT min(reference) FROM "
                     "hookledger_private.payments)")
    assert [d.table for d in asyncio.run(verify(db_url)).differences] == ["payments"]


def test_rebuilds_while_deliveries_arrive_and_the_leader_projects_skip_and_double_nothing(
        db_url: str) -> None:
    """Rebuilds one after another while deliveries are appended and a leader and a standby
    project them live, with the leader's session ended by the server now and then: at each
    hand-over (the rebuild's checkpoint, the live batch behind it, a standby taking over)
    no event is folded twice or left out, each finding is one ledger event folded once, and
    the views end equal to a fresh rebuild."""
    feeds = [mixed_events(40, seed=k, prefix=f"r{k}-") for k in range(5)]
    conflicts = [e for i in range(20) for e in (
        new_event("payment.confirmed", 91000, reference=f"RC{i}", amount=700),
        new_event("payment.failed", 91055, reference=f"RC{i}", amount=0,
                  timestamp="20261122090000"))]
    everything = [e for feed in feeds for e in feed] + conflicts

    async def caught_up() -> bool:
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
            cur = await conn.execute(
                "SELECT (SELECT min(position) FROM hookledger_private.projection_checkpoints)"
                " >= (SELECT max(position) FROM hookledger_private.ledger_events)")
            return bool((await cur.fetchone())[0])  # type: ignore[index]

    async def race() -> int:
        projectors = [LiveProjector(db_url, batch_size=7, poll_s=0.05, standby_retry_s=0.05)
                      for _ in range(2)]
        tasks = [asyncio.create_task(p.run()) for p in projectors]
        feeder = asyncio.create_task(append_all(db_url, [*conflicts, *(
            e for feed in feeds for e in feed)], chunk=3))
        rebuilds = 0
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as killer:
            while not feeder.done() or rebuilds < 2:
                await rebuild(db_url, batch_size=11, buffer_rows=5)
                rebuilds += 1
                await killer.execute(  # the leader's session, mid-batch or waiting
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE application_name = %s", (projectors[rebuilds % 2].name,))
        await feeder
        deadline = time.monotonic() + 20
        while not await caught_up():
            assert time.monotonic() < deadline, "the projectors did not catch up"
            await asyncio.sleep(0.05)
        for p in projectors:
            p.stop()
        await asyncio.gather(*tasks)
        return rebuilds

    assert asyncio.run(race()) >= 2
    with psycopg.connect(db_url) as conn:
        found = conn.execute("SELECT count(*) FROM hookledger.ledger "
                             "WHERE event_type = 'discrepancy.detected'").fetchone()
        folded = conn.execute("SELECT count(*), sum(event_count) "
                              "FROM hookledger_private.discrepancies").fetchone()
    assert found == (20,) and folded == (20, 20)
    assert applied_counts(db_url) - 20 == expected_applications(everything)
    live = snapshot(db_url)
    assert asyncio.run(verify(db_url)).identical
    asyncio.run(rebuild(db_url))
    assert snapshot(db_url) == live



def test_a_rebuild_folds_up_to_the_head_it_saw_and_leaves_later_events_to_the_projector(
        db_url: str) -> None:
    """Events appended while a rebuild replays (as ingest keeps appending) are not read by
    it: it stops at the ledger's head once the live projector waited, so that steady
    ingest cannot keep the views stopped for ever; the projector folds them after it."""
    before, during = mixed_events(60, seed=3, prefix="b-"), mixed_events(30, seed=4, prefix="d-")
    asyncio.run(append_all(db_url, before))
    with psycopg.connect(db_url) as conn:
        head = conn.execute("SELECT max(position) FROM hookledger.ledger").fetchone()
    appended: list[int] = []

    def progress(_position: int) -> None:
        """Between two of the rebuild's batches, others append (on a loop of their own)."""
        if not appended:
            appended.append(len(during))
            worker = threading.Thread(target=asyncio.run, args=(append_all(db_url, during),))
            worker.start()
            worker.join()

    result = asyncio.run(rebuild(db_url, batch_size=10, progress=progress))
    assert appended and head is not None
    assert (result.events, result.head) == (len(before), head[0])
    with psycopg.connect(db_url) as conn:
        positions = conn.execute("SELECT DISTINCT position FROM "
                                 "hookledger_private.projection_checkpoints").fetchall()
    assert positions == [head]
    asyncio.run(project_all(db_url))
    live = snapshot(db_url)
    asyncio.run(rebuild(db_url))
    assert snapshot(db_url) == live
    assert applied_counts(db_url) == expected_applications([*before, *during])


def test_the_findings_a_rebuild_appends_are_in_the_views_when_it_returns(db_url: str) -> None:
    """An upgrade's rebuild finds what the new rules flag in events folded before (an
    invoice cancelled with money received) and appends those findings; with no projector
    running (serve stopped for the upgrade), ``hookledger report`` right after it left them
    out, and ``rebuild --verify`` checked only up to the head the rebuild had seen."""
    block = {"invoiceNo": "RB-1", "total": 500, "currency": "TZS"}
    asyncio.run(append_all(db_url, [
        new_event("invoice.created", 93000, reference="RB-1", amount=500,
                  invoice={**block, "amountPaid": 0, "amountDue": 500}),
        new_event("invoice.cancelled", 93003, reference="RB-1", amount=500,
                  timestamp="20261122090000",
                  invoice={**block, "amountPaid": 200, "amountDue": 300})]))
    asyncio.run(rebuild(db_url))
    with psycopg.connect(db_url) as conn:
        found = conn.execute("SELECT kind, reference, status FROM hookledger.discrepancies"
                             ).fetchall()
        head = conn.execute("SELECT max(position) FROM hookledger.ledger").fetchone()
    assert found == [("cancelled_invoice_paid", "RB-1", "open")]
    assert asyncio.run(verify(db_url)).checkpoint == (head[0] if head else None)
