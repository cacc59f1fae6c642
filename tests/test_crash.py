"""Breaking things on purpose: kill -9 and SIGTERM under load lose nothing acknowledged.

``hookledger serve`` runs as its own process on the test database, loaded by threads that
each send distinct signed deliveries; the test kills or stops it mid-load, starts it again,
and then checks that every delivery answered 2xx is in the ledger exactly once and that the
projections, once caught up, equal a rebuild (``verify``).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from hookledger import migrate
from hookledger.embedded_postgres import EmbeddedPostgres
from projections.rebuild import verify
from tests.fault_report import record
from tests.general_events import encode, general_body
from tests.signing import general_header
from tests.test_serve_process import free_port, postgres_running, wait_ready
from tests.test_spool import _connections

pytestmark = pytest.mark.slow
SECRET = "crash-secret"


def serve(db_url: str, home: Path, port: int) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOOKLEDGER_")}
    env.update(HOOKLEDGER_DATABASE_URL=db_url, HOOKLEDGER_HOME=str(home),
               HOOKLEDGER_PORT=str(port), HOOKLEDGER_GENERAL_SECRETS=f"main={SECRET}",
               HOOKLEDGER_LOG_LEVEL="warning", HOOKLEDGER_LOG_FORMAT="json")
    log = open(home / f"serve-{port}.log", "ab")
    # a file, not a pipe: a pipe nobody reads fills up and blocks the service's logging
    return subprocess.Popen([sys.executable, "-m", "hookledger", "serve"], env=env,
                            stdout=subprocess.DEVNULL, stderr=log)


class Load:
    """Threads sending distinct deliveries until stopped; remembers what was acknowledged."""

    def __init__(self, port: int, tag: str, threads: int = 6) -> None:
        self.port, self.tag = port, tag
        self.acked: set[str] = set()
        self.spooled = 0  # acknowledged from the local spool, the database being away
        self.sent = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(t,)) for t in range(threads)]

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()

    def _run(self, worker: int) -> None:
        i = 0
        with httpx.Client(timeout=5) as client:
            while not self._stop.is_set():
                reference = f"{self.tag}-{worker}-{i}"
                i += 1
                raw = encode(general_body("payment.confirmed", 91000, reference=reference))
                try:
                    answer = client.post(
                        f"http://127.0.0.1:{self.port}/webhooks/general/main", content=raw,
                        headers={"x-service-signature": general_header(SECRET, raw)})
                except httpx.TransportError:
                    time.sleep(0.02)  # the service is down: this one was not acknowledged
                    continue
                with self._lock:
                    self.sent += 1
                    if 200 <= answer.status_code < 300:
                        self.acked.add(reference)
                        self.spooled += bool(answer.json().get("spooled"))


def ledger_references(db_url: str) -> list[str]:
    with psycopg.connect(db_url) as conn:
        return [r for (r,) in conn.execute(
            "SELECT payload->>'reference' FROM hookledger.ledger WHERE source = 'general'")]


def caught_up(db_url: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    with psycopg.connect(db_url, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT (SELECT coalesce(max(position), 0) FROM hookledger.ledger) - "
                "(SELECT min(position) FROM hookledger_private.projection_checkpoints)"
            ).fetchone()
            if row and row[0] == 0:
                return
            time.sleep(0.1)
    raise AssertionError("the projector did not catch up")


def test_kill_9_under_load_loses_nothing_acknowledged(db_url: str, tmp_path: Path) -> None:
    port = free_port()
    with Load(port, "K") as load:
        for _round in range(3):
            proc = serve(db_url, tmp_path, port)
            wait_ready(port, proc)
            time.sleep(1.5)  # under load
            proc.kill()  # no goodbye: mid-request, mid-batch, mid-projection
            proc.wait()
        proc = serve(db_url, tmp_path, port)
        wait_ready(port, proc)
        time.sleep(1)
    try:
        caught_up(db_url)
        stored = ledger_references(db_url)
        record("kill -9 x3 under load", sent=load.sent, acknowledged=len(load.acked),
               stored=len(stored))
        assert load.acked and load.acked <= set(stored)
        assert len(stored) == len(set(stored))  # once each
        result = asyncio.run(verify(db_url))
        assert result.identical, result.differences[:5]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


def test_sigterm_under_load_finishes_in_flight_work_and_exits_0(db_url: str,
                                                                  tmp_path: Path) -> None:
    port = free_port()
    proc = serve(db_url, tmp_path, port)
    wait_ready(port, proc)
    with Load(port, "T") as load:
        time.sleep(2)
        asked = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
        took = time.monotonic() - asked
    assert code == 0, (tmp_path / f"serve-{port}.log").read_text()[-2000:]
    assert took < 35, f"shutdown took {took:.1f} s"
    stored = ledger_references(db_url)
    record("SIGTERM under load", sent=load.sent, acknowledged=len(load.acked),
           stored=len(stored), stopped_in=f"{took:.2f} s")
    assert load.acked and load.acked <= set(stored)
    with psycopg.connect(db_url) as conn:  # the projector stopped at a batch boundary
        row = conn.execute("SELECT count(DISTINCT position) FROM "
                           "hookledger_private.projection_checkpoints").fetchone()
    assert row == (1,)
    assert asyncio.run(verify(db_url)).identical


def test_database_outages_under_load_lose_nothing_acknowledged(
        db_url: str, pg_admin_url: str, tmp_path: Path) -> None:
    """What a PostgreSQL restart looks like to the service: every connection cut, new ones
    refused for a while, then accepted again; meanwhile deliveries keep coming."""
    name = str(conninfo_to_dict(db_url)["dbname"])
    port = free_port()
    proc = serve(db_url, tmp_path, port)
    wait_ready(port, proc)
    try:
        with Load(port, "O") as load:
            for _cycle in range(2):
                time.sleep(1)
                _connections(pg_admin_url, name, allow=False)
                time.sleep(2)
                _connections(pg_admin_url, name, allow=True)
            time.sleep(1)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            stored = ledger_references(db_url)
            if load.acked <= set(stored):
                break
            time.sleep(0.2)
        record("database connections cut and refused x2", sent=load.sent,
               acknowledged=len(load.acked), stored=len(stored),
               acknowledged_from_the_spool=load.spooled)
        assert load.acked and load.acked <= set(stored)
        assert load.spooled > 0  # the outage was real: some answers came from the spool
        assert len(stored) == len(set(stored))
        caught_up(db_url)
        assert asyncio.run(verify(db_url)).identical
    finally:
        _connections(pg_admin_url, name, allow=True)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0


def test_a_real_postgresql_restart_under_load_loses_nothing_acknowledged(
        tmp_path: Path) -> None:
    """The service's own PostgreSQL server (a private one, so the suite's is untouched) is
    stopped and started twice while deliveries keep coming."""
    server = EmbeddedPostgres(tmp_path / "pg")
    url = server.start()
    try:
        migrate.upgrade(url)
        port = free_port()
        proc = serve(url, tmp_path, port)
        wait_ready(port, proc)
        try:
            with Load(port, "R") as load:
                for _cycle in range(2):
                    time.sleep(1)
                    server.stop()
                    time.sleep(1.5)
                    server.start()
                time.sleep(1)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                stored = ledger_references(url)
                if load.acked <= set(stored):
                    break
                time.sleep(0.2)
            record("PostgreSQL stopped and started x2", sent=load.sent,
                   acknowledged=len(load.acked), stored=len(stored),
                   acknowledged_from_the_spool=load.spooled)
            assert load.acked and load.acked <= set(stored)
            assert load.spooled > 0  # the outage was real: some answers came from the spool
            assert len(stored) == len(set(stored))
            caught_up(url)
            assert asyncio.run(verify(url)).identical
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) == 0
    finally:
        server.stop()


def test_sigterm_under_load_with_workers_and_the_embedded_database(tmp_path: Path) -> None:
    """The way most people run it: two HTTP workers, the projector in the supervisor, the
    embedded PostgreSQL. SIGTERM under load: exit 0 in bounded time, the embedded server
    stopped, every acknowledged delivery kept, and the projections equal to a rebuild."""
    home, port = tmp_path / "home", free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOOKLEDGER_")}
    env.update(HOOKLEDGER_HOME=str(home), HOOKLEDGER_PORT=str(port),
               HOOKLEDGER_GENERAL_SECRETS=f"main={SECRET}", HOOKLEDGER_WORKERS="2",
               HOOKLEDGER_LOG_LEVEL="warning", HOOKLEDGER_ADMIN_TOKEN="admin-token")
    with open(tmp_path / "serve.log", "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "hookledger", "serve"], env=env,
                                stdout=subprocess.DEVNULL, stderr=log)
    wait_ready(port, proc, timeout=120)
    with Load(port, "W") as load:
        time.sleep(2)
        # the projector runs in the supervisor, and a worker knows it leads
        status = httpx.get(f"http://127.0.0.1:{port}/api/status",
                           headers={"authorization": "Bearer admin-token"}).json()
        assert status["projector_leader"] is True and status["projected_to"] > 0, status
        asked = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=90)
        took = time.monotonic() - asked
    assert code == 0, (tmp_path / "serve.log").read_text()[-2000:]
    assert took < 35, f"shutdown took {took:.1f} s"
    assert not postgres_running(home), "the embedded server outlived the service"
    # start the database again (the command line does, on the same home) and look
    checked = subprocess.run(
        [sys.executable, "-c", VERIFY_ON_HOME], env=env, capture_output=True, text=True,
        timeout=120)
    assert checked.returncode == 0, checked.stderr[-2000:]
    stored, identical = checked.stdout.split("\t")
    references = set(stored.split(","))
    record("SIGTERM under load, 2 workers, embedded PostgreSQL", sent=load.sent,
           acknowledged=len(load.acked), stored=len(references), stopped_in=f"{took:.2f} s")
    assert load.acked and load.acked <= references
    assert identical.strip() == "True"
    assert not postgres_running(home)


# what the test asks of the stopped service's home: the references in its ledger (after the
# projector would have caught up) and whether the projections equal a rebuild
VERIFY_ON_HOME = """
import asyncio, psycopg
from hookledger.cli import load_settings
from hookledger.database import database
from projections.projector import connect, project_batch
from projections.rebuild import verify

async def catch_up(url):
    async with await connect(url) as conn:
        while await project_batch(conn):
            pass

with database(load_settings()) as url:
    with psycopg.connect(url) as conn:
        refs = [r for (r,) in conn.execute(
            "SELECT payload->>'reference' FROM hookledger.ledger WHERE source = 'general'")]
    asyncio.run(catch_up(url))
    print(",".join(refs), asyncio.run(verify(url)).identical, sep="\\t")
"""
