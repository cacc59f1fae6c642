"""Recording refused deliveries: why, when, where, and a bounded prefix of the body."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg_pool import AsyncConnectionPool

from ledger import LedgerUnavailable
from ledger.sqlfiles import load

UNVERIFIED_PREFIX_BYTES = 1024
VERIFIED_PREFIX_BYTES = 64 * 1024
MAX_DETAIL = 500
KEEP_ROWS = 100_000
PRUNE_EVERY = 128
RECORD_TIMEOUT_S = 2.0
MAX_BODY_SIZE = 2**63 - 1  # what ``body_size`` (bigint) holds; HTTP allows 2^64 - 1


@dataclass(frozen=True, slots=True)
class Refusal:
    received_at: datetime
    endpoint: str
    reason: str
    detail: str | None
    verified: bool
    http_status: int
    body: bytes
    body_size: int
    headers: Mapping[str, str]
    remote_addr: str | None
    # a verified body kept as short as an unverified one: a copy already kept whole
    short: bool = False

    def row(self) -> dict[str, Any]:
        """The row to store: an unverified body keeps only a short prefix (it may be junk)."""
        keep = (VERIFIED_PREFIX_BYTES if self.verified and not self.short
                else UNVERIFIED_PREFIX_BYTES)
        return {
            "received_at": self.received_at,
            "endpoint": self.endpoint,
            "reason": self.reason,
            "detail": (self.detail or "")[:MAX_DETAIL] or None,
            "verified": self.verified,
            "http_status": self.http_status,
            "body_sha256": hashlib.sha256(self.body).hexdigest(),
            "body_size": min(self.body_size, MAX_BODY_SIZE),  # a declared size, at most
            "body_prefix": self.body[:keep],
            "headers": json.dumps(dict(self.headers), sort_keys=True),
            "remote_addr": self.remote_addr,
        }


class RejectionLog:
    """Records refusals in a table that a flood cannot grow without bound.

    Bodies are cut to a prefix (1 KiB unverified, 64 KiB for a verified body), and every
    ``prune_every`` records this process deletes all but the newest ``keep`` rows, so the
    table holds at most about ``keep`` rows plus what the processes recorded since.
    """

    def __init__(self, pool: AsyncConnectionPool, *, keep: int = KEEP_ROWS,
                 prune_every: int = PRUNE_EVERY, timeout_s: float = RECORD_TIMEOUT_S,
                 answer_within_s: float | None = None) -> None:
        self._pool = pool
        self._keep = keep
        self._prune_every = prune_every
        self._timeout_s = timeout_s
        # the service's HOOKLEDGER_APPEND_STALL_S: see record()
        self._answer_within_s = answer_within_s
        self._abandoned: set[asyncio.Task[None]] = set()
        self._recorded = 0

    async def record(self, refusal: Refusal) -> None:
        """Store ``refusal``, giving up after ``answer_within_s`` with
        :class:`LedgerUnavailable`. A database that stops answering (a partition, a frozen
        server) sends no error: the insert waited for ever, and with it the refused
        request, its HTTP connection and a pool connection, past the provider's window
        (and a chat delivery already waited once, for its secrets). Given up on, the
        insert is cancelled and left to end in the background, as an append is
        (:func:`ingest.appender.answered_within`): cancelling waits for psycopg to cancel
        it on the server, up to ten seconds more on a dead network."""
        if self._answer_within_s is None:
            await self._insert(refusal)
            return
        task = asyncio.ensure_future(self._insert(refusal))
        try:
            await asyncio.wait((task,), timeout=self._answer_within_s)
        except asyncio.CancelledError:
            task.cancel()
            raise
        if task.done():
            return task.result()
        task.cancel()
        self._abandoned.add(task)  # kept referenced until it ends
        task.add_done_callback(self._forget)
        raise LedgerUnavailable(
            f"the database did not answer within {self._answer_within_s:g} s")

    def _forget(self, task: asyncio.Task[None]) -> None:
        self._abandoned.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: it was given up on, and said so already

    async def _insert(self, refusal: Refusal) -> None:
        async with self._pool.connection(timeout=self._timeout_s) as conn:
            await conn.execute(load("ingest", "insert_rejected"), refusal.row())
            self._recorded += 1
            if self._recorded % self._prune_every == 0:
                await conn.execute(load("ingest", "prune_rejected"), {"keep": self._keep})
