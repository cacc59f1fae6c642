"""The machine figures the ingest benchmark prints beside a saturating load, and the ratio's
two factors built from them."""

from __future__ import annotations

import threading
import time

import pytest

from bench.ingest_bench import Load, paired_ratios, ratio_parts
from bench.machine_cpu import (
    CpuTimes,
    MachineCpu,
    MachineFigures,
    described,
    figures,
    parse_cpu_line,
    parts_described,
    read_cpu_times,
    window,
)


def test_the_aggregate_line_is_split_into_busy_idle_and_stolen_ticks() -> None:
    # user nice system idle iowait irq softirq steal guest guest_nice
    times = parse_cpu_line("cpu  100 5 40 800 20 3 2 30 7 0")
    assert times == CpuTimes(busy=100 + 5 + 40 + 3 + 2, idle=800 + 20, steal=30)
    # guest time is already inside user: counting it again would inflate busy
    assert parse_cpu_line("cpu  100 5 40 800 20 3 2 30 0 0") == times
    # a kernel that stops before steal
    assert parse_cpu_line("cpu  1 2 3 4 5 6 7") == CpuTimes(1 + 2 + 3 + 6 + 7, 4 + 5, 0)


def test_figures_are_cores_and_shares_of_the_window() -> None:
    earlier, later = CpuTimes(1000, 5000, 10), CpuTimes(1350, 5140, 20)
    got = figures(later.since(earlier), window_s=2.0, ticks_per_s=100)
    assert got is not None
    assert got.cores_busy == pytest.approx(1.75)  # 350 ticks in 2 s at 100 a second
    assert got.idle_pct == pytest.approx(100 * 140 / 500)
    assert got.steal_pct == pytest.approx(100 * 10 / 500)
    assert got.cpu_us_per_delivery(2500) == pytest.approx(700)  # 1.75 cores / 2,500 a second
    assert got.cpu_us_per_delivery(0) is None
    assert figures(CpuTimes(0, 0, 0), 1.0, 100) is None  # a window too short to tick


def test_the_window_skips_the_generator_start_and_stays_inside_short_loads() -> None:
    assert window(15) == (1.5, 13.0)
    start, length = window(1)
    assert start + length < 1


def test_a_busy_thread_shows_as_busy_cores() -> None:
    if read_cpu_times() is None:
        pytest.skip("no /proc/stat here")
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            sum(range(1000))

    spinner = threading.Thread(target=spin)
    spinner.start()
    try:
        with MachineCpu(1.5) as machine:
            time.sleep(1.5)
    finally:
        stop.set()
        spinner.join()
    assert machine.result is not None
    assert machine.result.cores_busy >= 0.5  # the spinning thread held a core throughout
    assert 0 <= machine.result.idle_pct <= 100


def test_a_load_that_ends_before_its_window_reports_nothing() -> None:
    with MachineCpu(15) as machine:
        pass
    assert machine.result is None


def _load(rate: float, machine: MachineFigures | None) -> Load:
    return Load("x", int(rate * 10), int(rate * 10), 10.0, 1.0, 2.0, 3.0, "wrk",
                machine=machine)


def test_a_rounds_ratio_is_cpu_per_delivery_times_cores_busy() -> None:
    bare = _load(3000, MachineFigures(2.0, 1.0, 0.0, 10))  # 667 us a delivery
    ours = _load(3200, MachineFigures(1.6, 20.0, 0.0, 10))  # 500 us a delivery
    parts = ratio_parts(bare, ours)
    assert parts == {"cpu_per_delivery": 1.33, "cores_busy": 0.8}
    assert parts["cpu_per_delivery"] * parts["cores_busy"] == pytest.approx(
        ours.rate / bare.rate, abs=0.01)
    assert ratio_parts(bare, _load(3200, None)) is None
    assert parts_described([parts, None]).endswith("1.33x * 0.8x, ?")


def test_a_row_of_rounds_is_described_with_each_round() -> None:
    line = described({"cores_busy": 1.75, "idle_pct": 18.2, "steal_pct": 0.4,
                      "cpu_us_per_delivery": 715},
                     [{"machine": {"cores_busy": 1.75, "idle_pct": 18.2, "steal_pct": 0,
                                   "cpu_us_per_delivery": 715}},
                      {"machine": {"cores_busy": 1.8, "idle_pct": 17.0, "steal_pct": 0,
                                   "cpu_us_per_delivery": None}}])
    assert line.startswith("1.75 cores busy, 18% idle, 0% stolen; 715 us of CPU per delivery")
    assert line.endswith("1.75 cores / 18% idle / 715 us, 1.80 cores / 17% idle / ? us")


def test_rounds_are_paired_with_the_bare_endpoints_and_a_contender_left_out_has_none() -> None:
    bare = [_load(3000, None), _load(4000, None)]
    assert paired_ratios(bare, [_load(3300, None), _load(3000, None)]) == pytest.approx(
        [1.1, 0.75])
    assert paired_ratios(bare, []) == []  # ``--no-projector-off``: no such runs
    assert paired_ratios([_load(0, None)], [_load(3000, None)]) == []  # nothing to divide by
