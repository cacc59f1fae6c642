"""Appending to and reading from the ledger table.

Writes accept the caller's connection (``append_in``) so that a consumer can append in the
same transaction as its own output; ``append`` takes a connection from the pool and
commits. Either way a result is returned only for committed (or joined) work.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from os import urandom
from types import MappingProxyType
from typing import Any
from uuid import UUID

import psycopg
from psycopg.rows import args_row
from psycopg_pool import AsyncConnectionPool

from ledger import pgarrays, sqlfiles
from ledger.errors import LedgerError, LedgerIntegrityError, LedgerUnavailable
from ledger.jsonenc import dumps
from ledger.pgarrays import bytea_array, text_array, timestamptz_array, uuid_array
from ledger.records import AppendResult, NewEvent, StoredEvent

pgarrays.register()  # the append binds its columns as packed arrays (ledger/pgarrays.py)


def _sql(name: str) -> str:
    return sqlfiles.load("ledger", name)


def _columns(events: Sequence[NewEvent]) -> dict[str, Any]:
    return {
        "event_id": uuid_array(time_ordered_uuids(len(events))),
        "stream": text_array([e.stream for e in events]),
        "event_type": text_array([e.event_type for e in events]),
        "source": text_array([e.source for e in events]),
        "dedupe_key": text_array([e.dedupe_key for e in events]),
        "endpoint": text_array([e.endpoint for e in events]),
        "verified_by": text_array([e.verified_by for e in events]),
        "raw_body": bytea_array([e.raw_body for e in events]),
        "headers": text_array([dumps(dict(e.headers)) for e in events]),
        "payload": text_array([_stored_payload(e) for e in events]),
        "facts": text_array([dumps(dict(e.facts)) for e in events]),
        "occurred_at": timestamptz_array([e.occurred_at for e in events]),
        "received_at": timestamptz_array([e.received_at for e in events]),
    }


def time_ordered_uuids(count: int, *, now_ns: int | None = None) -> list[bytes]:
    """Version 7 UUIDs (RFC 9562), as their bytes: the Unix time in milliseconds, then 74
    random bits from one read of the OS's random source.

    Time first, so each new event id lands at the right-hand edge of the ledger's unique
    index on ``event_id`` rather than on a random page of it. With random (version 4) ids
    and 5,000,000 events in the ledger, every append dirtied a page of that 192 MB index
    that was seldom in shared buffers, and after each checkpoint wrote it whole to the WAL:
    6.8-7.0 KB of WAL per row against 2.8-3.2 KB, and about a quarter more server time per
    row under the append lock. The ids stay unguessable (74 random bits); the time they
    show is no more than ``recorded_at`` already does. They are not the ledger's order:
    ``position`` is.

    The column's default, ``gen_random_uuid()``, is not used for a second reason: on a
    server built without OpenSSL (the embedded one) it opens, reads and closes
    ``/dev/urandom`` for every row, 5% of an append's server time in a profile (perf).
    """
    millis = (time.time_ns() if now_ns is None else now_ns) // 1_000_000
    stamp = (millis & 0xFFFF_FFFF_FFFF).to_bytes(6, "big")
    pool = urandom(10 * count)
    ids: list[bytes] = []
    for start in range(0, 10 * count, 10):
        ids.append(stamp
                   + bytes((0x70 | pool[start] & 0x0F, pool[start + 1],  # version 7, rand_a
                            0x80 | pool[start + 2] & 0x3F))  # variant: RFC 9562
                   + pool[start + 3:start + 10])  # the rest of rand_b
    return ids


def _stored_payload(event: NewEvent) -> str | None:
    """None when the payload is exactly the raw body's text: the ledger keeps those bytes
    once, and readers compute the jsonb from them (migration 0009)."""
    raw = event.raw_body
    if raw is not None and len(raw) >= len(event.payload_json) \
            and event.payload_json.encode() == raw:
        return None
    return event.payload_json


# SQLSTATE classes that say the database as it stands cannot run the statement, whatever its
# values (they are bound parameters, with explicit casts): access rules and missing objects
# (42: a role left without INSERT by a restore that dropped the grants, a table not there
# yet) and a missing schema (3F). Taken for the event's fault, a direct delivery was
# answered 503 with the spool at hand (the general system never resends), and a spooled one
# was moved to the quarantine file by the drain, out of the ledger once the grant was back.
NOT_THE_EVENTS_FAULT = frozenset({"42", "3F"})


@asynccontextmanager
async def translated_errors() -> AsyncIterator[None]:
    """Turn driver errors into the ledger's own, so callers never import psycopg."""
    try:
        yield
    except (psycopg.OperationalError, psycopg.InterfaceError,  # incl. PoolTimeout
            # a read-only server (a standby, or the old primary just after a failover)
            # cannot take writes now but will, or its successor will: not the event's fault
            psycopg.errors.ReadOnlySqlTransaction) as exc:
        raise LedgerUnavailable(f"database unavailable: {type(exc).__name__}") from exc
    except psycopg.IntegrityError as exc:
        raise LedgerIntegrityError(str(exc).splitlines()[0]) from exc
    except psycopg.Error as exc:
        if (exc.sqlstate or "")[:2] in NOT_THE_EVENTS_FAULT:
            raise LedgerUnavailable(f"database unavailable: {type(exc).__name__}") from exc
        raise LedgerError(f"database error: {type(exc).__name__}") from exc


