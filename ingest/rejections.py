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


async def record(pool: AsyncConnectionPool, refusal: Refusal) -> None:
    async with pool.connection() as conn:
        await conn.execute(load("ingest", "insert_rejected"), refusal.row())
