"""Applying ledger events to the projection tables, exactly once.

One batch is one transaction: lock the checkpoint rows (``FOR UPDATE``), read the events
after the checkpoint, load the rows they touch, fold, store the rows, append any
discrepancies found, move the checkpoint, commit. A crash anywhere rolls the whole batch
back, so no event is skipped or applied twice; a second projector on the same database
waits on the checkpoint lock and then continues from where the first committed. Leader
election (an advisory lock, see :mod:`projections.live`) only avoids wasted work; the
checkpoint lock is what guarantees exactly-once.

Discrepancies are appended as the batch's last statement because an append takes the
ledger's append lock until commit: appending last keeps ingest waiting as little as possible.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from typing import Any

import orjson
import psycopg
from psycopg import sql
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb, set_json_dumps, set_json_loads
from sqlalchemy.dialects import postgresql

import projections.schema  # noqa: F401 - declares the projection tables on metadata
from ledger import NewEvent, StoredEvent
from ledger.jsonenc import dumps
from ledger.schema import PRIVATE_SCHEMA, metadata
from ledger.store import (
    IDLE_IN_TRANSACTION_S,
    append_in,
    end_if_idle_in_transaction,
    read_in,
    ready_to_append,
)
from projections.folding import Discrepancy
from projections.malformed import malformed_discrepancy
from projections.registry import PROJECTIONS, Projection, Row
from projections.replay_buffer import ReplayBuffer, Spill

Connection = psycopg.AsyncConnection[Any]
PROJECTIONS_BY_TABLE = {p.table: p for p in PROJECTIONS}
DISCREPANCY_EVENT = "discrepancy.detected"


@dataclass(frozen=True, slots=True)
class Finding:
    discrepancy: Discrepancy
    cause: StoredEvent


def discrepancy_event(finding: Finding, now: datetime) -> NewEvent:
    d = finding.discrepancy
    payload = {
        "kind": d.kind, "subject": d.subject, "reference": d.reference, "detail": d.detail,
        "amount_at_risk": d.amount_at_risk, "evidence": list(d.evidence),
        "detected_by": "projector", "cause_position": finding.cause.position,
    }
    text = dumps(payload)
    return NewEvent(stream=f"discrepancy:{d.subject}:{d.reference}", event_type=DISCREPANCY_EVENT,
                    source="projector", dedupe_key=d.dedupe_key, payload_json=text,
                    received_at=now, facts=payload, occurred_at=finding.cause.occurred_at)


# A batch's longest wait between two of its statements is its reading and folding in Python:
# 30-70 us an event where measured (bench/PERFORMANCE.md). A millisecond an event is far
# beyond that, and grows with a configured batch size.
FOLD_ALLOWANCE_S_PER_EVENT = 0.001


async def connect(url: str, *, application_name: str | None = None,
                  idle_in_transaction_s: float = IDLE_IN_TRANSACTION_S) -> Connection:
    """A connection set up for folding: autocommit, orjson, READ COMMITTED and durable
    commits (see :func:`ledger.store.ready_to_append`), sessions in UTC, and never left idle
    inside a transaction that holds the append lock for longer than ``idle_in_transaction_s``
    (:func:`ledger.store.end_if_idle_in_transaction`; 0: no bound, for a caller that
    appends nothing and may fold for minutes between two statements).

    In UTC the driver builds datetimes with ``timezone.utc`` rather than a ``ZoneInfo``,
    which takes a fifth off reading the ledger (measured); the values are the same instants.
    """
    extra: dict[str, Any] = {"application_name": application_name} if application_name else {}
    conn = await psycopg.AsyncConnection.connect(url, autocommit=True, connect_timeout=10,
                                                 **extra)
    await ready_to_append(conn)  # its batches append discrepancies
    await end_if_idle_in_transaction(conn, idle_in_transaction_s)
    await ready_for_folding(conn)
    return conn


async def ready_for_folding(conn: Connection) -> None:
    """Set up a connection as :func:`connect` does for folding: its session in UTC, orjson.

    Folds do arithmetic on times (a chat window is 24 hours). In a session whose zone keeps
    summer time the driver builds datetimes with a ``ZoneInfo``, where adding 24 hours is
    wall-clock time (23 real hours across the spring night) and comparing two in the
    repeated autumn hour ignores which of them is the later: a reconciliation pass folding
    on its own connection stored other rows than the live projector and ``rebuild``.
    """
    if conn.info.parameter_status("TimeZone") != "UTC":
        await conn.execute("SET TimeZone = 'UTC'")
    use_fast_json(conn)


def use_fast_json(conn: Connection) -> None:
    """orjson for this connection's jsonb: safe here because facts and projection
    bookkeeping carry money as text, never as JSON numbers (orjson reads those as floats)."""
    set_json_loads(json_loads, context=conn)
    set_json_dumps(json_dumps, context=conn)


def json_loads(data: bytes | bytearray | memoryview | str) -> Any:
    """orjson, or the standard library for the jsonb orjson will not read: a number past a
    double's range, such as a provider's code that reconciliation keeps as given (jsonb
    holds it exactly). One such number in any event's facts failed the read of every
    batch from then on, stopping every projection; the standard library reads it exactly,
    as it does on connections without :func:`use_fast_json`."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(bytes(data) if isinstance(data, memoryview) else data)


