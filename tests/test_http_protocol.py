"""serve's HTTP protocol: a response leaves in one write, and HTTP/1.1 still holds.

A real uvicorn server with :class:`CoalescingHttpToolsProtocol` on a loopback port, spoken
to over raw sockets; the socket writes are counted under the coalescing layer.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
import uvicorn
from starlette.types import Receive, Scope, Send

from hookledger.http_protocol import (
    FLUSH_AT,
    MAX_HEAD_BYTES,
    CoalescingHttpToolsProtocol,
    CoalescingTransport,
    complete_body,
)
from ingest.body import read_limited
from ingest.incoming import Incoming
from tests.test_serve_process import free_port

pytestmark = pytest.mark.anyio

WRITES: list[bytes] = []  # what the socket transports below were asked to write, in order


class CountingTransport:
    """The real transport, with each ``write`` recorded."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport

    def write(self, data: bytes) -> None:
        WRITES.append(bytes(data))
        self._transport.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class CountedProtocol(CoalescingHttpToolsProtocol):
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(CountingTransport(transport))  # type: ignore[arg-type]


SECOND_PART = asyncio.Event()


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    assert scope["type"] == "http"
    if scope["path"] == "/body":  # how the webhook endpoints read: "ready:" or "read:" + body
        ready = complete_body(receive)
        body = await read_limited(Incoming(scope, receive, {}, ready), 1 << 20)
        answer = (b"ready:" if ready is not None else b"read:") + body
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(len(answer)).encode())]})
        await send({"type": "http.response.body", "body": answer})
        return
    if scope["path"] == "/early":  # refused before its body is read, as a 413 is
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})
        return
    while (await receive()).get("more_body"):
        pass
    if scope["path"] == "/stream":  # the second part only after the client saw the first
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"first", "more_body": True})
        await SECOND_PART.wait()
        await send({"type": "http.response.body", "body": b"second"})
        return
    body = scope["path"].encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


KEEP_ALIVE_S = 1


@pytest.fixture
async def port() -> AsyncIterator[int]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                           http=CountedProtocol, lifespan="off",
                                           log_config=None, access_log=False,
                                           timeout_keep_alive=KEEP_ALIVE_S))
    serving = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    WRITES.clear()
    global SECOND_PART
    SECOND_PART = asyncio.Event()  # this test's loop's
    yield port
    server.should_exit = True
    await serving


def get(path: str, *, close: bool = False) -> bytes:
    connection = b"Connection: close\r\n" if close else b""
    return b"GET " + path.encode() + b" HTTP/1.1\r\nHost: t\r\n" + connection + b"\r\n"