async def ready_to_append(conn: psycopg.AsyncConnection[Any]) -> None:
    """Pin what an appending session needs, whatever the server's, the database's or the
    role's defaults: call it on every connection that appends. Once per connection, in one
    round trip: nothing is added to an append.

    READ COMMITTED (``default_transaction_isolation``): the append trigger finds the event a
    new one chains to with a query it runs after taking the append lock. Under READ
    COMMITTED that query takes a fresh snapshot, so it sees every event committed before the
    lock was granted. Under REPEATABLE READ or SERIALIZABLE (a default some teams set) it
    reads the transaction's first snapshot: an event another session committed since is
    passed over, the new hash chains to the one before it, and ``hookledger verify`` calls
    an untouched ledger tampered with.

    Durable commits (``synchronous_commit``): a default of ``off`` (a common tuning) returns
    from a commit before its WAL is flushed, so a delivery was answered ``200`` before it was
    durable and a crash of the server lost it, while the general system never sends it again.
    Only ``off`` is raised (to ``on``); ``local`` flushes locally, and the ``remote_*``
    levels, chosen for a standby, are kept.
    """
    await conn.execute(
        "SELECT set_config('default_transaction_isolation', 'read committed', false), "
        "set_config('synchronous_commit', CASE current_setting('synchronous_commit') "
        "WHEN 'off' THEN 'on' ELSE current_setting('synchronous_commit') END, false)")


# How long a session that appends inside longer transactions (the projector, a
# reconciliation pass, a rebuild) may sit idle inside one. Their waits between two statements
# of a transaction are folding and deciding in Python, a second at most where measured.
IDLE_IN_TRANSACTION_S = 60.0


def _milliseconds(seconds: float) -> str:
    """A session limit's setting: at least 1 ms for any bound, 0 (none) for none."""
    return str(max(1, round(seconds * 1000))) if seconds > 0 else "0"


async def end_if_idle_in_transaction(conn: psycopg.AsyncConnection[Any],
                                     seconds: float = IDLE_IN_TRANSACTION_S) -> None:
    """Have the server end this session once it has sat idle inside a transaction for
    ``seconds`` (0: never): call it on every connection that appends between other
    statements.

    A network blip between two statements leaves the server's session idle in its
    transaction, holding its locks, until the kernel gives up on the socket (hours without
    keepalives; never on a socket a proxy keeps open). Once that transaction has appended,
    one of its locks is the ledger's append lock: every append waited, every delivery went
    to the spool, and the views stopped. Ending the session rolls the transaction back;
    its owner has seen its connection go and does the work again.
    """
    await conn.execute("SELECT set_config('idle_in_transaction_session_timeout', %s, false)",
                       (_milliseconds(seconds),))


async def end_if_idle(conn: psycopg.AsyncConnection[Any], seconds: float) -> None:
    """Have the server end this session once it has sat idle, outside a transaction, for
    ``seconds`` (PostgreSQL 14 or newer; older servers keep it as before).

    For sessions that hold a session lock (the projector's, a reconciliation pass's): the
    lock goes when the server ends the session, not when the client does, and after a
    network blip the server may keep the session, idle, until the kernel gives up on its
    socket (two hours and more by default), with the lock and every process waiting for it.
    Set before the lock is taken; the session must then speak more often than this."""
    if conn.info.server_version >= 140000:
        await conn.execute("SELECT set_config('idle_session_timeout', %s, false)",
                           (_milliseconds(seconds),))


