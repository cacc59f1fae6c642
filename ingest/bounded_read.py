"""An HTTP answer's body read to a bound, its ``Content-Encoding`` undone within that bound.

httpx undoes every encoding layer of a chunk in full before a caller sees it: one 64 KiB
chunk of gzip is up to about 64 MiB, and a second layer (``Content-Encoding: gzip, gzip``)
multiplies again, so 600 bytes on the wire became 256 MiB in memory at once, whatever bound
the caller counted against afterwards. Here the raw bytes are read and each layer is
undone with zlib's ``max_length``: no layer ever gives more than about the bound.

Only what :data:`ACCEPT_ENCODING` asks for is undone (and ``x-gzip``, ``identity``); any
other encoding, or more than :data:`MAX_LAYERS` of them, is an :class:`httpx.DecodingError`,
as a body that is not what its label says is: read as it is, a media would be stored
still encoded.
"""

from __future__ import annotations

import zlib

import httpx

ACCEPT_ENCODING = "gzip, deflate"  # never br or zstd, which httpx adds when installed
MAX_LAYERS = 3
_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS,
          "deflate": zlib.MAX_WBITS}


class _TooLarge(Exception):
    pass


class _Layer:
    """One encoding undone, its output bounded. Deflate comes zlib-wrapped or raw (servers
    send both, and httpx reads both): its first two bytes say which."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._inflate = zlib.decompressobj(_WBITS[name]) if name != "deflate" else None
        self._head = b""

    def undo(self, data: bytes, room: int) -> bytes:
        """``data`` decoded, never past ``room`` bytes (:class:`_TooLarge` beyond)."""
        if self._inflate is None:
            self._head += data
            if len(self._head) < 2:
                return b""
            data, self._head = self._head, b""
            self._inflate = zlib.decompressobj(
                zlib.MAX_WBITS if zlib_wrapped(data) else -zlib.MAX_WBITS)
        try:
            out = self._inflate.decompress(data, room + 1)
        except zlib.error as exc:
            raise httpx.DecodingError(f"not {self._name}: {exc}") from None
        if self._inflate.unconsumed_tail or len(out) > room:
            raise _TooLarge
        return out

    def rest(self, room: int) -> bytes:
        if self._inflate is None:  # a deflate body of under two bytes is none
            if self._head:
                raise httpx.DecodingError(f"not {self._name}: too short")
            return b""
        try:
            out = self._inflate.flush()
        except zlib.error as exc:
            raise httpx.DecodingError(f"not {self._name}: {exc}") from None
        if len(out) > room:
            raise _TooLarge
        return out


def zlib_wrapped(head: bytes) -> bool:
    """Whether a deflate body begins with a zlib header (RFC 1950: method 8, a check
    making the first two bytes a multiple of 31), not raw deflate. Pure."""
    return head[0] & 0x0F == 8 and (head[0] << 8 | head[1]) % 31 == 0


def layers_of(response: httpx.Response) -> list[_Layer]:
    """The decoders for ``response``, outermost first (the header lists them as applied)."""
    names = [value.strip().lower() for value in
             response.headers.get_list("content-encoding", split_commas=True)]
    names = [name for name in names if name and name != "identity"]
    unknown = sorted({name for name in names if name not in _WBITS})
    if unknown:
        raise httpx.DecodingError(f"unsupported content encoding {unknown[0][:40]!r}")
    if len(names) > MAX_LAYERS:
        raise httpx.DecodingError(f"more than {MAX_LAYERS} content encodings")
    return [_Layer(name) for name in reversed(names)]


def inner_bound(limit: int) -> int:
    """What a layer with another inside it may give: a little over ``limit``, since an
    encoding of content that does not compress is a little longer than the content. Pure."""
    return limit + limit // 64 + 1024


class _Counted:
    """Every layer's output so far, the innermost's within ``limit``, the others' within
    :func:`inner_bound`."""

    def __init__(self, layers: list[_Layer], limit: int) -> None:
        self._layers = layers
        self._bounds = [inner_bound(limit)] * (len(layers) - 1) + [limit]
        self._sizes = [0] * len(layers)

    def _room(self, index: int) -> int:
        return self._bounds[index] - self._sizes[index]

    def feed(self, data: bytes) -> bytes:
        for index, layer in enumerate(self._layers):
            data = layer.undo(data, self._room(index))
            self._sizes[index] += len(data)
        return data

    def finish(self) -> bytes:
        """What the layers still hold, each passed through the ones inside it."""
        tail = b""
        for index, layer in enumerate(self._layers):
            if tail:
                tail = layer.undo(tail, self._room(index))
                self._sizes[index] += len(tail)
            rest = layer.rest(self._room(index))
            self._sizes[index] += len(rest)
            tail += rest
        return tail


async def read_at_most(response: httpx.Response, limit: int) -> bytes | None:
    """The decoded body of a streamed ``response``, or None as soon as it (or any layer of
    its encoding) passes ``limit`` bytes; a declared length over it is refused unread.
    Raises :class:`httpx.DecodingError` for a body its encoding does not fit."""
    declared = response.headers.get("content-length", "")
    if declared.isascii() and declared.isdigit() and int(declared) > limit:
        return None
    counted = _Counted(layers_of(response), limit)
    chunks: list[bytes] = []
    size = 0
    try:
        async for raw in response.aiter_raw():
            chunk = counted.feed(raw)
            size += len(chunk)
            if size > limit:
                return None
            chunks.append(chunk)
        chunk = counted.finish()
    except _TooLarge:
        return None
    if size + len(chunk) > limit:
        return None
    chunks.append(chunk)
    return b"".join(chunks)
