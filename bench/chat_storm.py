"""Chat retry storm: many signed deliveries, each sent several times at once, against a real
``hookledger serve`` process, on a fresh database like every benchmark (embedded PostgreSQL
with durable defaults, or one on ``HOOKLEDGER_BENCH_DATABASE_URL``'s server).

    .venv/bin/python -m bench.chat_storm [--deliveries 1200] [--copies 4] [--concurrency 64]

Prints latency percentiles of the answers and the ledger count against the distinct
delivery ids (they must be equal), and writes bench/results/chat_storm.json.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import hmac
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psycopg

from bench.common import RESULTS as COMMON_RESULTS
from bench.common import fresh_database
from bench.loadgen import percentile, post_request, run
from bench.projections_bench import free_port

PHONE = "2557000001"
SECRET = "bench-chat-secret-0123456789"
RESULTS = COMMON_RESULTS / "chat_storm.json"


def _sign(body: bytes) -> str:
    t = int(time.time())
    digest = hmac.new(SECRET.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={t},v1={digest}"


def _body(n: int) -> bytes:
    return json.dumps({
        "type": "message", "wabaId": "waba-bench", "phoneNumberId": PHONE,
        "contactWaId": f"2557{n:08d}", "profileName": "Bench",
        "message": {"id": f"wamid.storm.{n}", "from": f"2557{n:08d}",
                    "timestamp": str(int(time.time())), "type": "text",
                    "text": {"body": f"storm message {n}"}},
    }, separators=(",", ":")).encode()


async def _storm(base: str, deliveries: int, copies: int,
                 concurrency: int) -> tuple[list[float], dict[int, int]]:
    """Every delivery id sent ``copies`` times, shuffled, ``concurrency`` at a time.

    Requests are signed and encoded before the clock starts and written on raw keep-alive
    connections (bench/loadgen.py), so the figures are the server's, not the client's.
    """
    host, port = base.removeprefix("http://").split(":")
    sends = [(n, attempt) for n in range(deliveries) for attempt in range(1, copies + 1)]
    random.Random(7).shuffle(sends)  # copies of one id arrive interleaved and concurrently
    bodies = {n: _body(n) for n in range(deliveries)}
    requests = [post_request(host, f"/webhooks/chat/{PHONE}", bodies[n], {
        "User-Agent": "service-chat-webhook/1.0", "X-Service-Delivery-Id": f"storm-{n}",
        "X-Service-Attempt": str(attempt), "X-Service-Signature": _sign(bodies[n])})
        for n, attempt in sends]
    answers = await run(host, int(port), requests, rate=None, connections=concurrency)
    statuses: dict[int, int] = {}
    for answer in answers:
        statuses[answer.status] = statuses.get(answer.status, 0) + 1
    return [a.latency * 1000 for a in answers], statuses


def _wait_ready(base: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit("hookledger serve exited early")
        try:
            if httpx.get(f"{base}/readyz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise SystemExit("hookledger serve did not become ready")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deliveries", type=int, default=1200)
    parser.add_argument("--copies", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=64)
    args = parser.parse_args()

    with fresh_database() as url, \
            tempfile.TemporaryDirectory(prefix="hookledger-chat-storm-") as home:
        result = _measure(url, Path(home), args)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    lat = result["latency_ms"]
    print(f"{result['requests']} requests ({args.deliveries} delivery ids x {args.copies}), "
          f"concurrency {args.concurrency}, {result['elapsed_s']} s, "
          f"{result['requests_per_s']} req/s, statuses {result['statuses']}")
    print(f"latency ms: p50 {lat['p50']}  p95 {lat['p95']}  p99 {lat['p99']}  max {lat['max']}")
    print(f"ledger events {result['ledger_events']} for {args.deliveries} distinct delivery "
          f"ids ({'exactly once' if result['exactly_once'] else 'MISMATCH'})")
    print(f"written to {RESULTS}")


def _measure(url: str, home: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Run ``serve`` on ``url``, storm it, and count what the ledger kept."""
    port = free_port()
    env = {**os.environ, "HOOKLEDGER_DATABASE_URL": url, "HOOKLEDGER_PORT": str(port),
           "HOOKLEDGER_HOME": str(home), "HOOKLEDGER_CHAT_SECRETS": f"{PHONE}={SECRET}",
           "HOOKLEDGER_LOG_LEVEL": "warning", "HOOKLEDGER_LOG_FORMAT": "json"}
    env.pop("HOOKLEDGER_API_BASE_URL", None)
    proc = subprocess.Popen([sys.executable, "-m", "hookledger", "serve"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        base = f"http://127.0.0.1:{port}"
        _wait_ready(base, proc)
        started = time.perf_counter()
        latencies, statuses = asyncio.run(
            _storm(base, args.deliveries, args.copies, args.concurrency))
        elapsed = time.perf_counter() - started
        with psycopg.connect(url) as conn:
            events, distinct = conn.execute(
                "SELECT count(*), count(DISTINCT dedupe_key) FROM hookledger.ledger "
                "WHERE source = 'chat'").fetchone() or (0, 0)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return {
        "requests": len(latencies), "deliveries": args.deliveries,
        "copies_per_delivery": args.copies, "concurrency": args.concurrency,
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "elapsed_s": round(elapsed, 2),
        "requests_per_s": round(len(latencies) / elapsed, 1),
        "latency_ms": {"p50": round(percentile(latencies, 0.50), 2),
                       "p95": round(percentile(latencies, 0.95), 2),
                       "p99": round(percentile(latencies, 0.99), 2),
                       "max": round(max(latencies), 2)},
        "ledger_events": events, "distinct_delivery_ids": args.deliveries,
        "distinct_dedupe_keys": distinct, "exactly_once": events == args.deliveries,
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                    "platform": platform.platform()},
        "database": ("HOOKLEDGER_BENCH_DATABASE_URL's server"
                     if os.environ.get("HOOKLEDGER_BENCH_DATABASE_URL")
                     else "embedded PostgreSQL, durable defaults (fsync on)"),
    }


if __name__ == "__main__":
    main()