def json_dumps(value: Any) -> bytes:
    """orjson, or the standard library for what orjson will not write: an integer past 64
    bits (such a code, read from an event's facts into a discrepancy's). Raised inside a
    COPY, it failed that batch every time it was retried."""
    try:
        return orjson.dumps(value)
    except TypeError:  # orjson.JSONEncodeError is a TypeError
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


@dataclass(frozen=True, slots=True)
class Statements:
    """One projection's statements in one schema, spelled once: composing them and naming
    the COPY's column types cost 0.1-0.15 ms of Python per projection and batch (measured),
    paid again on every batch of the live projector, whose batches under load hold a few
    hundred events."""

    load: str
    copy_fresh: str
    stage: str
    copy_staged: str
    upsert: str
    truncate_stage: str
    column_types: tuple[str, ...]
    json_positions: tuple[int, ...]  # the columns written as jsonb


@cache
def statements(schema: str, projection: Projection) -> Statements:
    columns = projection.columns
    table = metadata.tables[f"{PRIVATE_SCHEMA}.{projection.table}"]
    dialect = postgresql.dialect()
    target = sql.Identifier(schema, projection.table)
    stage = sql.Identifier(f"stage_{projection.table}")
    key = sql.Identifier(projection.key_column)
    names = sql.SQL(", ").join(map(sql.Identifier, columns))
    updates = sql.SQL(", ").join(
        sql.SQL("{} = EXCLUDED.{}").format(sql.Identifier(c), sql.Identifier(c))
        for c in columns if c != projection.key_column)
    copy = "COPY {} ({}) FROM STDIN (FORMAT BINARY)"
    return Statements(
        load=sql.SQL("SELECT * FROM {} WHERE {} = ANY(%s)").format(target, key).as_string(),
        copy_fresh=sql.SQL(copy).format(target, names).as_string(),
        stage=sql.SQL("CREATE TEMP TABLE IF NOT EXISTS {stage} (LIKE {table} INCLUDING "
                      "DEFAULTS)").format(stage=stage, table=target).as_string(),
        copy_staged=sql.SQL(copy).format(stage, names).as_string(),
        upsert=sql.SQL("INSERT INTO {table} ({names}) SELECT {names} FROM {stage} "
                       "ON CONFLICT ({key}) DO UPDATE SET {updates}").format(
                           table=target, names=names, stage=stage, key=key,
                           updates=updates).as_string(),
        truncate_stage=sql.SQL("TRUNCATE {}").format(stage).as_string(),
        column_types=tuple(table.c[name].type.compile(dialect=dialect).lower()
                           for name in columns),
        json_positions=tuple(i for i, c in enumerate(columns) if c in projection.json_columns))


async def load_rows(conn: Connection, schema: str, projection: Projection,
                    keys: Sequence[str]) -> dict[str, Row]:
    async with conn.cursor(row_factory=dict_row, binary=True) as cur:
        await cur.execute(statements(schema, projection).load, (list(keys),))
        return {row[projection.key_column]: row for row in await cur.fetchall()}


