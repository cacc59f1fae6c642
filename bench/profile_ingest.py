"""Where ingest's time goes: py-spy on every ``serve`` process under load, and the CPU split.

    python -m bench.profile_ingest [--seconds 10] [--workers 1] [--top 25] [--states]

Runs ``hookledger serve`` on a fresh database, loads it with pre-signed distinct deliveries
(wrk when installed, else ``bench/loadgen.py``), and meanwhile

* counts the CPU seconds of each group of processes (HTTP workers, the supervisor with the
  projector, PostgreSQL, the load generator) from ``/proc``, as cores and as microseconds
  per acknowledged delivery, and the time each group's threads were runnable but waited
  for a core;
* with ``--states``, samples what the appending PostgreSQL backends do (running, waiting
  for the WAL fsync, idle between statements);
* samples every ``serve`` process with py-spy (``pip install py-spy``; without it only the
  CPU split is printed) and prints the functions with the most samples, by own time and
  including what they call.

The figures are what the performance notes quote; rerun to see them on another machine.
"""

from __future__ import annotations

import argparse
import collections
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg

from bench.common import fresh_database
from bench.deliveries import delivery
from bench.ingest_bench import (
    hookledger,
    python_load,
    write_presigned,
    wrk_load,
)
from bench.projections_bench import free_port

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_by_group(serve_pid: int, backends: dict[int, str] | None = None
                 ) -> dict[str, float]:
    """CPU seconds used so far by each group of processes on this machine; PostgreSQL's
    processes split by whom they serve when ``backends`` (pid: label) is given."""
    groups: collections.defaultdict[str, float] = collections.defaultdict(float)
    for pid, group in processes_by_group(serve_pid, backends):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        groups[group] += (int(fields[11]) + int(fields[12])) / TICKS
    return dict(groups)


def waits_by_group(serve_pid: int, backends: dict[int, str] | None = None
                   ) -> dict[str, float]:
    """Seconds each group's threads have spent runnable but waiting for a core (the
    scheduler's run queue, ``/proc/<pid>/task/<tid>/schedstat``): a process that is
    seldom idle yet gets less than a core shows here, not in its CPU time. A thread that
    ends between two looks drops out of the second, so a group with short-lived threads
    or processes comes out low."""
    groups: collections.defaultdict[str, float] = collections.defaultdict(float)
    for pid, group in processes_by_group(serve_pid, backends):
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                waited = Path(f"/proc/{pid}/task/{task}/schedstat").read_text().split()[1]
            except (OSError, IndexError):
                continue
            groups[group] += int(waited) / 1e9
    return dict(groups)


def processes_by_group(serve_pid: int, backends: dict[int, str] | None
                       ) -> Iterator[tuple[int, str]]:
    """(pid, group) of every process of ``serve``, PostgreSQL and the load generator."""
    backends = backends or {}
    serve = {serve_pid, *children(serve_pid)}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            command = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        pid = int(entry)
        if pid == serve_pid:
            yield pid, "supervisor (projector)"
        elif pid in serve:
            yield pid, "HTTP workers"
        elif b"postgres" in command:
            label = backends.get(pid, ": postmaster, later backends") if backends else ""
            yield pid, f"PostgreSQL{label}"
        elif command.startswith(b"wrk"):
            yield pid, "load generator"


