"""Exact JSON for money: ``Decimal`` is written as a JSON number digit for digit.

The standard encoder refuses ``Decimal`` and a float would round it; the provider sends
exact numbers, so the sandbox must too. Pure; compact separators; key order kept (the
bytes are signed, so they must be reproducible).
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any


def dumps(value: Any) -> str:
    """JSON text for dicts, lists, str, int, Decimal, bool and None (no floats: they round)."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise ValueError("a money amount must be finite")
        return format(value, "f")
    if isinstance(value, dict):
        return "{" + ",".join(f"{dumps(str(k))}:{dumps(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(dumps(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} as exact JSON")


def encode(value: Any) -> bytes:
    """UTF-8 bytes of :func:`dumps` (what is signed and sent)."""
    return dumps(value).encode("utf-8")


def loads(text: str | bytes) -> Any:
    """Parse JSON keeping non-integer numbers exact."""
    return json.loads(text, parse_float=Decimal)
