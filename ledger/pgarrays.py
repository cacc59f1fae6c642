"""One-dimensional PostgreSQL arrays in their binary wire format, packed once per batch.

An append binds each column of a batch as one array (``ledger/sql/append.sql``). Given
Python lists, psycopg walks every list to choose an element type, builds a dumper for it and
dumps element by element through its generic machinery: on the 2-core machine that was
about 300 us of a worker's CPU per append statement whatever the batch's size, the largest
cost of a lone delivery's append. The columns' types are known, so each is packed here
directly (header, then each element's length and bytes) and handed to psycopg as ready
binary data under the array's type.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import psycopg
from psycopg import postgres
from psycopg.adapt import Dumper
from psycopg.pq import Format

_TEXT, _BYTEA, _TIMESTAMPTZ, _UUID = (
    postgres.types[name] for name in ("text", "bytea", "timestamptz", "uuid"))
_HEADER = struct.Struct("!iiiii")  # dimensions, has-null flag, element type, length, lower bound
_LENGTH = struct.Struct("!i")
_MICROSECONDS = struct.Struct("!q")
_NULL = _LENGTH.pack(-1)
_POSTGRES_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
_ONE_MICROSECOND = timedelta(microseconds=1)


class PackedArray(bytes):
    """A packed array: its bytes are the binary value psycopg sends."""

    __slots__ = ()


class TextArray(PackedArray):
    __slots__ = ()


class ByteaArray(PackedArray):
    __slots__ = ()


class TimestamptzArray(PackedArray):
    __slots__ = ()


class UuidArray(PackedArray):
    __slots__ = ()


def _packed(element_oid: int, encoded: Sequence[bytes | None]) -> bytes:
    parts = [b""]
    has_null = 0
    for value in encoded:
        if value is None:
            has_null = 1
            parts.append(_NULL)
        else:
            parts.append(_LENGTH.pack(len(value)))
            parts.append(value)
    parts[0] = _HEADER.pack(1, has_null, element_oid, len(encoded), 1)
    return b"".join(parts)


def text_array(values: Sequence[str | None]) -> TextArray:
    return TextArray(_packed(_TEXT.oid, [None if v is None else v.encode() for v in values]))


def bytea_array(values: Sequence[bytes | None]) -> ByteaArray:
    return ByteaArray(_packed(_BYTEA.oid, values))


def timestamptz_array(values: Sequence[datetime | None]) -> TimestamptzArray:
    """Timezone-aware times only: a naive one has no instant, and is refused here."""
    encoded: list[bytes | None] = []
    for value in values:
        if value is None:
            encoded.append(None)
            continue
        if value.utcoffset() is None:
            raise ValueError(f"a naive datetime has no instant: {value!r}")
        encoded.append(_MICROSECONDS.pack((value - _POSTGRES_EPOCH) // _ONE_MICROSECOND))
    return TimestamptzArray(_packed(_TIMESTAMPTZ.oid, encoded))


def uuid_array(values: Sequence[bytes]) -> UuidArray:
    """UUIDs given as their 16 bytes each (``UUID.bytes``)."""
    if any(len(value) != 16 for value in values):
        raise ValueError("a UUID is 16 bytes")
    return UuidArray(_packed(_UUID.oid, values))


class _PackedDumper(Dumper):
    format = Format.BINARY

    def dump(self, obj: bytes) -> bytes:
        return obj


class _TextArrayDumper(_PackedDumper):
    oid = _TEXT.array_oid


class _ByteaArrayDumper(_PackedDumper):
    oid = _BYTEA.array_oid


class _TimestamptzArrayDumper(_PackedDumper):
    oid = _TIMESTAMPTZ.array_oid


class _UuidArrayDumper(_PackedDumper):
    oid = _UUID.array_oid


def register() -> None:
    """Teach psycopg's global adapters, and so every connection made after, to send packed
    arrays."""
    for kind, dumper in ((TextArray, _TextArrayDumper), (ByteaArray, _ByteaArrayDumper),
                         (TimestamptzArray, _TimestamptzArrayDumper),
                         (UuidArray, _UuidArrayDumper)):
        psycopg.adapters.register_dumper(kind, dumper)