async def store_rows(conn: Connection, schema: str, projection: Projection,
                     rows: Sequence[Row], *, fresh: bool = False) -> None:
    """Upsert rows: binary COPY into a session staging table, then one INSERT ... SELECT.

    COPY is PostgreSQL's bulk path: rows are written in binary by the driver's C code, far
    cheaper than one parameter per value. ``fresh`` rows (the caller knows none of their
    keys has a row) are copied straight into the table.
    """
    columns = projection.columns
    spelled = statements(schema, projection)
    if not fresh:
        await conn.execute(spelled.stage)
    async with conn.cursor() as cur:
        async with cur.copy(spelled.copy_fresh if fresh else spelled.copy_staged) as copy:
            copy.set_types(spelled.column_types)
            for row in rows:
                values = list(map(row.get, columns))
                for i in spelled.json_positions:
                    if values[i] is not None:
                        values[i] = Jsonb(values[i])
                await copy.write_row(values)
        if fresh:
            return
        await cur.execute(spelled.upsert)
        await cur.execute(spelled.truncate_stage)


INTEGER_RANGES = {"integer": (-2**31, 2**31 - 1), "bigint": (-2**63, 2**63 - 1)}


@cache
def integer_columns(table: str) -> tuple[tuple[str, int, int], ...]:
    """A projection table's integer columns, each with the least and greatest value it
    holds."""
    dialect = postgresql.dialect()
    return tuple((column.name, *INTEGER_RANGES[kind])
                 for column in metadata.tables[f"{PRIVATE_SCHEMA}.{table}"].columns
                 if (kind := column.type.compile(dialect=dialect).lower()) in INTEGER_RANGES)


def check_storable(table: str, row: Row) -> None:
    """Raise ``OverflowError`` when a folded row holds an integer its column cannot.

    Such a row (a provider's code past ``integer`` in a recovered state) was written by
    the binary COPY wrapped round, silently: 9100000055 became 510065463, live and rebuilt
    alike. Checked as part of the fold, it is that event's failure alone, left out and
    reported as any event a fold cannot apply, live and in a rebuild alike."""
    for name, least, greatest in integer_columns(table):
        value = row.get(name)
        if value is not None and not least <= value <= greatest:
            raise OverflowError(f"{name} is out of range for its column")


def fold_touched(projection: Projection, touched: Sequence[tuple[str, StoredEvent]],
                 known: dict[str, Row]) -> tuple[dict[str, Row], list[Finding]]:
    """Fold each (key, event) in order into the row of that key; pure, ``known`` is kept."""
    changed: dict[str, Row] = {}
    findings: list[Finding] = []
    for key, event in touched:
        try:
            new, found = projection.fold(changed.get(key, known.get(key)), event)
            check_storable(projection.table, new)
        except (MemoryError, RecursionError):
            raise  # the machine's trouble, not the event's: retry the batch, skip nothing
        except Exception as exc:  # noqa: BLE001 - one bad event must not stall every projection
            findings.append(Finding(unprojectable(projection, key, event, exc), event))
            continue
        changed[key] = new
        if found:
            findings.extend(Finding(d, event) for d in found)
    return changed, findings


def touched_keys(projection: Projection, events: Sequence[StoredEvent]
                 ) -> tuple[list[tuple[str, StoredEvent]], list[Finding]]:
    """The (subject key, event) pairs a projection folds; an event whose keys cannot even
    be read is reported like one that cannot be folded."""
    touched: list[tuple[str, StoredEvent]] = []
    findings: list[Finding] = []
    for event in events:
        try:
            keys = projection.keys(event)
        except (MemoryError, RecursionError):
            raise
        except Exception as exc:  # noqa: BLE001 - see fold_touched
            findings.append(Finding(unprojectable(projection, "?", event, exc), event))
            continue
        for key in keys:  # most events touch no subject of a given projection: no generator
            touched.append((key, event))
    return touched, findings


