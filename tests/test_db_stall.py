"""A database that stops answering, with no reset and no error: deliveries still get their
answer inside the provider's window, from the spool, and reach the ledger exactly once.

Before, the append's statement waited for ever, and every delivery queued behind it: no
answer within the general system's 30 s, which then never sends the delivery again.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import httpx
from psycopg.conninfo import conninfo_to_dict

from tests.chat_events import PHONE, inbound
from tests.chat_events import encode as chat_encode
from tests.chat_live import post_chat, wait_for
from tests.general_events import encode, general_body
from tests.live import running_service
from tests.signing import general_header
from tests.test_general_webhook import rows

SECRET = "whsec-stall-1"


class FreezableProxy:
    """TCP on loopback to the database (its Unix socket, or its TCP address when
    ``socket_path`` is None); while ``frozen`` it forwards nothing either way (a partition:
    the connections stay open and silent)."""

    def __init__(self, socket_path: str | None, address: tuple[str, int] | None = None
                 ) -> None:
        self.socket_path = socket_path
        self.address = address
        self.frozen = threading.Event()
        self.port = 0
        self._loop = asyncio.new_event_loop()
        ready = threading.Event()
        threading.Thread(target=self._serve, args=(ready,), daemon=True).start()
        if not ready.wait(10):
            raise RuntimeError("the proxy did not start")

    def _serve(self, ready: threading.Event) -> None:
        async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            with contextlib.suppress(Exception):
                while data := await reader.read(65536):
                    while self.frozen.is_set():
                        await asyncio.sleep(0.02)
                    writer.write(data)
                    await writer.drain()
            writer.close()

        async def connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            if self.socket_path is not None:
                upstream_reader, upstream_writer = await asyncio.open_unix_connection(
                    self.socket_path)
            else:
                assert self.address is not None
                upstream_reader, upstream_writer = await asyncio.open_connection(
                    *self.address)
            await asyncio.gather(pump(reader, upstream_writer), pump(upstream_reader, writer))

        async def main() -> None:
            server = await asyncio.start_server(connect, "127.0.0.1", 0)
            self.port = server.sockets[0].getsockname()[1]
            ready.set()
            await asyncio.Event().wait()

        self._loop.run_until_complete(main())


@contextlib.contextmanager
def proxied(db_url: str) -> Iterator[tuple[str, FreezableProxy]]:
    """``db_url`` through a :class:`FreezableProxy`: the same user, password, database and
    other parameters, only the server's address swapped for the proxy's."""
    params = conninfo_to_dict(db_url)
    host, port = str(params.get("host") or ""), int(params.get("port") or 5432)
    if host.startswith("/") or not host:  # a Unix socket (the embedded server's)
        folder = host or next((d for d in ("/var/run/postgresql", "/tmp")
                               if Path(d, f".s.PGSQL.{port}").exists()), "/tmp")
        proxy = FreezableProxy(f"{folder}/.s.PGSQL.{port}")
    else:  # a server at HOOKLEDGER_TEST_DATABASE_URL, over TCP
        proxy = FreezableProxy(None, (host, port))
    parts = urlsplit(db_url)
    userinfo = parts.netloc.rpartition("@")[0]
    query = urlencode([(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True)
                       if k not in ("host", "port")])
    netloc = f"{userinfo}@127.0.0.1:{proxy.port}" if userinfo else f"127.0.0.1:{proxy.port}"
    yield urlunsplit((parts.scheme, netloc, parts.path, query, "")), proxy


def post(base: str, reference: str) -> tuple[int, dict[str, object], float]:
    raw = encode(general_body("payment.confirmed", 91000, reference=reference))
    started = time.monotonic()
    answer = httpx.post(f"{base}/webhooks/general/primary", content=raw, timeout=30,
                        headers={"x-service-signature": general_header(SECRET, raw)})
    return answer.status_code, answer.json(), time.monotonic() - started


def test_a_silent_database_is_given_up_on_and_the_delivery_spooled(
        db_url: str, tmp_path: Path) -> None:
    home = tmp_path / "home"
    with proxied(db_url) as (url, proxy), running_service(
            url, home=str(home), general_secrets=f"primary={SECRET}",
            append_stall_s=1.0) as base:
        assert post(base, "BEFORE")[:2] == (200, {"status": "accepted", "duplicate": False,
                                                  "position": 1})
        proxy.frozen.set()
        try:
            status, answer, seconds = post(base, "DURING-1")
            assert (status, answer.get("spooled")) == (200, True) and seconds < 5
            # the spool has a backlog now: the next goes there at once, not after a wait
            status, answer, seconds = post(base, "DURING-2")
            assert (status, answer.get("spooled")) == (200, True) and seconds < 1
        finally:
            proxy.frozen.clear()
        def general_references() -> list[str] | None:
            found = [r for (r,) in rows(db_url, "SELECT payload->>'reference' FROM "
                                                "hookledger.ledger WHERE source = 'general'")]
            return found if len(found) >= 3 else None

        assert sorted(wait_for(general_references, timeout_s=30)) == [
            "BEFORE", "DURING-1", "DURING-2"]  # each once, whichever way it got there
        wait_for(lambda: not any((home / "spool").rglob("spool-*.hls")), timeout_s=30)


def test_a_chat_delivery_is_answered_too_from_the_secrets_read_last(
        db_url: str, tmp_path: Path) -> None:
    """The chat secret lookup waited for ever as well: now, given up on, the secrets read
    within the rotation grace still verify, and the delivery is spooled (before, no answer:
    the platform retries, but only after its own 15 s wait, and the request hung on)."""
    chat_secret = "chat-stall-secret-1"
    with proxied(db_url) as (url, proxy), running_service(
            url, home=str(tmp_path / "home"), chat_secrets={PHONE: chat_secret},
            append_stall_s=1.0) as base:
        first = post_chat(base, PHONE, chat_encode(inbound(message_id="wamid.S1")),
                          chat_secret, delivery_id="stall-1")
        assert first.status_code == 200 and first.json()["duplicate"] is False
        proxy.frozen.set()
        try:
            time.sleep(1.2)  # past the secrets' one-second cache
            started = time.monotonic()
            # two at once wait on one lookup: the first to give up cancels it for both
            with ThreadPoolExecutor(2) as pool:
                during = list(pool.map(lambda n: post_chat(
                    base, PHONE, chat_encode(inbound(message_id=f"wamid.S{n}")),
                    chat_secret, delivery_id=f"stall-{n}"), (2, 3)))
            assert [(a.status_code, a.json().get("spooled")) for a in during] == [
                (200, True), (200, True)]
            assert time.monotonic() - started < 5
        finally:
            proxy.frozen.clear()
        assert wait_for(lambda: rows(db_url, "SELECT count(*) FROM hookledger.ledger "
                                             "WHERE source = 'chat'")[0][0] == 3,
                        timeout_s=30)


def test_a_refused_delivery_is_answered_while_the_database_is_silent(
        db_url: str, tmp_path: Path) -> None:
    """Recording a refusal waited on a silent database as long as an append once did (for
    ever, on a partition): the 401 never came, and each such request held a pool connection
    and its HTTP connection past the provider's 30 s. It is given up on after
    ``HOOKLEDGER_APPEND_STALL_S`` now, and the refusal is answered all the same."""
    raw = encode(general_body("payment.confirmed", 91000, reference="FORGED"))
    with proxied(db_url) as (url, proxy), running_service(
            url, home=str(tmp_path / "home"), general_secrets=f"primary={SECRET}",
            append_stall_s=1.0) as base:
        assert post(base, "BEFORE")[0] == 200  # the pool's connections are open
        proxy.frozen.set()
        try:
            started = time.monotonic()
            answer = httpx.post(f"{base}/webhooks/general/primary", content=raw, timeout=15,
                                headers={"x-service-signature": "sha256=" + "0" * 64})
            assert answer.status_code == 401 and answer.json()["reason"] == "bad_signature"
            assert time.monotonic() - started < 3
        finally:
            proxy.frozen.clear()
