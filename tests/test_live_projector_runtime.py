"""The live projector's runtime on a real database: a cut session, a read-only database,
a wait behind a rebuild, and ``hookledger project``'s stop while the database is silent."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from structlog.testing import capture_logs

from projections import live
from projections.live import (
    APPLICATION_PREFIX,
    LOCK_WAIT_S,
    STOP_GRACE_S,
    LiveProjector,
    leader_query,
)
from projections.projector import lock_checkpoint
from tests.dbutil import database_read_only
from tests.projection_events import new_event
from tests.relay import SocketRelay
from tests.test_projector import (
    append_all,
    applied_counts,
    expected_applications,
    folded,
    mixed_events,
    waiting_for_a_lock,
)


async def until(condition: Any, seconds: float, what: str) -> None:
    """Return once ``condition()`` (sync or async) is true; fail after ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        answer = condition()
        if asyncio.iscoroutine(answer):
            answer = await answer
        if answer:
            return
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)


async def terminate_sessions_of(url: str, name: str) -> int:
    """End, as the server does, every session whose ``application_name`` is ``name``."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute("SELECT count(pg_terminate_backend(pid)) FROM "
                                 "pg_stat_activity WHERE application_name = %s", (name,))
        row = await cur.fetchone()
        return int(row[0]) if row else 0


def test_a_leader_whose_session_the_server_ends_leaves_no_task_exception_unretrieved(
        db_url: str) -> None:
    """The server ends the leader's session while it waits for a notification: its waiting
    task failed and nobody looked at the failure, so asyncio logged "Task exception was
    never retrieved" (with the driver's traceback) each time; the projector went on. Now
    the failure is the leader's own: it reconnects, leads and folds again, and asyncio has
    nothing to report."""
    projector = LiveProjector(db_url, poll_s=0.5, standby_retry_s=0.1)
    reported: list[dict[str, Any]] = []

    async def run() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _loop, c: reported.append(c))
        task = asyncio.create_task(projector.run())
        try:
            await until(lambda: projector.is_leader, 10, "the projector never led")
            await asyncio.sleep(0.3)  # waiting for news
            assert await terminate_sessions_of(db_url, projector.name) == 1
            await until(lambda: not projector.is_leader, 10, "the cut went unnoticed")
            await until(lambda: projector.is_leader, 10, "the projector never led again")
            await append_all(db_url, [new_event("payment.confirmed", 91000,
                                                reference="AFTER-CUT", amount=100)])
            await until(lambda: folded(db_url, "AFTER-CUT"), 10, "nothing folded again")
            gc.collect()  # a task nobody holds is reported when it is collected
            await asyncio.sleep(0)
        finally:
            projector.stop()
            await asyncio.wait_for(task, timeout=10)

    asyncio.run(run())
    assert reported == []


def test_a_read_only_database_is_logged_once_and_projecting_resumes_when_it_takes_writes(
        db_url: str) -> None:
    """A database that takes no writes (sessions read-only by default, a hot standby):
    the projector logged ``projector.leading`` and ``projector.failed`` with a full
    traceback at every retry, for as long as it lasted. Now it says so once, a warning
    without a traceback, keeps trying, and says when the database takes writes again, then
    leads and folds."""
    projector = LiveProjector(db_url, poll_s=0.2, standby_retry_s=0.1)

    async def run() -> None:
        task = asyncio.create_task(projector.run())
        try:
            await until(lambda: projector.is_leader, 10, "the projector never led")
            with database_read_only(db_url):
                await until(lambda: not projector.is_leader, 10, "the cut went unnoticed")
                await asyncio.sleep(1.5)  # about fifteen retries
                assert not projector.is_leader
            await until(lambda: projector.is_leader, 10, "the projector never led again")
            await append_all(db_url, [new_event("payment.confirmed", 91000,
                                                reference="WRITABLE", amount=100)])
            await until(lambda: folded(db_url, "WRITABLE"), 10, "nothing folded again")
        finally:
            projector.stop()
            await asyncio.wait_for(task, timeout=10)

    with capture_logs() as logs:
        asyncio.run(run())
    events = [entry["event"] for entry in logs]
    assert "projector.failed" not in events, logs
    assert not [entry for entry in logs if "exc_info" in entry], logs
    read_only = [entry for entry in logs if entry["event"] == "projector.database_read_only"]
    assert len(read_only) == 1 and read_only[0]["log_level"] == "warning", logs
    after = events[events.index("projector.database_read_only"):]
    assert after.count("projector.database_writable") == 1, events
    assert after.count("projector.leading") == 1, events


def test_a_leader_waiting_behind_a_rebuild_keeps_no_growing_queue_of_notifications(
        db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each commit to the ledger notifies the leader. Waiting behind a rebuild's lock, it
    never read them, and the driver kept every one (about 170 bytes a commit) for as long
    as the rebuild lasted. A notification only means "something new", and the next batch
    reads everything new: now the waiting leader lets go of those that came in during each
    wait, so it holds no more than one wait's worth, and folds everything once the lock
    is free."""
    connections: list[psycopg.AsyncConnection[Any]] = []
    real_connect = live.connect

    async def kept_connect(*args: Any, **kwargs: Any) -> psycopg.AsyncConnection[Any]:
        conn = await real_connect(*args, **kwargs)
        connections.append(conn)  # the real connection, to look at its queue
        return conn

    monkeypatch.setattr(live, "connect", kept_connect)
    bursts = [mixed_events(100, seed=40 + n, prefix=f"burst{n}-") for n in range(4)]
    projector = LiveProjector(db_url, poll_s=0.2, standby_retry_s=0.1)

    def queued() -> int:
        """Notifications the driver holds for the leader's session, unread (psycopg's
        own queue: what grew)."""
        return len(connections[-1]._notifies_backlog or ())

    async def run() -> None:
        task = asyncio.create_task(projector.run())
        try:
            await until(lambda: projector.is_leader, 10, "the projector never led")
            async with await psycopg.AsyncConnection.connect(db_url) as rebuild_like:
                await lock_checkpoint(rebuild_like)  # held until this transaction ends
                await waiting_for_a_lock(db_url, projector)
                most = 0
                for burst in bursts:  # one commit each, over several waits
                    await append_all(db_url, burst, chunk=1)
                    await asyncio.sleep(1.5 * LOCK_WAIT_S)
                    most = max(most, queued())
                assert projector.is_leader and projector.applied == 0
                per_burst = min(len(burst) for burst in bursts)
                assert most < per_burst, f"{most} notifications kept"
                await rebuild_like.rollback()
            every = [event for burst in bursts for event in burst]
            await until(lambda: applied_counts(db_url) == expected_applications(every), 20,
                        "the leader did not fold what came in while it waited")
        finally:
            projector.stop()
            await asyncio.wait_for(task, timeout=10)

    asyncio.run(run())


