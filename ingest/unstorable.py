"""Signed JSON objects that strict reading refuses but that must still be kept.

A body with a key twice, a NUL or a lone surrogate in a string (a name cut in the middle of
an emoji), nesting past :data:`ingest.json_body.MAX_DEPTH` or a number beyond ``numeric``
is still a JSON object the provider signed. PostgreSQL ``jsonb`` cannot hold it as it is,
so it used to be refused with a 400, and the general system never sends a delivery again.

Such a body is kept as its system's malformed event: the raw bytes exactly, a placeholder
payload saying why there is no ``jsonb`` copy, facts read leniently from what can be read
(only text ``jsonb`` can hold), and a key from the raw bytes. The projector reports it as a
``malformed_delivery`` and reconciliation asks the provider about its reference.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime
from decimal import Decimal
from typing import Any, Protocol, TypeVar

import structlog

from ingest.errors import BodyError
from ingest.json_body import check_text
from ledger.errors import LedgerError, LedgerUnavailable
from ledger.jsonenc import decimal_or_text, dumps
from ledger.records import AppendResult, NewEvent

log = structlog.get_logger("hookledger.ingest")

# strict-reading reasons for a body that is a JSON object all the same
UNSTORABLE_REASONS = frozenset({"duplicate_json_key", "nul_character", "invalid_unicode",
                                "too_deep", "number_out_of_range"})


def is_unstorable(error: BodyError) -> bool:
    return error.reason in UNSTORABLE_REASONS


def lenient_object(raw: bytes) -> dict[str, Any]:
    """What Python's own reader makes of the body (the last of duplicate keys wins), or
    an empty object when even that fails: only used to find a reference to file it under.
    One byte order mark before the object is passed over, as strict reading passes it."""
    try:
        value = json.loads(raw.decode("utf-8").removeprefix("\ufeff"),
                           parse_float=decimal_or_text, parse_int=_integer)
    except (ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


def _integer(text: str) -> int | Decimal:
    """An ``int`` as strict reading gives (a number-typed id compares as one), or a
    ``Decimal`` past the digits Python's ``int()`` accepts."""
    return int(text) if len(text) <= 4000 else Decimal(text)


def storable_text(value: Any, limit: int) -> str | None:
    """``value`` if it is non-blank text of at most ``limit`` characters that ``jsonb`` can
    hold (no NUL, no lone surrogate); else None."""
    if not isinstance(value, str) or not value.strip() or len(value) > limit:
        return None
    try:
        check_text(value)
    except BodyError:
        return None
    return value


def raw_digest(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()


def refused_by_database(error: Exception) -> BodyError:
    """Why a verified event strict reading took was still refused by the database: kept as
    unstorable too, since the sender will not send it again (general) or only the same."""
    return BodyError("refused_by_database", str(error)[:200])


class Reading(Protocol):
    """A verified delivery as either system reads it (``GeneralDelivery``,
    ``ChatDelivery``): what its ledger event takes from the body."""

    @property
    def event_type(self) -> str: ...
    @property
    def stream(self) -> str: ...
    @property
    def dedupe_key(self) -> str: ...
    @property
    def occurred_at(self) -> datetime | None: ...
    @property
    def facts(self) -> Mapping[str, Any]: ...


DeliveryT = TypeVar("DeliveryT", bound=Reading)


async def append_keeping_refused(
        append: Callable[[NewEvent], Awaitable[AppendResult]],
        event_of: Callable[[DeliveryT, str], NewEvent], delivery: DeliveryT, text: str,
        kept_as: Callable[[BodyError], DeliveryT]) -> AppendResult:
    """Append ``event_of(delivery, text)``; should the database refuse that one event (not
    be away), keep the signed bytes as unstorable (``kept_as``) rather than answer 503."""
    try:
        return await append(event_of(delivery, text))
    except LedgerUnavailable:
        raise
    except LedgerError as exc:
        if delivery.facts.get("unstorable"):
            raise
        refused = refused_by_database(exc)
        log.error("delivery.refused_by_database", error=refused.detail)
        try:
            kept = kept_as(refused)
        except BodyError:
            raise exc from None
        return await append(event_of(kept, placeholder_payload(refused)))


def placeholder_payload(error: BodyError) -> str:
    """The ``payload`` of a kept body ``jsonb`` cannot hold; the body is in ``raw_body``."""
    return dumps({"unstorable": True, "reason": error.reason, "detail": error.detail,
                  "see": "raw_body"})
