"""Benchmark: reconcile 10,000 expectations against the sandbox API answering with 50 ms
latency (goal < 60 s with bounded concurrency), and write the scheduled report of 100,000
discrepancies from the database, every format (goal < 10 s), with its process's peak
memory (it runs in the service). Prints the figures and writes JSON to bench/results/.

Run: ``.venv/bin/python bench/reconcile_bench.py [--expectations N] [--discrepancies N]``
(uses HOOKLEDGER_TEST_DATABASE_URL, or starts an embedded PostgreSQL in a temp folder).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import RESULTS  # noqa: E402
from hookledger import logs, migrate  # noqa: E402
from hookledger.embedded_postgres import EmbeddedPostgres  # noqa: E402
from reconcile.client import ReferenceClient  # noqa: E402
from reconcile.report import Row  # noqa: E402
from reconcile.runner import PassConfig, Reconciler  # noqa: E402
from sandbox.faults import FaultSettings  # noqa: E402
from sandbox.runner import running_sandbox  # noqa: E402
from sandbox.state import DEFAULT_API_KEY, SandboxState  # noqa: E402
from tests.dbutil import create_database, drop_database, unique_name, with_database  # noqa: E402


def seed(url: str, state: SandboxState, count: int) -> None:
    initiated = datetime.now(UTC) - timedelta(minutes=10)
    with psycopg.connect(url, autocommit=True) as conn:
        with conn.cursor() as cur:
            cur.executemany("SELECT hookledger.expect(%s, 'collection', %s, %s)",
                            [(f"B-{i:06d}", Decimal(1000 + i), initiated)
                             for i in range(count)])
    for i in range(count):
        state.put_record(f"B-{i:06d}", {
            "reference": f"B-{i:06d}", "status": "SUCCESSFUL", "amount": 1000 + i,
            "event": "payment.confirmed", "code": 91000, "service": "Collection",
            "type": "CHARGE", "timestamp": "20261122080000"})


async def reconcile_all(url: str, api: str, concurrency: int) -> tuple[float, int, int]:
    started = time.perf_counter()
    async with ReferenceClient(api, DEFAULT_API_KEY, timeout_s=10,
                               concurrency=concurrency) as client:
        config = PassConfig(max_subjects=100_000, chunk_size=2000)
        result = await Reconciler(url, client, config).run_pass()
    return time.perf_counter() - started, result.checked, len(result.recovered)


def report_rows(count: int) -> list[Row]:
    now = datetime.now(UTC)
    kinds = ["missing_webhook", "status_mismatch", "amount_mismatch", "unresolved",
             "unknown_at_provider", "conflicting_events", "unsettled_paid_invoice"]
    return [Row(f"{i:024x}", kinds[i % 7], ["Collection", "Disbursement"][i % 2],
                ["collection", "payout"][i % 2], f"REF-{i}", f"detail {i}",
                Decimal(i % 5000) + Decimal("0.50"), "open" if i % 3 else "resolved",
                now - timedelta(minutes=i), None if i % 3 else now, 91052 if i % 7 else None)
            for i in range(count)]


def seed_discrepancies(url: str, rows: list[Row]) -> None:
    """Written straight into the projection's table: the report reads nothing else."""
    with psycopg.connect(url, autocommit=True) as conn, conn.cursor() as cur, cur.copy(
            "COPY hookledger_private.discrepancies (id, kind, service, subject, reference, "
            "detail, amount_at_risk, status, detected_at, resolved_at, facts, event_count, "
            "last_position) FROM STDIN") as copy:
        for position, r in enumerate(rows, 1):
            facts = json.dumps({"provider_code": r.code} if r.code else {})
            copy.write_row((r.id, r.kind, r.service, r.subject, r.reference, r.detail,
                            r.amount_at_risk, r.status, r.detected_at, r.resolved_at, facts,
                            1, position))


