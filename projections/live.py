"""The live projector inside ``serve``: one leader per database, woken by NOTIFY.

Every ``serve`` process runs one of these; the one holding the projector advisory lock
projects, the others wait to take over (the lock is a session lock, so it is released
when the leader's connection dies, and a standby gets it within ``standby_retry_s``). The
leader wakes on the ledger's NOTIFY after each commit, and polls every ``poll_s`` in case a
notification is missed. After a wake-up it lets ``coalesce_s`` pass before projecting, so
that under load a batch holds the deliveries of that interval rather than of one commit:
the fixed cost of a batch (checkpoint lock, staging, commit) is then shared by many events,
for a delay far inside the few hundred milliseconds a reader may wait.

With several HTTP workers in one ``serve``, the supervisor process runs the projector (see
:class:`ProjectorThread`), so folding never competes with answering on a worker's loop.
The leader's connection carries ``application_name`` ``hookledger-projector:<token>``, which
is how any process can tell from PostgreSQL who leads (:func:`leader_query`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
import uuid
from typing import Any

import psycopg
import structlog

from ledger.store import end_if_idle, end_if_idle_in_transaction
from projections.projector import FOLD_ALLOWANCE_S_PER_EVENT, connect, project_batch

PROJECTOR_LOCK_KEY = 0x686F6F6B70726F6A  # "hookproj"
NOTIFY_CHANNEL = "hookledger_ledger"
APPLICATION_PREFIX = "hookledger-projector:"
# How long the leader's batch waits for the checkpoint rows before it gives way and is
# tried again. A rebuild holds them for its whole run: an unbounded wait behind it left a
# stop (SIGTERM) unnoticed until the rebuild committed.
LOCK_WAIT_S = 1.0
# How long a stop waits for the statement in flight before dropping the connection: a
# batch commits well within it, and a wait for the checkpoint rows lasts LOCK_WAIT_S. A
# database silent mid-statement (a network blip) never answers: a stop waited for it, and
# SIGTERM went unheeded, for as long as the kernel kept the socket.
STOP_GRACE_S = 3.0


def application_name(token: str | None = None) -> str:
    """The projector connection's name: a token drawn once per ``serve`` (process ids
    repeat across containers, where every replica may well be pid 1)."""
    return f"{APPLICATION_PREFIX}{token or uuid.uuid4().hex[:16]}"


# The session holding the projector lock in this database, as ``pg_locks`` shows it: an
# advisory lock on a bigint key is its high and low 32 bits.
_HOLDS_PROJECTOR_LOCK = (
    "l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 "
    "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
    "AND l.classid::bigint = %(hi)s AND l.objid::bigint = %(lo)s")
_LOCK_KEY = {"hi": PROJECTOR_LOCK_KEY >> 32, "lo": PROJECTOR_LOCK_KEY & 0xFFFFFFFF}


def leader_query(name: str) -> tuple[str, dict[str, object]]:
    """SQL and parameters telling whether the projector lock is held by the session named
    ``name``."""
    return ("SELECT EXISTS (SELECT 1 FROM pg_locks l JOIN pg_stat_activity a USING (pid) "
            f"WHERE {_HOLDS_PROJECTOR_LOCK} AND a.application_name = %(name)s)",
            {**_LOCK_KEY, "name": name})


def stranded_leader_query(after_s: float) -> tuple[str, dict[str, object]]:
    """SQL and parameters ending the session that holds the projector lock when it has sat
    for more than ``after_s`` in one statement waiting on its client (``ClientRead``,
    ``ClientWrite``); each row is a pid and whether it was signalled.

    A network blip while the leader's batch is in its ``COPY`` (the server waiting for the
    rows) or while the server sends it the batch's events leaves the session *active*, not
    idle: neither ``idle_session_timeout`` nor ``idle_in_transaction_session_timeout`` ends
    it, and a server does not act on ``statement_timeout`` while it waits on the client.
    It kept the projector lock and the checkpoint rows until the kernel gave up on the
    socket (hours with the default keepalives; never behind a proxy that keeps its side
    open), and no projector led. A working leader sends a batch's rows and reads its events
    at once, far inside a batch's bound; ending one that was merely slow rolls its batch
    back, to be folded again by whoever leads next.
    """
    return ("SELECT a.pid, pg_terminate_backend(a.pid) "
            "FROM pg_locks l JOIN pg_stat_activity a USING (pid) "
            f"WHERE {_HOLDS_PROJECTOR_LOCK} AND a.state = 'active' "
            "AND a.wait_event_type = 'Client' AND a.wait_event IN ('ClientRead', 'ClientWrite') "
            "AND a.state_change < clock_timestamp() - make_interval(secs => %(after)s)",
            {**_LOCK_KEY, "after": after_s})

log = structlog.get_logger("hookledger.projector")


async def takes_no_writes(conn: psycopg.AsyncConnection[Any]) -> bool:
    """Whether this session's transactions are read-only: a hot standby, or sessions read
    only by default (``default_transaction_read_only`` of the database, role or server)."""
    cur = await conn.execute("SHOW transaction_read_only")
    return bool((await cur.fetchone() or ("off",))[0] == "on")


def idle_limit_s(*, poll_s: float, standby_retry_s: float, coalesce_s: float) -> float:
    """How long a projector's session may sit idle before the server ends it: several
    times the longest a working one ever waits between statements (a leader polls every
    ``poll_s`` and then lets ``coalesce_s`` pass; a standby asks every ``standby_retry_s``)."""
    return 5 * max(1.0, poll_s + coalesce_s, standby_retry_s)


def idle_in_batch_limit_s(idle_s: float, batch_size: int) -> float:
    """How long a projector's session may sit idle inside a batch's transaction."""
    return idle_s + batch_size * FOLD_ALLOWANCE_S_PER_EVENT


def drop_connection(conn: psycopg.AsyncConnection[Any]) -> None:
    """Shut the connection's socket down under whatever waits on it, which then fails at
    once as a lost connection (a transaction in flight is never committed, so it rolls
    back). Shut down rather than closed: the driver still owns the descriptor, and closing
    it under the event loop's watch of it is undefined."""
    with contextlib.suppress(OSError, psycopg.Error):  # already gone: nothing to drop
        descriptor = os.dup(conn.pgconn.socket)
        try:
            same = socket.socket(fileno=descriptor)
        except OSError:
            os.close(descriptor)  # not a socket after all: the copy is ours to close
            raise
        with same:
            same.shutdown(socket.SHUT_RDWR)