def unprojectable(projection: Projection, key: str, event: StoredEvent,
                  exc: Exception) -> Discrepancy:
    """An event a fold cannot apply is left out of that projection and reported.

    Folds are pure, so the same event fails the same way in a rebuild: leaving it out keeps
    live and rebuilt projections equal, and the discrepancy tells an operator which event to
    look at, instead of the projector retrying one batch for ever.
    """
    return Discrepancy(
        kind="unprojectable_event", subject=projection.table, reference=key,
        detail=f"event {event.position} ({event.event_type}) could not be folded into "
               f"{projection.table}: {type(exc).__name__}; it was left out of that projection",
        amount_at_risk=None, evidence=(event.dedupe_key,))


async def apply_events(conn: Connection, events: Sequence[StoredEvent], *,
                       schema: str = PRIVATE_SCHEMA,
                       projections: Sequence[Projection] = PROJECTIONS,
                       buffer: ReplayBuffer | None = None,
                       past: Mapping[str, int] | None = None,
                       upto: Mapping[str, int] | None = None) -> list[Finding]:
    """Fold ``events`` into the projection tables of ``schema``; return what was found.

    Without ``buffer`` (the live projector) the rows are read and written in this call;
    with one (a replay) they are held there and written when it spills or drains. With
    ``past`` (checkpoint name -> position), a projection folds only the events after its
    own checkpoint: the checkpoints can stand apart (an older ``serve`` still leading
    after a migration added a projection moves only those it knows), and the batch read
    from the lowest of them folded the others' events twice. (A malformed delivery's
    finding may then be made again: its dedupe key keeps it one ledger event.) With
    ``upto``, a projection folds only the events up to its own position there: ``verify``
    replays each projection to its live checkpoint, wherever the others stand.
    """
    findings = [Finding(unread, event) for event in events
                if (unread := malformed_discrepancy(event)) is not None]
    for projection in projections:
        mine = events
        if past is not None and (done := past.get(projection.table)) is not None \
                and done >= events[0].position:
            mine = [event for event in events if event.position > done]
        if upto is not None and (last := upto.get(projection.table)) is not None \
                and last < events[-1].position:
            mine = [event for event in mine if event.position <= last]
        touched, unkeyed = touched_keys(projection, mine)
        findings.extend(unkeyed)
        if not touched:
            continue
        keys = sorted({key for key, _ in touched})
        if buffer is None:
            known = await load_rows(conn, schema, projection, keys)
        else:
            known, to_load = buffer.known(projection.table, keys)
            if to_load:
                known.update(await load_rows(conn, schema, projection, to_load))
        changed, found = fold_touched(projection, touched, known)
        findings.extend(found)
        if buffer is None:
            await store_changed(conn, schema, projection, changed, known)
        else:
            buffer.keep(projection.table, projection.key_column, list(changed.values()))
    if buffer is not None:
        await store_spill(conn, schema, buffer.overflow())
    return findings


async def store_changed(conn: Connection, schema: str, projection: Projection,
                        changed: dict[str, Row], known: dict[str, Row]) -> None:
    """Write a live batch's rows: those of subjects new to the projection straight in,
    the others upserted.

    A subject's first event is the common case (a payment is new once, then changes a few
    times), and copying its row straight into the table spares PostgreSQL the staging
    table and the upsert. It is safe because every writer of the projection tables holds
    the checkpoint rows' lock (``lock_checkpoint``) for its whole transaction, so no row
    can appear between ``load_rows`` and this write; if one did, the COPY would fail on
    the key and roll the batch back, never duplicate a row.
    """
    fresh = [row for key, row in changed.items() if key not in known]
    again = [row for key, row in changed.items() if key in known]
    if fresh:
        await store_rows(conn, schema, projection, fresh, fresh=True)
    if again:
        await store_rows(conn, schema, projection, again)


async def store_spill(conn: Connection, schema: str, spill: Spill) -> None:
    """Write the rows a replay buffer hands out: new ones straight in, others upserted."""
    for table, rows in spill.fresh.items():
        await store_rows(conn, schema, PROJECTIONS_BY_TABLE[table], rows, fresh=True)
    for table, rows in spill.again.items():
        await store_rows(conn, schema, PROJECTIONS_BY_TABLE[table], rows)


CHECKPOINT_NAMES = [p.table for p in PROJECTIONS]


