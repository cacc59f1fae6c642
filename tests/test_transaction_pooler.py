"""Behind a connection pooler in transaction mode (PgBouncer), as the README allows for
appends: each statement may run on another server session, so nothing may rely on a
session keeping what an earlier statement left there."""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import httpx
import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from hookledger.app import ingest_pool
from ledger import LedgerStore
from tests.general_events import encode, general_body
from tests.live import running_service
from tests.projection_events import new_event
from tests.signing import general_header


@pytest.mark.anyio
async def test_the_ingest_sessions_keep_no_prepared_statement(db_url: str) -> None:
    """psycopg prepares a statement on the server after its fifth run on a connection, by a
    name kept in that server session. Behind a pooler in transaction mode the next run goes
    to another session, where the name is missing (or already taken): the append failed
    there, taken for the event's fault."""
    pool = ingest_pool(db_url, max_size=2)
    await pool.open(wait=True)
    try:
        store = LedgerStore(pool)
        for i in range(20):
            await store.append([new_event("payment.confirmed", 91000, reference=f"PREP-{i}")])
        async with pool.connection() as first, pool.connection() as second:
            for conn in (first, second):
                cur = await conn.execute("SELECT name FROM pg_prepared_statements")
                assert await cur.fetchall() == []
    finally:
        await pool.close()


def _through(db_url: str, port: int) -> str:
    """``db_url`` with the server's address swapped for 127.0.0.1:``port``."""
    parts = urlsplit(db_url)
    userinfo = parts.netloc.rpartition("@")[0]
    query = urlencode([(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True)
                       if k not in ("host", "port")])
    netloc = f"{userinfo}@127.0.0.1:{port}" if userinfo else f"127.0.0.1:{port}"
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


@contextmanager
def pgbouncer(db_url: str, folder: Path) -> Iterator[str]:
    """A PgBouncer in transaction mode in front of ``db_url``'s server; yields the URL of
    the same database through it."""
    binary = shutil.which("pgbouncer")
    if binary is None:
        pytest.skip("pgbouncer is not installed")
    params = conninfo_to_dict(db_url)
    server = {k: str(v) for k, v in params.items()
              if k in ("host", "port", "user", "password") and v}
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = folder / "pgbouncer.ini"
    config.write_text(
        "[databases]\n* = " + " ".join(f"{k}={v}" for k, v in server.items()) + "\n"
        f"[pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        "auth_type = any\npool_mode = transaction\ndefault_pool_size = 8\n"
        "ignore_startup_parameters = extra_float_digits,options\n")
    # PgBouncer refuses to run as root: it reads its file, then becomes another user, the
    # owner of the server's socket folder when it connects through one (the embedded
    # server's, whose folder only that user may enter)
    command = [binary, str(config)]
    if os.geteuid() == 0:
        host = server.get("host", "")
        owner = pwd.getpwuid(os.stat(host).st_uid).pw_name if host.startswith("/") \
            else "nobody"
        command[1:1] = ["-u", owner]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = _through(db_url, port)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                psycopg.connect(url, connect_timeout=2).close()
                break
            except psycopg.OperationalError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise
                time.sleep(0.05)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_behind_pgbouncer_in_transaction_mode_every_delivery_is_kept_as_it_came(
        db_url: str, tmp_path: Path) -> None:
    """Two ``serve`` processes (here two services) behind one PgBouncer 1.18 in transaction
    mode: of 200 concurrent deliveries, dozens were answered 503 (the general system never
    sends those again) and others kept as ``general.malformed`` (refused_by_database:
    'prepared statement "_pg3_0" does not exist'), each with a discrepancy for a person."""
    with pgbouncer(db_url, tmp_path) as url, \
            running_service(url, general_secrets="main=s3cret", home=tmp_path / "a",
                            projector=False) as first, \
            running_service(url, general_secrets="main=s3cret", home=tmp_path / "b",
                            projector=False) as second:  # a projector needs a session
        def deliver(i: int) -> int:
            raw = encode(general_body("payment.confirmed", 91000, reference=f"PGB-{i}"))
            base = (first, second)[i % 2]
            return httpx.post(f"{base}/webhooks/general/main", content=raw, timeout=30,
                              headers={"x-service-signature": general_header("s3cret", raw)}
                              ).status_code

        with ThreadPoolExecutor(16) as threads:
            answers = list(threads.map(deliver, range(200)))
        assert answers == [200] * 200
        deadline = time.monotonic() + 30
        while True:  # any spooled meanwhile drain
            with psycopg.connect(db_url) as conn:
                kept = conn.execute("SELECT event_type, count(*) FROM hookledger.ledger "
                                    "GROUP BY event_type").fetchall()
            if sum(n for _, n in kept) >= 200 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert kept == [("payment.confirmed", 200)]