async def end_when_idle(conn: psycopg.AsyncConnection[Any], seconds: float,
                        in_batch_seconds: float) -> None:
    """Have the server end this session once it has sat idle for ``seconds``, or for
    ``in_batch_seconds`` inside a transaction.

    The projector lock is the session's, so it goes when the server ends the session, not
    when the client does. After a network blip the leader sees its connection go and opens
    a new one, while the server may keep the old session, idle, until the kernel gives up
    on its socket (tens of minutes; hours without keepalives): its lock stayed held, so no
    process led and nothing was projected. A working leader or standby is never idle that
    long. A blip inside a batch left the session idle in its transaction, which
    ``idle_session_timeout`` does not end: the projector lock, the checkpoint rows and,
    after a batch's discrepancies are appended, the ledger's append lock stayed held, so
    every append waited (:func:`ledger.store.end_if_idle_in_transaction`). Ending it rolls
    the batch back, which is retried whole. (PostgreSQL 13 has no ``idle_session_timeout``;
    the bound inside a transaction it has.)
    """
    await end_if_idle_in_transaction(conn, in_batch_seconds)
    await end_if_idle(conn, seconds)


class LiveProjector:
    def __init__(self, url: str, *, batch_size: int = 1000, poll_s: float = 1.0,
                 standby_retry_s: float = 2.0, coalesce_s: float = 0.0,
                 name: str | None = None) -> None:
        self._url = url
        self._batch_size = batch_size
        self._poll_s = poll_s
        self._standby_retry_s = standby_retry_s
        self._coalesce_s = coalesce_s
        self._idle_limit_s = idle_limit_s(poll_s=poll_s, standby_retry_s=standby_retry_s,
                                          coalesce_s=coalesce_s)
        self._idle_in_batch_limit_s = idle_in_batch_limit_s(self._idle_limit_s, batch_size)
        self.name = name or application_name()
        self._stop = asyncio.Event()
        self.is_leader = False
        self.applied = 0
        self._may_not_end_sessions = False
        self._read_only = False  # the database took no writes when last asked
        self._conn: psycopg.AsyncConnection[Any] | None = None  # the session's, while open

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        """Project until stopped; survive database outages by reconnecting."""
        watchdog = asyncio.ensure_future(self._cut_short_when_stuck())
        try:
            while not self._stop.is_set():
                try:
                    await self._session()
                except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
                    log.warning("projector.disconnected", error=type(exc).__name__)
                except psycopg.errors.ReadOnlySqlTransaction:  # turned read-only since asked
                    self._note_read_only()
                except Exception:  # a bug in one batch must not end projecting
                    log.exception("projector.failed")
                finally:
                    self.is_leader = False
                    self._conn = None
                await self._sleep(self._standby_retry_s)
        finally:
            watchdog.cancel()
            await asyncio.gather(watchdog, return_exceptions=True)

    async def _cut_short_when_stuck(self) -> None:
        """Once stopped, give the statement in flight ``STOP_GRACE_S`` to end (a batch
        commits), then drop the connection it waits on: the database may never answer."""
        await self._stop.wait()
        await asyncio.sleep(STOP_GRACE_S)
        if self._conn is not None:
            log.warning("projector.stop_cut_short",
                        reason="the database has not answered since the stop was asked; "
                               "the connection is dropped (a batch in flight rolls back "
                               "unless its commit had reached the server)",
                        after_s=STOP_GRACE_S)
            drop_connection(self._conn)

    async def _session(self) -> None:
        async with await connect(self._url, application_name=self.name) as conn:
            self._conn = conn  # for a stop to drop; run() forgets it
            await end_when_idle(conn, self._idle_limit_s, self._idle_in_batch_limit_s)
            if await takes_no_writes(conn):
                self._note_read_only()
                return  # asked again after standby_retry_s, on a new session
            if self._read_only:
                self._read_only = False
                log.info("projector.database_writable")
            while not self._stop.is_set():
                cur = await conn.execute("SELECT pg_try_advisory_lock(%s)",
                                         (PROJECTOR_LOCK_KEY,))
                row = await cur.fetchone()
                if row and row[0]:
                    break
                await self._end_stranded_leader(conn)
                await self._sleep(self._standby_retry_s)
            if self._stop.is_set():
                return
            self.is_leader = True
            log.info("projector.leading")
            await conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
            waiting = False
            while not self._stop.is_set():
                try:
                    applied = await project_batch(conn, batch_size=self._batch_size,
                                                  lock_wait_s=LOCK_WAIT_S)
                except psycopg.errors.LockNotAvailable:  # rolled back; still the leader
                    if not waiting:
                        log.info("projector.waiting_for_lock",
                                 reason="another transaction (a rebuild?) holds the "
                                        "projections' checkpoint")
                    waiting = True
                    await self._forget_news(conn)
                    continue
                if waiting:
                    log.info("projector.lock_granted")
                    waiting = False
                self.applied += applied
                if applied < self._batch_size:
                    await self._wait_for_news(conn)
                    if self._coalesce_s:
                        await self._sleep(self._coalesce_s)

    def _note_read_only(self) -> None:
        """Say once that the database takes no writes, without a traceback: it is a state
        (a standby, a database set read-only for maintenance), not a failure, and lasts.
        Every retry logged ``projector.leading`` and ``projector.failed`` with a traceback,
        every ``standby_retry_s`` for as long as it lasted. ``projector.database_writable``
        says when it ends."""
        if not self._read_only:
            self._read_only = True
            log.warning("projector.database_read_only",
                        reason="the database takes no writes (a standby, or sessions read "
                               "only by default); projecting resumes when it does",
                        retry_s=self._standby_retry_s)

    async def _end_stranded_leader(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """As a standby, end a leader's session stranded on its client mid-statement
        (:func:`stranded_leader_query`) once it has sat there longer than a batch may sit
        idle inside its transaction, so that a projector leads again."""
        if self._may_not_end_sessions:
            return
        query, params = stranded_leader_query(self._idle_in_batch_limit_s)
        try:
            cur = await conn.execute(query, params)
        except psycopg.errors.InsufficientPrivilege:  # the leader runs as another role
            self._may_not_end_sessions = True
            log.warning("projector.cannot_end_stranded_leader",
                        reason="this role may not end the leader's session")
            return
        for pid, ended in await cur.fetchall():
            if ended:
                log.warning("projector.stranded_leader_ended", pid=pid,
                            after_s=self._idle_in_batch_limit_s)

    async def _wait_for_news(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Return on the next NOTIFY, after ``poll_s``, or at once when stopped.

        psycopg keeps notifications that arrive while a batch runs and hands them over
        here at once, so a commit during a batch is never waited for. A connection lost
        while waiting is raised here, as in a batch: the session ends and :meth:`run`
        reconnects. (Left in its task unread, asyncio logged it as "Task exception was
        never retrieved", with a traceback, at every cut.)
        """
        waiter = asyncio.ensure_future(self._next_notify(conn))
        stopper = asyncio.ensure_future(self._stop.wait())
        done, pending = await asyncio.wait({waiter, stopper},
                                           return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for task in done:
            task.result()

    @staticmethod
    async def _forget_news(conn: psycopg.AsyncConnection[Any]) -> None:
        """Let go of the notifications received since the last look, without waiting.

        A notification only means "something new", and the next batch reads everything
        new. Between two batches :meth:`_wait_for_news` reads them; a leader waiting
        behind a rebuild's lock tries batch after batch and never got there, so the driver
        kept every commit's notification (about 170 bytes each) for as long as the rebuild
        lasted.
        """
        async for _ in conn.notifies(timeout=0):
            pass

    async def _next_notify(self, conn: psycopg.AsyncConnection[Any]) -> None:
        async for _ in conn.notifies(timeout=self._poll_s, stop_after=1):
            pass

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), timeout=seconds)


class ProjectorThread:
    """A live projector on its own event loop in a thread of this process.

    ``serve`` with several HTTP workers runs the projector here, in the supervisor, which
    otherwise only waits on its workers.
    """

    def __init__(self, projector: LiveProjector) -> None:
        self.projector = projector
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()
        self._stopping = threading.Event()  # asked to stop, perhaps before the loop existed
        self._thread = threading.Thread(target=self._main, name="hookledger-projector",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()
        self._ready.wait(timeout=10)

    def stop(self, timeout: float = 30.0) -> None:
        """Stop at a batch boundary (the batch in flight commits) and wait for it.

        A stop that comes while the thread is still starting (SIGTERM during ``start``)
        finds no loop to call into yet; the flag makes the thread stop as soon as its loop
        is there, rather than project on while this waits out ``timeout``.
        """
        self._stopping.set()
        if self._thread.ident is None:
            return  # never started (serve was stopped while it started)
        loop = self._loop
        if loop is not None and self._thread.is_alive():
            # the thread may have seen the flag and closed its loop since is_alive()
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self.projector.stop)
        self._thread.join(timeout)

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def _main(self) -> None:
        async def run() -> None:
            self._loop = asyncio.get_running_loop()
            self._ready.set()
            if self._stopping.is_set():  # asked before the loop was there to be called
                self.projector.stop()
            await self.projector.run()

        try:
            asyncio.run(run())
        except BaseException:  # run() survives every Exception: this is the end of the line
            log.critical("projector.thread_died", exc_info=True)
            raise
