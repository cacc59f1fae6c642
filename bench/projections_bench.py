"""Projector and rebuild throughput on a large ledger, and commit-to-view lag under load.

    python -m bench.projections_bench [--events 1000000] [--rate 500] [--seconds 20]

1. fills a fresh ledger with ``--events`` events of a realistic mix (bench/ledger_mix.py);
2. live projector: from an empty projection, ``project_batch`` (1,000 events a batch, one
   transaction each, as ``serve`` runs it) until caught up: events/s;
3. ``rebuild``: the same ledger rebuilt in one transaction: events/s;
4. lag: ``hookledger serve`` as a subprocess on that database, fed distinct signed
   deliveries at a steady ``--rate`` per second; for each, the time from its 200 answer
   (its commit) to its row being visible in ``hookledger.payments``: p50/p99.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import hmac
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from typing import Any

import httpx
import psycopg

from bench.common import fresh_database, write_results
from bench.ledger_mix import Mix
from bench.loadgen import Answer, percentile, post_request, run
from ledger.store import append_in
from projections.projector import connect, project_batch
from projections.rebuild import rebuild
from projections.registry import PROJECTIONS

SECRET = "bench-secret"


async def fill(url: str, total: int, batch: int = 5000) -> float:
    started = time.perf_counter()
    mix = Mix(seed=1)
    pending = []
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        for event in mix.events(total):
            pending.append(event)
            if len(pending) == batch:
                async with conn.transaction():
                    await append_in(conn, pending)
                pending = []
        if pending:
            async with conn.transaction():
                await append_in(conn, pending)
    return time.perf_counter() - started


async def reset_projections(url: str) -> None:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        for p in PROJECTIONS:
            await conn.execute(f"DELETE FROM hookledger_private.{p.table}")
        await conn.execute("UPDATE hookledger_private.projection_checkpoints SET position = 0")
        await conn.execute("VACUUM ANALYZE")


async def live_projector(url: str, batch_size: int = 1000) -> tuple[int, float]:
    started = time.perf_counter()
    applied = 0
    async with await connect(url) as conn:  # serve's projector connection, set up alike
        while n := await project_batch(conn, batch_size=batch_size):
            applied += n
    return applied, time.perf_counter() - started


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def body(reference: str) -> bytes:
    return json.dumps({
        "timestamp": "20261122083000", "reference": reference, "amount": 1000,
        "type": "CHARGE", "merchantAccountId": "shop", "status": "SUCCESSFUL",
        "customer": {"firstname": "A", "lastname": "B", "phoneNumber": "255712345678",
                     "mno": "Op"},
        "transactionId": "TX", "event": "payment.confirmed", "service": "Collection",
        "message": "Paid", "code": 91000}).encode()


async def lag(url: str, rate: int, seconds: float) -> dict[str, Any]:
    port = free_port()
    env = {**os.environ, "HOOKLEDGER_DATABASE_URL": url, "HOOKLEDGER_PORT": str(port),
           "HOOKLEDGER_GENERAL_SECRETS": f"main={SECRET}", "HOOKLEDGER_LOG_LEVEL": "warning"}
    server = subprocess.Popen([sys.executable, "-m", "hookledger", "serve"], env=env)
    total = int(rate * seconds)
    requests = []
    for i in range(total):
        raw = body(f"LAG-{i}")
        signature = "sha256=" + hmac.new(SECRET.encode(), raw, hashlib.sha256).hexdigest()
        requests.append(post_request("127.0.0.1", "/webhooks/general/main", raw,
                                     {"X-Service-Signature": signature}))
    acked: dict[str, float] = {}
    visible: dict[str, float] = {}
    try:
        wait_ready(port)
        stop = asyncio.Event()

        def on_answer(answer: Answer) -> None:
            if answer.status == 200:
                acked[f"LAG-{answer.index}"] = answer.done

        async def watch() -> None:
            async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
                while not stop.is_set() or len(visible) < len(acked):
                    waiting = [r for r in acked if r not in visible]
                    if waiting:
                        cur = await conn.execute(
                            "SELECT reference FROM hookledger.payments "
                            "WHERE reference = ANY(%s)", (waiting,))
                        now = time.perf_counter()
                        for (reference,) in await cur.fetchall():
                            visible[reference] = now
                    await asyncio.sleep(0.005)

        watcher = asyncio.create_task(watch())
        started = time.perf_counter()
        answers = await run("127.0.0.1", port, requests, rate=rate, connections=16,
                            on_answer=on_answer)
        achieved = len(answers) / (time.perf_counter() - started)
        stop.set()
        await asyncio.wait_for(watcher, timeout=60)
    finally:
        server.terminate()
        server.wait(timeout=60)
    lags = [visible[r] - acked[r] for r in acked]
    answer_latency = [a.latency for a in answers]
    return {"sent": total, "acknowledged": len(acked), "achieved_rate": round(achieved, 1),
            "answer_p99_ms": round(percentile(answer_latency, 0.99) * 1000, 1),
            "lag_p50_ms": round(statistics.median(lags) * 1000, 1),
            "lag_p99_ms": round(percentile(lags, 0.99) * 1000, 1),
            "lag_max_ms": round(max(lags) * 1000, 1)}


def wait_ready(port: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise RuntimeError("hookledger did not become ready")


async def main(events: int, rate: int, seconds: float) -> dict[str, Any]:
    with fresh_database() as url:
        fill_s = await fill(url, events)
        print(f"ledger filled: {events:,} events in {fill_s:.1f} s "
              f"({events / fill_s:,.0f} events/s)", flush=True)
        await reset_projections(url)
        applied, live_s = await live_projector(url)
        print(f"live projector: {applied:,} events in {live_s:.1f} s "
              f"({applied / live_s:,.0f} events/s)", flush=True)
        result = await rebuild(url)
        print(f"rebuild: {result.events:,} events in {result.seconds:.1f} s "
              f"({result.rate:,.0f} events/s)", flush=True)
        figures = await lag(url, rate, seconds)
        print(f"commit-to-view lag at {figures['achieved_rate']}/s: p50 "
              f"{figures['lag_p50_ms']} ms, p99 {figures['lag_p99_ms']} ms, max "
              f"{figures['lag_max_ms']} ms ({figures['acknowledged']} acknowledged)", flush=True)
    return {"events": events, "fill_events_per_s": round(events / fill_s),
            "live_projector_events_per_s": round(applied / live_s),
            "rebuild_events_per_s": round(result.rate), "lag": figures}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--rate", type=int, default=500)
    parser.add_argument("--seconds", type=float, default=20)
    args = parser.parse_args()
    figures = asyncio.run(main(args.events, args.rate, args.seconds))
    print("written", write_results("projections", figures))
