"""`hookledger serve` as a user runs it: fresh home, embedded database, signals, sharing."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from hookledger.embedded_postgres import pid_alive
from tests.general_events import encode, general_body
from tests.signing import general_header

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def hookledger(home: Path, *args: str, port: int | None = None, workers: int = 1,
               settings: dict[str, str] | None = None,
               **popen: object) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOOKLEDGER_")}
    env.update(HOOKLEDGER_HOME=str(home), HOOKLEDGER_GENERAL_SECRETS="main=proc-secret",
               HOOKLEDGER_PORT=str(free_port() if port is None else port),
               HOOKLEDGER_LOG_FORMAT="json",
               HOOKLEDGER_WORKERS=str(workers), **(settings or {}))
    return subprocess.Popen([sys.executable, "-m", "hookledger", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen)  # type: ignore[call-overload]


def wait_ready(port: int, proc: subprocess.Popen[bytes], timeout: float = 60) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if proc.poll() is not None:
            raise AssertionError(proc.stderr.read().decode() if proc.stderr else "exited")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                return time.monotonic() - started
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise AssertionError("not ready in time")


def database_url(home: Path) -> str:
    """The URL of a home's embedded database, as a user gets it (``hookledger db url``)."""
    return subprocess.run([sys.executable, "-m", "hookledger", "db", "url"],
                          env={**os.environ, "HOOKLEDGER_HOME": str(home)},
                          capture_output=True, text=True, check=True).stdout.strip()


def postgres_running(home: Path) -> bool:
    pid_file = home / "postgres" / "data" / "postmaster.pid"
    try:
        first = pid_file.read_text().split()[:1]
    except FileNotFoundError:
        return False
    # read while the postmaster is still writing it, the file can be empty: not up yet
    return bool(first) and first[0].isdigit() and pid_alive(int(first[0]))


