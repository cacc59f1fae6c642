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

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from ledger import NewEvent, StoredEvent
from ledger.jsonenc import dumps
from ledger.schema import PRIVATE_SCHEMA
from ledger.store import append_in, read_in
from projections.folding import Discrepancy
from projections.registry import PROJECTIONS, Projection, Row

Connection = psycopg.AsyncConnection[Any]
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


async def load_rows(conn: Connection, schema: str, projection: Projection,
                    keys: Sequence[str]) -> dict[str, Row]:
    query = sql.SQL("SELECT * FROM {} WHERE {} = ANY(%s)").format(
        sql.Identifier(schema, projection.table), sql.Identifier(projection.key_column))
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(query, (list(keys),))
        return {row[projection.key_column]: row for row in await cur.fetchall()}


async def store_rows(conn: Connection, schema: str, projection: Projection,
                     rows: Sequence[Row]) -> None:
    columns = projection.columns
    updates = [c for c in columns if c != projection.key_column]
    query = sql.SQL(
        "INSERT INTO {table} ({columns}) VALUES ({values}) "
        "ON CONFLICT ({key}) DO UPDATE SET {updates}"
    ).format(
        table=sql.Identifier(schema, projection.table),
        columns=sql.SQL(", ").join(map(sql.Identifier, columns)),
        values=sql.SQL(", ").join(sql.Placeholder() * len(columns)),
        key=sql.Identifier(projection.key_column),
        updates=sql.SQL(", ").join(
            sql.SQL("{} = EXCLUDED.{}").format(sql.Identifier(c), sql.Identifier(c))
            for c in updates),
    )
    params = [
        [Jsonb(row.get(c)) if c in projection.json_columns and row.get(c) is not None
         else row.get(c) for c in columns]
        for row in rows
    ]
    async with conn.cursor() as cur:
        await cur.executemany(query, params)


async def apply_events(conn: Connection, events: Sequence[StoredEvent], *,
                       schema: str = PRIVATE_SCHEMA,
                       projections: Sequence[Projection] = PROJECTIONS) -> list[Finding]:
    """Fold ``events`` into the projection tables of ``schema``; return what was found."""
    findings: list[Finding] = []
    for projection in projections:
        touched = [(key, event) for event in events for key in projection.keys(event)]
        if not touched:
            continue
        rows = await load_rows(conn, schema, projection, sorted({k for k, _ in touched}))
        changed: dict[str, Row] = {}
        for key, event in touched:
            new, found = projection.fold(changed.get(key, rows.get(key)), event)
            changed[key] = new
            findings.extend(Finding(d, event) for d in found)
        await store_rows(conn, schema, projection, list(changed.values()))
    return findings


CHECKPOINT_NAMES = [p.table for p in PROJECTIONS]


async def lock_checkpoint(conn: Connection) -> int:
    """Lock the projections' checkpoint rows for this transaction; return the position."""
    cur = await conn.execute(
        "SELECT min(position) FROM (SELECT position FROM hookledger_private."
        "projection_checkpoints WHERE name = ANY(%s) ORDER BY name FOR UPDATE) AS locked",
        (CHECKPOINT_NAMES,))
    row = await cur.fetchone()
    return int(row[0]) if row and row[0] is not None else 0


async def move_checkpoint(conn: Connection, position: int) -> None:
    await conn.execute(
        "UPDATE hookledger_private.projection_checkpoints SET position = %s, updated_at = now() "
        "WHERE name = ANY(%s)", (position, CHECKPOINT_NAMES))


async def project_batch(conn: Connection, *, batch_size: int = 1000, emit: bool = True,
                        projections: Sequence[Projection] = PROJECTIONS) -> int:
    """Apply the next batch in one transaction; return how many events it held."""
    async with conn.transaction():
        after = await lock_checkpoint(conn)
        events = await read_in(conn, after, batch_size, facts_only=True)
        if not events:
            return 0
        findings = await apply_events(conn, events, projections=projections)
        await move_checkpoint(conn, events[-1].position)
        if emit and findings:
            now = datetime.now(UTC)
            await append_in(conn, [discrepancy_event(f, now) for f in findings])
    return len(events)


async def checkpoint(conn: Connection) -> int:
    cur = await conn.execute(
        "SELECT min(position) FROM hookledger_private.projection_checkpoints "
        "WHERE name = ANY(%s)", (CHECKPOINT_NAMES,))
    row = await cur.fetchone()
    return int(row[0]) if row and row[0] is not None else 0