def leading_projector(url: str) -> str | None:
    """The application name of the session that holds the projector lock, if any."""
    with psycopg.connect(url, autocommit=True) as conn:
        for (name,) in conn.execute("SELECT application_name FROM pg_stat_activity "
                                    "WHERE application_name LIKE %s",
                                    (f"{APPLICATION_PREFIX}%",)).fetchall():
            query, params = leader_query(name)
            if conn.execute(query, params).fetchone() == (True,):
                return str(name)
    return None


def test_sigterm_ends_hookledger_project_while_the_database_is_silent_mid_statement(
        db_url: str, tmp_path: Path) -> None:
    """The network goes silent (no answer, nothing closed) while the projector's batch
    waits on the database: SIGTERM asked the projector to stop at the batch's end, which
    never came, and ``hookledger project`` ran on until killed. Now the batch in flight is
    given a few seconds; then its connection is dropped (the batch rolls back, for the
    next leader to fold), a warning says so, and the command exits 0."""
    relay = SocketRelay(db_url)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOOKLEDGER_")}
    env.update(HOOKLEDGER_HOME=str(tmp_path), HOOKLEDGER_LOG_FORMAT="json",
               HOOKLEDGER_DATABASE_URL=relay.postgresql_url)
    proc = subprocess.Popen([sys.executable, "-m", "hookledger", "project"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while leading_projector(db_url) is None:
            assert proc.poll() is None, proc.communicate()[1].decode()
            assert time.monotonic() < deadline, "hookledger project never led"
            time.sleep(0.1)
        relay.hold()
        time.sleep(2.5)  # past a poll (1 s): its next batch waits on the silent database
        asked = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            _, err = proc.communicate(timeout=STOP_GRACE_S + 5)
        except subprocess.TimeoutExpired:
            pytest.fail("hookledger project did not end on SIGTERM")
        took = time.monotonic() - asked
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        relay.close()
    lines = [json.loads(line) for line in err.decode().splitlines() if line.startswith("{")]
    events = [line["event"] for line in lines]
    assert proc.returncode == 0, err.decode()
    assert STOP_GRACE_S <= took < STOP_GRACE_S + 3
    assert "projector.stop_cut_short" in events, events
    assert events[-1] == "projector.exited", events