def started_at(pid: int) -> str | None:
    """The process's start time in clock ticks (with the pid, it names one process)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return None if fields[0] == "Z" else fields[19]


def stop(proc: subprocess.Popen[bytes]) -> int:
    proc.send_signal(signal.SIGTERM)
    return proc.wait(timeout=60)


def test_serve_on_a_fresh_home_accepts_a_delivery_and_exits_cleanly(tmp_path: Path) -> None:
    home = tmp_path / "fresh-home"
    port = free_port()
    proc = hookledger(home, "serve", port=port)
    try:
        seconds = wait_ready(port, proc)
        print(f"serve to ready on a fresh home: {seconds:.2f} s")
        raw = encode(general_body("payment.confirmed", 91000, reference="R-PROC"))
        answer = httpx.post(f"http://127.0.0.1:{port}/webhooks/general/main", content=raw,
                            headers={"x-service-signature": general_header("proc-secret", raw)})
        assert answer.status_code == 200
        url = database_url(home)
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT event_type FROM hookledger.ledger").fetchall() == [
                ("payment.confirmed",)]
    finally:
        code = stop(proc)
    assert code == 0, proc.stderr.read().decode() if proc.stderr else ""
    assert not postgres_running(home), "the embedded server outlived the service"


def test_workers_share_one_socket_one_ledger_and_stop_with_the_supervisor(
        tmp_path: Path) -> None:
    home = tmp_path / "workers-home"
    port = free_port()
    proc = hookledger(home, "serve", port=port, workers=2)
    try:
        wait_ready(port, proc)
        bodies = [encode(general_body("payment.confirmed", 91000, reference=f"R-W{i}"))
                  for i in range(40)]
        with httpx.Client() as client:  # new connections: the kernel spreads them
            for raw in bodies + bodies[:10]:  # ten repeats, deduplicated whichever worker
                answer = client.post(
                    f"http://127.0.0.1:{port}/webhooks/general/main", content=raw,
                    headers={"x-service-signature": general_header("proc-secret", raw),
                             "connection": "close"})
                assert answer.status_code == 200
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        workers = {(int(p), started_at(int(p))) for p in children  # not multiprocessing's
                   if b"resource_tracker" not in Path(f"/proc/{p}/cmdline").read_bytes()}
        assert len(workers) >= 2
        url = database_url(home)
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT count(*) FROM hookledger.ledger").fetchone() == (40,)
    finally:
        code = stop(proc)
    assert code == 0, proc.stderr.read().decode() if proc.stderr else ""
    assert not postgres_running(home), "the embedded server outlived the workers"
    for pid, started in workers:  # the same pid may already be another, newer process
        assert started_at(pid) != started, "a worker outlived its supervisor"


def test_a_serve_with_its_projector_off_only_ingests_and_a_project_process_folds(
        tmp_path: Path) -> None:
    """``HOOKLEDGER_PROJECTOR=off``: serve acknowledges and stores, never folds; ``hookledger
    project`` on the same database folds what is there and what comes, and stops on
    SIGTERM at a batch boundary, exit 0."""
    home = tmp_path / "roles-home"
    port = free_port()
    ingest = hookledger(home, "serve", port=port, settings={"HOOKLEDGER_PROJECTOR": "off"})
    projector: subprocess.Popen[bytes] | None = None
    try:
        wait_ready(port, ingest)
        url = database_url(home)

        def deliver(reference: str) -> None:
            raw = encode(general_body("payment.confirmed", 91000, reference=reference))
            answer = httpx.post(
                f"http://127.0.0.1:{port}/webhooks/general/main", content=raw,
                headers={"x-service-signature": general_header("proc-secret", raw)})
            assert answer.status_code == 200

        def projected() -> list[str]:
            with psycopg.connect(url) as conn:
                return [r for (r,) in conn.execute(
                    "SELECT reference FROM hookledger.payments ORDER BY reference")]

        def wait_for(references: list[str]) -> None:
            deadline = time.monotonic() + 30
            while projected() != references:
                assert time.monotonic() < deadline, f"projected only {projected()}"
                time.sleep(0.1)

        deliver("R-ROLE-1")
        time.sleep(1.5)  # serve's own projector folds within about 0.1 s
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT count(*) FROM hookledger.ledger").fetchone() == (1,)
        assert projected() == []
        projector = hookledger(home, "project")
        wait_for(["R-ROLE-1"])
        deliver("R-ROLE-2")
        wait_for(["R-ROLE-1", "R-ROLE-2"])
        assert stop(projector) == 0, projector.stderr.read().decode() if projector.stderr \
            else ""
        assert postgres_running(home), "the projector stopped the server serve still uses"
    finally:
        if projector is not None and projector.poll() is None:
            stop(projector)
        code = stop(ingest)
    assert code == 0, ingest.stderr.read().decode() if ingest.stderr else ""
    assert not postgres_running(home)


def test_two_processes_share_one_embedded_server_and_the_last_stops_it(tmp_path: Path) -> None:
    home = tmp_path / "shared-home"
    port_a, port_b = free_port(), free_port()
    first = hookledger(home, "serve", port=port_a)
    try:
        wait_ready(port_a, first)
        second = hookledger(home, "serve", port=port_b)
        try:
            wait_ready(port_b, second)
            assert stop(first) == 0
            assert postgres_running(home), "stopped while another process still used it"
            assert httpx.get(f"http://127.0.0.1:{port_b}/readyz").status_code == 200
        finally:
            assert stop(second) == 0
    finally:
        if first.poll() is None:
            stop(first)
    assert not postgres_running(home)


def test_a_killed_process_does_not_keep_the_server_alive(tmp_path: Path) -> None:
    """After kill -9, the next process adopts the orphaned server and stops it on exit."""
    home = tmp_path / "orphan-home"
    port = free_port()
    victim = hookledger(home, "serve", port=port)
    wait_ready(port, victim)
    victim.kill()
    victim.wait()
    assert postgres_running(home)
    migrate = hookledger(home, "migrate")
    assert migrate.wait(timeout=60) == 0
    assert not postgres_running(home)


def test_bad_configuration_names_the_key_and_never_echoes_a_value(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOOKLEDGER_")}
    env.update(HOOKLEDGER_HOME=str(tmp_path), HOOKLEDGER_GENERAL_SECRETS="oops-no-equals-s3cret",
               HOOKLEDGER_PORT="eighty")
    result = subprocess.run([sys.executable, "-m", "hookledger", "migrate"], env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "HOOKLEDGER_GENERAL_SECRETS" in result.stderr and "HOOKLEDGER_PORT" in result.stderr
    assert "s3cret" not in result.stderr + result.stdout


def _wait_for_server(home: Path, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not postgres_running(home):
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else "exited"
        assert time.monotonic() < deadline, "the embedded server never came up"
        time.sleep(0.05)


def test_a_stop_asked_for_while_serve_starts_stops_it_and_its_server(tmp_path: Path) -> None:
    """SIGTERM once the embedded server is up but before serve answers: serve once ignored
    it and went on to serve (and a supervisor's kill -9 later left the server running)."""
    home = tmp_path / "starting-home"
    port = free_port()
    proc = hookledger(home, "serve", port=port)
    try:
        _wait_for_server(home, proc)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not postgres_running(home)


def test_sigterm_to_a_one_shot_command_stops_the_embedded_server_it_started(
        tmp_path: Path) -> None:
    """Python's default for SIGTERM ends a process where it stands: a `hookledger chat
    rotate-secret` (here waiting on a provider that never answers) left the embedded
    server running."""
    from sandbox.faults import FaultSettings
    from sandbox.runner import running_sandbox

    home = tmp_path / "one-shot-home"
    hang = FaultSettings(timeout_rate=1.0, hang_s=60)
    with running_sandbox(api_key="k1", faults=hang) as api:
        api.state.connect_number("1098765432", secret="before")
        proc = hookledger(home, "chat", "rotate-secret", "1098765432", settings={
            "HOOKLEDGER_API_BASE_URL": api.url, "HOOKLEDGER_API_KEY": "k1"})
        try:
            _wait_for_server(home, proc)
            time.sleep(1.0)  # migrating, or waiting on the provider: either way mid-command
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) == 128 + signal.SIGTERM
        finally:
            if proc.poll() is None:
                proc.kill()
    assert not postgres_running(home)


