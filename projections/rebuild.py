"""Rebuilding the projections from the ledger, and verifying them against a rebuild.

``rebuild`` replaces every projection row in ONE transaction: it locks the checkpoint rows
(the live projector waits), deletes the rows (``DELETE``, not ``TRUNCATE``: readers keep
seeing the old state until the commit), replays the ledger up to the head committed when
it took that lock, and commits. Nobody ever sees a half-built projection. The findings its
folds make that the ledger did not hold yet (new rules meeting old events) are appended in
that transaction and folded right after it commits.

``verify`` rebuilds into temporary tables (a private shadow schema, ``pg_temp``) inside a
``REPEATABLE READ`` snapshot, up to the live checkpoint of that same snapshot, and compares
them row by row with the live tables. It touches nothing live.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime

import psycopg
from psycopg import sql

from ledger.schema import PRIVATE_SCHEMA
from ledger.store import IDLE_IN_TRANSACTION_S, append_in, read_in
from projections.projector import (
    FOLD_ALLOWANCE_S_PER_EVENT,
    Connection,
    Finding,
    apply_events,
    checkpoint,
    checkpoints,
    connect,
    discrepancy_event,
    lock_checkpoint,
    move_checkpoint,
    project_batch,
    store_spill,
)
from projections.registry import PROJECTIONS
from projections.replay_buffer import ReplayBuffer

Progress = Callable[[int], None]
SHADOW_SCHEMA = "pg_temp"
BUFFER_ROWS = 400_000  # rows a replay holds in memory: about 1 KB each


@dataclass(frozen=True)
class RebuildResult:
    events: int
    seconds: float
    head: int

    @property
    def rate(self) -> float:
        return self.events / self.seconds if self.seconds else float("inf")


@dataclass(frozen=True)
class Difference:
    table: str
    key: str
    kind: str  # "differs", "only_live", "only_rebuilt"


@dataclass(frozen=True)
class VerifyResult:
    checkpoint: int
    rows: dict[str, int]
    differences: list[Difference] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        return not self.differences


async def head_position(conn: Connection) -> int:
    cur = await conn.execute("SELECT coalesce(max(position), 0) FROM hookledger.ledger")
    row = await cur.fetchone()
    return int(row[0]) if row else 0


async def _replay(conn: Connection, reader: Connection, *, schema: str,
                  until: Mapping[str, int] | None, batch_size: int, buffer_rows: int,
                  progress: Progress | None, last: int | None = None
                  ) -> tuple[int, int, list[Finding]]:
    """Replay the ledger into empty tables of ``schema`` (the caller emptied them), each
    projection up to its position in ``until`` (its live checkpoint), or all of it up to
    position ``last`` (every position when ``None``).

    ``reader`` reads the ledger one batch ahead while ``conn`` folds and writes the current
    one, so the server's work on a read overlaps the folding. A second connection sees the
    same events: the ledger only grows, and only in position order.
    """
    position, count = 0, 0
    if until is not None:
        last = max(until.values(), default=0)
    findings: list[Finding] = []
    buffer = ReplayBuffer(buffer_rows)
    with collector_paused():
        ahead = asyncio.create_task(read_in(reader, position, batch_size, facts_only=True))
        try:
            while True:
                events = await ahead
                if last is not None:
                    events = [e for e in events if e.position <= last]
                if not events:
                    break
                ahead = asyncio.create_task(
                    read_in(reader, events[-1].position, batch_size, facts_only=True))
                findings.extend(await apply_events(conn, events, schema=schema,
                                                   buffer=buffer, upto=until))
                # the buffer may keep ``conn`` from any statement for minutes, and a session
                # idle that long in its transaction is ended (see projector.connect)
                await conn.execute("SELECT 1")
                position = events[-1].position
                count += len(events)
                if progress:
                    progress(position)
        finally:
            if not ahead.done():
                ahead.cancel()
                await asyncio.gather(ahead, return_exceptions=True)
        await store_spill(conn, schema, buffer.drain())
    return position, count, findings


@contextmanager
def collector_paused() -> Iterator[None]:
    """Keep Python's cycle collector out of a replay.

    A replay holds hundreds of thousands of row dicts; every full collection would walk all
    of them again (a third of a rebuild's time, measured). Folds make no reference cycles,
    so nothing is lost by collecting once at the end instead.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
        gc.collect()


async def rebuild(url: str, *, batch_size: int = 5000, buffer_rows: int = BUFFER_ROWS,
                  progress: Progress | None = None) -> RebuildResult:
    started = time.perf_counter()
    # the writing connection waits, between two statements, for a batch's reading and
    # folding: a millisecond an event on top of the usual bound, as the live projector's
    bound = IDLE_IN_TRANSACTION_S + batch_size * FOLD_ALLOWANCE_S_PER_EVENT
    async with await connect(url, idle_in_transaction_s=bound) as conn, \
            await connect(url) as reader:
        async with conn.transaction():
            await lock_checkpoint(conn)
            # the ledger as far as it was committed once the live projector stopped: reading
            # on to its end took as long again as ingest kept appending (near a rebuild's own
            # rate, for ever), with the views stopped all that while; the live projector
            # folds what came after once this commits
            head = await head_position(conn)
            for projection in PROJECTIONS:
                await conn.execute(sql.SQL("DELETE FROM {}").format(
                    sql.Identifier(PRIVATE_SCHEMA, projection.table)))
            position, count, findings = await _replay(
                conn, reader, schema=PRIVATE_SCHEMA, until=None, batch_size=batch_size,
                buffer_rows=buffer_rows, progress=progress, last=head)
            await move_checkpoint(conn, position)
            appended: list[int] = []
            if findings:  # already in the ledger unless the rules changed: dedupe decides
                now = datetime.now(UTC)
                kept = await append_in(conn, [discrepancy_event(f, now) for f in findings])
                appended = [k.position for k in kept if not k.duplicate]
        if appended:
            await fold_through(conn, max(appended), batch_size=batch_size)
    return RebuildResult(count, time.perf_counter() - started, max(head, position))


async def fold_through(conn: Connection, position: int, *, batch_size: int) -> None:
    """Fold the ledger up to ``position`` now, as the live projector would a moment later:
    the findings a rebuild appends (what new rules flag in events folded before, such as an
    invoice cancelled with money received) waited for a projector, and with none running
    (``serve`` stopped for an upgrade) ``report`` left them out. Batch by batch under the
    checkpoint lock, so a live projector folding meanwhile folds nothing twice."""
    while await checkpoint(conn) < position:
        if not await project_batch(conn, batch_size=batch_size):
            return


async def verify(url: str, *, batch_size: int = 5000, buffer_rows: int = BUFFER_ROWS,
                 progress: Progress | None = None) -> VerifyResult:
    # verify appends nothing and holds no lock anyone waits for: its transaction (a
    # snapshot and temporary tables) may sit between statements as long as comparing takes
    async with await connect(url, idle_in_transaction_s=0) as conn, \
            await connect(url) as reader:
        await conn.set_isolation_level(psycopg.IsolationLevel.REPEATABLE_READ)
        # its shadow tables are temporary, which a database or role whose sessions read
        # only by default (a standby's stand-in) still allows once asked; a standby never
        await conn.execute("SET default_transaction_read_only = off")
        async with conn.transaction():
            # each projection is compared as folded to its own checkpoint: during a rolling
            # upgrade an older leader moves only those it knows, and replaying all to the
            # lowest called every row the others had folded since different
            folded_to = await checkpoints(conn)
            live_checkpoint = min(folded_to.values(), default=0)
            for projection in PROJECTIONS:
                await conn.execute(sql.SQL(
                    "CREATE TEMP TABLE {} (LIKE {} INCLUDING ALL) ON COMMIT DROP").format(
                        sql.Identifier(projection.table),
                        sql.Identifier(PRIVATE_SCHEMA, projection.table)))
            await _replay(conn, reader, schema=SHADOW_SCHEMA, until=folded_to,
                          batch_size=batch_size, buffer_rows=buffer_rows, progress=progress)
            differences: list[Difference] = []
            rows: dict[str, int] = {}
            for projection in PROJECTIONS:
                live = sql.Identifier(PRIVATE_SCHEMA, projection.table)
                shadow = sql.Identifier(SHADOW_SCHEMA, projection.table)
                key = sql.Identifier(projection.key_column)
                only_live = await _keys(conn, sql.SQL(
                    "SELECT {k} FROM (SELECT * FROM {a} EXCEPT SELECT * FROM {b}) d").format(
                        k=key, a=live, b=shadow))
                only_rebuilt = await _keys(conn, sql.SQL(
                    "SELECT {k} FROM (SELECT * FROM {b} EXCEPT SELECT * FROM {a}) d").format(
                        k=key, a=live, b=shadow))
                for k in sorted(only_live | only_rebuilt):
                    kind = ("differs" if k in only_live and k in only_rebuilt
                            else "only_live" if k in only_live else "only_rebuilt")
                    differences.append(Difference(projection.table, k, kind))
                cur = await conn.execute(sql.SQL("SELECT count(*) FROM {}").format(live))
                counted = await cur.fetchone()
                rows[projection.table] = int(counted[0]) if counted else 0
    return VerifyResult(live_checkpoint, rows, differences)


async def _keys(conn: Connection, query: sql.Composed) -> set[str]:
    cur = await conn.execute(query)
    return {str(row[0]) for row in await cur.fetchall()}
