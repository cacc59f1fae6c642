"""What every benchmark needs: a fresh database, the machine's description, results."""

from __future__ import annotations

import json
import os
import platform
import shutil
import signal
import tempfile
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg

from bench.speed_probe import probe as speed_probe
from bench.wakeup_probe import probe as wakeup_probe
from hookledger import migrate
from hookledger.embedded_postgres import EmbeddedPostgres

RESULTS = Path(os.environ.get("HOOKLEDGER_BENCH_RESULTS")
               or Path(__file__).resolve().parent / "results")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine() -> dict[str, Any]:
    """The machine's description, with how long it takes to wake a process on another core
    (bench/wakeup_probe.py), which moves every process's CPU per delivery from one machine
    to the next, and how fast it runs the steps the issue timed (bench/speed_probe.py)."""
    return {"python": platform.python_version(), "platform": platform.platform(),
            "cpu": cpu_model(), "cpus": os.cpu_count(), "memory_gib": round(
                os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
            "wakeup": wakeup_probe(), "speed": speed_probe()}


def _with_db(url: str, name: str) -> str:
    p = urlsplit(url)
    return urlunsplit((p.scheme, p.netloc, "/" + name, p.query, p.fragment))


@contextmanager
def unwinding_on_sigterm() -> Iterator[None]:
    """While inside, SIGTERM unwinds like Ctrl-C (``SystemExit``, so ``finally`` runs).

    By default SIGTERM ends Python on the spot: a benchmark stopped by ``kill`` or a job's
    timeout left the embedded server it started running, its cluster (gigabytes after a
    5,000,000-event run) left in the temporary folder, and its ``serve`` processes behind.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def fresh_database() -> Iterator[str]:
    """A migrated database on HOOKLEDGER_BENCH_DATABASE_URL's server, else an embedded one,
    removed again however the benchmark ends (SIGTERM included).

    The embedded server keeps its durable defaults (fsync on): figures are for real use.
    """
    with unwinding_on_sigterm():
        yield from _fresh_database()


def _fresh_database() -> Iterator[str]:
    configured = os.environ.get("HOOKLEDGER_BENCH_DATABASE_URL")
    server: EmbeddedPostgres | None = None
    home = None
    try:
        if configured:
            admin = configured
        else:
            home = tempfile.mkdtemp(prefix="hookledger-bench-")
            os.chmod(home, 0o755)
            server = EmbeddedPostgres(Path(home))
            admin = _with_db(server.start(), "postgres")
        with _migrated_database(admin, f"hookledger_bench_{uuid.uuid4().hex[:8]}") as url:
            yield url
    finally:  # a server that will not drop the database is still stopped and removed
        if server is not None:
            server.stop()
        if home is not None:  # the cluster is the bench's own: a 5M-event run leaves GBs
            shutil.rmtree(home, ignore_errors=True)


@contextmanager
def sibling_database(url: str, suffix: str) -> Iterator[str]:
    """A second migrated database on ``url``'s server, named after ``url``'s, dropped
    again on the way out: two ledgers measured side by side share one server, so the
    server's settings, cache and disk are not what differs between them. Made and dropped
    from a connection to ``url`` itself, which the benchmark can reach whatever else it
    cannot."""
    with _migrated_database(url, f"{urlsplit(url).path.lstrip('/')}_{suffix}") as sibling:
        yield sibling


@contextmanager
def _migrated_database(admin: str, name: str) -> Iterator[str]:
    """Database ``name``, created and migrated from a connection to ``admin``, and dropped
    from one on the way out (only if it was created)."""
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        url = _with_db(admin, name)
        migrate.upgrade(url)
        yield url
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def write_results(name: str, figures: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({"machine": machine(), **figures}, indent=2, default=str))
    return path
