"""Checking the ledger's hash chain: has any event changed since it was appended?

The database chains each event to the one before (migration 0005:
``chain_hash = sha256(previous chain_hash || ledger_event_digest(event))``). Checking
recomputes the chain here, in position order, from digests the database computes over the
rows as they are now: an event edited behind the immutability trigger (by someone who can
disable it) gets a different digest, and the first such event is named. Someone who also
rewrites every later hash is caught only by comparing the head hash with one kept
elsewhere, which is why the result reports it.

The digest is spelled out in the query, from PostgreSQL's own functions only (the search
path pinned to ``pg_catalog``), not taken from ``ledger_event_digest``: the rights that
switch the trigger off to edit an event also replace that function, and one returning the
old digest for the edited row verified the edit, head hash unchanged.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg

Progress = Callable[[int], None]

# The digest of migrations 0005, 0009 and 0010 (its ``DIGEST``), byte for byte: every
# stored chain hash was computed with it (tests/test_chain.py holds the two equal).
DIGEST = r"""sha256(
    sha256(convert_to(ROW.position::text, 'UTF8')) ||
    sha256(convert_to(ROW.event_id::text, 'UTF8')) ||
    sha256(convert_to(ROW.stream, 'UTF8')) ||
    sha256(convert_to(ROW.event_type, 'UTF8')) ||
    sha256(convert_to(ROW.source, 'UTF8')) ||
    sha256(convert_to(ROW.dedupe_key, 'UTF8')) ||
    sha256(convert_to(coalesce('+' || ROW.endpoint, '-'), 'UTF8')) ||
    sha256(convert_to(coalesce('+' || ROW.verified_by, '-'), 'UTF8')) ||
    sha256(coalesce('\x2b'::bytea || ROW.raw_body, '\x2d'::bytea)) ||
    sha256(convert_to(ROW.headers::text, 'UTF8')) ||
    coalesce(sha256(convert_to(ROW.payload::text, 'UTF8')), sha256('\x2d'::bytea)) ||
    sha256(convert_to(ROW.facts::text, 'UTF8')) ||
    sha256(convert_to(coalesce(
        '+' || round(extract(epoch FROM ROW.occurred_at) * 1000000)::bigint::text, '-'),
        'UTF8')) ||
    sha256(convert_to(round(extract(epoch FROM ROW.received_at) * 1000000)::bigint::text,
                      'UTF8')) ||
    sha256(convert_to(round(extract(epoch FROM ROW.recorded_at) * 1000000)::bigint::text,
                      'UTF8')))"""

CHAIN_QUERY = f"""
SELECT position, chain_hash, {DIGEST.replace("ROW.", "e.")}
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
        # built-ins only: a function or operator of the same name in a schema the role's
        # search path puts first is not the one that hashed the row
        await conn.execute("SET LOCAL search_path TO pg_catalog")
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
