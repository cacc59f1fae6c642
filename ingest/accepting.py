"""The end both endpoints share: a verified delivery's reading appended, counted, logged,
and answered.

The two systems differ in how a delivery is verified and read, not in what follows: the
reading becomes one ledger event beside what the request gave it (raw bytes, headers,
endpoint, the secret that verified it), the append keeps a body the database refuses as
unstorable rather than answer 503, and the answer says accepted, duplicate or spooled.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import structlog
from starlette.responses import Response

from ingest import responses
from ingest.chat_body import SOURCE as CHAT_SOURCE
from ingest.chat_body import DeliveryMeta, unstorable_chat
from ingest.errors import BodyError
from ingest.general_body import unstorable_general
from ingest.metrics import IngestMetrics, SystemOutcomes
from ingest.unstorable import (
    DeliveryT,
    Reading,
    append_keeping_refused,
    placeholder_payload,
    refused_by_database,
)
from ledger import AppendResult, LedgerError, NewEvent

log = structlog.get_logger("hookledger.ingest")


@dataclass(frozen=True, slots=True)
class Envelope:
    """What the request, not the body, gives a delivery's ledger event."""

    source: str
    received_at: datetime
    raw_body: bytes
    headers: Mapping[str, str]
    endpoint: str
    verified_by: str

    def event(self, delivery: DeliveryT, text: str) -> NewEvent:
        """The ledger event of ``delivery`` (read from this envelope's body) with ``text``
        as its payload."""
        return NewEvent(
            stream=delivery.stream,
            event_type=delivery.event_type,
            source=self.source,
            dedupe_key=delivery.dedupe_key,
            payload_json=text,
            received_at=self.received_at,
            facts=delivery.facts,
            occurred_at=delivery.occurred_at,
            raw_body=self.raw_body,
            headers=self.headers,
            endpoint=self.endpoint,
            verified_by=self.verified_by,
        )


async def append_and_answer(
        append: Callable[[NewEvent], Awaitable[AppendResult]], envelope: Envelope,
        delivery: DeliveryT, text: str, kept_as: Callable[[BodyError], DeliveryT], *,
        metrics: IngestMetrics, outcomes: SystemOutcomes) -> Response | responses.Accepted:
    """Append the delivery and answer: 200 once it is durable (in the ledger or the
    spool), 503 when neither could take it."""
    started = time.perf_counter()
    try:
        result = await append_keeping_refused(append, envelope.event, delivery, text, kept_as)
    except LedgerError as exc:
        log.error("delivery.unavailable", error=str(exc))
        return responses.unavailable()
    metrics.append_seconds.observe(time.perf_counter() - started)
    if result.spooled:
        outcomes.spooled.inc()
        log.warning("delivery.spooled", reason="ledger unavailable; durable on local disk")
    elif result.duplicate:
        outcomes.duplicates.inc()
        log.info("delivery.duplicate", position=result.position)
    else:
        outcomes.accepted.inc()
        log.info("delivery.accepted", position=result.position,
                 recognised=delivery.facts["recognised"])
    return responses.accepted(result)


def kept_unstorable(event: NewEvent, error: Exception) -> NewEvent | None:
    """What :func:`append_keeping_refused` appends when the database refuses ``event`` for
    itself, made from the event alone: for a spooled delivery the database refuses only when
    the spool drains. Quarantined instead, it was in no view and no discrepancy, though
    answered 200 and never sent again. None when it cannot be kept so: no raw bytes,
    already unstorable (as a direct append, it is not kept twice), or neither system's.
    """
    raw = event.raw_body
    if raw is None or event.facts.get("unstorable"):
        return None
    refused = refused_by_database(error)
    kept: Reading
    if event.source == "general":
        kept = unstorable_general(raw, refused)
    elif event.source == CHAT_SOURCE:
        try:
            kept = unstorable_chat(raw, _chat_meta(event.facts), refused)
        except BodyError:  # a body naming another number: refused when read, never here
            return None
    else:
        return None
    return dataclasses.replace(
        event, stream=kept.stream, event_type=kept.event_type, dedupe_key=kept.dedupe_key,
        payload_json=placeholder_payload(refused), facts=kept.facts,
        occurred_at=kept.occurred_at)


def _chat_meta(facts: Mapping[str, Any]) -> DeliveryMeta:
    """The request's side of a chat delivery, as its reading kept it in ``facts``."""
    return DeliveryMeta(phone_number_id=str(facts.get("phone_number_id") or ""),
                        delivery_id=facts.get("delivery_id"), attempt=facts.get("attempt"),
                        user_agent=facts.get("user_agent"),
                        delivery_id_unusable=bool(facts.get("delivery_id_unusable")))
