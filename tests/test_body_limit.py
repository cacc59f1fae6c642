"""The body reader never takes more than the limit from the connection."""

from __future__ import annotations

import pytest
from starlette.requests import Request

from ingest.body import read_limited
from ingest.errors import BodyTooLarge

pytestmark = pytest.mark.anyio


def request_with(chunks: list[bytes], headers: list[tuple[bytes, bytes]] | None = None
                 ) -> tuple[Request, list[int]]:
    consumed: list[int] = []
    remaining = list(chunks)

    async def receive() -> dict[str, object]:
        chunk = remaining.pop(0)
        consumed.append(len(chunk))
        return {"type": "http.request", "body": chunk, "more_body": bool(remaining)}

    scope = {"type": "http", "method": "POST", "path": "/", "headers": headers or []}
    return Request(scope, receive), consumed


async def test_stops_reading_as_soon_as_the_limit_is_passed() -> None:
    request, consumed = request_with([b"x" * 100] * 1000)
    with pytest.raises(BodyTooLarge):
        await read_limited(request, limit=250)
    assert sum(consumed) == 300  # three chunks: the one that crossed the limit is the last


async def test_a_declared_length_over_the_limit_is_refused_before_reading() -> None:
    request, consumed = request_with([b"x" * 10], headers=[(b"content-length", b"999999")])
    with pytest.raises(BodyTooLarge):
        await read_limited(request, limit=1000)
    assert consumed == []


async def test_a_body_at_the_limit_is_read_whole() -> None:
    request, _ = request_with([b"a" * 600, b"b" * 400])
    assert await read_limited(request, limit=1000) == b"a" * 600 + b"b" * 400