async def lock_checkpoints(conn: Connection, *, wait_s: float | None = None) -> dict[str, int]:
    """Lock the projections' checkpoint rows for this transaction; return each position.

    With ``wait_s``, raise ``LockNotAvailable`` (the transaction is then aborted) after
    waiting that long: a rebuild holds these rows for its whole run, and a caller that must
    notice a stop asks again rather than wait for the rebuild to commit. Only this wait is
    bounded; the batch's others (the append lock for its discrepancies, NOTIFY at commit)
    last one commit of the ledger's.
    """
    if wait_s is not None:
        await conn.execute(f"SET LOCAL lock_timeout = '{max(1, round(wait_s * 1000))}ms'")
    cur = await conn.execute(
        "SELECT name, position FROM hookledger_private.projection_checkpoints "
        "WHERE name = ANY(%s) ORDER BY name FOR UPDATE", (CHECKPOINT_NAMES,))
    positions = {str(name): int(position) for name, position in await cur.fetchall()}
    if wait_s is not None:
        await conn.execute("SET LOCAL lock_timeout TO DEFAULT")
    return positions


async def lock_checkpoint(conn: Connection, *, wait_s: float | None = None) -> int:
    """Lock the checkpoint rows (see :func:`lock_checkpoints`); return the lowest position."""
    return min((await lock_checkpoints(conn, wait_s=wait_s)).values(), default=0)


async def move_checkpoint(conn: Connection, position: int,
                          names: Sequence[str] = CHECKPOINT_NAMES) -> None:
    """The projections ``names`` (every one by default) are folded up to ``position`` now;
    one already past it stays."""
    await conn.execute(
        "UPDATE hookledger_private.projection_checkpoints "
        "SET position = greatest(position, %s), updated_at = now() "
        "WHERE name = ANY(%s)", (position, list(names)))


async def project_batch(conn: Connection, *, batch_size: int = 1000, emit: bool = True,
                        projections: Sequence[Projection] = PROJECTIONS,
                        lock_wait_s: float | None = None) -> int:
    """Apply the next batch in one transaction; return how many events it held.
    ``lock_wait_s`` bounds the wait for the checkpoint (see :func:`lock_checkpoint`).

    A connection whose session is not in UTC is set up first (:func:`ready_for_folding`):
    whoever opened it, the rows folded on it are the ones every other fold would store."""
    if conn.info.parameter_status("TimeZone") != "UTC":
        await ready_for_folding(conn)
    async with conn.transaction():
        positions = await lock_checkpoints(conn, wait_s=lock_wait_s)
        # the projections folded here (one without a checkpoint row is left out, as ever)
        after = min((positions[p.table] for p in projections if p.table in positions),
                    default=0)
        events = await read_in(conn, after, batch_size, facts_only=True)
        if not events:
            return 0
        findings = await apply_events(conn, events, projections=projections,
                                      past=positions)
        # only the projections folded: another's checkpoint moved would skip these events
        await move_checkpoint(conn, events[-1].position, [p.table for p in projections])
        if emit and findings:
            now = datetime.now(UTC)
            await append_in(conn, [discrepancy_event(f, now) for f in findings])
    return len(events)


async def catch_up(conn: Connection, *, batch_size: int = 5000) -> None:
    """Project everything in the ledger now, so what is read next is current."""
    while await project_batch(conn, batch_size=batch_size):
        pass


async def checkpoints(conn: Connection) -> dict[str, int]:
    """Each projection's checkpoint, unlocked: what a snapshot of the live tables holds."""
    cur = await conn.execute(
        "SELECT name, position FROM hookledger_private.projection_checkpoints "
        "WHERE name = ANY(%s)", (CHECKPOINT_NAMES,))
    return {str(name): int(position) for name, position in await cur.fetchall()}


async def checkpoint(conn: Connection) -> int:
    cur = await conn.execute(
        "SELECT min(position) FROM hookledger_private.projection_checkpoints "
        "WHERE name = ANY(%s)", (CHECKPOINT_NAMES,))
    row = await cur.fetchone()
    return int(row[0]) if row and row[0] is not None else 0
