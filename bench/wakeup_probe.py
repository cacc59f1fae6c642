"""How long one process takes to wake another, on the same core and across the two.

Every delivery crosses processes several times (load generator, HTTP worker, PostgreSQL and
back), and every crossing wakes the process on the other side. On some virtual machines a
core left idle is halted, and only the hypervisor wakes it: a crossing to an idle core then
costs several times a crossing on a busy one, and every process's CPU per delivery rises
with it. Measured on 2026-11-26 on a machine where the bare endpoint spent 852 us of CPU
per delivery (262 on the fastest machine of the same kind, that morning): 60-137 us per
round trip across cores, 14-25 us on one core. Whether it moves hookledger's ratio to the
bare endpoint is not shown: with the guest's halt-polling raised there (which cut the round
trip across cores to about 40 us), the bare endpoint's CPU per delivery fell and
hookledger's ratio did not rise (bench/PERFORMANCE.md).

A round trip is one byte each way over a socket pair between two processes. The result is
put beside each run's figures so that runs on different days can be read apart by one
more cause than "slow" or "fast".
"""

from __future__ import annotations

import os
import socket
import statistics
import time
from typing import Any

ROUND_TRIPS = 2000
REPEATS = 3  # the median of three: a single run moved by half from one to the next


def _ping_pong(ours: socket.socket, cpu: int | None, round_trips: int) -> float:
    """Microseconds per round trip, with this process on ``cpu`` (None: wherever)."""
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    ours.recv(1)  # the partner is placed and ready
    started = time.perf_counter()
    for _ in range(round_trips):
        ours.send(b"x")
        ours.recv(1)
    return (time.perf_counter() - started) / round_trips * 1e6


def _partner(theirs: socket.socket, cpu: int | None, round_trips: int) -> None:
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    theirs.send(b"r")
    for _ in range(round_trips):
        theirs.recv(1)
        theirs.send(b"x")


def round_trip_us(ours_cpu: int | None, theirs_cpu: int | None,
                  round_trips: int = ROUND_TRIPS) -> float:
    """One placement measured: this process on ``ours_cpu``, a forked partner on
    ``theirs_cpu``; this process's own affinity is restored afterwards."""
    previous = os.sched_getaffinity(0)
    ours, theirs = socket.socketpair()
    pid = os.fork()
    if pid == 0:  # the partner: only the ping-pong, then out without Python's shutdown
        try:
            ours.close()
            _partner(theirs, theirs_cpu, round_trips)
        finally:
            os._exit(0)
    theirs.close()
    try:
        return _ping_pong(ours, ours_cpu, round_trips)
    finally:
        ours.close()
        os.waitpid(pid, 0)
        os.sched_setaffinity(0, previous)


def probe() -> dict[str, Any]:
    """Microseconds per round trip (the median of three runs) on one core, across two, and
    placed by the kernel; an empty dict where the machine cannot say (one core, no
    affinity)."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(cpus) < 2 or not hasattr(os, "fork"):
        return {}
    first, second = cpus[:2]
    placements = {"same_core_us": (first, first), "across_cores_us": (first, second),
                  "unpinned_us": (None, None)}
    return {name: round(statistics.median(round_trip_us(*cpus_of) for _ in range(REPEATS)), 1)
            for name, cpus_of in placements.items()}


def described(figures: dict[str, Any]) -> str:
    """The figures in words for the summary table."""
    if not figures:
        return "not measured (fewer than two cores)"
    return (f"{figures['same_core_us']} us on one core, {figures['across_cores_us']} across "
            f"cores, {figures['unpinned_us']} placed by the kernel")


if __name__ == "__main__":
    print(described(probe()))
