"""JSON text for events hookledger writes itself: Decimals exact (as strings), times ISO."""

from __future__ import annotations

import json
from datetime import date, datetime
from decimal import Decimal
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
