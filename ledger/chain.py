"""Checking the ledger's hash chain: has any event changed since it was appended?

The database chains each event to the one before (migration 0005:
``chain_hash = sha256(previous chain_hash || ledger_event_digest(event))``). Checking
recomputes the chain here, in position order, from digests the database computes over the
rows as they are now: an event edited behind the immutability trigger (by someone who can
disable it) gets a different digest, and the first such event is named. Someone who also
rewrites every later hash is caught only by comparing the head hash with one kept
elsewhere, which is why the result reports it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg

Progress = Callable[[int], None]

CHAIN_QUERY = """
SELECT position, chain_hash, hookledger_private.ledger_event_digest(e)
FROM hookledger_private.ledger_events e
ORDER BY position
"""


@dataclass(frozen=True)
class ChainResult:
    checked: int
    head_position: int
    head_hash: str
    first_mismatch: int | None  # the position of the first event that does not match

    @property
    def intact(self) -> bool:
        return self.first_mismatch is None


def next_hash(previous: bytes, digest: bytes) -> bytes:
    return hashlib.sha256(previous + digest).digest()


async def check_chain(conn: psycopg.AsyncConnection[Any], *,
                      progress: Progress | None = None) -> ChainResult:
    """Walk the whole chain (a server-side cursor: memory stays flat); stop at the first
    event whose stored hash is not what its content and its predecessor give."""
    previous, checked, position = b"", 0, 0
    async with conn.transaction(), conn.cursor("hookledger_chain") as cur:
        cur.itersize = 5000
        await cur.execute(CHAIN_QUERY)
        async for position, stored, digest in cur:
            expected = next_hash(previous, bytes(digest))
            if bytes(stored) != expected:
                return ChainResult(checked, position, previous.hex(), position)
            previous = expected
            checked += 1
            if progress and checked % 5000 == 0:
                progress(position)
    return ChainResult(checked, position, previous.hex(), None)
