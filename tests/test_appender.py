"""Group commit: concurrent callers share batches, and one caller going away harms no one."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest
from psycopg_pool import AsyncConnectionPool

from ingest import appender as appender_module
from ingest.appender import BatchingAppender
from ingest.spool import Spool, read_records
from ingest.spool_drain import SpoolDrainer
from ledger import AppendResult, LedgerError, LedgerStore, LedgerUnavailable, NewEvent
from tests.projection_events import new_event

EVENTS = [new_event("payment.confirmed", 91000, reference=f"G-{i}") for i in range(50)]
KEYS = [e.dedupe_key for e in EVENTS]


async def stored_keys(pool: AsyncConnectionPool) -> list[str]:
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT dedupe_key FROM hookledger_private.ledger_events "
                                 "ORDER BY position")
        return [key for (key,) in await cur.fetchall()]


@pytest.mark.anyio
async def test_concurrent_callers_share_batches_and_each_learns_its_own_position(
        pool: AsyncConnectionPool) -> None:
    appender = BatchingAppender(LedgerStore(pool).append)
    appender.start()
    results = await asyncio.gather(*(appender.append(e) for e in EVENTS),
                                   appender.append(EVENTS[7]))
    await appender.close()
    assert appender.batches < len(EVENTS)  # they queued behind one another's commits
    assert [r.duplicate for r in results] == [False] * len(EVENTS) + [True]
    assert results[-1].position == results[7].position
    positions = [r.position for r in results[:-1]]
    assert positions == sorted(positions)  # the ledger's order is the order of arrival
    assert await stored_keys(pool) == KEYS


@pytest.mark.anyio
async def test_a_caller_that_goes_away_cancels_neither_its_batch_nor_the_appender(
        pool: AsyncConnectionPool) -> None:
    """Its event was received and is committed with the rest; only its answer is lost."""
    appender = BatchingAppender(LedgerStore(pool).append)
    appender.start()
    first = asyncio.create_task(appender.append(EVENTS[0]))
    await asyncio.sleep(0)  # the appender takes event 0 and starts committing it
    callers = [asyncio.create_task(appender.append(e)) for e in EVENTS[1:11]]
    await asyncio.sleep(0)
    callers[4].cancel()  # queued behind event 0's commit
    first.cancel()  # its commit is in flight
    done = await asyncio.gather(first, *callers, return_exceptions=True)
    assert isinstance(done[0], asyncio.CancelledError)
    assert isinstance(done[5], asyncio.CancelledError)
    answered = [r for r in done if not isinstance(r, BaseException)]
    assert len(answered) == 9 and all(not r.duplicate for r in answered)
    later = await appender.append(EVENTS[11])
    await appender.close()
    assert not later.duplicate
    assert await stored_keys(pool) == KEYS[:12]


@pytest.mark.anyio
async def test_a_failure_after_the_commit_neither_loses_the_answer_nor_stops_the_appender(
        pool: AsyncConnectionPool) -> None:
    """A bug beside the commit (here the batch-size metric) is logged; the callers of that
    batch still learn their positions, and the deliveries after it are still appended."""
    sizes: list[int] = []

    def metric_failing_once(size: int) -> None:
        sizes.append(size)
        if len(sizes) == 1:
            raise RuntimeError("a bug in a metric")

    appender = BatchingAppender(LedgerStore(pool).append, on_batch=metric_failing_once)
    appender.start()
    first = await asyncio.wait_for(appender.append(EVENTS[0]), timeout=5)
    later = await asyncio.wait_for(appender.append(EVENTS[1]), timeout=5)
    await appender.close()
    assert first.position and later.position > first.position
    assert sizes == [1, 1]
    assert await stored_keys(pool) == KEYS[:2]


@pytest.mark.anyio
async def test_an_event_the_writer_cannot_encode_fails_alone(pool: AsyncConnectionPool) -> None:
    """A value no JSON encoder takes (a bug upstream, but one event's) sinks neither the
    batch it arrived in nor the appender: the others are appended, and only its caller
    hears of it, as a refusal of that event (which ingest then keeps by its raw bytes)."""
    poison = replace(EVENTS[5], facts={**EVENTS[5].facts, "oops": object()})
    appender = BatchingAppender(LedgerStore(pool).append)
    appender.start()
    first = asyncio.create_task(appender.append(EVENTS[0]))
    await asyncio.sleep(0)  # event 0 is committing; the rest queue into one batch
    rest = [asyncio.create_task(appender.append(e))
            for e in [*EVENTS[1:5], poison, *EVENTS[6:10]]]
    done = await asyncio.gather(first, *rest, return_exceptions=True)
    later = await appender.append(EVENTS[10])
    await appender.close()
    assert appender.events == 10
    assert isinstance(done[5], LedgerError) and not isinstance(done[5], LedgerUnavailable)
    assert "object" in str(done[5])
    answered = [r for i, r in enumerate(done) if i != 5]
    assert all(isinstance(r, AppendResult) and not r.duplicate for r in answered)
    assert not later.duplicate
    assert await stored_keys(pool) == [k for i, k in enumerate(KEYS[:11]) if i != 5]


@pytest.mark.anyio
async def test_a_failure_while_retrying_one_by_one_stops_neither_the_rest_nor_their_answers(
        pool: AsyncConnectionPool) -> None:
    """A batch failing over one bad event is retried event by event. A bug met on the way
    (here the batch-size metric, failing every time) must not leave the later events of
    that batch untried and answered 503: the general system would never resend them."""
    poison = replace(EVENTS[2], facts={**EVENTS[2].facts, "oops": object()})

    def metric_always_failing(size: int) -> None:
        raise RuntimeError("a bug in a metric")

    appender = BatchingAppender(LedgerStore(pool).append, on_batch=metric_always_failing)
    appender.start()
    first = asyncio.create_task(appender.append(EVENTS[0]))
    await asyncio.sleep(0)
    rest = [asyncio.create_task(appender.append(e))
            for e in [EVENTS[1], poison, *EVENTS[3:6]]]
    done = await asyncio.gather(first, *rest, return_exceptions=True)
    await appender.close()
    assert isinstance(done[2], LedgerError) and not isinstance(done[2], LedgerUnavailable)
    assert all(isinstance(r, AppendResult) for i, r in enumerate(done) if i != 2), done
    assert await stored_keys(pool) == [KEYS[0], KEYS[1], *KEYS[3:6]]


@pytest.mark.anyio
async def test_cancelling_the_appender_while_it_retries_one_by_one_answers_every_caller(
        pool: AsyncConnectionPool) -> None:
    """Stopping the process mid-retry must not leave callers waiting for ever: each one not
    answered yet hears that its event was not appended."""
    store = LedgerStore(pool)
    retrying = asyncio.Event()
    held = asyncio.Event()

    async def append_many(events: Sequence[NewEvent]) -> list[AppendResult]:
        if len(events) == 1 and events[0].dedupe_key == KEYS[3]:
            retrying.set()  # the one-by-one retry reached the fourth event
            await held.wait()  # and stays there until the appender is cancelled
        return await store.append(events)

    poison = replace(EVENTS[1], facts={**EVENTS[1].facts, "oops": object()})
    appender = BatchingAppender(append_many)
    appender.start()
    first = asyncio.create_task(appender.append(EVENTS[0]))
    await asyncio.sleep(0)
    rest = [asyncio.create_task(appender.append(e)) for e in [poison, *EVENTS[2:6]]]
    await asyncio.wait_for(retrying.wait(), timeout=10)
    assert appender._task is not None
    appender._task.cancel()
    done = await asyncio.wait_for(asyncio.gather(first, *rest, return_exceptions=True),
                                  timeout=10)
    assert isinstance(done[0], AppendResult) and isinstance(done[2], AppendResult)
    assert isinstance(done[1], LedgerError)  # the poison, refused alone
    assert all(isinstance(r, LedgerUnavailable) for r in done[3:]), done
    assert await stored_keys(pool) == [KEYS[0], KEYS[2]]


@pytest.mark.anyio
async def test_callers_queued_when_the_appender_stops_are_answered_and_later_ones_refused(
        pool: AsyncConnectionPool) -> None:
    """Cancelled with a batch in flight and more queued behind it: the queued callers hear
    their events were not appended, and a delivery arriving after that is refused at once
    rather than queued for a task that is gone."""
    store = LedgerStore(pool)
    in_flight = asyncio.Event()

    async def append_many(events: Sequence[NewEvent]) -> list[AppendResult]:
        in_flight.set()
        await asyncio.sleep(3600)  # a commit that never comes back
        return await store.append(events)

    appender = BatchingAppender(append_many)
    appender.start()
    first = asyncio.create_task(appender.append(EVENTS[0]))
    await asyncio.wait_for(in_flight.wait(), timeout=10)
    queued = [asyncio.create_task(appender.append(e)) for e in EVENTS[1:4]]
    await asyncio.sleep(0)
    assert appender._task is not None
    appender._task.cancel()
    done = await asyncio.wait_for(asyncio.gather(first, *queued, return_exceptions=True),
                                  timeout=10)
    assert all(isinstance(r, LedgerUnavailable) for r in done), done
    with pytest.raises(LedgerUnavailable):
        await asyncio.wait_for(appender.append(EVENTS[4]), timeout=1)
    assert await stored_keys(pool) == []


@pytest.mark.anyio
async def test_a_flush_the_database_holds_is_answered_from_the_spool_and_kept_once(
        pool: AsyncConnectionPool, tmp_path: Path) -> None:
    """A lock holds the append (in life: a partition, no error ever comes): past
    ``stall_s`` the held batch's callers are answered from the spool by a new task, the
    ones queued behind it too, and one added later at once. The held statement is
    cancelled in the server, so its connection goes back to the pool, and draining the
    spool appends each event once, in arrival order."""
    spool = Spool(tmp_path / "spool")
    store = LedgerStore(pool)
    appender = BatchingAppender(store.append, spool=spool, stall_s=0.3)
    appender.start()
    loop = asyncio.get_running_loop()
    async with pool.connection() as holder:
        async with holder.transaction():
            await holder.execute("LOCK TABLE hookledger_private.ledger_events "
                                 "IN ACCESS EXCLUSIVE MODE")
            started = loop.time()
            held = asyncio.create_task(appender.append(EVENTS[0]))
            await asyncio.sleep(0.05)  # its batch is sent and waits on the lock
            queued = asyncio.create_task(appender.append(EVENTS[1]))
            answers = await asyncio.gather(held, queued)
            assert [a.spooled for a in answers] == [True, True]
            assert loop.time() - started < 0.6
            later = await appender.append(EVENTS[2])  # the backlog takes it at once
            assert later.spooled and loop.time() - started < 0.7
        async with pool.connection() as watcher:  # cancelled while the lock still held
            for _ in range(40):
                cur = await watcher.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND query LIKE '%%ledger_events%%' AND pid <> pg_backend_pid()")
                if await cur.fetchone() == (0,):
                    break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError("the held statement was never cancelled")
    await appender.close()
    assert await stored_keys(pool) == []
    assert await SpoolDrainer(spool, store.append).drain_once() == 3
    assert await stored_keys(pool) == KEYS[:3]  # each once, in arrival order


@pytest.mark.anyio
async def test_a_delivery_the_full_spool_cannot_take_behind_its_backlog_is_committed(
        pool: AsyncConnectionPool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After an outage, new deliveries go to the spool behind its backlog, to keep the
    order. With the spool's disk full they were answered 503, though the database was
    there to take them: lost, since the general system never sends a delivery again. The
    database takes them now, ahead of the backlog (the projections fold by rank and the
    provider's time, not by position); 503 is left for what neither can take."""
    spool = Spool(tmp_path)
    spool.write([EVENTS[0]])  # the outage's backlog, not drained yet

    def disk_full(events: Sequence[NewEvent]) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(spool, "write", disk_full)
    appender = BatchingAppender(LedgerStore(pool).append, spool=spool)
    appender.start()
    result = await appender.append(EVENTS[1])
    await appender.close()
    assert not result.spooled and result.position > 0
    assert await stored_keys(pool) == [KEYS[1]]
    assert spool.backlog == 1  # still drained afterwards, in its own order


@pytest.mark.anyio
async def test_an_event_the_spool_cannot_encode_fails_alone(tmp_path: Path) -> None:
    """With the database away a batch goes to the spool. An event the writer cannot encode
    (a bug upstream, but one event's) sank the whole batch there, every caller answered
    503, though on the database's way it fails alone. Now only its caller hears it refused,
    as there (ingest then keeps it by its raw bytes), and the others are spooled."""
    async def database_away(events: Sequence[NewEvent]) -> list[AppendResult]:
        raise LedgerUnavailable("database unavailable: OperationalError")

    poison = replace(EVENTS[1], facts={**EVENTS[1].facts, "oops": object()})
    spool = Spool(tmp_path)
    appender = BatchingAppender(database_away, spool=spool, max_wait_s=0.05)
    appender.start()
    done = await asyncio.gather(*(appender.append(e) for e in [EVENTS[0], poison, EVENTS[2]]),
                                return_exceptions=True)
    await appender.close()
    assert isinstance(done[1], LedgerError) and not isinstance(done[1], LedgerUnavailable)
    assert [isinstance(r, AppendResult) and r.spooled for r in (done[0], done[2])] \
        == [True, True], done
    spool.seal()
    spooled = [e.dedupe_key for _, handle in spool.drainable()
               for e in read_records(handle.read())[0]]
    assert spooled == [KEYS[0], KEYS[2]]


@pytest.mark.anyio
async def test_a_long_queue_behind_slow_flushes_is_answered_from_the_spool_and_kept_once(
        pool: AsyncConnectionPool, tmp_path: Path) -> None:
    """A database slow but answering, each batch just inside ``stall_s``: nothing was ever
    held, so the last of a long queue waited for every batch before it (here five, 1 s;
    in life past the sender's window). Once the first queued event has waited
    ``queue_wait_s``, the queue is answered from the spool, and draining it appends each
    event once, after the batch that was committed, in arrival order."""
    store = LedgerStore(pool)

    async def slow(events: Sequence[NewEvent]) -> list[AppendResult]:
        await asyncio.sleep(0.2)  # the database's time for each batch
        return await store.append(events)

    spool = Spool(tmp_path / "spool")
    appender = BatchingAppender(slow, max_batch=2, spool=spool, stall_s=0.3,
                                queue_wait_s=0.15)
    appender.start()
    loop = asyncio.get_running_loop()
    started = loop.time()

    async def timed(event: NewEvent) -> tuple[AppendResult, float]:
        result = await appender.append(event)
        return result, loop.time() - started

    answers = await asyncio.gather(*(timed(e) for e in EVENTS[:10]))
    later = await appender.append(EVENTS[10])  # behind the backlog: spooled, in order
    await appender.close()
    assert [a.spooled for a, _ in answers] == [False] * 2 + [True] * 8
    assert max(t for _, t in answers) < 0.5, answers
    assert later.spooled
    assert await stored_keys(pool) == KEYS[:2]
    assert await SpoolDrainer(spool, store.append).drain_once() == 9
    assert await stored_keys(pool) == KEYS[:11]


@pytest.mark.anyio
async def test_an_overdue_queue_the_spool_cannot_take_goes_on_to_the_database(
        pool: AsyncConnectionPool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the disk full as well, the overdue queue is not refused (the general system
    would never send it again): it waits for the database after all, in order."""
    store = LedgerStore(pool)

    async def slow(events: Sequence[NewEvent]) -> list[AppendResult]:
        await asyncio.sleep(0.1)
        return await store.append(events)

    spool = Spool(tmp_path / "spool")

    def disk_full(events: Sequence[NewEvent]) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(spool, "write", disk_full)
    appender = BatchingAppender(slow, max_batch=2, spool=spool, stall_s=0.3,
                                queue_wait_s=0.05)
    appender.start()
    answers = await asyncio.gather(*(appender.append(e) for e in EVENTS[:7]))
    await appender.close()
    assert [a.spooled for a in answers] == [False] * 7
    assert await stored_keys(pool) == KEYS[:7]


@pytest.mark.anyio
async def test_an_event_answered_refused_by_the_spool_is_not_committed_as_well(
        pool: AsyncConnectionPool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Behind a backlog, a batch goes to the spool first. One event the spool cannot encode
    is answered refused (its caller then keeps the delivery as unstorable); when the disk
    then refused the rest, the whole batch, that event included, went on to the database:
    the same delivery in the ledger twice, under two keys."""
    spool = Spool(tmp_path)
    spool.write([EVENTS[0]])  # an outage's backlog, not drained yet
    real_encode = appender_module.encode_event

    def encode(event: NewEvent) -> bytes:
        if event.dedupe_key == KEYS[1]:
            raise ValueError("the spool cannot encode this one")
        return real_encode(event)

    def disk_full(events: Sequence[NewEvent]) -> None:
        for event in events:
            encode(event)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(appender_module, "encode_event", encode)
    monkeypatch.setattr(spool, "write", disk_full)
    appender = BatchingAppender(LedgerStore(pool).append, spool=spool, max_wait_s=0.05)
    appender.start()
    done = await asyncio.gather(*(appender.append(e) for e in EVENTS[1:3]),
                                return_exceptions=True)
    await appender.close()
    assert isinstance(done[0], LedgerError) and not isinstance(done[0], LedgerUnavailable)
    assert isinstance(done[1], AppendResult) and not done[1].spooled
    assert await stored_keys(pool) == [KEYS[2]]


@pytest.mark.anyio
async def test_a_batch_lingering_for_company_is_not_taken_for_one_held_up_by_slow_flushes(
        pool: AsyncConnectionPool, tmp_path: Path) -> None:
    """``HOOKLEDGER_APPEND_MAX_WAIT_MS`` is waited out on top of the spool's bounds (README).
    A linger as long as a third of ``HOOKLEDGER_APPEND_STALL_S`` (200 ms against 0.3 s: the
    service's ``queue_wait_s``) was counted as a queue overdue behind slow batches: under
    light load and a healthy database, every delivery went to the spool, not the ledger."""
    store = LedgerStore(pool)
    spool = Spool(tmp_path / "spool")
    appender = BatchingAppender(store.append, spool=spool, max_wait_s=0.2, stall_s=0.3,
                                queue_wait_s=0.1)
    appender.start()
    answers = [await appender.append(e) for e in EVENTS[:3]]
    together = await asyncio.gather(*(appender.append(e) for e in EVENTS[3:6]))
    await appender.close()
    assert [a.spooled for a in answers + together] == [False] * 6
    assert appender.batches == 4  # the three lingering together were one batch
    assert await stored_keys(pool) == KEYS[:6]
