"""The durable spool: nothing acknowledged is lost while the database is away."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import os
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import AsyncConnectionPool

from ingest.accepting import Envelope
from ingest.appender import BatchingAppender
from ingest.chat_body import DeliveryMeta, read_chat_or_malformed
from ingest.json_body import parse_object
from ingest.spool import QUARANTINE, Spool, encode_event, read_records
from ingest.spool_drain import CHUNK_BYTES, SpoolDrainer, chunks, event_bytes
from ledger import AppendResult, LedgerStore, NewEvent
from tests.chat_events import PHONE, chat_header, inbound
from tests.chat_events import encode as chat_encode
from tests.dbutil import refuse_event_type
from tests.general_events import encode, general_body
from tests.live import running_service
from tests.relay import SocketRelay
from tests.signing import general_header


def event(i: int) -> NewEvent:
    return NewEvent(stream=f"collection:S-{i}", event_type="payment.confirmed",
                    source="general", dedupe_key=f"general:spool-{i}",
                    payload_json=f'{{"reference": "S-{i}", "amount": 1000.50}}',
                    received_at=datetime(2026, 11, 22, 9, 0, i % 60, tzinfo=UTC),
                    facts={"reference": f"S-{i}", "amount": "1000.50"},
                    raw_body=b'{"reference": "S-%d"}' % i, headers={"user-agent": "t"},
                    endpoint="general/main", verified_by="main")


def sized(i: int, body_bytes: int) -> NewEvent:
    """``event(i)`` whose raw body is ``body_bytes`` long."""
    return dataclasses.replace(event(i), raw_body=b"x" * body_bytes)


@given(st.lists(st.integers(min_value=0, max_value=400), max_size=40),
       st.integers(min_value=1, max_value=8), st.integers(min_value=1, max_value=600))
def test_chunks_keep_order_and_stay_within_both_bounds(
        sizes: list[int], max_events: int, max_bytes: int) -> None:
    """Every event once, in order; no chunk over either bound unless one event alone is
    larger; and no chunk cut short while the next event still fitted."""
    events = [sized(i, n) for i, n in enumerate(sizes)]
    cut = list(chunks(events, max_events=max_events, max_bytes=max_bytes))
    assert [e for chunk in cut for e in chunk] == events
    for i, chunk in enumerate(cut):
        weight = sum(event_bytes(e) for e in chunk)
        assert 0 < len(chunk) <= max_events
        assert weight <= max_bytes or len(chunk) == 1
        if i + 1 < len(cut) and len(chunk) < max_events:
            assert weight + event_bytes(cut[i + 1][0]) > max_bytes


@pytest.mark.anyio
async def test_a_backlog_of_large_bodies_drains_in_chunks_each_commit_can_finish(
        pool: AsyncConnectionPool, tmp_path: Path) -> None:
    """Each drained chunk must commit within the stall bound, or it is given up and tried
    the same way every round: 256 bodies of a megabyte in one statement never drained, and
    every new delivery queued behind that backlog for good. Chunks are bounded in bytes."""
    spool = Spool(tmp_path)
    big = [sized(i, 1024 * 1024) for i in range(12)]
    spool.write(big)
    store = LedgerStore(pool)
    sent: list[int] = []

    async def append_many(events: Any) -> Any:
        sent.append(sum(event_bytes(e) for e in events))
        return await store.append(events)

    assert await SpoolDrainer(spool, append_many).drain_once() == len(big)
    assert len(sent) > 1 and max(sent) <= CHUNK_BYTES
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT dedupe_key FROM hookledger.ledger ORDER BY position")
        assert [k for (k,) in await cur.fetchall()] == [e.dedupe_key for e in big]


@contextlib.contextmanager
def write_held_in_fsync(spool: Spool, events: list[NewEvent],
                        monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``spool.write(events)`` running in a thread, held in its fsync (as on a slow disk)
    for the body of the ``with``; released and finished on the way out."""
    started, release = threading.Event(), threading.Event()
    real_fsync = os.fsync

    def slow_fsync(fd: int) -> None:
        started.set()
        release.wait(10)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", slow_fsync)
    writer = threading.Thread(target=spool.write, args=(events,))
    writer.start()
    try:
        assert started.wait(5)
        yield
    finally:
        release.set()
        writer.join(10)