def test_a_worker_that_cannot_start_makes_serve_exit_non_zero(tmp_path: Path) -> None:
    """uvicorn stops every worker when one fails to start; serve used to exit 0 then, which
    a supervisor restarting on failure reads as a clean stop."""
    home = tmp_path / "broken-home"
    home.mkdir()
    (home / "spool").write_text("not a directory")  # the worker's spool cannot be made
    proc = hookledger(home, "serve")
    try:
        assert proc.wait(timeout=90) != 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "an HTTP worker could not start" in (proc.stderr.read().decode()
                                                if proc.stderr else "")
    assert not postgres_running(home)


def test_a_chat_number_or_secret_the_store_refuses_is_a_configuration_error(
        tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOOKLEDGER_")}
    env.update(HOOKLEDGER_HOME=str(tmp_path), HOOKLEDGER_CHAT_SECRETS="1" * 70 + "=s3cret")
    result = subprocess.run([sys.executable, "-m", "hookledger", "migrate"], env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "HOOKLEDGER_CHAT_SECRETS" in result.stderr
    assert "s3cret" not in result.stderr + result.stdout


def test_a_port_the_kernel_picks_is_named_in_the_log(db_url: str, tmp_path: Path) -> None:
    """``HOOKLEDGER_PORT=0`` listens where the kernel says, and no line said where: the
    start-up line names the address bound, so that the service can be reached."""
    proc = hookledger(tmp_path / "home", "serve", port=0,
                      settings={"HOOKLEDGER_DATABASE_URL": db_url})
    try:
        line = _log_line(proc, "service.workers")
        assert line["host"] == "127.0.0.1" and isinstance(line["port"], int), line
        assert line["port"] != 0
        wait_ready(line["port"], proc)
    finally:
        code = stop(proc)
    assert code == 0


def _log_line(proc: subprocess.Popen[bytes], event: str, timeout: float = 60) -> dict[str, Any]:
    """The first JSON log line of ``event`` on ``proc``'s standard error."""
    assert proc.stderr is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stderr], [], [], 0.5)
        if not ready:
            continue
        raw = proc.stderr.readline()
        if not raw:
            raise AssertionError(f"exited before logging {event}")
        with contextlib.suppress(ValueError):
            line = json.loads(raw)
            if isinstance(line, dict) and line.get("event") == event:
                return line
    raise AssertionError(f"no {event} line in time")