async def database_identity(conn: psycopg.AsyncConnection[Any]) -> str:
    """The ledger's own identity (migration 0011) and the database's name.

    The id is drawn once and kept by a dump and restore, a failover and a change of
    address, none of which may strand spool files; the name tells apart the copies made
    from one database as a template (staging made from production), which share the id.
    (Renaming a database with spool files waiting leaves them in the old name's folder,
    which ``serve`` names at start.)"""
    cur = await conn.execute("SELECT id::text, current_database() "
                             "FROM hookledger_private.ledger_identity")
    row = await cur.fetchone()
    if row is None:
        raise LedgerError("the ledger has no identity row: run hookledger migrate")
    return f"{row[0]}/{row[1]}"


class LedgerStore:
    """The ledger over a psycopg async connection pool."""

    def __init__(self, pool: AsyncConnectionPool, *,
                 acquire_timeout_s: float | None = None) -> None:
        self._pool = pool
        self._acquire_timeout_s = acquire_timeout_s  # None: the pool's own timeout

    async def append(self, events: Sequence[NewEvent]) -> list[AppendResult]:
        """Append events atomically; return when they have committed.

        The batch is one INSERT statement on an autocommit connection: a statement is its
        own transaction, so it commits whole or not at all, without the BEGIN and COMMIT
        round trips of an explicit transaction (a third of a small batch's cost). Looking
        up the positions of duplicates afterwards needs no transaction: a conflicting row
        is committed by the time ON CONFLICT skips over it.
        """
        if not events:
            return []
        async with translated_errors(), \
                self._pool.connection(timeout=self._acquire_timeout_s) as conn:
            try:
                if not conn.autocommit:
                    async with conn.transaction():
                        return await append_in(conn, events)
                return await append_in(conn, events)
            except psycopg.errors.ReadOnlySqlTransaction:
                # connected to a server that is (now) a standby: closed, the connection
                # leaves the pool, and the next one is made afresh (to the new primary)
                await conn.close()
                raise

    async def read(self, after: int = 0, limit: int = 1000) -> list[StoredEvent]:
        """Events with position greater than ``after``, in order, at most ``limit``."""
        async with translated_errors(), self._pool.connection() as conn:
            return await read_in(conn, after, limit)

    async def head(self) -> int:
        """The greatest position committed so far (0 for an empty ledger)."""
        async with translated_errors(), self._pool.connection() as conn:
            cur = await conn.execute(_sql("head"))
            row = await cur.fetchone()
            return int(row[0]) if row else 0


async def positions_by_key(conn: psycopg.AsyncConnection[Any], keys: Sequence[str]
                           ) -> dict[str, int]:
    """The position of each of ``keys`` the ledger holds (the others are absent)."""
    if not keys:
        return {}
    cur = await conn.execute(_sql("positions_by_key"), {"keys": list(keys)})
    return {key: pos for key, pos in await cur.fetchall()}


async def append_in(conn: psycopg.AsyncConnection[Any], events: Sequence[NewEvent]
                    ) -> list[AppendResult]:
    """Append within the caller's transaction; results are in the order of ``events``."""
    cur = await conn.execute(_sql("append"), _columns(events))
    inserted: dict[str, int] = {key: pos for pos, key in await cur.fetchall()}
    existing = await positions_by_key(
        conn, [e.dedupe_key for e in events if e.dedupe_key not in inserted])
    results: list[AppendResult] = []
    claimed: set[str] = set()
    for event in events:
        key = event.dedupe_key
        if key in inserted and key not in claimed:
            claimed.add(key)
            results.append(AppendResult(inserted[key], duplicate=False))
        else:
            results.append(AppendResult(inserted.get(key) or existing[key], duplicate=True))
    return results


async def read_in(conn: psycopg.AsyncConnection[Any], after: int, limit: int, *,
                  facts_only: bool = False) -> list[StoredEvent]:
    """Events after ``after`` in order; ``facts_only`` leaves out bodies and headers."""
    if facts_only:
        async with conn.cursor(binary=True) as cur:
            await cur.execute(_sql("read_facts"), {"after": after, "limit": limit})
            return [_facts_event(*row) for row in await cur.fetchall()]
    async with conn.cursor(row_factory=args_row(StoredEvent), binary=True) as cur:
        await cur.execute(_sql("read_from"), {"after": after, "limit": limit})
        return await cur.fetchall()


_NO_HEADERS: Mapping[str, str] = MappingProxyType({})


def _facts_event(position: int, event_id: UUID, stream: str, event_type: str, source: str,
                 dedupe_key: str, facts: Mapping[str, Any], received_at: datetime,
                 recorded_at: datetime, occurred_at: datetime | None, endpoint: str | None,
                 verified_by: str | None) -> StoredEvent:
    return StoredEvent(position, event_id, stream, event_type, source, dedupe_key, None, facts,
                       received_at, recorded_at, occurred_at, None, _NO_HEADERS, endpoint,
                       verified_by)
