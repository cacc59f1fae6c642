"""JSON text for events hookledger writes itself: Decimals exact (as strings), times ISO."""

from __future__ import annotations

import json
from datetime import date, datetime
from decimal import Decimal, InvalidOperation
from typing import Any
from uuid import UUID

import orjson


def _default(value: Any) -> Any:
    if isinstance(value, Decimal):
        return format(value, "f")
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, UUID):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def dump_bytes(value: Any) -> bytes:
    """Serialise deterministically (sorted keys, no spaces, UTF-8) so equal content gives
    equal bytes: the standard library's ``sort_keys=True, separators=(",", ":"),
    ensure_ascii=False`` spelling.

    orjson does it about ten times faster (this runs for every delivery); what it refuses
    (an integer past 64 bits, a non-string key) takes the standard library's way.
    """
    try:
        return orjson.dumps(value, default=_default, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # orjson.JSONEncodeError is a TypeError
        return json.dumps(value, default=_default, sort_keys=True, separators=(",", ":"),
                          ensure_ascii=False, allow_nan=False).encode("utf-8")


def dumps(value: Any) -> str:
    """:func:`dump_bytes` as text."""
    return dump_bytes(value).decode("utf-8")


def jsonb_can_hold(text: str) -> bool:
    """False for text ``jsonb`` refuses: a NUL character, or a lone surrogate (not UTF-8).
    One such string fails the whole statement it is in, every event of it with it."""
    if "\x00" in text:
        return False
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def jsonb_safe(text: str) -> str:
    """``text`` with what ``jsonb`` refuses written as escapes (``\\u0000``, ``\\ud800``):
    for free text from outside (an API's message) kept in an event as information."""
    if jsonb_can_hold(text):
        return text
    return text.replace("\x00", "\\u0000").encode("utf-8", "backslashreplace").decode("utf-8")


def decimal_or_text(text: str) -> Decimal | str:
    """A JSON number as a ``Decimal`` (a reader's ``parse_float``), or its text when its
    exponent is past ``Decimal``'s range (``1e99999999999999999999``): ``InvalidOperation``
    is no ``ValueError``, and escaped the readers that expected one. Whatever needs the
    number then finds text where it wants one, and says so."""
    try:
        return Decimal(text)
    except InvalidOperation:
        return text
