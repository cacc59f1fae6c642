"""Records that cross the ledger's boundary, as frozen dataclasses."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID


@dataclass(frozen=True, slots=True)
class NewEvent:
    """An event to append.

    ``payload_json`` is JSON text: for a delivery, the body exactly as the provider sent
    it (PostgreSQL's jsonb keeps its numbers exact); for events hookledger makes itself,
    text from :func:`ledger.jsonenc.dumps`. ``dedupe_key`` is unique across the ledger: an
    append whose key is already there is a duplicate and adds nothing.
    """

    stream: str
    event_type: str
    source: str
    dedupe_key: str
    payload_json: str
    received_at: datetime
    facts: Mapping[str, Any] = field(default_factory=dict)
    occurred_at: datetime | None = None
    raw_body: bytes | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    endpoint: str | None = None
    verified_by: str | None = None


@dataclass(frozen=True, slots=True)
class AppendResult:
    """Where an appended event stands, and whether it was already there."""

    position: int
    duplicate: bool
    spooled: bool = False  # durable in the local spool, not yet in the ledger (position 0)


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """An event as the ledger holds it."""

    position: int
    event_id: UUID
    stream: str
    event_type: str
    source: str
    dedupe_key: str
    payload: Any
    facts: Mapping[str, Any]
    received_at: datetime
    recorded_at: datetime
    occurred_at: datetime | None
    raw_body: bytes | None
    headers: Mapping[str, str]
    endpoint: str | None
    verified_by: str | None
