"""Ingest side by side with the bare endpoint, on the same PostgreSQL, in the same run.

    python -m bench.ingest_bench [--seconds 15] [--connections 64] [--rounds 3]
                                 [--scale-events 5000000]

1. **throughput**: wrk (64 connections, pre-signed distinct 1 KB deliveries, each sent once)
   against the bare endpoint (``bench/bare_endpoint.py``, 2 uvicorn workers, one INSERT per
   request), then against ``hookledger serve``: req/s, p50/p99, and the ratio. The pair runs
   ``--rounds`` times (3), alternating, and the table keeps the median req/s and p50: this
   machine's speed drifts by the minute (the bare endpoint alone measured 3,551 to 8,465
   req/s across one day's runs), and one pair showed the drift as much as the difference.
   Which contender goes first alternates too (:func:`round_order`), since the drift
   within a round favoured the one measured later.
   The ratio is the median of each round's own ratio; p99 is the worst round's. Rounds
   after the first start with the earlier rounds' events in the ledger (under 200,000;
   the scaling run below has 5,000,000). After each run the ledger is counted against the
   number of 2xx answers: every acknowledged delivery must be there, once.
   Unless ``--no-projector-off`` is given, each round also measures ``serve`` with
   ``HOOKLEDGER_PROJECTOR=off`` on a database of its own (nothing there waits to be
   folded): the ingest path alone, so the table shows how much of the ratio the projector
   takes and how much the ingest path itself leaves.
2. **latency at a fixed rate**: both at a steady 1,000 req/s (open loop, from this process).
3. **scaling**: a second database on the same server is filled to ``--scale-events`` events
   (server side, through the ledger's own trigger, with dedupe keys spread as real ones
   are), and hookledger is measured on it and on a third, empty one in ``--scale-rounds``
   pairs (2), alternating, each first in one pair; the figure is the median of the pairs'
   ratios.
4. **memory**: hookledger's resident memory, sampled during the loads, and before and
   after a soak at a steady rate (``--soak-seconds``, 10 minutes by default).
5. **start-up**: ``hookledger serve`` on a fresh home, embedded database included, until
   ``/readyz`` answers 200.

wrk comes from the distribution (``apt-get install wrk``); without it the load comes from
``bench/loadgen.py`` in this process, and the table says so.

Every measured load starts with the machine quiet (:func:`quiesce`): PostgreSQL has
checkpointed (where the role may) and the operating system has written out what earlier
loads left dirty in its page cache. A 15 s saturating run leaves
about 600 MB; the kernel writes it back some 30 s later, and a load measured meanwhile
waits on that disk traffic at every commit (a 1,000 req/s run measured p99 200 ms, against
13 ms once synced). Each system is measured on its own, not on the previous one's I/O debt.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import hmac
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import psycopg

from bench.bare_endpoint import TABLE_DDL
from bench.checkpoints import checkpoint, checkpoint_activity
from bench.checkpoints import described as checkpoints_described
from bench.common import fresh_database, sibling_database
from bench.deliveries import delivery
from bench.disk_probe import DiskFigures, DiskProbe, described
from bench.loadgen import collector_paused, percentile, post_request, run
from bench.machine_cpu import MachineCpu, MachineFigures, parts_described
from bench.machine_cpu import described as machine_described
from bench.projections_bench import free_port
from bench.sampling import Sampler

SECRET = "bench-secret"
PATH = "/webhooks/general/main"
LUA = Path(__file__).with_name("wrk_presigned.lua")
ROOT = Path(__file__).resolve().parent.parent
T = TypeVar("T")


def signature(raw: bytes) -> str:
    return "sha256=" + hmac.new(SECRET.encode(), raw, hashlib.sha256).hexdigest()


CHAT_PHONE = "2557000001"
CHAT_SECRET = "bench-chat-secret"
CHAT_PATH = f"/webhooks/chat/{CHAT_PHONE}"


def chat_delivery(tag: str, i: int) -> bytes:
    """A distinct inbound chat message of about 0.5 KB."""
    now = str(int(time.time()))
    return json.dumps({
        "type": "message", "wabaId": "waba-bench", "phoneNumberId": CHAT_PHONE,
        "contactWaId": f"2557{i % 50_000:08d}", "profileName": "Bench Customer",
        "message": {"id": f"wamid.{tag}.{i}", "from": f"2557{i % 50_000:08d}",
                    "timestamp": now, "type": "text",
                    "text": {"body": "Habari, I would like to ask about my order " + "z" * 200}},
    }, separators=(",", ":")).encode()


def chat_headers(tag: str, i: int, raw: bytes) -> dict[str, str]:
    """Signed now: the run lasts seconds, far inside the 300 s tolerance."""
    t = str(int(time.time()))
    digest = hmac.new(CHAT_SECRET.encode(), t.encode() + b"." + raw, hashlib.sha256)
    return {"X-Service-Signature": f"t={t},v1={digest.hexdigest()}",
            "X-Service-Delivery-Id": f"{tag}-{i}", "X-Service-Attempt": "1",
            "User-Agent": "service-chat-webhook/1.0"}


def write_presigned(folder: Path, tag: str, count: int, threads: int) -> str:
    """One file per wrk thread of whole, signed HTTP requests, each after its length on a
    line of its own; returns their prefix.

    The requests are complete here so that wrk's ``init`` only reads them: wrk runs each
    thread's ``init`` before starting that thread, and counts from when the last one has
    started. Building 190,000 requests in Lua took 2.5 s a thread on the 2-core machine,
    while the first thread's load, already running, was counted against a window that began
    after it (up to 8% on a 15 s rate); reading them takes 0.6 s, and no thread sends until
    every thread has read its own (bench/wrk_presigned.lua).
    """
    prefix = folder / tag
    files = [open(f"{prefix}.{t}", "wb") for t in range(threads)]
    try:
        for i in range(count):
            raw = delivery(tag, i)
            request = post_request("127.0.0.1", PATH, raw, {"X-Service-Signature": signature(raw)})
            files[i % threads].write(b"%d\n%b" % (len(request), request))
    finally:
        for f in files:
            f.close()
    return str(prefix)


@dataclass
class Load:
    label: str
    requests: int
    ok: int
    seconds: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    generator: str
    extra: dict[str, Any] = field(default_factory=dict)
    rounds: list[Load] = field(default_factory=list)  # the runs a median row stands for
    disk: DiskFigures | None = None  # the disk's fsync stalls while a fixed-rate load ran
    machine: MachineFigures | None = None  # the whole machine's CPU while a saturating load ran

    @property
    def rate(self) -> float:
        if self.rounds:
            return statistics.median(r.rate for r in self.rounds)
        return self.ok / self.seconds if self.seconds else 0.0


def median_of(label: str, runs: list[Load]) -> Load:
    """One row for several runs of the same load: the median req/s and p50, but the worst
    round's p99 and maximum (a latency goal is not met by a median of tails), and every
    request and error counted."""
    extra: dict[str, Any] = {}
    for each in runs:
        for key, value in each.extra.items():
            so_far = extra.get(key, 0)  # None: a figure some round could not read
            extra[key] = None if value is None or so_far is None else so_far + value
    return Load(label, sum(r.requests for r in runs), sum(r.ok for r in runs),
                sum(r.seconds for r in runs), statistics.median(r.p50_ms for r in runs),
                max(r.p99_ms for r in runs), max(r.max_ms for r in runs),
                runs[0].generator, extra, list(runs))


def wrk_load(label: str, port: int, prefix: str, seconds: float, connections: int,
             threads: int) -> Load:
    markers = [Path(f"{prefix}.ready.{t}") for t in range(threads)]
    try:  # each thread's "ready" marker (bench/wrk_presigned.lua): none left from before,
        for marker in markers:  # whose presence would let a thread start before the rest
            marker.unlink(missing_ok=True)
        out = subprocess.run(
            ["wrk", f"-t{threads}", f"-c{connections}", f"-d{max(1, round(seconds))}s",
             "--timeout", "10s", "-s", str(LUA), f"http://127.0.0.1:{port}", "--", prefix,
             str(threads)],
            check=True, capture_output=True, text=True).stdout
    finally:
        for marker in markers:
            marker.unlink(missing_ok=True)
    line = next(x for x in out.splitlines() if x.startswith("{"))
    r = json.loads(line)
    if r["exhausted"]:
        raise RuntimeError(f"{label}: wrk ran out of distinct deliveries; raise the count")
    errors = r["connect_errors"] + r["read_errors"] + r["write_errors"] + r["timeouts"]
    return Load(label, r["requests"], r["ok"], r["duration_us"] / 1e6, r["p50_us"] / 1000,
                r["p99_us"] / 1000, r["max_us"] / 1000, "wrk",
                {"refused": r["refused"], "socket_errors": errors})


def python_load(label: str, port: int, bodies: list[bytes], *, rate: float | None,
                connections: int, requests: list[bytes] | None = None) -> Load:
    if requests is None:
        requests = [post_request("127.0.0.1", PATH, raw,
                                 {"X-Service-Signature": signature(raw)}) for raw in bodies]
    # a fixed rate's tail is read beside the disk's own stalls under it (bench/disk_probe.py)
    probe = DiskProbe() if rate else None
    with collector_paused(), probe or contextlib.nullcontext():
        started = time.perf_counter()
        answers = asyncio.run(run("127.0.0.1", port, requests, rate=rate,
                                  connections=connections))
        seconds = time.perf_counter() - started
    latencies = [a.latency for a in answers]
    ok = sum(1 for a in answers if 200 <= a.status < 300)
    # open loop: a request due while every connection is busy waits in the generator, and
    # that wait is in its latency; how much of a tail it is, is told apart
    extra = {"queued_p99_ms": round(percentile([a.queued for a in answers], 0.99) * 1000, 2)
             } if rate else {}
    return Load(label, len(answers), ok, seconds, percentile(latencies, 0.5) * 1000,
                percentile(latencies, 0.99) * 1000, max(latencies) * 1000,
                "loadgen (open loop)" if rate else "loadgen", extra,
                disk=probe.figures if probe else None)


def wait_listening(port: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1)
            return
        except httpx.TransportError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing answered on port {port}")


@contextmanager
def process(argv: list[str], env: dict[str, str], port: int) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(argv, env={**os.environ, **env}, cwd=ROOT)
    try:
        wait_listening(port)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()


def bare_endpoint(url: str, port: int, workers: int = 2) -> Any:
    return process([sys.executable, "-m", "uvicorn", "bench.bare_endpoint:app",
                    "--port", str(port), "--workers", str(workers), "--no-access-log",
                    "--log-level", "warning"],
                   {"BARE_DATABASE_URL": url, "BARE_SECRET": SECRET}, port)


def hookledger(url: str, port: int, home: Path, extra: dict[str, str] | None = None) -> Any:
    return process([sys.executable, "-m", "hookledger", "serve"],
                   {"HOOKLEDGER_DATABASE_URL": url, "HOOKLEDGER_PORT": str(port),
                    "HOOKLEDGER_HOME": str(home), "HOOKLEDGER_GENERAL_SECRETS": f"main={SECRET}",
                    "HOOKLEDGER_LOG_LEVEL": "warning", **(extra or {})}, port)


class RssSampler(Sampler):
    """Peak resident memory of a process and its children, sampled every 100 ms."""

    thread_name = "rss-sampler"

    def __init__(self, pid: int) -> None:
        super().__init__()
        self.pid = pid
        self.samples: list[int] = []

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            self.samples.append(rss_kib(self.pid))

    @property
    def peak_mib(self) -> float:
        return max(self.samples, default=0) / 1024


def rss_kib(pid: int) -> int:
    total = 0
    pids = [pid]
    children = Path(f"/proc/{pid}/task/{pid}/children")
    if children.exists():
        pids += [int(p) for p in children.read_text().split()]
    for p in pids:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except FileNotFoundError:
            pass
    return total


def chat_count(url: str, tag: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM hookledger.ledger WHERE source = 'chat' "
                           "AND headers->>'x-service-delivery-id' LIKE %s",
                           (f"{tag}-%",)).fetchone()
    return int(row[0]) if row else 0


def server_version(url: str) -> str:
    with psycopg.connect(url) as conn:
        row = conn.execute("SHOW server_version").fetchone()
    return str(row[0]) if row else "?"


def settle(url: str, timeout: float = 180) -> float:
    """Wait until the projector has folded everything in the ledger; return how long it took.

    A fixed-rate measurement is of the steady state: right after a saturating run the
    projector is still folding tens of thousands of events, which is another figure
    (projector throughput, ``projections_bench``), not latency at 1,000 req/s.
    """
    started = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn:
        while time.perf_counter() - started < timeout:
            row = conn.execute(
                "SELECT (SELECT coalesce(max(position), 0) FROM hookledger_private.ledger_events)"
                " - (SELECT min(position) FROM hookledger_private.projection_checkpoints)"
            ).fetchone()
            if row and row[0] <= 0:
                break
            time.sleep(0.1)
    time.sleep(1)  # and let the database's own background work (autovacuum) start
    return time.perf_counter() - started


def quiesce(url: str) -> None:
    """Write out the server's dirty buffers (a checkpoint) and the page cache's dirty data
    (the previous load's), then let the disk settle, so the next measurement carries no
    earlier load's write-back."""
    checkpoint(url)
    os.sync()
    time.sleep(0.5)


def ledger_count(url: str, tag: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM hookledger.ledger WHERE source = 'general' "
                           "AND stream LIKE %s", (f"%{tag}-%",)).fetchone()
    return int(row[0]) if row else 0


def bare_count(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM bare_deliveries").fetchone()
    return int(row[0]) if row else 0


def fill_ledger(url: str, target: int) -> float:
    """Grow the ledger to ``target`` events server side: copies of real deliveries with new
    references, each through the ledger's trigger. The projector's checkpoint is moved to
    the end so that the measured service does not spend the run catching up.

    Each copy's dedupe key is 64 hex digits of a digest, as a real general delivery's is
    (``general:`` and a SHA-256), so the unique index on ``dedupe_key`` holds millions of
    keys spread over the whole key space, and every new delivery's key lands on a random
    page of it, as in a real ledger. (An earlier fill appended a counter to one key: its
    5,000,000 keys sat together in one corner of the index, and the measured run never
    touched them.) md5 twice makes the 64 digits; the server's md5 is cheaper than its
    sha256, and only the spread matters here. Event ids come from the column's default,
    random ones, as in a ledger written before ids were time-ordered: the new ids the
    measured run writes then gather in the middle of that index, not at its edge."""
    started = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM hookledger_private.ledger_events").fetchone()
        have = int(row[0]) if row else 0
        if not have:
            raise ValueError("fill_ledger copies a stored delivery: append one first")
        step, round_no = 250_000, 0
        while have < target:
            n = min(step, target - have)
            round_no += 1
            conn.execute("""
                INSERT INTO hookledger_private.ledger_events
                    (stream, event_type, source, dedupe_key, endpoint, verified_by, raw_body,
                     headers, payload, facts, occurred_at, received_at)
                SELECT t.stream || ':f' || %(r)s || '-' || g, t.event_type, t.source,
                       'general:' || md5(t.dedupe_key || ':f' || %(r)s || '-' || g)
                           || md5(g || '-' || %(r)s || ':f' || t.dedupe_key),
                       t.endpoint, t.verified_by,
                       t.raw_body, t.headers, t.payload, t.facts, t.occurred_at, t.received_at
                FROM (SELECT * FROM hookledger_private.ledger_events ORDER BY position
                      LIMIT 1) t, generate_series(1, %(n)s) g""", {"r": round_no, "n": n})
            have += n
            print(f"  ledger filled to {have:,} events", flush=True)
        conn.execute("UPDATE hookledger_private.projection_checkpoints SET position = "
                     "(SELECT max(position) FROM hookledger_private.ledger_events)")
        conn.execute("VACUUM ANALYZE hookledger_private.ledger_events")
    return time.perf_counter() - started


def ready_seconds() -> float:
    """From starting ``serve`` on a fresh home (embedded database) to ``/readyz`` = 200."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="hookledger-fresh-") as home:
        env = {k: v for k, v in os.environ.items() if not k.startswith("HOOKLEDGER_")}
        env.update(HOOKLEDGER_HOME=home, HOOKLEDGER_PORT=str(port),
                   HOOKLEDGER_LOG_LEVEL="warning")
        started = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "hookledger", "serve"], env=env,
                                cwd=ROOT)
        try:
            while time.perf_counter() - started < 120:
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/readyz",
                                 timeout=1).status_code == 200:
                        return time.perf_counter() - started
                except httpx.TransportError:
                    pass
                time.sleep(0.02)
            raise RuntimeError("serve was not ready within 120 s")
        finally:
            proc.terminate()
            proc.wait(timeout=60)


def measure(seconds: float, connections: int, scale_events: int, fixed_rate: int,
            fixed_seconds: float, soak_seconds: float, soak_rate: int,
            generator: str = "auto", workers: int = 1, rounds: int = 3,
            scale_rounds: int = 2, projector_off: bool = True) -> dict[str, Any]:
    threads = 2
    use_wrk = generator == "wrk" or (generator == "auto" and shutil.which("wrk") is not None)
    ceiling = 25_000  # req/s no contender reaches here; sizes the pre-signed sets
    per_run = int(ceiling * seconds)
    service = {"HOOKLEDGER_WORKERS": str(workers),
               "HOOKLEDGER_CHAT_SECRETS": f"{CHAT_PHONE}={CHAT_SECRET}"}
    rows: list[Load] = []
    scale_ratios: list[float] = []
    checks: dict[str, Any] = {}
    memory: dict[str, float] = {}
    with fresh_database() as url, tempfile.TemporaryDirectory(prefix="hookledger-ingest-") as tmp, \
            contextlib.ExitStack() as databases:
        folder = Path(tmp)
        # the projector-off runs get a database of their own: their events are never
        # folded, so none is left for the next round's projector to catch up on
        off_url = (databases.enter_context(sibling_database(url, "noproj"))
                   if projector_off else None)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(TABLE_DDL)
        postgres_version = server_version(url)
        checkpointed = checkpoint(url)  # quiesce() checkpoints again before every load
        if not checkpointed:
            print("this role may not CHECKPOINT (a superuser or pg_checkpoint may): each "
                  "load starts with whatever the server has left to write", flush=True)

        def load(label: str, port: int, tag: str, count: int) -> Load:
            measured = count == per_run
            duration = seconds if measured else max(1.0, seconds / 4)
            if use_wrk and not measured:  # a warm-up: enough distinct deliveries for it all
                count = int(ceiling * duration)
            # written before the quiesce: 435 MiB of requests written after it were written
            # back by the kernel during the load on a machine with little memory to cache them
            prefix = write_presigned(folder, tag, count, threads) if use_wrk else ""
            if measured:
                quiesce(url)
            # cores busy and CPU per delivery, so a ratio can be read as both
            # (bench/machine_cpu.py)
            if use_wrk:
                before = checkpoint_activity(url)
                with MachineCpu(duration) as machine:
                    result = wrk_load(label, port, prefix, duration, connections, threads)
                for t in range(threads):
                    os.unlink(f"{prefix}.{t}")
            else:
                bodies = [delivery(tag, i) for i in range(count)]
                before = checkpoint_activity(url)
                with MachineCpu(duration) as machine:
                    result = python_load(label, port, bodies, rate=None,
                                         connections=connections)
            result.machine = machine.result
            # its tail is read beside the server's checkpoints and new WAL segments
            # (bench/checkpoints.py)
            during = checkpoint_activity(url).since(before)
            result.extra.update(checkpoints_begun=during.begun,
                                checkpoint_buffers=during.buffers,
                                wal_files_added=during.wal_files)
            return result

        def fixed(label: str, port: int, tag: str) -> Load:
            bodies = [delivery(tag, i) for i in range(int(fixed_rate * fixed_seconds))]
            quiesce(url)
            return python_load(label, port, bodies, rate=fixed_rate, connections=32)

        bare_label = "bare endpoint (2 workers, INSERT per request)"
        our_label = f"hookledger ({workers} workers, empty ledger)"
        of_rounds = f", {rounds} rounds" if rounds > 1 else ""
        off_label = f"hookledger ({workers} workers, projector off)"
        bare_runs: list[Load] = []
        our_runs: list[Load] = []
        off_runs: list[Load] = []
        peak_rss = 0.0

        def checked(name: str, r: int) -> str:  # each round is checked on its own
            return f"{name}_round{r + 1}" if rounds > 1 else name

        def bare_round(r: int, last: bool) -> None:
            port = free_port()
            with bare_endpoint(url, port):
                load("warm-up", port, f"BW{r}", 2000)
                before = bare_count(url)
                bare_runs.append(load(bare_label, port, f"BB{r}", per_run))
                checks[checked("bare_rows_vs_2xx", r)] = [bare_count(url) - before,
                                                          bare_runs[-1].ok]
                if last:
                    rows.append(median_of(bare_label + of_rounds, bare_runs))
                    rows.append(fixed(f"bare endpoint at {fixed_rate}/s", port, "BF"))

        def off_round(r: int, last: bool) -> None:
            if off_url is None:
                return
            port = free_port()
            with tempfile.TemporaryDirectory(prefix="hookledger-home-") as home, \
                    hookledger(off_url, port, Path(home),
                               {**service, "HOOKLEDGER_PROJECTOR": "off"}):
                load("warm-up", port, f"OW{r}", 2000)
                off_runs.append(load(off_label, port, f"OM{r}", per_run))
                checks[checked("ledger_vs_2xx_projector_off", r)] = [
                    ledger_count(off_url, f"OM{r}"), off_runs[-1].ok]
            if last:
                rows.append(median_of(off_label + of_rounds, off_runs))

        def our_round(r: int, last: bool) -> None:
            nonlocal peak_rss
            port = free_port()
            with contextlib.ExitStack() as stack:
                home = stack.enter_context(
                    tempfile.TemporaryDirectory(prefix="hookledger-home-"))
                proc = stack.enter_context(hookledger(url, port, Path(home), service))
                rss = stack.enter_context(RssSampler(proc.pid))
                load("warm-up", port, f"HW{r}", 2000)
                our_runs.append(load(our_label, port, f"HM{r}", per_run))
                checks[checked("ledger_vs_2xx", r)] = [ledger_count(url, f"HM{r}"),
                                                       our_runs[-1].ok]
                caught_up.append(settle(url))
                if not last:
                    peak_rss = max(peak_rss, rss.peak_mib)
                    return
                # the last round's service goes on: steady rates, then the soak
                rows.append(median_of(our_label + of_rounds, our_runs))
                rows.append(fixed(f"hookledger at {fixed_rate}/s", port, "HF"))
                checks["ledger_vs_2xx_fixed_rate"] = [ledger_count(url, "HF"), rows[-1].ok]
                settle(url)
                chat_count_sent = int(fixed_rate * fixed_seconds)
                chat_requests = [
                    post_request("127.0.0.1", CHAT_PATH, raw, chat_headers("CF", i, raw))
                    for i, raw in enumerate(chat_delivery("CF", i) for i in range(chat_count_sent))]
                quiesce(url)
                rows.append(python_load(f"hookledger chat at {fixed_rate}/s", port, [],
                                        rate=fixed_rate, connections=32,
                                        requests=chat_requests))
                checks["ledger_vs_2xx_chat_fixed_rate"] = [chat_count(url, "CF"), rows[-1].ok]
                memory["peak_rss_under_load_mib"] = max(peak_rss, rss.peak_mib)
                memory["rss_before_soak_mib"] = rss_kib(proc.pid) / 1024
                soak = [delivery("HS", i) for i in range(int(soak_rate * soak_seconds))]
                soaked = python_load(
                    f"hookledger soak at {soak_rate}/s for {soak_seconds:.0f} s",
                    port, soak, rate=soak_rate, connections=16)
                time.sleep(1)
                memory["rss_after_soak_mib"] = rss_kib(proc.pid) / 1024
                memory["peak_rss_mib"] = max(peak_rss, rss.peak_mib)
                rows.append(soaked)
                checks["ledger_vs_2xx_soak"] = [ledger_count(url, "HS"), soaked.ok]

        caught_up: list[float] = []
        for r in range(rounds):
            last = r == rounds - 1
            for contender in round_order(r, rounds, [bare_round, off_round, our_round]):
                contender(r, last)
            off = (f" (projector off: {off_runs[-1].rate:,.0f} req/s)"
                   if off_url is not None else "")
            print(f"  round {r + 1}/{rounds}: bare {bare_runs[-1].rate:,.0f} req/s, "
                  f"hookledger {our_runs[-1].rate:,.0f} req/s{off}; projector caught up "
                  f"{caught_up[-1]:.1f} s after", flush=True)

        if scale_events:
            # Two more databases on the same server: one empty, one holding the large
            # ledger. Measured in pairs, alternating, as the bare endpoint's ratio is: the
            # machine drifts by the minute, and one large run against empty rounds half
            # an hour older read the drift as much as the ledger.
            with sibling_database(url, "empty") as empty_url, \
                    sibling_database(url, "large") as large_url:
                port = free_port()
                with tempfile.TemporaryDirectory(prefix="hookledger-home-") as home, \
                        hookledger(large_url, port, Path(home), service):
                    load("warm-up", port, "SW", 2000)  # real deliveries for the fill to copy
                print(f"filling a second database's ledger to {scale_events:,} events...",
                      flush=True)
                fill_s = fill_ledger(large_url, scale_events)
                print(f"  filled in {fill_s:.0f} s", flush=True)
                small_label = f"hookledger ({workers} workers, empty ledger, paired)"
                large_label = f"hookledger ({workers} workers, {scale_events:,} events in " \
                              "the ledger)"
                small_runs: list[Load] = []
                large_runs: list[Load] = []
                for r in range(scale_rounds):
                    for target, tag, label, runs in round_order(r, scale_rounds, [
                            (empty_url, f"SE{r}", small_label, small_runs),
                            (large_url, f"SM{r}", large_label, large_runs)]):
                        port = free_port()
                        with tempfile.TemporaryDirectory(prefix="hookledger-home-") as home, \
                                hookledger(target, port, Path(home), service):
                            load("warm-up", port, f"{tag}W", 2000)
                            runs.append(load(label, port, tag, per_run))
                            checks[f"ledger_vs_2xx_{tag}"] = [ledger_count(target, tag),
                                                              runs[-1].ok]
                    print(f"  scaling pair {r + 1}/{scale_rounds}: empty ledger "
                          f"{small_runs[-1].rate:,.0f} req/s, large ledger "
                          f"{large_runs[-1].rate:,.0f} req/s", flush=True)
                of_pairs = f", {scale_rounds} rounds" if scale_rounds > 1 else ""
                for label, runs in ((small_label, small_runs), (large_label, large_runs)):
                    rows.append(median_of(label + of_pairs, runs) if len(runs) > 1
                                else runs[0])
                scale_ratios = [big.rate / small.rate for small, big
                                in zip(small_runs, large_runs, strict=True) if small.rate]
    # each round's pair ran minutes apart at most: the median of the paired ratios follows
    # the machine's drift less than a ratio of two medians would
    ratios = paired_ratios(bare_runs, our_runs)
    parts = [ratio_parts(b, o) for b, o in zip(bare_runs, our_runs, strict=True)]
    off_ratios = paired_ratios(bare_runs, off_runs)
    figures: dict[str, Any] = {
        "postgresql": postgres_version,
        "ready_seconds": round(ready_seconds(), 2),
        "generator": "wrk" if use_wrk else "loadgen", "connections": connections,
        "seconds": seconds, "body_bytes": len(delivery("HM", 0)),
        "loads": [_figures(r) for r in rows],
        "ratio_vs_bare": round(statistics.median(ratios), 2) if ratios else 0.0,
        "ratio_rounds": [round(x, 2) for x in ratios],
        "ratio_parts": parts if any(parts) else [],  # round by round, None where unread
        "checks": checks, "memory": memory,
        "checkpoint_before_loads": checkpointed,
    }
    if off_runs:
        figures["ratio_projector_off_vs_bare"] = round(statistics.median(off_ratios), 2) \
            if off_ratios else 0.0
        figures["ratio_projector_off_rounds"] = [round(x, 2) for x in off_ratios]
    if scale_events:
        figures["scaled_vs_empty"] = round(statistics.median(scale_ratios), 2) \
            if scale_ratios else 0.0
        figures["scaled_rounds"] = [round(x, 2) for x in scale_ratios]
    return figures


def round_order(r: int, rounds: int, contenders: list[T]) -> list[T]:
    """Round ``r``'s order of the contenders: as given in the last round (whose service
    goes on to the fixed-rate loads and the soak) and every second round before it,
    reversed in the others. The machine's speed drifts within a round too, and the one
    measured later in a round tended to answer more (eight rounds of eleven, on the EPYC
    machine of 2026-11-30): a fixed order read that drift as a difference between them."""
    return list(contenders) if (rounds - 1 - r) % 2 == 0 else contenders[::-1]


def paired_ratios(bare_runs: list[Load], our_runs: list[Load]) -> list[float]:
    """Each round's req/s over the bare endpoint's in the same round; none for a contender
    that was left out (``--no-projector-off``) or a round the bare endpoint answered nothing."""
    if not our_runs:
        return []
    return [o.rate / b.rate for b, o in zip(bare_runs, our_runs, strict=True) if b.rate]


def ratio_parts(bare: Load, ours: Load) -> dict[str, float] | None:
    """One round's ratio as its two factors: CPU per delivery (the bare endpoint's over
    hookledger's: above 1, hookledger spends less) times cores busy (hookledger's over the
    bare endpoint's). None when either load has no machine figures."""
    if bare.machine is None or ours.machine is None:
        return None
    theirs, mine = bare.machine.cpu_us_per_delivery(bare.rate), \
        ours.machine.cpu_us_per_delivery(ours.rate)
    if not theirs or not mine:  # no deliveries, or no busy ticks: no factors to read
        return None
    return {"cpu_per_delivery": round(theirs / mine, 2),
            "cores_busy": round(ours.machine.cores_busy / bare.machine.cores_busy, 2)}


def _machine(load: Load, rounds: list[dict[str, Any]]) -> dict[str, Any] | None:
    """A load's machine figures as JSON; a median row's are its rounds' medians."""
    if load.machine is not None:
        return load.machine.as_json(load.rate)
    measured = [r["machine"] for r in rounds if r.get("machine")]
    if not measured:
        return None
    medians = {key: statistics.median(m[key] for m in measured)
               for key in ("cores_busy", "idle_pct", "steal_pct", "cpu_us_per_delivery")
               if all(m.get(key) is not None for m in measured)}
    return {key: round(value) if key == "cpu_us_per_delivery" else round(value, 3)
            for key, value in medians.items()}


def _figures(load: Load) -> dict[str, Any]:
    """A load as JSON; a median row carries its rounds, each the same way."""
    rounds = [_figures(x) for x in load.rounds]
    machine = _machine(load, rounds)
    return {"label": load.label, "requests": load.requests, "ok": load.ok,
            "req_per_s": round(load.rate), "p50_ms": round(load.p50_ms, 2),
            "p99_ms": round(load.p99_ms, 2), "max_ms": round(load.max_ms, 2),
            "generator": load.generator, **load.extra,
            **({"disk": load.disk.as_json()} if load.disk else {}),
            **({"machine": machine} if machine else {}),
            **({"rounds": rounds} if rounds else {})}


def print_table(figures: dict[str, Any]) -> None:
    print(f"\n{'load':58} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'2xx':>9}")
    for r in figures["loads"]:
        print(f"{r['label']:58} {r['req_per_s']:>8,} {r['p50_ms']:>8} {r['p99_ms']:>8} "
              f"{r['ok']:>9,}")
        if "disk" in r:
            print(f"  the disk meanwhile: {described(r['disk'])}; waiting for a free "
                  f"generator connection: p99 {r['queued_p99_ms']} ms")
        if "checkpoint_buffers" in r:
            print(f"  meanwhile: {checkpoints_described(r)}")
        if "machine" in r:
            print(f"  the machine meanwhile: {machine_described(r['machine'], r.get('rounds'))}")
    rounds = ", ".join(f"{x}x" for x in figures.get("ratio_rounds", []))
    print(f"hookledger / bare endpoint: {figures['ratio_vs_bare']}x (rounds: {rounds})")
    if figures.get("ratio_parts"):
        print(f"  each round's ratio as {parts_described(figures['ratio_parts'])}")
    if "ratio_projector_off_vs_bare" in figures:
        off = ", ".join(f"{x}x" for x in figures["ratio_projector_off_rounds"])
        print(f"hookledger with its projector off / bare endpoint: "
              f"{figures['ratio_projector_off_vs_bare']}x (rounds: {off})")
    if "scaled_vs_empty" in figures:
        pairs = ", ".join(f"{x}x" for x in figures.get("scaled_rounds", []))
        print(f"with a large ledger / empty: {figures['scaled_vs_empty']}x "
              f"(pairs: {pairs})")
    for name, (found, acked) in figures["checks"].items():
        # wrk stops mid-flight: a request stored but not yet answered is stored and not
        # counted, so "every acknowledged one is stored" is found >= acknowledged
        print(f"{name}: {found:,} stored for {acked:,} acknowledged "
              f"({'ok' if found >= acked else 'MISSING'})")
    memory = figures["memory"]
    print(f"hookledger RSS: peak {memory['peak_rss_mib']:.0f} MiB; before soak "
          f"{memory['rss_before_soak_mib']:.0f} MiB, after {memory['rss_after_soak_mib']:.0f} MiB")
    print(f"serve ready on a fresh home in {figures['ready_seconds']} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--scale-events", type=int, default=5_000_000)
    parser.add_argument("--fixed-rate", type=int, default=1000)
    parser.add_argument("--fixed-seconds", type=float, default=10)
    parser.add_argument("--soak-seconds", type=float, default=600)
    parser.add_argument("--soak-rate", type=int, default=500)
    parser.add_argument("--workers", type=int, default=1,
                        help="hookledger's HOOKLEDGER_WORKERS (the baseline runs 2; on two "
                             "cores one worker beside serve's projector answers more)")
    parser.add_argument("--generator", choices=["auto", "wrk", "loadgen"], default="auto",
                        help="auto: wrk when installed, else bench/loadgen.py")
    parser.add_argument("--rounds", type=int, default=3,
                        help="saturating runs of each contender, alternating (median kept)")
    parser.add_argument("--scale-rounds", type=int, default=2,
                        help="pairs of runs on an empty ledger and the large one, "
                             "alternating (the median of the pairs' ratios is kept)")
    parser.add_argument("--no-projector-off", dest="projector_off", action="store_false",
                        help="leave out the rounds of serve with HOOKLEDGER_PROJECTOR=off "
                             "(the ingest path alone)")
    args = parser.parse_args()
    if args.rounds < 1 or args.scale_rounds < 1:
        parser.error("--rounds and --scale-rounds must be at least 1")
    figures = measure(args.seconds, args.connections, args.scale_events, args.fixed_rate,
                      args.fixed_seconds, args.soak_seconds, args.soak_rate, args.generator,
                      args.workers, args.rounds, args.scale_rounds, args.projector_off)
    print_table(figures)
    from bench.common import write_results
    print("written", write_results("ingest", figures))
    missing = [name for name, (found, acked) in figures["checks"].items() if found < acked]
    idle = [r["label"] for r in figures["loads"] if r["ok"] == 0]
    if missing or idle:
        sys.exit(f"acknowledged deliveries missing: {missing}; loads with no 2xx: {idle}")


if __name__ == "__main__":
    main()
