"""How busy the whole machine was while a saturating load ran, and its CPU per delivery.

Two contenders' req/s on one machine are each the cores they keep busy divided by the CPU
they spend per delivery (every process counted: the server, PostgreSQL, the load generator),
so their ratio is the product of two ratios, and the bench prints both. Every delivery to
one ``serve`` passes through its HTTP worker's one thread, and on two cores that thread can
be the limit while part of the other core idles, where the bare endpoint's independent
requests keep both busy. Without these figures a ratio says which contender won, not
whether CPU per delivery or the machine's use decided it (the README has the figures).

The figures come from ``/proc/stat``'s first line (all CPUs), read at the two ends of a
window inside the load, clear of the generator's start and of its last half second. Time
the hypervisor gave to other guests (steal) counts as neither busy nor idle, and is printed:
a round with much of it ran on a slower machine. Elsewhere than Linux there is no
``/proc/stat`` and no figures.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.sampling import Sampler

PROC_STAT = Path("/proc/stat")


@dataclass(frozen=True)
class CpuTimes:
    """Cumulative clock ticks of all CPUs since boot."""

    busy: int  # user, nice, system, irq, softirq (guest time is inside user)
    idle: int  # idle and iowait
    steal: int

    def since(self, earlier: CpuTimes) -> CpuTimes:
        return CpuTimes(self.busy - earlier.busy, self.idle - earlier.idle,
                        self.steal - earlier.steal)


def parse_cpu_line(line: str) -> CpuTimes:
    """The aggregate ``cpu`` line of ``/proc/stat``; older kernels stop before steal."""
    fields = [int(x) for x in line.split()[1:]] + [0] * 8
    user, nice, system, idle, iowait, irq, softirq, steal = fields[:8]
    return CpuTimes(user + nice + system + irq + softirq, idle + iowait, steal)


def read_cpu_times() -> CpuTimes | None:
    try:
        with PROC_STAT.open() as f:
            return parse_cpu_line(f.readline())
    except OSError:
        return None


@dataclass(frozen=True)
class MachineFigures:
    cores_busy: float  # busy ticks a second, in cores
    idle_pct: float  # of all ticks in the window
    steal_pct: float
    window_s: float

    def cpu_us_per_delivery(self, rate: float) -> float | None:
        return self.cores_busy / rate * 1e6 if rate > 0 else None

    def as_json(self, rate: float) -> dict[str, Any]:
        per = self.cpu_us_per_delivery(rate)
        return {**{k: round(v, 3) for k, v in asdict(self).items()},
                "cpu_us_per_delivery": None if per is None else round(per)}


def figures(delta: CpuTimes, window_s: float, ticks_per_s: float) -> MachineFigures | None:
    """What one window's tick counts mean; None for a window with no ticks (too short)."""
    total = delta.busy + delta.idle + delta.steal
    if total <= 0 or window_s <= 0:
        return None
    return MachineFigures(cores_busy=delta.busy / ticks_per_s / window_s,
                          idle_pct=100 * delta.idle / total,
                          steal_pct=100 * delta.steal / total, window_s=window_s)


def window(duration_s: float) -> tuple[float, float]:
    """(start, length) of the measured window within a load of ``duration_s``: past the
    generator's start (wrk reads its pre-signed requests first, about 0.6 s) and short of
    its end."""
    start = min(1.5, duration_s * 0.2)
    return start, max(0.2, duration_s - start - 0.5)


class MachineCpu(Sampler):
    """Measures :class:`MachineFigures` in a thread while the ``with`` body runs a load.

    ``result`` is None when the window did not fit inside the body, so a load cut short
    never reports figures of the idle machine after it.
    """

    thread_name = "machine-cpu"

    def __init__(self, duration_s: float) -> None:
        super().__init__()
        self._start_s, self._length_s = window(duration_s)
        self.result: MachineFigures | None = None

    def _run(self) -> None:
        if self._stop.wait(self._start_s):
            return
        before, began = read_cpu_times(), time.monotonic()
        if self._stop.wait(self._length_s):
            return
        after, ended = read_cpu_times(), time.monotonic()
        if before is not None and after is not None:
            self.result = figures(after.since(before), ended - began,
                                  os.sysconf("SC_CLK_TCK"))


def described(machine: dict[str, Any], rounds: list[dict[str, Any]] | None = None) -> str:
    """One line for a table from a load's JSON figures (``machine``), with each round's."""
    line = _one(machine)
    if rounds:
        line += "; each round's: " + ", ".join(
            _one(r["machine"], short=True) for r in rounds if r.get("machine"))
    return line


def _one(m: dict[str, Any], *, short: bool = False) -> str:
    per = m.get("cpu_us_per_delivery")
    per_text = "?" if per is None else f"{per:,}"
    if short:
        return f"{m['cores_busy']:.2f} cores / {m['idle_pct']:.0f}% idle / {per_text} us"
    return (f"{m['cores_busy']:.2f} cores busy, {m['idle_pct']:.0f}% idle, "
            f"{m['steal_pct']:.0f}% stolen; {per_text} us of CPU per delivery "
            "(server, PostgreSQL and load generator)")


def parts_described(parts: list[dict[str, float] | None]) -> str:
    """The ratio's two factors, round by round (None: a round without figures), for a table."""
    return ("CPU per delivery (bare / hookledger) x cores busy (hookledger / bare): "
            + ", ".join("?" if p is None else f"{p['cpu_per_delivery']}x * {p['cores_busy']}x"
                        for p in parts))
