"""Reading a request body without ever holding more than the limit."""

from __future__ import annotations

import asyncio

from starlette.types import Receive

from ingest.errors import BodyIncomplete, BodyTooLarge, BodyTooSlow
from ingest.incoming import DeliveryRequest, ready_body

BODY_TIMEOUT_S = 10.0
# what a refusal for size keeps of the body (its unverified prefix: rejections.py)
HEAD_BYTES = 1024
HEAD_WAIT_S = 1.0


async def read_limited(request: DeliveryRequest, limit: int,
                       timeout_s: float = BODY_TIMEOUT_S, *,
                       head_bytes: int = HEAD_BYTES) -> bytes:
    """The whole body, or :class:`BodyTooLarge` as soon as it passes ``limit`` bytes, or
    :class:`BodyTooSlow` when it has not all arrived after ``timeout_s``, or
    :class:`BodyIncomplete` when the client goes away first.

    A declared ``Content-Length`` over the limit is refused after reading at most its first
    ``head_bytes`` (kept with the refusal); a client trickling its body cannot hold a
    request (and its memory) open for ever.
    """
    declared = request.headers.get("content-length")
    if declared is not None and declared.isascii() and declared.isdigit() \
            and int(declared) > limit:
        raise BodyTooLarge("body_too_large", f"declared {declared} bytes, limit {limit}",
                           await _head(request, head_bytes, min(timeout_s, HEAD_WAIT_S)),
                           int(declared))
    body = ready_body(request)
    if body is not None:  # all there already: nothing to wait for, nothing to time
        if len(body) > limit:
            raise BodyTooLarge("body_too_large", f"more than {limit} bytes",
                               body[:head_bytes], len(body))
        return body
    try:
        async with asyncio.timeout(timeout_s):
            return await _read(request.receive, limit, head_bytes)
    except TimeoutError as exc:
        raise BodyTooSlow("body_timeout", f"body not received within {timeout_s:g} s") from exc


async def _read(receive: Receive, limit: int, head_bytes: int) -> bytes:
    """The ASGI ``http.request`` messages' bodies, joined; a client that goes away first is
    :class:`BodyIncomplete` with what it sent (an exception nobody caught, answered 500 and
    recorded nowhere, before)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise BodyIncomplete("client_disconnected",
                                 f"the connection closed after {size} bytes of the body",
                                 b"".join(chunks))
        if message["type"] != "http.request":
            continue
        chunk = message.get("body", b"")
        if chunk:
            size += len(chunk)
            if size > limit:
                raise BodyTooLarge("body_too_large", f"more than {limit} bytes",
                                   _first([*chunks, chunk], head_bytes), size)
            chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _first(parts: list[bytes], count: int) -> bytes:
    """The first ``count`` bytes of ``parts`` joined, without joining the rest."""
    head = bytearray()
    for part in parts:
        if len(head) >= count:
            break
        head += part[:count - len(head)]
    return bytes(head)


async def _head(request: DeliveryRequest, limit: int, wait_s: float) -> bytes:
    """Up to ``limit`` bytes of a body refused for its declared size, waiting at most
    ``wait_s`` for them; nothing from a client waiting for ``100 Continue`` (reading would
    invite the whole body it offered to hold back)."""
    if limit <= 0 or (request.headers.get("expect") or "").strip().lower() == "100-continue":
        return b""
    ready = ready_body(request)
    if ready is not None:  # the server had it all already (and took it from ``receive``)
        return ready[:limit]
    head = bytearray()
    try:
        async with asyncio.timeout(wait_s):
            while len(head) < limit:
                message = await request.receive()
                if message["type"] != "http.request":
                    break  # gone: what arrived is all there is
                head += message.get("body", b"")
                if not message.get("more_body", False):
                    break
    except TimeoutError:
        pass
    return bytes(head[:limit])
