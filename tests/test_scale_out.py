"""Two ``serve`` processes on one database, no balancer: both ingest, one projects, and
killing the projecting one hands projection over to the other within seconds."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psycopg
import pytest

from tests.fault_report import FIGURES
from tests.general_events import encode, general_body
from tests.signing import general_header
from tests.test_serve_process import free_port, wait_ready

pytestmark = pytest.mark.slow
SECRET = "scale-secret"
TOKEN = "scale-admin-token"


def serve(db_url: str, home: Path, port: int) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOOKLEDGER_")}
    env.update(HOOKLEDGER_DATABASE_URL=db_url, HOOKLEDGER_HOME=str(home),
               HOOKLEDGER_PORT=str(port), HOOKLEDGER_GENERAL_SECRETS=f"main={SECRET}",
               HOOKLEDGER_ADMIN_TOKEN=TOKEN, HOOKLEDGER_LOG_LEVEL="warning")
    return subprocess.Popen([sys.executable, "-m", "hookledger", "serve"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def deliver(port: int, reference: str) -> None:
    raw = encode(general_body("payment.confirmed", 91000, reference=reference))
    answer = httpx.post(f"http://127.0.0.1:{port}/webhooks/general/main", content=raw,
                        headers={"x-service-signature": general_header(SECRET, raw)})
    assert answer.status_code == 200


def leads(port: int) -> bool:
    answer = httpx.get(f"http://127.0.0.1:{port}/api/status",
                       headers={"authorization": f"Bearer {TOKEN}"})
    return bool(answer.json()["projector_leader"])


def visible(db_url: str, reference: str, within: float) -> float:
    started = time.monotonic()
    with psycopg.connect(db_url, autocommit=True) as conn:
        while time.monotonic() - started < within:
            if conn.execute("SELECT 1 FROM hookledger.payments WHERE reference = %s",
                            (reference,)).fetchone():
                return time.monotonic() - started
            time.sleep(0.05)
    raise AssertionError(f"{reference} not projected within {within} s")


def test_both_ingest_one_projects_and_the_survivor_takes_over(db_url: str,
                                                              tmp_path: Path) -> None:
    ports = [free_port(), free_port()]
    procs = [serve(db_url, tmp_path / f"home-{i}", port) for i, port in enumerate(ports)]
    try:
        for port, proc in zip(ports, procs, strict=True):
            wait_ready(port, proc)
        for i in range(10):
            deliver(ports[i % 2], f"SC-{i}")
            deliver(ports[(i + 1) % 2], f"SC-{i}")  # the same event through the other one
        with psycopg.connect(db_url) as conn:
            assert conn.execute("SELECT count(*) FROM hookledger.ledger").fetchone() == (10,)
        visible(db_url, "SC-9", within=10)
        leaders = [leads(port) for port in ports]
        assert sorted(leaders) == [False, True]

        leader = leaders.index(True)
        procs[leader].send_signal(signal.SIGKILL)
        procs[leader].wait()
        survivor = ports[1 - leader]
        deliver(survivor, "SC-after")
        took = visible(db_url, "SC-after", within=15)
        FIGURES.append(f"scale-out: projector leader killed (-9); the survivor projected "
                       f"a new delivery {took:.2f} s later")
        assert leads(survivor)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=60)