# run in a process of its own, so that its peak resident memory is the report's alone
# (VmHWM, which starts afresh with the program: getrusage's maximum outlives exec, and
# would report this bench's own)
REPORT_CHILD = """
import json, sys, time
from pathlib import Path
from reconcile.report_files import write_report_files
def high_water_kib():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
before = high_water_kib()
started = time.perf_counter()
written = write_report_files(sys.argv[1], Path(sys.argv[2]))
print(json.dumps({"seconds": time.perf_counter() - started, "rss_before_kib": before,
                  "rss_peak_kib": high_water_kib(),
                  "bytes": {p.suffix[1:]: p.stat().st_size for p in written
                            if p.name.startswith("latest.")}}))
"""


def time_report(url: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as directory:
        done = subprocess.run([sys.executable, "-c", REPORT_CHILD, url, directory],
                              capture_output=True, text=True, check=True,
                              cwd=Path(__file__).resolve().parent.parent)
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--expectations", type=int, default=10_000)
    parser.add_argument("--discrepancies", type=int, default=100_000)
    parser.add_argument("--latency-ms", type=int, default=50)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    # every expectation is a deliberately lost webhook, so the pass warns 10,000 times
    # ("reconcile.repaired"): right for a service, noise in a benchmark's output
    logs.configure(level="error")
    figures: dict[str, object] = {"machine": platform.platform(), "python": sys.version.split()[0],
                                  "expectations": args.expectations,
                                  "latency_ms": args.latency_ms,
                                  "concurrency": args.concurrency,
                                  "discrepancies": args.discrepancies}

    with tempfile.TemporaryDirectory() as home:
        configured = (os.environ.get("HOOKLEDGER_BENCH_DATABASE_URL")
                      or os.environ.get("HOOKLEDGER_TEST_DATABASE_URL"))  # as it used to
        server = None if configured else EmbeddedPostgres(
            Path(home), server_settings={"fsync": "off", "synchronous_commit": "off"})
        admin = configured or with_database(server.start(), "postgres")  # type: ignore[union-attr]
        name = unique_name("hookledger_bench")
        url = create_database(admin, name)
        try:
            migrate.upgrade(url)
            state = SandboxState()
            seed(url, state, args.expectations)
            with running_sandbox(state=state,
                                 faults=FaultSettings(latency_ms=args.latency_ms)) as api:
                seconds, checked, recovered = asyncio.run(
                    reconcile_all(url, api.url, args.concurrency))
            figures.update(reconcile_seconds=round(seconds, 2), checked=checked,
                           recovered=recovered,
                           reconcile_per_s=round(checked / seconds, 1))
            print(f"reconcile: {checked} expectations checked ({recovered} recovered) in "
                  f"{seconds:.1f} s = {checked / seconds:.0f}/s "
                  f"(latency {args.latency_ms} ms, concurrency {args.concurrency}; goal < 60 s)")
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("TRUNCATE hookledger_private.discrepancies")
            seed_discrepancies(url, report_rows(args.discrepancies))
            report = time_report(url)
        finally:
            drop_database(admin, name)
            if server is not None:
                server.stop()

    peak = report["rss_peak_kib"] / 1024
    figures.update(report_total_seconds=round(report["seconds"], 2),
                   report_peak_rss_mib=round(peak), report_bytes=report["bytes"],
                   report_rss_before_mib=round(report["rss_before_kib"] / 1024))
    print(f"report: {args.discrepancies} discrepancies in the database "
          f"({sum(1 for i in range(args.discrepancies) if i % 3)} open), every format "
          f"written in {report['seconds']:.2f} s (goal < 10 s); peak resident memory "
          f"{peak:.0f} MiB ({report['rss_before_kib'] / 1024:.0f} before it began); "
          + ", ".join(f"{fmt} {size / 2**20:.0f} MiB" for fmt, size in report["bytes"].items()))
    out = RESULTS
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"reconcile-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}.json"
    path.write_text(json.dumps(figures, indent=2), encoding="utf-8")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
