"""Recording refused deliveries: why, when, where, and a bounded prefix of the body."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg_pool import AsyncConnectionPool

from ledger.sqlfiles import load

UNVERIFIED_PREFIX_BYTES = 1024
VERIFIED_PREFIX_BYTES = 64 * 1024
MAX_DETAIL = 500
KEEP_ROWS = 100_000
PRUNE_EVERY = 128
RECORD_TIMEOUT_S = 2.0


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

    def row(self) -> dict[str, Any]:
        """The row to store: an unverified body keeps only a short prefix (it may be junk)."""
        keep = VERIFIED_PREFIX_BYTES if self.verified else UNVERIFIED_PREFIX_BYTES
        return {
            "received_at": self.received_at,
            "endpoint": self.endpoint,
            "reason": self.reason,
            "detail": (self.detail or "")[:MAX_DETAIL] or None,
            "verified": self.verified,
            "http_status": self.http_status,
            "body_sha256": hashlib.sha256(self.body).hexdigest(),
            "body_size": self.body_size,
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
                 prune_every: int = PRUNE_EVERY, timeout_s: float = RECORD_TIMEOUT_S) -> None:
        self._pool = pool
        self._keep = keep
        self._prune_every = prune_every
        self._timeout_s = timeout_s
        self._recorded = 0

    async def record(self, refusal: Refusal) -> None:
        async with self._pool.connection(timeout=self._timeout_s) as conn:
            await conn.execute(load("ingest", "insert_rejected"), refusal.row())
            self._recorded += 1
            if self._recorded % self._prune_every == 0:
                await conn.execute(load("ingest", "prune_rejected"), {"keep": self._keep})
