"""Reading a request body without ever holding more than the limit."""

from __future__ import annotations

import asyncio

from starlette.types import Receive

from ingest.errors import BodyIncomplete, BodyTooLarge, BodyTooSlow
from ingest.incoming import DeliveryRequest, ready_body

BODY_TIMEOUT_S = 10.0


async def read_limited(request: DeliveryRequest, limit: int,
                       timeout_s: float = BODY_TIMEOUT_S) -> bytes:
    """The whole body, or :class:`BodyTooLarge` as soon as it passes ``limit`` bytes, or
    :class:`BodyTooSlow` when it has not all arrived after ``timeout_s``, or
    :class:`BodyIncomplete` when the client goes away first.

    A declared ``Content-Length`` over the limit is refused before a byte is read; a client
    trickling its body cannot hold a request (and its memory) open for ever.
    """
    declared = request.headers.get("content-length")
    if declared is not None and declared.isascii() and declared.isdigit() \
            and int(declared) > limit:
        raise BodyTooLarge("body_too_large", f"declared {declared} bytes, limit {limit}")
    body = ready_body(request)
    if body is not None:  # all there already: nothing to wait for, nothing to time
        if len(body) > limit:
            raise BodyTooLarge("body_too_large", f"more than {limit} bytes")
        return body
    try:
        async with asyncio.timeout(timeout_s):
            return await _read(request.receive, limit)
    except TimeoutError as exc:
        raise BodyTooSlow("body_timeout", f"body not received within {timeout_s:g} s") from exc


async def _read(receive: Receive, limit: int) -> bytes:
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
                raise BodyTooLarge("body_too_large", f"more than {limit} bytes")
            chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)
