"""uvicorn's httptools protocol, sending each response in one write instead of two.

uvicorn writes a response's status line and headers when the app sends
``http.response.start`` and its body on ``http.response.body``: two ``send`` calls on the
socket, and, with ``TCP_NODELAY``, two packets the client must wake for. For a webhook's
short answer that second system call was a tenth of an HTTP worker's time (py-spy: the two
``transport.write`` lines of ``RequestResponseCycle.send``). Here the protocol writes through
:class:`CoalescingTransport`, which gathers what one turn of the event loop writes to a
connection and hands it to the socket once, at the end of that turn.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

FLUSH_AT = 64 * 1024  # bytes buffered in one turn that are sent without waiting for its end
# the most of a request's head (request line and headers) taken before it is refused: exactly,
# on a connection waiting for a request; pipelined behind one, from the read after the one the
# head began in (that read may also end the last body), so up to a read (256 KiB) more
MAX_HEAD_BYTES = 64 * 1024
HEAD_TOO_LARGE = (b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
                  b"content-type: text/plain; charset=utf-8\r\n"
                  b"content-length: 31\r\nconnection: close\r\n\r\n"
                  b"Request header fields too large")


class CoalescingTransport:
    """A transport whose writes within one event-loop turn leave as one.

    Everything but ``write`` and ``close`` is the wrapped transport's own. Order is kept
    (one buffer, flushed in order), a close first sends what is buffered, and an abort
    drops it, as the socket's own buffer would be. Past :data:`FLUSH_AT` bytes the buffer
    is handed on at once, so a large response streamed within one turn still meets the
    socket's flow control (uvicorn pauses the app when the transport's buffer is full).
    """

    __slots__ = ("_loop", "_pending", "_size", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] = []
        self._size = 0

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not self._pending:
            self._loop.call_soon(self._flush)
        self._pending.append(bytes(data))
        self._size += len(data)
        if self._size >= FLUSH_AT:
            self._flush()

    def writelines(self, chunks: Any) -> None:
        for chunk in chunks:
            self.write(chunk)

    def _flush(self) -> None:
        if not self._pending:
            return
        data = self._pending[0] if len(self._pending) == 1 else b"".join(self._pending)
        self._pending.clear()
        self._size = 0
        if not self._transport.is_closing():
            self._transport.write(data)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def abort(self) -> None:
        self._pending.clear()
        self._size = 0
        self._transport.abort()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + self._size

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class CoalescingHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's ``httptools`` protocol over a :class:`CoalescingTransport`, which also
    bounds how long a connection answered before its request's body ended (a ``413``, a
    ``408``) goes on taking that body.

    uvicorn reads and drops the rest of such a body, and every byte of it cancels the
    keep-alive timer set when the answer went out; nothing set it again once the body had
    passed. A sender that went on sending, or stopped without closing, held the connection
    (and a file descriptor) for ever. Here it may go on for the keep-alive time after the
    answer, and once the body has passed the connection idles as after any answer.

    The keep-alive time also bounds the wait for a whole request head, on a new connection
    as after an answer. uvicorn set no timer before a connection's first answer, and every
    byte cancelled the one it set after: a connection opened and left silent, or sent a head
    a byte at a time (or blank lines, which start no request), held its file descriptor for
    ever, and a few hundred of them left none for the next delivery's connection.

    Nor is a head taken past :data:`MAX_HEAD_BYTES`: httptools has no bound of its own, and
    a header line that never ended was held whole, however large (a body is never held past
    ``HOOKLEDGER_MAX_BODY_BYTES``), till the worker ran out of memory. It is answered
    ``431`` and the connection closed.
    """

    _linger: asyncio.TimerHandle | None = None
    _heads = 0  # request heads completed on this connection
    _in_head = False  # a request has begun and its head is not yet whole
    _head_bytes = 0  # of that head so far (see MAX_HEAD_BYTES)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(
            CoalescingTransport(transport, self.loop))  # type: ignore[arg-type]
        # waiting for its first request as an idle connection waits for its next one
        self.timeout_keep_alive_task = self.loop.call_later(
            self.timeout_keep_alive, self.timeout_keep_alive_handler)

    def data_received(self, data: bytes) -> None:
        # waiting for a request: the read is blank lines and the head, till a head is whole
        waiting = self.timeout_keep_alive_task is not None and self._linger is None
        in_head, heads = self._in_head, self._heads
        self._timed_data_received(data)
        if self._in_head and (in_head or (waiting and self._heads == heads)):
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD_BYTES and not self.transport.is_closing():
                if self.cycle is not None and not self.cycle.response_complete:
                    self.flow.pause_reading()  # pipelined: the request in hand is answered
                    return  # first, and the next read after its answer refuses this one
                self.transport.write(HEAD_TOO_LARGE)
                self.transport.close()

    def _timed_data_received(self, data: bytes) -> None:
        waiting = self.timeout_keep_alive_task
        if waiting is None:  # a request in hand, or an answered one's body still arriving
            super().data_received(data)
            return
        # uvicorn cancels the timer at every byte; it stands until a request's head is whole
        self.timeout_keep_alive_task = None
        heads = self._heads
        super().data_received(data)
        if self.timeout_keep_alive_task is None and self._heads == heads \
                and not self.transport.is_closing():
            self.timeout_keep_alive_task = waiting  # still no whole head: the deadline stands
        else:
            waiting.cancel()

    def on_headers_complete(self) -> None:
        self._heads += 1
        self._in_head = False
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        cycle = self.cycle  # the answered request's, unless another was parsed after it
        if cycle is not None and cycle.response_complete and cycle.more_body \
                and not self.pipeline and not self.transport.is_closing():
            self._cancel_linger()
            self._linger = self.loop.call_later(self.timeout_keep_alive, self._end_linger)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        if self._linger is not None and self.cycle.response_complete:
            self._cancel_linger()  # the answered request's body has passed: idle from here
            self._unset_keepalive_if_required()
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive, self.timeout_keep_alive_handler)

    def on_message_begin(self) -> None:
        # the next request, in the data that ended the last body: it is no longer idle,
        # nor still taking a body
        self._unset_keepalive_if_required()
        self._cancel_linger()
        super().on_message_begin()
        self._in_head, self._head_bytes = True, 0

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_linger()
        super().connection_lost(exc)

    def _cancel_linger(self) -> None:
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None

    def _end_linger(self) -> None:
        self._linger = None
        if not self.transport.is_closing():
            self.transport.close()


def complete_body(receive: Any) -> bytes | None:
    """The request's whole body when uvicorn has already read all of it, else None.

    A webhook's 1 KB body nearly always arrives in the packet with its headers, so by the
    time the app runs the body is buffered in uvicorn's request cycle. Taking it from there,
    as the cycle's ``receive`` would hand it over, spares each delivery a ``receive`` call
    and the timer guarding it (py-spy: about a twentieth of an HTTP worker's time). Anything
    else (another server, a body still arriving, a client awaiting ``100 Continue``) gives
    None, and the caller reads through ``receive`` as before.
    """
    cycle = getattr(receive, "__self__", None)
    if type(cycle) is not RequestResponseCycle or cycle.more_body or cycle.disconnected \
            or cycle.response_complete or cycle.waiting_for_100_continue:
        return None
    body = bytes(cycle.body)
    cycle.body = bytearray()  # taken, as ``receive`` takes it
    return body
