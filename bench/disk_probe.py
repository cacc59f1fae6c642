"""How long the disk takes to make a small write durable, measured while a load runs.

Every acknowledged delivery waits for PostgreSQL's WAL fsync, so a disk that stalls an
fsync for 300 ms stalls every request in flight for 300 ms, whatever the service does. On
the virtual disks these benchmarks run on, such stalls come a few times a minute even on
an idle machine (a 60 s probe alone: p99 0.6 ms, max 183 ms). A fixed-rate load's p99 is
only meaningful beside the stalls that happened under it, so each such load is measured
with this probe running: one 8 KB write and ``fdatasync`` every 10 ms, in the folder
given (the embedded cluster lives under the same TMPDIR). That is load of its own, 100
small fsyncs and 800 KB a second, beside the roughly 3 MB of WAL a second hookledger
writes at 1,000 deliveries a second: the figures it sits beside include it.
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

from bench.loadgen import percentile
from bench.sampling import Sampler

STALL_S = 0.020  # an fsync this slow is a stall: the whole p99 budget at 1,000 req/s


@dataclass(frozen=True, slots=True)
class DiskFigures:
    """What the probe saw: fsyncs timed, their p99 and maximum, and how many stalled."""

    fsyncs: int
    p99_ms: float
    max_ms: float
    stalls: int  # fsyncs slower than STALL_S

    def as_json(self) -> dict[str, float | int]:
        return {"fsyncs": self.fsyncs, "fsync_p99_ms": self.p99_ms,
                "fsync_max_ms": self.max_ms, "stalls": self.stalls,
                "stall_ms": round(STALL_S * 1000)}


def summarise(durations_s: list[float]) -> DiskFigures:
    """Figures of the fsync durations (seconds) a probe recorded."""
    if not durations_s:
        return DiskFigures(0, 0.0, 0.0, 0)
    return DiskFigures(len(durations_s), round(percentile(durations_s, 0.99) * 1000, 2),
                       round(max(durations_s) * 1000, 2),
                       sum(1 for d in durations_s if d > STALL_S))


def described(disk: dict[str, Any]) -> str:
    """One line of :meth:`DiskFigures.as_json`'s figures, as both tables print them."""
    return (f"fdatasync p99 {disk['fsync_p99_ms']} ms, max {disk['fsync_max_ms']} ms, "
            f"{disk['stalls']} over {disk['stall_ms']} ms")


class DiskProbe(Sampler):
    """A thread timing one small durable write every ``interval_s`` until the block ends."""

    thread_name = "disk-probe"

    def __init__(self, folder: str | Path | None = None, interval_s: float = 0.010) -> None:
        super().__init__()
        self._folder = Path(folder or tempfile.gettempdir())
        self._interval_s = interval_s
        self._durations: list[float] = []
        self._fd = -1

    def __enter__(self) -> Self:
        self._fd, path = tempfile.mkstemp(prefix="hookledger-disk-probe-", dir=self._folder)
        os.unlink(path)  # the open descriptor keeps it until the probe ends; nothing left
        return super().__enter__()

    @property
    def figures(self) -> DiskFigures:
        return summarise(list(self._durations))

    def _run(self) -> None:
        fd = self._fd
        block = b"\xa5" * 8192
        try:
            os.pwrite(fd, block, 0)  # allocated once: later writes change no metadata
            os.fdatasync(fd)
            while not self._stop.wait(self._interval_s):
                started = time.perf_counter()
                os.pwrite(fd, block, 0)
                os.fdatasync(fd)
                self._durations.append(time.perf_counter() - started)
        finally:
            os.close(fd)