async def read_response(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    return head, await reader.readexactly(length)


async def test_a_response_leaves_in_one_write(port: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(get("/one"))
    head, body = await read_response(reader)
    assert head.startswith(b"HTTP/1.1 200 ") and body == b"/one"
    assert WRITES == [head + body]  # status line, headers and body in one socket write
    writer.close()


async def test_pipelined_requests_are_answered_in_order(port: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(get("/a") + get("/bb") + get("/ccc"))
    assert [(await read_response(reader))[1] for _ in range(3)] == [b"/a", b"/bb", b"/ccc"]
    assert len(WRITES) == 3
    writer.close()


def post(body: bytes, *, extra: bytes = b"") -> bytes:
    return (b"POST /body HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n" % len(body)
            + extra + b"\r\n" + body)


async def test_a_body_that_came_with_its_headers_is_taken_whole(port: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(post(b'{"a": 1}') + post(b"second"))  # pipelined, too
    assert (await read_response(reader))[1] == b'ready:{"a": 1}'
    assert (await read_response(reader))[1] == b"ready:second"
    writer.close()


async def test_a_body_still_arriving_is_read_through_receive(port: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    message = post(b"x" * 3000)
    writer.write(message[:-2000])
    await asyncio.sleep(0.2)  # the app has started with a third of the body
    writer.write(message[-2000:])
    assert (await read_response(reader))[1] == b"read:" + b"x" * 3000
    writer.close()


async def test_a_client_awaiting_100_continue_gets_it_and_its_body_is_read(port: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    message = post(b"later", extra=b"Expect: 100-continue\r\n")
    writer.write(message[:-5])
    assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5) \
        == b"HTTP/1.1 100 Continue\r\n\r\n"
    writer.write(b"later")
    assert (await read_response(reader))[1] == b"read:later"
    writer.close()


def test_a_receive_that_is_not_uvicorns_gives_no_body() -> None:
    async def receive() -> dict[str, object]:
        return {"type": "http.request", "body": b"", "more_body": False}

    assert complete_body(receive) is None


async def test_a_streamed_body_is_not_held_back_for_its_end(port: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(get("/stream"))
    received = b""
    while not received.endswith(b"first\r\n"):  # chunked: "5\r\nfirst\r\n"
        received += await asyncio.wait_for(reader.read(1024), timeout=5)
    SECOND_PART.set()
    rest = await asyncio.wait_for(reader.readuntil(b"0\r\n\r\n"), timeout=5)
    assert rest == b"6\r\nsecond\r\n0\r\n\r\n"
    writer.close()


async def test_connection_close_sends_the_whole_response_before_closing(port: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(get("/bye", close=True))
    everything = await asyncio.wait_for(reader.read(), timeout=5)  # up to the server's EOF
    assert everything.startswith(b"HTTP/1.1 200 ") and everything.endswith(b"\r\n\r\n/bye")
    assert WRITES == [everything]
    writer.close()


class RecordingTransport:
    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.closed = self.aborted = False

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def is_closing(self) -> bool:
        return self.closed or self.aborted

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def get_write_buffer_size(self) -> int:
        return 0


async def test_an_abort_drops_what_was_not_yet_written() -> None:
    under = RecordingTransport()
    transport = CoalescingTransport(under, asyncio.get_running_loop())  # type: ignore[arg-type]
    transport.write(b"never")
    assert transport.get_write_buffer_size() == 5
    transport.abort()
    await asyncio.sleep(0)  # the end of the loop turn, when a flush would have run
    assert under.written == [] and under.aborted


async def test_writes_of_one_turn_leave_together_and_in_order() -> None:
    under = RecordingTransport()
    transport = CoalescingTransport(under, asyncio.get_running_loop())  # type: ignore[arg-type]
    transport.write(b"a")
    transport.writelines([b"b", bytearray(b"c")])
    assert under.written == []
    await asyncio.sleep(0)
    transport.write(b"d")
    transport.close()  # a close sends what is buffered first
    assert under.written == [b"abc", b"d"] and under.closed


async def test_a_large_write_is_handed_on_at_once_for_flow_control() -> None:
    under = RecordingTransport()
    transport = CoalescingTransport(under, asyncio.get_running_loop())  # type: ignore[arg-type]
    transport.write(b"head")
    transport.write(b"x" * FLUSH_AT)  # the socket's own buffer now sees it, and may push back
    assert under.written == [b"head" + b"x" * FLUSH_AT]
    assert transport.get_write_buffer_size() == 0
    transport.write(b"tail")
    await asyncio.sleep(0)
    assert under.written[1:] == [b"tail"]


def declaring(path: str, length: int) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Length: {length}\r\n\r\n"
            .encode())


async def closed_within(reader: asyncio.StreamReader, seconds: float) -> float | None:
    """Seconds until the server closed the connection (EOF or reset), else None."""
    started = asyncio.get_running_loop().time()
    try:
        async with asyncio.timeout(seconds):
            while await reader.read(4096):
                pass
    except TimeoutError:
        return None
    except ConnectionResetError:
        pass
    return asyncio.get_running_loop().time() - started


async def test_a_sender_trickling_a_refused_body_is_closed_after_the_keep_alive(
        port: int) -> None:
    """Answered before its body ended, a connection went on taking the body, and every byte
    of it cancelled the keep-alive timer: a sender that never stopped held it for ever."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(declaring("/early", 10_000_000) + b"x" * 1000)
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413 ")

    async def trickle() -> None:
        with contextlib.suppress(ConnectionError):
            while True:
                writer.write(b"x" * 100)
                await writer.drain()
                await asyncio.sleep(0.1)

    trickling = asyncio.create_task(trickle())
    try:
        after = await closed_within(reader, KEEP_ALIVE_S + 4)
    finally:
        trickling.cancel()
        writer.close()
    assert after is not None and after < KEEP_ALIVE_S + 2


async def test_after_the_refused_body_has_passed_the_connection_idles_as_after_any_answer(
        port: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(declaring("/early", 3000) + b"x" * 1000)
    assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 413 ")
    writer.write(b"x" * 2000 + get("/next"))  # the rest of it, then the next request
    head, body = await read_response(reader)
    assert head.startswith(b"HTTP/1.1 200 ") and body == b"/next"
    await asyncio.sleep(KEEP_ALIVE_S * 0.5)  # answered, then idle: kept until the timer
    assert not reader.at_eof()
    writer.write(declaring("/early", 3000) + b"x" * 1000)
    assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 413 ")
    writer.write(b"x" * 2000)  # the rest of the body after the answer, then silence
    after = await closed_within(reader, KEEP_ALIVE_S + 4)
    writer.close()
    assert after is not None and after < KEEP_ALIVE_S + 2


async def test_a_pipelined_request_still_taking_its_body_is_not_cut_off(port: int) -> None:
    """The bound is for the answered request's body. A request pipelined behind another,
    whose body was still arriving when the first answer ended, was taken for one answered
    mid-body and closed a keep-alive later, before it was answered."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(get("/stream") + declaring("/body", 3000) + b"x" * 1000)
    assert (await reader.readuntil(b"first")).startswith(b"HTTP/1.1 200 ")
    SECOND_PART.set()  # the first answer ends; the second request starts, its body unread
    assert (await reader.readuntil(b"0\r\n\r\n")).endswith(b"second\r\n0\r\n\r\n")
    await asyncio.sleep(KEEP_ALIVE_S * 2.5)
    writer.write(b"x" * 2000)
    head, body = await read_response(reader)
    writer.close()
    assert head.startswith(b"HTTP/1.1 200 ") and body == b"read:" + b"x" * 3000


async def test_a_connection_that_never_sends_a_request_is_closed_after_the_keep_alive(
        port: int) -> None:
    """uvicorn times a connection out only once it has answered on it: one opened and left
    silent held its file descriptor for ever, and a few hundred of them (a slowloris, or
    clients gone without a FIN) left no descriptor for the next delivery's connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    after = await closed_within(reader, KEEP_ALIVE_S + 4)
    writer.close()
    assert after is not None and after < KEEP_ALIVE_S + 2


@pytest.mark.parametrize("opening", [b"GET /slow HTTP/1.1\r\n", b"\r\n"])
async def test_a_request_head_trickled_a_byte_at_a_time_is_closed(port: int,
                                                                   opening: bytes) -> None:
    """Every byte cancelled the keep-alive timer, so a head sent a byte a second (or blank
    lines, which start no request) held the connection for ever, on a new connection and
    after an answer alike: the head must be whole within the keep-alive time."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(get("/first"))
    head, _ = await read_response(reader)
    assert head.startswith(b"HTTP/1.1 200 ")
    fresh_reader, fresh_writer = await asyncio.open_connection("127.0.0.1", port)
    header_bytes = b"\r\n" if opening == b"\r\n" else b"x-padding: " + b"a" * 1000

    async def trickle(out: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            out.write(opening)
            for byte in header_bytes:
                out.write(bytes([byte]))
                await out.drain()
                await asyncio.sleep(0.1)

    tricklers = [asyncio.create_task(trickle(writer)), asyncio.create_task(trickle(fresh_writer))]
    try:
        after = await asyncio.gather(closed_within(reader, KEEP_ALIVE_S + 4),
                                     closed_within(fresh_reader, KEEP_ALIVE_S + 4))
    finally:
        for trickler in tricklers:
            trickler.cancel()
        writer.close()
        fresh_writer.close()
    assert all(seconds is not None and seconds < KEEP_ALIVE_S + 2 for seconds in after), after


async def test_a_request_whose_head_came_whole_is_answered_however_long_it_takes(
        port: int) -> None:
    """The bound is on the head alone: a request being answered (its body read, the
    ledger's commit awaited) is never cut off by it, nor is one pipelined behind it."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(get("/stream") + b"GET /next HTTP/1.1\r\n")  # the second head unfinished
    assert (await reader.readuntil(b"first")).startswith(b"HTTP/1.1 200 ")
    await asyncio.sleep(KEEP_ALIVE_S * 2.5)
    SECOND_PART.set()
    assert (await reader.readuntil(b"0\r\n\r\n")).endswith(b"second\r\n0\r\n\r\n")
    writer.write(b"Host: t\r\n\r\n")  # the rest of the second head, just after the answer
    head, body = await read_response(reader)
    writer.close()
    assert head.startswith(b"HTTP/1.1 200 ") and body == b"/next"


async def test_a_request_head_past_its_bound_is_answered_431_and_closed(port: int) -> None:
    """A head has no size of its own in httptools: a header line that never ended was held
    whole (330 MiB of a worker's memory for 185 MiB sent, in a test), however large, till
    the worker ran out of memory, where a body is never held past its limit."""
    start = b"GET /big HTTP/1.1\r\nHost: t\r\nx-big: "
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(start + b"a" * (MAX_HEAD_BYTES + 1 - len(start)))  # one byte too many
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)  # not the timer's close
    after = await closed_within(reader, 5)
    writer.close()
    assert head.startswith(b"HTTP/1.1 431 ") and b"connection: close" in head.lower()
    assert after is not None


async def test_a_request_head_within_its_bound_and_a_large_body_are_answered(port: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    headers = b"".join(b"x-h%d: %s\r\n" % (n, b"v" * 4000) for n in range(12))  # 48 KiB
    writer.write(b"GET /big HTTP/1.1\r\nHost: t\r\n" + headers + b"\r\n")
    head, body = await read_response(reader)
    assert head.startswith(b"HTTP/1.1 200 ") and body == b"/big"
    writer.write(declaring("/body", 900_000))
    for _ in range(9):
        writer.write(b"y" * 100_000)
        await writer.drain()
    head, body = await read_response(reader)
    writer.close()
    assert head.startswith(b"HTTP/1.1 200 ") and body == b"read:" + b"y" * 900_000


async def test_a_head_past_its_bound_pipelined_behind_a_request_waits_for_its_answer(
        port: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(get("/stream") + b"GET /big HTTP/1.1\r\nx-big: ")
    assert (await reader.readuntil(b"first")).startswith(b"HTTP/1.1 200 ")
    for _ in range(4):  # 256 KiB of the next head while the first answer is being sent
        writer.write(b"a" * 65536)
        await writer.drain()
    await asyncio.sleep(0.2)
    SECOND_PART.set()
    assert (await reader.readuntil(b"0\r\n\r\n")).endswith(b"second\r\n0\r\n\r\n")
    writer.write(b"a")  # (little: all of it read before the close, which a reset would cut)
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    writer.close()
    assert head.startswith(b"HTTP/1.1 431 ")