def backend_labels(url: str) -> dict[int, str]:
    """PostgreSQL's processes by whom they serve: the ingest workers' appends, the
    projector, other clients, and the server's own background processes."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute("SELECT pid, coalesce(application_name, ''), backend_type "
                            "FROM pg_stat_activity").fetchall()
    labels = {}
    for pid, name, kind in rows:
        if name == "hookledger-ingest":
            labels[pid] = ": ingest appends"
        elif name.startswith("hookledger-projector"):
            labels[pid] = ": projector"
        elif kind == "client backend":
            labels[pid] = ": other clients"
        else:
            labels[pid] = ": background (WAL, checkpoints)"
    return labels


def wal_written(url: str) -> tuple[int, int, int] | None:
    """The server's WAL so far: records, full-page images and bytes; None before
    PostgreSQL 14, which has no ``pg_stat_wal`` (the project supports 13)."""
    with psycopg.connect(url, autocommit=True) as conn:
        try:
            row = conn.execute("SELECT wal_records, wal_fpi, wal_bytes FROM pg_stat_wal"
                               ).fetchone()
        except psycopg.errors.UndefinedTable:
            return None
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2])


def backend_states(url: str, runner: threading.Thread, every_s: float = 0.002
                   ) -> collections.Counter[str]:
    """What the appends are doing while ``runner`` lives, sampled every ``every_s``: the
    state of each appending backend that is in a statement (running, or waiting for a
    named event), or that none is (the workers are between appends)."""
    seen: collections.Counter[str] = collections.Counter()
    with psycopg.connect(url, autocommit=True) as conn:
        while runner.is_alive():
            active = [f"waiting for {kind}/{event}" if event else "running"
                      for state, kind, event in conn.execute(
                          "SELECT state, wait_event_type, wait_event FROM pg_stat_activity "
                          "WHERE application_name = 'hookledger-ingest'").fetchall()
                      if state == "active"]
            seen.update(active or ["no append in progress"])
            time.sleep(every_s)
    return seen


def children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


# leaves of stacks that are waiting, not working (py-spy cannot always tell): uvicorn's
# supervisor pipe, the multiprocessing resource tracker, idle selectors and conditions
IDLE_LEAVES = ("Connection._recv ", "Condition.wait ", "EpollSelector.select ",
               "resource_tracker.py", "Event.wait ", "Thread._wait_for_tstate_lock ")


def aggregate(raw_files: list[Path], top: int) -> list[str]:
    """py-spy's raw (collapsed stack) output, summed: own samples and inclusive samples."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = idle = 0
    for path in raw_files:
        for line in path.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            if not stack or not count.isdigit():
                continue
            n = int(count)
            frames = stack.split(";")
            if any(marker in frames[-1] for marker in IDLE_LEAVES):
                idle += n
                continue
            total += n
            own[frames[-1]] += n
            for frame in set(frame.split(":")[0] for frame in frames):
                inclusive[frame] += n
    if not total:
        return ["py-spy recorded no samples"]
    lines = [f"{total} samples ({idle} of waiting threads left out); own time:"]
    lines += [f"  {100 * n / total:5.1f}%  {name[:110]}" for name, n in own.most_common(top)]
    lines.append("including callees:")
    lines += [f"  {100 * n / total:5.1f}%  {name[:110]}"
              for name, n in inclusive.most_common(top * 2)]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--states", action="store_true",
                        help="also sample what the appending backends do every 2 ms "
                             "(the sampling costs some CPU itself; its own backend counts "
                             "among PostgreSQL's later backends)")
    parser.add_argument("--no-profile", action="store_true",
                        help="only the CPU split (py-spy itself costs CPU)")
    args = parser.parse_args()
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    has_py_spy = Path(py_spy).exists() and not args.no_profile
    use_wrk = shutil.which("wrk") is not None
    with fresh_database() as url, tempfile.TemporaryDirectory(prefix="hookledger-prof-") as tmp:
        folder, port = Path(tmp), free_port()
        count = int(25_000 * args.seconds)
        prefix = write_presigned(folder, "PP", count, 2) if use_wrk else ""
        with hookledger(url, port, folder / "home", {"HOOKLEDGER_WORKERS": str(args.workers)}
                        ) as proc:
            python_load("warm-up", port, [delivery("PW", i) for i in range(2000)], rate=None,
                        connections=32)
            spies = []
            if has_py_spy:
                for pid in [proc.pid, *children(proc.pid)]:
                    out = folder / f"py-spy-{pid}.txt"
                    spies.append((out, subprocess.Popen(
                        [py_spy, "record", "--pid", str(pid), "--duration",
                         str(max(1, round(args.seconds - 1))), "--rate", "100", "--format",
                         "raw", "--output", str(out)],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)))
            backends = backend_labels(url)
            wal_before = wal_written(url)
            before, started = cpu_by_group(proc.pid, backends), time.perf_counter()
            waits_before = waits_by_group(proc.pid, backends)
            children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
            result: dict[str, int] = {}

            def load() -> None:
                if use_wrk:
                    done = wrk_load("profile", port, prefix, args.seconds, args.connections, 2)
                else:
                    done = python_load("profile", port, [delivery("PP", i) for i in range(
                        int(2500 * args.seconds))], rate=None, connections=args.connections)
                result["ok"] = done.ok

            runner = threading.Thread(target=load)
            runner.start()
            states = backend_states(url, runner) if args.states else None
            runner.join()
            seconds = time.perf_counter() - started
            after = cpu_by_group(proc.pid, backends)
            waits_after = waits_by_group(proc.pid, backends)
            wal_after = wal_written(url)
            wal = ([b - a for a, b in zip(wal_before, wal_after, strict=True)]
                   if wal_before and wal_after else None)
            if use_wrk:  # wrk has exited: its CPU is in this process's reaped children
                children_after = resource.getrusage(resource.RUSAGE_CHILDREN)
                after["load generator"] = (
                    children_after.ru_utime + children_after.ru_stime
                    - children_before.ru_utime - children_before.ru_stime)
            for _, spy in spies:
                spy.wait(timeout=60)
            profile = (aggregate([out for out, _ in spies if out.exists()], args.top)
                       if has_py_spy else [])
    ok = result.get("ok", 0)
    print(f"\n{ok:,} deliveries acknowledged in {seconds:.1f} s ({ok / seconds:,.0f}/s), "
          f"{'wrk' if use_wrk else 'loadgen'}, {args.workers} workers")
    print(f"{'CPU by process group':28} {'cores':>6} {'us per delivery':>16} "
          f"{'waiting for a core':>19}")
    for group in sorted(after, key=lambda g: -(after[g] - before.get(g, 0))):
        used = after[group] - before.get(group, 0)
        # the load generator starts after the first look: its waits are not counted
        waited = (f"{(waits_after[group] - waits_before[group]) / seconds:19.2f}"
                  if group in waits_before and group in waits_after else f"{'-':>19}")
        print(f"{group:28} {used / seconds:6.2f} {1e6 * used / max(ok, 1):16.0f} {waited}")
    per = max(ok, 1)
    print(f"\nWAL per delivery: {wal[0] / per:.1f} records, {wal[1] / per:.2f} full-page "
          f"images, {wal[2] / per:,.0f} bytes" if wal else
          "\nWAL per delivery: not shown (pg_stat_wal needs PostgreSQL 14)")
    if states is not None:
        print("\nthe appending backends, sampled every 2 ms:")
        total = sum(states.values()) or 1
        for state, n in states.most_common(8):
            print(f"  {100 * n / total:5.1f}%  {state}")
    if has_py_spy:
        print("\n" + "\n".join(profile))
    elif not args.no_profile:
        print("\n(py-spy is not installed: pip install py-spy, for where the time goes)")


if __name__ == "__main__":
    main()
