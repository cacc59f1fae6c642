"""Reading a request body without ever holding more than the limit."""

from __future__ import annotations

from starlette.requests import Request

from ingest.errors import BodyTooLarge


async def read_limited(request: Request, limit: int) -> bytes:
    """The whole body, or :class:`BodyTooLarge` as soon as it passes ``limit`` bytes.

    A declared ``Content-Length`` over the limit is refused before a byte is read.
    """
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge("body_too_large", f"declared {declared} bytes, limit {limit}")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge("body_too_large", f"more than {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)
