"""A benchmark stopped by SIGTERM (``kill``, a job's timeout) removes what it started."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from hookledger.embedded_postgres import pid_alive

ROOT = Path(__file__).resolve().parent.parent

HOLD_A_FRESH_DATABASE = """
import time
from bench.common import fresh_database
with fresh_database() as url:
    print(url, flush=True)
    time.sleep(600)
"""


def test_sigterm_stops_the_embedded_server_and_removes_its_cluster(
        bench_tmpdir: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "HOOKLEDGER_BENCH_DATABASE_URL"}
    env["TMPDIR"] = str(bench_tmpdir)
    proc = subprocess.Popen([sys.executable, "-c", HOLD_A_FRESH_DATABASE], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, text=True)
    postmaster = 0
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline()
        assert url.startswith("postgresql://"), "the benchmark's database did not start"
        [home] = bench_tmpdir.glob("hookledger-bench-*")
        postmaster = int((home / "postgres" / "data" / "postmaster.pid")
                         .read_text().split()[0])
        assert pid_alive(postmaster)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
        deadline = time.monotonic() + 10
        while pid_alive(postmaster) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not pid_alive(postmaster)
        assert not home.exists()
    finally:  # on failure, leave no server behind (SIGQUIT: its immediate shutdown)
        if proc.poll() is None:
            proc.kill()
        if postmaster and pid_alive(postmaster):
            os.kill(postmaster, signal.SIGQUIT)
