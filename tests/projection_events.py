"""Ledger events for projection tests, built the way ingest builds them (real reading)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from itertools import count
from typing import Any
from uuid import uuid4
from zoneinfo import ZoneInfo

from ingest.general_body import GeneralDelivery, read_general, read_general_or_malformed
from ingest.json_body import parse_object
from ledger import NewEvent, StoredEvent
from tests.general_events import general_body

EAT = ZoneInfo("Africa/Dar_es_Salaam")
_positions = count(1)


def new_event(event: str, code: int, **kwargs: Any) -> NewEvent:
    """A general delivery read by the real ingest code, ready to append; a body that cannot
    be read raises (a mistake in a test shows, rather than becoming a malformed event)."""
    raw = json.dumps(general_body(event, code, **kwargs)).encode()
    return _appendable(raw, read_general(parse_object(raw)[0], EAT))


def kept_event(event: str, code: int, **kwargs: Any) -> NewEvent:
    """As ingest keeps it: read, or ``general.malformed`` when its fields cannot be read."""
    raw = json.dumps(general_body(event, code, **kwargs)).encode()
    return _appendable(raw, read_general_or_malformed(parse_object(raw)[0], EAT))


def restamped(new: NewEvent, timestamp: str) -> NewEvent:
    """The same body the provider sent again (a repeated callback) stamped ``timestamp``:
    another ledger event, since ``timestamp`` is part of the dedupe key."""
    body = json.loads(new.payload_json)
    raw = json.dumps({**body, "timestamp": timestamp}).encode()
    return _appendable(raw, read_general(parse_object(raw)[0], EAT))


def _appendable(raw: bytes, read: GeneralDelivery) -> NewEvent:
    text = raw.decode()
    return NewEvent(stream=read.stream, event_type=read.event_type, source="general",
                    dedupe_key=read.dedupe_key, payload_json=text,
                    received_at=datetime.now(UTC), facts=read.facts,
                    occurred_at=read.occurred_at, raw_body=raw)


def stored(new: NewEvent, position: int | None = None) -> StoredEvent:
    """The same event as the ledger would hand it to a fold (no database needed)."""
    now = datetime.now(UTC)
    return StoredEvent(position=position or next(_positions), event_id=uuid4(),
                       stream=new.stream, event_type=new.event_type, source=new.source,
                       dedupe_key=new.dedupe_key, payload=None,
                       facts=json.loads(json.dumps(dict(new.facts))), received_at=now,
                       recorded_at=now, occurred_at=new.occurred_at, raw_body=None,
                       headers={}, endpoint=None, verified_by=None)