def test_the_backlog_is_read_without_waiting_for_a_write_in_progress(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The appender reads ``backlog`` on the event loop: behind a write's fsync, every
    connection of the worker waited for the disk."""
    spool = Spool(tmp_path)
    spool.write([event(1)])
    with write_held_in_fsync(spool, [event(2), event(3)], monkeypatch):
        started = time.monotonic()
        during = spool.backlog
        waited = time.monotonic() - started
    assert waited < 1.0
    assert during == 1  # counted once on disk: the write in progress is not yet
    assert spool.backlog == 3


@pytest.mark.anyio
async def test_draining_never_holds_the_event_loop_behind_a_write_in_progress(
        pool: AsyncConnectionPool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A drain seals the file being written first, which waits for a write in progress;
    on the event loop that wait held every connection of the worker for the fsync."""
    spool = Spool(tmp_path)
    spool.write([event(1)])
    with write_held_in_fsync(spool, [event(2)], monkeypatch):
        drain = asyncio.ensure_future(SpoolDrainer(spool, LedgerStore(pool).append).drain_once())
        started = time.monotonic()
        await asyncio.sleep(0.05)  # the loop turns while the drain waits for the write
        turned_after = time.monotonic() - started
        assert not drain.done()
    assert turned_after < 1.0
    assert await drain == 2  # sealed after the write: both records drained
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT dedupe_key FROM hookledger.ledger ORDER BY position")
        assert [k for (k,) in await cur.fetchall()] == ["general:spool-1", "general:spool-2"]


def test_records_come_back_exactly_and_in_order() -> None:
    events = [event(i) for i in range(5)]
    back, damage = read_records(b"".join(encode_event(e) for e in events))
    assert back == events and damage == []


def test_a_torn_tail_is_reported_and_the_records_before_it_kept() -> None:
    data = b"".join(encode_event(event(i)) for i in range(3))
    back, damage = read_records(data[:-7], "f")
    assert back == [event(0), event(1)]
    assert [d.reason for d in damage] == ["truncated_record"]


def test_a_corrupt_record_in_the_middle_is_skipped_and_the_rest_kept() -> None:
    records = [encode_event(event(i)) for i in range(3)]
    broken = bytearray(records[1])
    broken[20] ^= 0xFF
    back, damage = read_records(records[0] + bytes(broken) + records[2])
    assert back == [event(0), event(2)]
    assert [d.reason for d in damage] == ["bad_checksum"]


@settings(max_examples=200, deadline=None)
@given(cut=st.integers(min_value=0, max_value=2000),
       flips=st.lists(st.integers(min_value=0, max_value=2000), max_size=3))
def test_any_damage_never_raises_and_never_invents_a_record(cut: int, flips: list[int]) -> None:
    events = [event(i) for i in range(4)]
    data = bytearray(b"".join(encode_event(e) for e in events))
    for at in flips:
        if at < len(data):
            data[at] ^= 0x5A
    back, _ = read_records(bytes(data[:cut]))
    assert all(e in events for e in back)
    assert [events.index(e) for e in back] == sorted(events.index(e) for e in back)


def test_a_spool_file_survives_its_process_and_is_drainable_by_another(tmp_path: Path) -> None:
    writer = Spool(tmp_path)
    writer.write([event(1), event(2)])
    other = Spool(tmp_path)
    assert list(other.drainable()) == []  # still being written: locked
    writer.seal()
    [(path, handle)] = [(p, h.read()) for p, h in other.drainable()]
    assert read_records(handle)[0] == [event(1), event(2)]
    assert other.depth() == path.stat().st_size > 0


def test_the_spool_and_its_quarantine_are_readable_by_their_owner_alone(
        tmp_path: Path) -> None:
    """They hold whole delivery bodies (customers' names, phone numbers, amounts): under
    the common umask 022 they were world-readable, and so stay the folder and files an
    earlier release made, unless the spool makes them private at start."""
    old_umask = os.umask(0o022)
    try:
        spool = Spool(tmp_path / "home" / "spool")
        spool.write([event(1)])
        spool.quarantine(event(2))
        spool.seal()
        earlier = tmp_path / "earlier"  # as the release before this one left them
        earlier.mkdir(mode=0o755)
        (earlier / QUARANTINE).write_bytes(b"")
        (earlier / "spool-old-000001.hls").write_bytes(b"")
        Spool(earlier).quarantine(event(3))
    finally:
        os.umask(old_umask)
    for folder in (tmp_path / "home" / "spool", earlier):
        assert folder.stat().st_mode & 0o777 == 0o700
        files = list(folder.iterdir())
        assert QUARANTINE in {p.name for p in files} and len(files) == 2
        assert {p.stat().st_mode & 0o777 for p in files} == {0o600}


def test_an_empty_unnamed_file_a_crash_left_is_swept_and_no_other_is(tmp_path: Path) -> None:
    """A crash between creating a spool file under its hidden name and renaming it left
    an empty ``.spool-*.hls.new`` behind for good. A spool's start and each drain pass now
    remove one that is empty, over a minute old and unlocked; a fresh one, a locked one (a
    live writer's) and one holding bytes stay."""
    names = ("dead", "fresh", "locked", "written")
    hidden = {name: tmp_path / f".spool-{name}-0badc0de-000001.hls.new" for name in names}
    for path in hidden.values():
        path.touch()
    hidden["written"].write_bytes(b"HLS1")
    long_ago = time.time() - 120
    for name in ("dead", "locked", "written"):
        os.utime(hidden[name], (long_ago, long_ago))
    with open(hidden["locked"], "rb") as writer:
        fcntl.flock(writer.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        spool = Spool(tmp_path)
        assert [name for name in names if hidden[name].exists()] == ["fresh", "locked", "written"]
        assert list(spool.drainable()) == []
        assert hidden["locked"].exists()
    assert list(spool.drainable()) == []  # its writer gone, the lock went with it
    assert [name for name in names if hidden[name].exists()] == ["fresh", "written"]


def test_a_restart_with_its_predecessors_process_id_never_writes_into_its_files(
        tmp_path: Path) -> None:
    """A restarted service often has the dead one's process id (1 in a container). With
    names from the id alone, its first spool write reopened the dead process's file while
    its own drainer held that file, and each waited for the other: the write never
    returned (and the drainer deleted the file under it)."""
    dead = Spool(tmp_path, owner="1")
    dead.write([event(1)])
    dead.seal()  # the process ends; its lock goes with it
    restarted = Spool(tmp_path, owner="1")
    draining = restarted.drainable()
    path, handle = next(draining)  # the drainer holds the dead process's file
    assert read_records(handle.read())[0] == [event(1)]
    writer = threading.Thread(target=restarted.write, args=([event(2)],), daemon=True)
    writer.start()
    writer.join(timeout=10)
    assert not writer.is_alive(), "the write waited for the drainer's lock"
    restarted.drained(path)
    draining.close()
    restarted.seal()
    [(written, data)] = [(p, h.read()) for p, h in Spool(tmp_path, owner="2").drainable()]
    assert written != path and read_records(data)[0] == [event(2)]
    assert sorted(p.name for p in tmp_path.iterdir()) == [written.name]  # nothing hidden left


def database_spool(home: Path) -> Path:
    """The spool folder a service on ``home`` made for its database (one per database)."""
    [folder] = (home / "spool").glob("db-*")
    return folder


def _connections(admin: str, name: str, allow: bool) -> None:
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS {str(allow).lower()}')
        if not allow:
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                         "WHERE datname = %s AND pid <> pg_backend_pid()", (name,))


def test_deliveries_during_an_outage_are_spooled_answered_and_drained_in_order(
        db_url: str, pg_admin_url: str, tmp_path: Path) -> None:
    name = str(conninfo_to_dict(db_url)["dbname"])
    bodies = [encode(general_body("payment.confirmed", 91000, reference=f"OUT-{i}"))
              for i in range(12)]

    def send(client: httpx.Client, base: str, raw: bytes) -> Any:
        answer = client.post(f"{base}/webhooks/general/main", content=raw,
                             headers={"x-service-signature": general_header("s3cret", raw)})
        assert answer.status_code == 200, answer.text
        return answer.json()

    with running_service(db_url, general_secrets="main=s3cret", home=tmp_path,
                         append_timeout_s=0.5) as base, httpx.Client(timeout=30) as client:
        assert send(client, base, bodies[0])["position"] == 1
        _connections(pg_admin_url, name, allow=False)
        try:
            answers = [send(client, base, raw) for raw in bodies[1:10]]
            assert all(a["spooled"] and a["position"] is None for a in answers)
            ready = client.get(f"{base}/readyz")
            assert ready.status_code == 503 and ready.json()["spool_bytes"] > 0
            metrics = client.get(f"{base}/metrics").text
            assert "hookledger_deliveries_spooled_total" in metrics
            assert gauge(metrics, "hookledger_spool_bytes") == ready.json()["spool_bytes"]
        finally:
            _connections(pg_admin_url, name, allow=True)
        # back: until the backlog is drained, new deliveries queue behind it (order kept)
        for raw in bodies[10:]:
            send(client, base, raw)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with psycopg.connect(db_url) as conn:
                refs = [r for (r,) in conn.execute(
                    "SELECT payload->>'reference' FROM hookledger.ledger ORDER BY position")]
            if len(refs) == len(bodies):
                break
            time.sleep(0.1)
        assert refs == [f"OUT-{i}" for i in range(12)]
        assert client.get(f"{base}/readyz").json()["spool_bytes"] == 0
    assert list(tmp_path.joinpath("spool").rglob("spool-*.hls")) == []


def test_a_home_shared_by_two_databases_drains_each_ones_spool_into_its_own_ledger(
        db_url: str, pg_admin_url: str, template_database: str, tmp_path: Path) -> None:
    """Two services run from one folder (one home) against two databases: spool files
    said nothing of their database, so the other service drained an acknowledged payment
    into its own ledger and deleted the file. Each database has its own spool now."""
    from tests.dbutil import create_database, drop_database, unique_name

    name = str(conninfo_to_dict(db_url)["dbname"])
    other_name = unique_name("hookledger_test_other")
    other_url = create_database(pg_admin_url, other_name, template=template_database)
    raw = encode(general_body("payment.confirmed", 91000, reference="PROD-PAY-1"))

    def references(url: str) -> list[str]:
        with psycopg.connect(url) as conn:
            return [r for (r,) in conn.execute(
                "SELECT payload->>'reference' FROM hookledger.ledger ORDER BY position")]

    try:
        with running_service(db_url, general_secrets="main=s3cret", home=tmp_path,
                             append_timeout_s=0.5) as base, \
                running_service(other_url, general_secrets="main=other", home=tmp_path), \
                httpx.Client(timeout=30) as client:
            _connections(pg_admin_url, name, allow=False)
            try:
                answer = client.post(f"{base}/webhooks/general/main", content=raw, headers={
                    "x-service-signature": general_header("s3cret", raw)})
                assert answer.status_code == 200 and answer.json()["spooled"], answer.text
                time.sleep(3)  # several drain rounds of both services
                assert references(other_url) == []
            finally:
                _connections(pg_admin_url, name, allow=True)
            deadline = time.monotonic() + 30
            while references(db_url) != ["PROD-PAY-1"]:
                assert time.monotonic() < deadline, "the spooled payment never reached its ledger"
                time.sleep(0.1)
            assert references(other_url) == []
    finally:
        drop_database(pg_admin_url, other_name)


@pytest.mark.anyio
async def test_an_event_the_ledger_refuses_is_quarantined_and_the_rest_drained(
        pool: AsyncConnectionPool, db_url: str, tmp_path: Path) -> None:
    """An event the ledger refuses even when kept as unstorable goes to the quarantine."""
    refuse_event_type(db_url, "general.malformed")  # the kept form refused as well
    spool = Spool(tmp_path)
    poison = dataclasses.replace(event(2), payload_json="not json")  # jsonb refuses it
    spool.write([event(1), poison, event(3)])
    drainer = SpoolDrainer(spool, LedgerStore(pool).append)
    await drainer.drain_once()
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT dedupe_key FROM hookledger.ledger ORDER BY position")
        assert [k for (k,) in await cur.fetchall()] == [event(1).dedupe_key,
                                                      event(3).dedupe_key]
    kept, damage = read_records((tmp_path / QUARANTINE).read_bytes())
    assert kept == [poison] and damage == []
    assert list(tmp_path.glob("spool-*.hls")) == [] and spool.backlog == 0
    assert drainer.quarantined == 1


@pytest.mark.anyio
async def test_spool_files_from_before_per_database_folders_are_still_drained(
        pool: AsyncConnectionPool, tmp_path: Path) -> None:
    """An upgrade must not strand what an older release spooled in ``spool/`` itself:
    those files are drained (first: they are older) and counted in the depth."""
    old = Spool(tmp_path, owner="old-release")
    old.write([event(1), event(2)])
    old.seal()
    spool = Spool(tmp_path / "db-0123", legacy=tmp_path)
    spool.write([event(3)])
    spool.seal()
    assert spool.depth() > 0 and spool.depth() == sum(
        p.stat().st_size for p in tmp_path.rglob("spool-*.hls"))
    assert await SpoolDrainer(spool, LedgerStore(pool).append).drain_once() == 3
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT dedupe_key FROM hookledger.ledger ORDER BY position")
        assert [k for (k,) in await cur.fetchall()] == [event(n).dedupe_key for n in (1, 2, 3)]
    assert list(tmp_path.rglob("spool-*.hls")) == [] and spool.depth() == 0


def test_files_waiting_for_another_database_are_named_never_drained(tmp_path: Path) -> None:
    mine = Spool(tmp_path / "db-mine", legacy=tmp_path)
    theirs = Spool(tmp_path / "db-theirs", legacy=tmp_path)
    theirs.write([event(1), event(2)])
    theirs.seal()
    Spool(tmp_path / "db-empty", legacy=tmp_path)
    assert mine.elsewhere() == {tmp_path / "db-theirs": 1}
    assert [path for path, _ in mine.drainable()] == []
    assert theirs.elsewhere() == {}


@pytest.mark.anyio
async def test_each_ledger_has_an_identity_of_its_own_that_stays(
        pool: AsyncConnectionPool, pg_admin_url: str, template_database: str) -> None:
    """The spool folder follows the ledger's identity (migration 0011, with the database's
    name): the same for every connection to it, another for another database, even one
    made from it as a template (as every test database here is). A restore copies the
    row, so it keeps the folder its spooled deliveries wait in, whatever the server."""
    from ledger.store import database_identity
    from tests.dbutil import create_database, drop_database, unique_name

    async with pool.connection() as conn:
        first = await database_identity(conn)
    async with pool.connection() as conn:
        assert await database_identity(conn) == first
    other_name = unique_name("hookledger_test_other")
    other_url = create_database(pg_admin_url, other_name, template=template_database)
    try:
        async with await psycopg.AsyncConnection.connect(other_url) as conn:
            assert await database_identity(conn) != first
    finally:
        drop_database(pg_admin_url, other_name)


@pytest.mark.anyio
async def test_a_file_drained_by_another_process_leaves_its_writers_backlog(
        pool: AsyncConnectionPool, tmp_path: Path) -> None:
    """With several workers any drainer takes any sealed file. The writer must see its
    backlog gone, or it would send every later delivery through the spool for good."""
    writer = Spool(tmp_path, owner="worker-b")
    other = Spool(tmp_path, owner="worker-a")
    writer.write([event(1), event(2)])
    assert writer.backlog == 2 and other.backlog == 0
    writer.seal()
    assert await SpoolDrainer(other, LedgerStore(pool).append).drain_once() == 2
    assert writer.backlog == 0 and list(tmp_path.glob("spool-*.hls")) == []
    appender = BatchingAppender(LedgerStore(pool).append, spool=writer)
    appender.start()
    result = await appender.append(event(3))
    await appender.close()
    assert not result.spooled and not result.duplicate and result.position > 0


def gauge(metrics: str, name: str) -> float:
    (line,) = [x for x in metrics.splitlines() if x.startswith(name + " ")]
    return float(line.split()[1])


def test_only_when_neither_the_database_nor_the_spool_can_take_it_is_the_answer_503(
        db_url: str, pg_admin_url: str, tmp_path: Path) -> None:
    """Database refusing connections and the spool folder unusable: 503 with Retry-After,
    nothing stored; once the spool can be written again, 200 from the spool."""
    name = str(conninfo_to_dict(db_url)["dbname"])
    raw = encode(general_body("payment.confirmed", 91000, reference="NOWHERE"))
    headers = {"x-service-signature": general_header("s3cret", raw)}
    with running_service(db_url, general_secrets="main=s3cret", home=tmp_path,
                         append_timeout_s=0.5) as base, httpx.Client(timeout=30) as client:
        folder = database_spool(tmp_path)
        folder.rmdir()
        folder.write_text("a file where the spool folder should be")  # even root cannot
        _connections(pg_admin_url, name, allow=False)
        try:
            answer = client.post(f"{base}/webhooks/general/main", content=raw, headers=headers)
            assert answer.status_code == 503, answer.text
            assert answer.headers["retry-after"] == "1"
            assert answer.json() == {"status": "unavailable", "reason": "ledger_unavailable"}
            folder.unlink()
            folder.mkdir()
            answer = client.post(f"{base}/webhooks/general/main", content=raw, headers=headers)
            assert answer.status_code == 200 and answer.json()["spooled"] is True
        finally:
            _connections(pg_admin_url, name, allow=True)


@pytest.mark.anyio
async def test_a_read_only_database_spools_the_batch_instead_of_refusing_it(
        db_url: str, tmp_path: Path) -> None:
    """A standby (or the old primary right after a failover) refuses writes for a while:
    that is the database being unavailable, so the deliveries are spooled, not answered 503,
    and drained once it takes writes again."""
    async def read_only(conn: psycopg.AsyncConnection[Any]) -> None:
        await conn.execute("SET default_transaction_read_only = on")

    spool = Spool(tmp_path)
    async with AsyncConnectionPool(db_url, min_size=1, max_size=2, open=False,
                                   kwargs={"autocommit": True}, configure=read_only) as pool:
        appender = BatchingAppender(LedgerStore(pool).append, spool=spool)
        appender.start()
        results = await asyncio.gather(*(appender.append(event(i)) for i in range(3)))
        await appender.close()
        # the read-only connection was closed, not handed out again
        assert pool.get_stats().get("returns_bad", 0) >= 1
    assert [r.spooled for r in results] == [True, True, True]
    assert spool.backlog == 3
    async with AsyncConnectionPool(db_url, min_size=1, max_size=2, open=False,
                                   kwargs={"autocommit": True}) as pool:
        drainer = SpoolDrainer(spool, LedgerStore(pool).append)
        await drainer.drain_once()
        async with pool.connection() as conn:
            cur = await conn.execute("SELECT dedupe_key FROM hookledger.ledger ORDER BY position")
            assert [k for (k,) in await cur.fetchall()] == [event(i).dedupe_key
                                                          for i in range(3)]
    assert drainer.quarantined == 0 and spool.backlog == 0


def test_readyz_is_503_while_the_database_is_read_only(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        name = conn.info.dbname
        conn.execute(f'ALTER DATABASE "{name}" SET default_transaction_read_only = on')
    with running_service(db_url, general_secrets="main=whsec-main") as base:
        answer = httpx.get(f"{base}/readyz", timeout=10)
    assert answer.status_code == 503
    assert answer.json()["database"] == "read_only"


def test_readyz_answers_503_in_seconds_when_the_database_stops_answering(
        db_url: str) -> None:
    """Packets that vanish (a dead route, a firewall dropping them) leave a pooled
    connection waiting for hours: the probe answered nothing meanwhile, and every probe
    held another connection of the pool that ingest appends through."""
    relay = SocketRelay(db_url)
    try:
        with running_service(relay.postgresql_url, general_secrets="main=whsec-main") as base:
            assert httpx.get(f"{base}/readyz", timeout=10).status_code == 200
            relay.hold()
            try:
                started = time.monotonic()
                answer = httpx.get(f"{base}/readyz", timeout=30)
                waited = time.monotonic() - started
            finally:
                relay.release()
            assert httpx.get(f"{base}/readyz", timeout=30).status_code == 200
    finally:
        relay.close()
    assert answer.status_code == 503 and answer.json()["database"] == "timeout"
    assert waited < 10


def test_a_chat_delivery_during_an_outage_verifies_with_the_secrets_read_last_and_is_spooled(
        db_url: str, pg_admin_url: str, tmp_path: Path) -> None:
    """The secrets live in the database: without this a chat delivery in an outage was a
    503 after a 30 s wait, past the platform's patience."""
    name = str(conninfo_to_dict(db_url)["dbname"])

    def send(client: httpx.Client, base: str, message_id: str) -> httpx.Response:
        raw = chat_encode(inbound(message_id=message_id))
        return client.post(f"{base}/webhooks/chat/{PHONE}", content=raw, headers={
            "x-service-signature": chat_header("chat-s3cret", raw, int(time.time())),
            "x-service-delivery-id": f"d-{message_id}"})

    with running_service(db_url, chat_secrets={PHONE: "chat-s3cret"}, home=tmp_path,
                         append_timeout_s=0.5) as base, httpx.Client(timeout=30) as client:
        assert send(client, base, "wamid.BEFORE").json()["position"] == 1
        time.sleep(1.2)  # past the secret cache's time to live
        _connections(pg_admin_url, name, allow=False)
        try:
            started = time.monotonic()
            during = send(client, base, "wamid.DURING")
            assert during.status_code == 200 and during.json()["spooled"] is True, during.text
            assert time.monotonic() - started < 10
            unknown = client.post(f"{base}/webhooks/chat/2999999999", content=b"{}",
                                  headers={"x-service-signature": "t=1,v1=" + "a" * 64})
            assert unknown.status_code == 503  # never seen: nothing to verify it with
        finally:
            _connections(pg_admin_url, name, allow=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with psycopg.connect(db_url) as conn:
                ids = [r for (r,) in conn.execute(
                    "SELECT facts->>'message_id' FROM hookledger.ledger ORDER BY position")]
            if len(ids) == 2:
                break
            time.sleep(0.1)
        assert ids == ["wamid.BEFORE", "wamid.DURING"]


def test_an_event_the_ledger_refuses_at_drain_time_is_kept_as_a_direct_append_keeps_it(
        db_url: str, pg_admin_url: str, tmp_path: Path) -> None:
    """A delivery the database refuses for itself is kept as unstorable (reason
    ``refused_by_database``) when appended directly, so it shows in the ledger and as a
    ``malformed_delivery``. Spooled first (the database away), it went to
    ``quarantine.hls`` only: answered 200, yet in no view and no discrepancy."""
    name = str(conninfo_to_dict(db_url)["dbname"])
    raw = encode(general_body("payment.confirmed", 91000, reference="LATE-REFUSED"))
    refuse_event_type(db_url, "payment.confirmed")
    with running_service(db_url, general_secrets="main=s3cret", home=tmp_path,
                         append_timeout_s=0.5) as base, httpx.Client(timeout=30) as client:
        _connections(pg_admin_url, name, allow=False)
        try:
            answer = client.post(f"{base}/webhooks/general/main", content=raw,
                                 headers={"x-service-signature": general_header("s3cret", raw)})
            assert answer.status_code == 200 and answer.json()["spooled"] is True
        finally:
            _connections(pg_admin_url, name, allow=True)
        deadline = time.monotonic() + 30
        while any(tmp_path.joinpath("spool").rglob("spool-*.hls")) \
                and time.monotonic() < deadline:
            time.sleep(0.1)
        with psycopg.connect(db_url) as conn:
            found = conn.execute("SELECT event_type, raw_body, stream, facts->>'reason' "
                                 "FROM hookledger.ledger WHERE source = 'general'").fetchall()
        assert [(t, bytes(b), s, r) for t, b, s, r in found] == [
            ("general.malformed", raw, "collection:LATE-REFUSED", "refused_by_database")]
        assert not database_spool(tmp_path).joinpath(QUARANTINE).exists()


@pytest.mark.anyio
async def test_a_chat_event_the_ledger_refuses_at_drain_time_is_kept_by_its_raw_bytes(
        pool: AsyncConnectionPool, db_url: str, tmp_path: Path) -> None:
    """The chat system's spooled delivery the database refuses is kept as the direct
    append keeps it: ``chat.malformed`` under its delivery id, not quarantined."""
    raw = chat_encode(inbound(message_id="wamid.LATE"))
    meta = DeliveryMeta(PHONE, delivery_id="late-1", attempt=1, user_agent="t")
    parsed, text = parse_object(raw)
    delivery = read_chat_or_malformed(parsed, meta)
    envelope = Envelope("chat", datetime.now(UTC), raw, {"x-service-delivery-id": "late-1"},
                        f"chat/{PHONE}", "current")
    spool = Spool(tmp_path)
    spool.write([envelope.event(delivery, text)])
    refuse_event_type(db_url, delivery.event_type)
    drainer = SpoolDrainer(spool, LedgerStore(pool).append)
    await drainer.drain_once()
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT event_type, dedupe_key, stream, raw_body, "
                                 "facts->>'reason' FROM hookledger.ledger")
        found = await cur.fetchall()
    assert [(t, k, s, bytes(b), r) for t, k, s, b, r in found] == [
        ("chat.malformed", "chat:delivery:late-1", "chat-message:wamid.LATE", raw,
         "refused_by_database")]
    assert not (tmp_path / QUARANTINE).exists() and drainer.quarantined == 0


def _fsynced_paths(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Record what each ``os.fsync`` made durable, by path."""
    synced: list[Path] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        synced.append(Path(os.readlink(f"/proc/self/fd/{fd}")))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return synced


def test_a_new_spool_folder_is_itself_durable_before_a_record_is_acknowledged(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a new home the spool folder is made at start-up; its name in the home was never
    fsynced, so a power cut could take the folder, and the records fsynced inside it, away
    after their 200."""
    synced = _fsynced_paths(monkeypatch)
    home = tmp_path / "home"
    spool = Spool(home / "spool" / "db-0123")  # as serve makes it: one per database
    spool.write([event(1)])
    assert {home, home / "spool", home / "spool" / "db-0123"} <= set(synced)


def test_the_quarantine_files_name_is_durable_before_the_spool_file_goes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The quarantine file may be an event's only copy once its spool file is deleted: its
    directory entry must be fsynced like a spool file's, not only its bytes."""
    spool = Spool(tmp_path)
    synced = _fsynced_paths(monkeypatch)
    spool.quarantine(event(1))
    assert synced == [tmp_path / QUARANTINE, tmp_path]


@pytest.mark.anyio
async def test_a_writers_later_file_waits_while_another_drainer_holds_its_earlier_one(
        pool: AsyncConnectionPool, tmp_path: Path) -> None:
    """With several workers on one home, any drainer takes any sealed file. One that found
    a writer's first file taken by another drainer went on to that writer's next file, so
    its events could reach the ledger before the first file's: out of the order they were
    written (and acknowledged) in. A writer's later files now wait for its earlier one."""
    writer = Spool(tmp_path, owner="worker-b")
    writer.write([event(1)])
    writer.seal()
    writer.write([event(2)])
    writer.seal()
    first = sorted(tmp_path.glob("spool-*.hls"))[0]
    with open(first, "rb") as other_drainer:  # another worker's drainer holds it
        fcntl.flock(other_drainer.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert await SpoolDrainer(writer, LedgerStore(pool).append).drain_once() == 0
    assert await SpoolDrainer(writer, LedgerStore(pool).append).drain_once() == 2
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT dedupe_key FROM hookledger.ledger ORDER BY position")
        assert [k for (k,) in await cur.fetchall()] == [event(1).dedupe_key,
                                                      event(2).dedupe_key]


def test_a_record_of_a_large_body_the_service_accepts_is_read_back_not_skipped() -> None:
    """``HOOKLEDGER_MAX_BODY_BYTES`` has no upper bound, but the reader took any record
    over 64 MiB for damage (``bad_header``) and skipped it: a body of about 28 MiB or more
    (kept twice in a record, once in base64), answered 200 from the spool, was dropped
    when the spool drained."""
    body = b'{"reference": "BIG", "pad": "' + b"x" * (28 * 1024 * 1024) + b'"}'
    big = dataclasses.replace(event(1), payload_json=body.decode(), raw_body=body)
    back, damage = read_records(encode_event(big))
    assert damage == [] and back == [big]


def test_a_file_whose_name_could_not_be_made_durable_takes_no_record(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A record is acknowledged only once its bytes and its file's name in the folder are
    fsynced. A folder fsync that failed as a file was named left that file in use: later
    records went into it and were answered 200, its name never made durable. Such a file
    now takes no record; the next write names a new one and fsyncs the folder for it."""
    spool = Spool(tmp_path)
    synced: list[Path] = []
    failures = [OSError(5, "Input/output error")]

    def fsync_folder(folder: Path) -> None:
        if failures:
            raise failures.pop()
        synced.append(folder)

    monkeypatch.setattr("ingest.spool.fsync_folder", fsync_folder)
    with pytest.raises(OSError):
        spool.write([event(1)])
    spool.write([event(2)])
    assert synced == [tmp_path]  # the name the acknowledged record went under
    spool.seal()
    back = [e for _, handle in spool.drainable() for e in read_records(handle.read())[0]]
    assert back == [event(2)]


@pytest.mark.anyio
async def test_a_failing_look_at_the_spool_folder_does_not_stop_the_drainer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each round first asks how much waits in the spool, outside the round's own error
    handling: one OSError there (EMFILE under load, EIO) ended the drainer's task for
    good, and with its backlog never drained every later delivery was spooled behind it,
    none reaching the ledger until a restart. The round is tried again instead."""
    spool = Spool(tmp_path)
    spool.write([event(1)])
    appended: list[NewEvent] = []

    async def append_many(events: Any) -> Any:
        appended.extend(events)
        return [AppendResult(i + 1, duplicate=False) for i in range(len(events))]

    failures = [OSError(24, "Too many open files")]
    real_depth = spool.depth

    def depth() -> int:
        if failures:
            raise failures.pop()
        return real_depth()

    monkeypatch.setattr(spool, "depth", depth)
    drainer = SpoolDrainer(spool, append_many, interval_s=0.01)
    drainer.start()
    for _ in range(200):
        if appended:
            break
        await asyncio.sleep(0.01)
    assert [e.dedupe_key for e in appended] == [event(1).dedupe_key]
    await drainer.stop()


def test_a_writers_files_drain_in_the_order_it_wrote_them_whatever_their_times(
        tmp_path: Path) -> None:
    """Files were drained oldest modification time first. A clock set back between two of
    a writer's files (an NTP step, a restored VM) gave its later file the earlier time, and
    its events reached the ledger before the earlier file's. A writer's own files now go in
    the order it wrote them (their generation), in the places the times give its files."""
    writer = Spool(tmp_path, owner="w")
    for i in range(1, 4):
        writer.write([event(i)])
        writer.seal()
    now = time.time()
    for age, path in zip([10, 30, 20], sorted(tmp_path.glob("spool-*.hls")), strict=True):
        os.utime(path, (now - age, now - age))
    order = [read_records(handle.read())[0] for _, handle in Spool(tmp_path).drainable()]
    assert order == [[event(1)], [event(2)], [event(3)]]


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_a_file_whose_close_failed_is_let_go_and_the_next_write_starts_another(
        tmp_path: Path) -> None:
    """A record a full disk refused stays in the file's buffer, so sealing the file fails
    too (its close flushes it again), though the file is closed. The spool kept it as its
    file: every write until the next seal raised ValueError, not OSError, so it was
    answered 503 where the database or the freed disk could have taken it. Now a seal
    always lets the file go, and the next write starts another."""
    spool = Spool(tmp_path)
    spool.write([event(1)])
    assert spool._file is not None
    spool._file.close()
    spool._file = open("/dev/full", "wb")  # a file on a disk that is full
    spool._file.write(b"HLS1")  # a record the disk refused, still in the buffer
    with pytest.raises(OSError):
        spool.seal()
    spool.write([event(2)])
    spool.seal()
    back = [e for _, handle in spool.drainable() for e in read_records(handle.read())[0]]
    assert back == [event(1), event(2)]


def test_a_file_this_process_cannot_read_holds_back_only_its_own_writers_later_files(
        tmp_path: Path) -> None:
    """Opening a spool file failed with anything but FileNotFoundError (another user's
    file, a disk error) every round, and no file after it was ever drained. Now it waits
    for a person, with its own writer's later files behind it (their order is kept), and
    other writers' files drain."""
    x, y = Spool(tmp_path, owner="x"), Spool(tmp_path, owner="y")
    for spool, first in ((x, 1), (x, 2), (y, 3)):
        spool.write([event(first)])
        spool.seal()
    unreadable = min(tmp_path.glob("spool-x-*.hls"))
    unreadable.unlink()
    unreadable.mkdir()  # opening it fails for root too (IsADirectoryError)
    drained = [read_records(handle.read())[0] for _, handle in Spool(tmp_path).drainable()]
    assert drained == [[event(3)]]


@contextlib.contextmanager
def writing_role(db_url: str) -> Iterator[tuple[str, str]]:
    """A role that may read and write everything (not a superuser, whose rights nothing
    takes away), and the test database's URL as that role."""
    role = f"hl_writer_{os.urandom(5).hex()}"
    if "://postgres@" not in db_url:
        pytest.skip("the test database's URL names no postgres user to replace")
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN")
        conn.execute(f"GRANT pg_read_all_data, pg_write_all_data TO {role}")
    url = db_url.replace("://postgres@", f"://{role}@", 1)
    try:
        try:
            psycopg.connect(url).close()
        except psycopg.OperationalError:
            pytest.skip("the test server asks this new role for a password")
        yield role, url
    finally:
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute(f"DROP ROLE {role}")


def _may_write(db_url: str, role: str, allowed: bool) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(f"{'GRANT' if allowed else 'REVOKE'} pg_write_all_data "
                     f"{'TO' if allowed else 'FROM'} {role}")


def _references(db_url: str, count: int) -> list[str]:
    deadline = time.monotonic() + 30
    while True:
        with psycopg.connect(db_url) as conn:
            refs = [r for (r,) in conn.execute(
                "SELECT payload->>'reference' FROM hookledger.ledger ORDER BY position")]
        if len(refs) >= count or time.monotonic() > deadline:
            return refs
        time.sleep(0.1)


def test_a_role_that_may_not_write_spools_the_delivery_and_it_drains_once_it_may(
        db_url: str, tmp_path: Path) -> None:
    """Privileges lost (a restore that left the grants behind) are the database's state, not
    the event's: the delivery was taken for one the database refuses, its unstorable form
    was refused too, and it was answered 503 with the spool at hand; the general system
    never sends it again."""
    raw = encode(general_body("payment.confirmed", 91000, reference="NO-GRANT"))
    headers = {"x-service-signature": general_header("s3cret", raw)}
    with writing_role(db_url) as (role, url), \
            running_service(url, general_secrets="main=s3cret", home=tmp_path) as base:
        _may_write(db_url, role, False)
        try:
            answer = httpx.post(f"{base}/webhooks/general/main", content=raw,
                                headers=headers, timeout=30)
            assert answer.status_code == 200, answer.text
            assert answer.json()["spooled"] is True
        finally:
            _may_write(db_url, role, True)
        assert _references(db_url, 1) == ["NO-GRANT"]
    assert not list(tmp_path.joinpath("spool").rglob("*.hls"))


def test_a_spooled_delivery_waits_while_the_role_may_not_write_never_quarantined(
        db_url: str, pg_admin_url: str, tmp_path: Path) -> None:
    """Spooled during an outage, then drained into a database that came back without the
    role's grants: every event was refused, kept as unstorable refused too, and moved to
    the quarantine file, so that, answered 200, it never reached the ledger once the grant
    was back."""
    name = str(conninfo_to_dict(db_url)["dbname"])
    raw = encode(general_body("payment.confirmed", 91000, reference="SPOOLED-NO-GRANT"))
    headers = {"x-service-signature": general_header("s3cret", raw)}
    with writing_role(db_url) as (role, url), \
            running_service(url, general_secrets="main=s3cret", home=tmp_path,
                            append_timeout_s=0.5) as base:
        _connections(pg_admin_url, name, allow=False)
        try:
            answer = httpx.post(f"{base}/webhooks/general/main", content=raw,
                                headers=headers, timeout=30)
            assert answer.status_code == 200 and answer.json()["spooled"] is True
            _may_write(pg_admin_url, role, False)
        finally:
            _connections(pg_admin_url, name, allow=True)
        try:
            time.sleep(3)  # drain rounds meet the missing grant
            assert not (database_spool(tmp_path) / QUARANTINE).exists()
        finally:
            _may_write(db_url, role, True)
        assert _references(db_url, 1) == ["SPOOLED-NO-GRANT"]
    assert not list(tmp_path.joinpath("spool").rglob("*.hls"))


@pytest.mark.anyio
async def test_after_an_outage_steady_load_goes_back_to_the_database(
        pool: AsyncConnectionPool, tmp_path: Path) -> None:
    """A batch behind a backlog goes to the spool, so that the order holds. Under steady
    load each drain round found what was spooled during the one before it, so the backlog
    was never empty when a batch came: after an outage, however short, every delivery went
    through the spool for good (16 senders, 960 deliveries: all 960 answered spooled, none
    with a position). The batch now waits for the drainer to catch up, and the order holds
    all the same."""
    store = LedgerStore(pool)
    spool = Spool(tmp_path)
    spool.write([event(i) for i in range(5)])  # what an outage left
    drainer = SpoolDrainer(spool, store.append, interval_s=0.05)
    appender = BatchingAppender(store.append, spool=spool, on_spooled=drainer.nudge,
                                stall_s=3.0, queue_wait_s=1.0, caught_up=drainer.caught_up)
    drainer.start()
    appender.start()
    answers: list[AppendResult] = []

    async def sender(first: int) -> None:
        for i in range(first, first + 60):
            answers.append(await appender.append(event(i)))
            await asyncio.sleep(0.001)

    await asyncio.gather(*(sender(5 + 60 * n) for n in range(16)))
    await appender.close()
    await drainer.stop()
    assert not any(answer.spooled for answer in answers[-900:])
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT dedupe_key FROM hookledger.ledger ORDER BY position")
        keys = [k for (k,) in await cur.fetchall()]
    assert keys[:5] == [event(i).dedupe_key for i in range(5)]  # the backlog first
    assert sorted(keys) == sorted(event(i).dedupe_key for i in range(5 + 960))


@pytest.mark.anyio
async def test_a_drainer_whose_file_another_holds_waits_for_its_next_round_not_spinning(
        pool: AsyncConnectionPool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With several workers on one home, another worker's drainer may hold a file of this
    one's. The round then drained nothing, the backlog stood, and the drainer started
    the next round at once: about 1,900 rounds a second, a whole core, for as long as the
    other held the file (a long file, or a silent database's stall time again and again)."""
    spool = Spool(tmp_path, owner="worker-a")
    spool.write([event(1)])
    spool.seal()
    drainer = SpoolDrainer(spool, LedgerStore(pool).append, interval_s=0.5)
    rounds = 0
    drain_once = drainer.drain_once

    async def counted() -> int:
        nonlocal rounds
        rounds += 1
        return await drain_once()

    monkeypatch.setattr(drainer, "drain_once", counted)
    (held,) = tmp_path.glob("spool-*.hls")
    with open(held, "rb") as other_drainer:  # another worker's drainer holds it
        fcntl.flock(other_drainer.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        drainer.start()
        drainer.nudge()
        await asyncio.sleep(1.2)
    assert rounds <= 4  # the nudge's, then one each interval
    await asyncio.sleep(0.6)  # let go: the next round drains it
    await drainer.stop()
    assert spool.backlog == 0
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT dedupe_key FROM hookledger.ledger")
        assert await cur.fetchall() == [(event(1).dedupe_key,)]
