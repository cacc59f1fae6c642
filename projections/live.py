"""The live projector inside ``serve``: one leader per database, woken by NOTIFY.

Every ``serve`` process runs one of these; the one holding the projector advisory lock
projects, the others wait to take over (the lock is a session lock, so it is released
when the leader's connection dies, and a standby gets it within ``standby_retry_s``). The
leader wakes on the ledger's NOTIFY after each commit, and polls every ``poll_s`` in case a
notification is missed.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import psycopg
import structlog

from projections.projector import connect, project_batch

PROJECTOR_LOCK_KEY = 0x686F6F6B70726F6A  # "hookproj"
NOTIFY_CHANNEL = "hookledger_ledger"

log = structlog.get_logger("hookledger.projector")


class LiveProjector:
    def __init__(self, url: str, *, batch_size: int = 1000, poll_s: float = 1.0,
                 standby_retry_s: float = 2.0) -> None:
        self._url = url
        self._batch_size = batch_size
        self._poll_s = poll_s
        self._standby_retry_s = standby_retry_s
        self._stop = asyncio.Event()
        self.is_leader = False
        self.applied = 0

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        """Project until stopped; survive database outages by reconnecting."""
        while not self._stop.is_set():
            try:
                await self._session()
            except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
                log.warning("projector.disconnected", error=type(exc).__name__)
            except Exception:  # a bug in one batch must not end projecting
                log.exception("projector.failed")
            finally:
                self.is_leader = False
            await self._sleep(self._standby_retry_s)

    async def _session(self) -> None:
        async with await connect(self._url) as conn:
            while not self._stop.is_set():
                cur = await conn.execute("SELECT pg_try_advisory_lock(%s)",
                                         (PROJECTOR_LOCK_KEY,))
                row = await cur.fetchone()
                if row and row[0]:
                    break
                await self._sleep(self._standby_retry_s)
            if self._stop.is_set():
                return
            self.is_leader = True
            log.info("projector.leading")
            await conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
            while not self._stop.is_set():
                applied = await project_batch(conn, batch_size=self._batch_size)
                self.applied += applied
                if applied < self._batch_size:
                    await self._wait_for_news(conn)

    async def _wait_for_news(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Return on the next NOTIFY, after ``poll_s``, or at once when stopped.

        psycopg keeps notifications that arrive while a batch runs and hands them over
        here at once, so a commit during a batch is never waited for.
        """
        waiter = asyncio.ensure_future(self._next_notify(conn))
        stopper = asyncio.ensure_future(self._stop.wait())
        _, pending = await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    async def _next_notify(self, conn: psycopg.AsyncConnection[Any]) -> None:
        async for _ in conn.notifies(timeout=self._poll_s, stop_after=1):
            pass

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), timeout=seconds)
