"""The body reader never takes more than the limit from the connection."""

from __future__ import annotations

import asyncio
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st
from starlette.datastructures import Headers
from starlette.requests import Request

from ingest import body
from ingest.body import read_limited
from ingest.errors import BodyIncomplete, BodyTooLarge
from ingest.incoming import Incoming, RawHeaders

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
    request, consumed = request_with([b"a" * 100, b"b" * 100] + [b"x" * 100] * 998)
    with pytest.raises(BodyTooLarge) as refused:
        await read_limited(request, limit=250, head_bytes=150)
    assert sum(consumed) == 300  # three chunks: the one that crossed the limit is the last
    assert (refused.value.head, refused.value.size) == (b"a" * 100 + b"b" * 50, 300)
    request, _ = request_with([b"a" * 100, b"b" * 100, b"c" * 100, b"d" * 100])
    with pytest.raises(BodyTooLarge) as refused:
        await read_limited(request, limit=250, head_bytes=1024)
    assert refused.value.head == b"a" * 100 + b"b" * 100 + b"c" * 100  # the last one too


async def test_a_declared_length_over_the_limit_reads_only_the_head_it_keeps() -> None:
    """The general system never sends a delivery again: the first kilobyte (which often
    names the reference) is kept with the refusal, and nothing more is read."""
    request, consumed = request_with([b'{"reference": "BIG-1", ' + b"x" * 600, b"y" * 600,
                                      b"z" * 600], headers=[(b"content-length", b"999999")])
    with pytest.raises(BodyTooLarge) as refused:
        await read_limited(request, limit=1000)
    assert consumed == [623, 600]  # up to the head's kilobyte, not the rest
    assert refused.value.head == (b'{"reference": "BIG-1", ' + b"x" * 600 + b"y" * 600)[:1024]
    assert refused.value.size == 999999


async def test_a_declared_length_over_the_limit_is_refused_unread_when_nothing_is_kept(
        ) -> None:
    for headers in ([(b"content-length", b"999999")],
                    [(b"content-length", b"999999"), (b"expect", b"100-continue")]):
        request, consumed = request_with([b"x" * 10], headers=headers)
        with pytest.raises(BodyTooLarge) as refused:
            await read_limited(request, limit=1000,
                               head_bytes=0 if len(headers) == 1 else 1024)
        assert consumed == [] and refused.value.head == b""


async def test_a_declared_length_over_the_limit_waits_for_its_head_only_briefly(
        monkeypatch: pytest.MonkeyPatch) -> None:
    async def receive() -> dict[str, object]:
        await asyncio.sleep(60)  # a client that declared a size and sends nothing
        raise AssertionError("unreachable")

    monkeypatch.setattr(body, "HEAD_WAIT_S", 0.3)
    incoming = Incoming({"headers": [(b"content-length", b"999999")]}, receive, {})
    started = time.monotonic()
    with pytest.raises(BodyTooLarge) as refused:
        await read_limited(incoming, limit=1000)  # the body's own timeout: 10 s
    assert 0.25 < time.monotonic() - started < 3 and refused.value.head == b""


async def test_a_body_at_the_limit_is_read_whole() -> None:
    request, _ = request_with([b"a" * 600, b"b" * 400])
    assert await read_limited(request, limit=1000) == b"a" * 600 + b"b" * 400


async def test_a_client_gone_before_its_body_ends_is_refused_with_what_it_sent() -> None:
    messages: list[dict[str, object]] = [
        {"type": "http.request", "body": b'{"reference": "R-', "more_body": True},
        {"type": "http.request", "body": b'17", "am', "more_body": True},
        {"type": "http.disconnect"}]

    async def receive() -> dict[str, object]:
        return messages.pop(0)

    incoming = Incoming({"headers": []}, receive, {})
    with pytest.raises(BodyIncomplete) as caught:
        await read_limited(incoming, limit=1000)
    assert caught.value.reason == "client_disconnected"
    assert caught.value.received == b'{"reference": "R-17", "am'


header_names = st.sampled_from(["Content-Length", "content-type", "X-Service-Signature",
                                "x-service-signature", "USER-AGENT", "host"])
header_values = st.text(alphabet=st.characters(max_codepoint=255), max_size=10)


@given(headers=st.lists(st.tuples(header_names, header_values), max_size=8),
       asked=header_names)
def test_the_light_request_reads_headers_as_starlette_does(
        headers: list[tuple[str, str]], asked: str) -> None:
    """The first of a repeated header, names matched in any case, latin-1 values."""
    raw = [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in headers]
    light, full = RawHeaders(raw), Headers(raw=raw)
    assert light.get(asked) == full.get(asked)
    assert light.get(asked, "none") == full.get(asked, "none")
    assert light.items() == full.items()


def test_the_light_request_names_its_client_as_starlette_does() -> None:
    scope = {"type": "http", "headers": [], "client": ("10.1.2.3", 4567)}
    light = Incoming(scope, _no_body, {"name": "main"})
    assert light.client is not None and Request(scope).client is not None
    assert light.client.host == Request(scope).client.host == "10.1.2.3"  # type: ignore[union-attr]
    assert Incoming({"headers": []}, _no_body, {}).client is None


async def _no_body() -> dict[str, object]:
    return {"type": "http.request", "body": b"", "more_body": False}
