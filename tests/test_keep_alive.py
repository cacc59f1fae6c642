"""How long ``serve`` keeps an idle connection open for the sender's next delivery.

A server that closes an idle connection just as its client sends the next request on it
resets that request; for the general system, which never resends, that delivery is lost.
Closing later than the sender's own idle expiry leaves the close to the sender, which is
race-free: so the keep-alive is configurable and outlasts common clients' and proxies'.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hookledger.http_protocol import MAX_HEAD_BYTES
from hookledger.settings import Settings
from tests.live import running_service
from tests.test_serve_process import free_port, wait_ready

pytestmark = pytest.mark.slow
REQUEST = b"GET /healthz HTTP/1.1\r\nhost: hookledger\r\n\r\n"


def connected(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def answered(sock: socket.socket) -> bool:
    """Send one request on ``sock``; whether a whole 200 came back on it (its body read to
    its length, so that nothing of it is left to be taken for the next answer)."""
    sock.sendall(REQUEST)
    answer = b""
    while b"\r\n\r\n" not in answer:
        chunk = sock.recv(4096)
        if not chunk:
            return False
        answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    [length] = [int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")[1:]
                if line.lower().startswith(b"content-length:")]
    while len(body) < length:
        chunk = sock.recv(4096)
        if not chunk:
            return False
        body += chunk
    return head.startswith(b"HTTP/1.1 200") and len(body) == length


def closed_within(sock: socket.socket, seconds: float) -> float | None:
    """How long until the server closed ``sock`` (polled), or None if it stayed open."""
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        if closed_by_server(sock):
            return time.monotonic() - started
        time.sleep(0.05)
    return None


def closed_by_server(sock: socket.socket) -> bool:
    """Whether the server has closed ``sock`` (nothing sent on it meanwhile)."""
    sock.setblocking(False)
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False  # open, nothing to read
    except ConnectionResetError:
        return True
    finally:
        sock.setblocking(True)


@pytest.fixture
def serving(db_url: str, tmp_path: Path) -> Iterator[int]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOOKLEDGER_")}
    env.update(HOOKLEDGER_DATABASE_URL=db_url, HOOKLEDGER_HOME=str(tmp_path),
               HOOKLEDGER_PORT=str(port), HOOKLEDGER_LOG_LEVEL="warning",
               HOOKLEDGER_KEEP_ALIVE_S="2", HOOKLEDGER_RECONCILE_INTERVAL_S="3600")
    proc = subprocess.Popen([sys.executable, "-m", "hookledger", "serve"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_ready(port, proc)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def test_serve_keeps_an_idle_connection_for_the_configured_time_then_closes_it(
        serving: int) -> None:
    with connected(serving) as sock:
        assert answered(sock)
        time.sleep(1)
        assert not closed_by_server(sock)
        assert answered(sock)  # the same connection carries the next delivery
        after = closed_within(sock, 15)
        assert after is not None and after > 1.5  # 2 s after its last answer


def test_by_default_an_idle_connection_outlasts_common_client_pools(db_url: str) -> None:
    """httpx's and uvicorn's own 5 s would race each other; the default waits far longer."""
    assert Settings(database_url=db_url).keep_alive_s >= 60
    with running_service(db_url) as base, connected(int(base.rsplit(":", 1)[1])) as sock:
        assert answered(sock)
        time.sleep(6)
        assert not closed_by_server(sock)
        assert answered(sock)


def test_serve_closes_a_silent_connection_and_a_trickled_head_after_the_keep_alive(
        serving: int) -> None:
    """A connection that never sent a request, or sent its head a byte at a time, was held
    for ever (uvicorn's timer starts at an answer, and each byte cancelled it): with a few
    hundred of them a worker had no file descriptor left for a genuine delivery."""
    with connected(serving) as silent, connected(serving) as trickled:
        trickled.sendall(b"POST /webhooks/general/main HTTP/1.1\r\nhost: hookledger\r\n")
        started = time.monotonic()
        closed: dict[str, float] = {}
        while time.monotonic() - started < 8 and len(closed) < 2:
            with contextlib.suppress(OSError):
                trickled.sendall(b"x")
            for name, sock in (("silent", silent), ("trickled", trickled)):
                if name not in closed and closed_by_server(sock):
                    closed[name] = time.monotonic() - started
            time.sleep(0.2)
    assert set(closed) == {"silent", "trickled"}, closed
    assert all(seconds < 4 for seconds in closed.values()), closed  # 2 s keep-alive


def test_serve_answers_a_head_past_its_bound_431_and_closes_it(serving: int) -> None:
    """A header line that never ended was taken whole, however large, till the worker ran
    out of memory (330 MiB for 185 MiB sent): now refused once past 64 KiB."""
    start = b"POST /webhooks/general/main HTTP/1.1\r\nhost: hookledger\r\nx-big: "
    with connected(serving) as sock:
        sock.sendall(start + b"a" * (MAX_HEAD_BYTES + 1 - len(start)))
        answer = b""
        while chunk := sock.recv(4096):  # to the close (else its 5 s timeout fails it)
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 431 ")
    with connected(serving) as sock:
        assert answered(sock)
