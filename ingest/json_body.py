"""Strict JSON for delivery bodies.

Everything here raises a :class:`BodyError` with a reason rather than returning something
``jsonb`` would reject (NUL characters, lone surrogates, numbers beyond ``numeric``), which
would otherwise fail a whole append batch. Bodies that are JSON objects all the same are
then kept by their raw bytes (:mod:`ingest.unstorable`); the rest are refused. Numbers are
parsed as ``int``/``Decimal``, never ``float``: money stays exact.
"""

from __future__ import annotations

import json
from decimal import MAX_EMAX, MAX_PREC, MIN_EMIN, Context, Decimal, InvalidOperation
from typing import Any

from ingest.errors import BodyError
from ingest.json_syntax import check_one_object
from ledger.jsonenc import jsonb_can_hold

MAX_DEPTH = 32
MAX_NUMBER_EXPONENT = 1000  # far beyond money, far inside PostgreSQL numeric
MAX_NUMBER_DIGITS = MAX_NUMBER_EXPONENT + 1  # an integer's digits (and sign) read as text


def _reject_constant(name: str) -> Any:
    raise BodyError("invalid_json", f"{name} is not JSON")


def object_of_distinct_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose every key is named once (``object_pairs_hook``); a key named
    twice is a :class:`BodyError` (``duplicate_json_key``): read with its last value, which
    of the two the sender meant would be a guess."""
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise BodyError("duplicate_json_key", f"key {key[:64]!r} appears twice")
        result[key] = value
    return result


def _decimal(text: str) -> Decimal:
    """The reader has checked the number's syntax; ``Decimal`` still refuses an exponent
    past its own range (``1e99999999999999999999``): that is a number out of range, in a
    body that may be a JSON object all the same, never invalid JSON (a 400 lost a signed
    delivery)."""
    try:
        return Decimal(text)
    except InvalidOperation as exc:
        raise BodyError("number_out_of_range", "a number is out of range") from exc


# every digit kept: the default context rounds to 28, and two amounts differing in the
# 29th digit had one dedupe key (the second delivery answered as a duplicate, not kept)
_EXACT = Context(prec=MAX_PREC, Emax=MAX_EMAX, Emin=MIN_EMIN)


def number_text(value: int | Decimal) -> str:
    """One spelling per numeric value, exactly: ``1000``, ``1000.00`` and ``1E+3`` agree.
    Dedupe keys hash it: numbers of up to 28 digits read as they always did."""
    return format(Decimal(value).normalize(_EXACT), "f")


def whole_number(value: Any, digits: int | None = None) -> Any:
    """``value`` as an ``int`` when it is a number with a zero fraction (``91055.0``: JSON
    has one number type, and JSON Schema reads it as the integer it spells) of fewer than
    ``digits`` digits before the point; anything else as it is, for the caller to judge."""
    if isinstance(value, Decimal) and value.is_finite() \
            and value == value.to_integral_value() \
            and (digits is None or value.adjusted() < digits):
        return int(value)
    return value


def plain_zero(zero: Decimal, places: int) -> Decimal:
    """A zero as spelled (``0.00``) within ``places`` decimal places, else plain ``0``: its
    exponent says nothing, and ``0E-20000`` handed on as 20,000 places fails a ``numeric``
    column, the projector's every batch with it. Never ``-0`` (JSON allows it): no amount
    is below zero, and kept, ``-0`` beside ``0`` read as two confirmed amounts."""
    exponent = zero.as_tuple().exponent
    return (zero.copy_abs() if isinstance(exponent, int) and -places <= exponent <= 0
            else Decimal(0))


def _integer(text: str) -> int:
    """An integer, refused as out of range past :data:`MAX_NUMBER_DIGITS` digits before
    ``int()`` sees it (Python's own limit is a ``ValueError`` that read as invalid JSON)."""
    if len(text) > MAX_NUMBER_DIGITS:
        raise BodyError("number_out_of_range", "a number is out of range")
    return int(text)


def _check(value: Any, depth: int, texts: bool = True) -> None:
    """Depth, numbers, and (with ``texts``) every string and key, as jsonb needs them."""
    if depth > MAX_DEPTH:
        raise BodyError("too_deep", f"nested deeper than {MAX_DEPTH}")
    if isinstance(value, str):
        if texts:
            check_text(value)
    elif isinstance(value, dict):
        for key, item in value.items():
            if texts:
                check_text(key)
            _check(item, depth + 1, texts)
    elif isinstance(value, list):
        for item in value:
            _check(item, depth + 1, texts)
    elif isinstance(value, Decimal):
        # its magnitude, and its decimal places: numeric holds at most 16,383 of those, and
        # 1500.000... with 17,000 zeros is small but was refused by the database (a 503)
        if not value.is_finite() or abs(value.adjusted()) > MAX_NUMBER_EXPONENT \
                or value.as_tuple().exponent < -MAX_NUMBER_EXPONENT:  # type: ignore[operator]
            raise BodyError("number_out_of_range", "a number is out of range")
    elif isinstance(value, int) and not isinstance(value, bool):
        if value.bit_length() > 3 * MAX_NUMBER_EXPONENT:
            raise BodyError("number_out_of_range", "a number is out of range")


def check_text(text: str) -> None:
    """Refuse text ``jsonb`` cannot hold: a NUL character or a lone surrogate."""
    if jsonb_can_hold(text):
        return
    if "\x00" in text:
        raise BodyError("nul_character", "a string holds a NUL character")
    raise BodyError("invalid_unicode", "a string holds a lone surrogate")


# One decoder for every body: json.loads with hooks builds a new one per call, a sixth of
# a 1 KB body's parse (measured). It keeps no state between calls.
_DECODER = json.JSONDecoder(object_pairs_hook=object_of_distinct_keys, parse_float=_decimal,
                            parse_int=_integer, parse_constant=_reject_constant)


# Reasons the decoder's hooks give as soon as they meet the key or number, before the rest of
# the body is read: they describe a JSON object jsonb cannot hold (ingest.unstorable), which
# is kept, so they stand only once the whole body is known to be one.
_FOUND_MID_PARSE = frozenset({"duplicate_json_key", "number_out_of_range"})


def _lenient_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _whole_object(text: str) -> None:
    """Raise why ``text`` is not one JSON object, read leniently (a repeated key's last
    value, numbers as text); return when it is one."""
    try:
        value = json.loads(text, parse_int=str, parse_float=str,
                           parse_constant=_lenient_constant)
    except RecursionError:
        check_one_object(text)  # nested past the reader's own depth: read without it
        return
    except ValueError as exc:
        raise BodyError("invalid_json", str(exc).split(":")[0][:200]) from None
    if not isinstance(value, dict):
        raise BodyError("not_an_object", f"the body is a JSON {type(value).__name__}")


def parse_object(raw: bytes) -> tuple[dict[str, Any], str]:
    """Parse a body that must be one JSON object; return it and the body as text."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BodyError("invalid_utf8", f"not UTF-8 at byte {exc.start}") from exc
    # one byte order mark may be ignored (RFC 8259, 8.1); refused, a signed delivery the
    # general system never sends again was lost over it (the raw body keeps it)
    text = text.removeprefix("\ufeff")
    if text.startswith("\ufeff"):  # as json.loads would say; the decoder alone would not
        raise BodyError("invalid_json", "Unexpected UTF-8 BOM (decode using utf-8-sig)")
    try:
        value = _DECODER.decode(text)
    except BodyError as exc:
        if exc.reason in _FOUND_MID_PARSE:
            _whole_object(text)
        raise
    except RecursionError as exc:
        check_one_object(text)  # the rest must still be one object for it to be kept
        raise BodyError("too_deep", "nested too deeply") from exc
    except ValueError as exc:  # JSONDecodeError, and ints past Python's digit limit
        raise BodyError("invalid_json", str(exc).split(":")[0][:200]) from exc
    if not isinstance(value, dict):
        raise BodyError("not_an_object", f"the body is a JSON {type(value).__name__}")
    # a NUL or a lone surrogate reaches a string only as a \u escape: strict JSON refuses
    # a raw control character, and the UTF-8 codec an encoded surrogate
    _check(value, 1, texts="\\u" in text)
    return value, text
