"""The wake-up probe put beside every benchmark run (bench/wakeup_probe.py)."""

from __future__ import annotations

import os

import pytest

from bench.wakeup_probe import described, probe, round_trip_us

TWO_CORES = len(os.sched_getaffinity(0)) >= 2


@pytest.mark.skipif(not TWO_CORES, reason="needs two cores")
def test_each_placement_is_measured_and_the_affinity_is_given_back() -> None:
    before = os.sched_getaffinity(0)
    figures = probe()
    assert set(figures) == {"same_core_us", "across_cores_us", "unpinned_us"}
    assert all(0 < value < 100_000 for value in figures.values())
    assert os.sched_getaffinity(0) == before


@pytest.mark.skipif(not TWO_CORES, reason="needs two cores")
def test_a_round_trip_is_per_exchange_not_per_run() -> None:
    """A hundred times the exchanges must not make each one a hundred times dearer."""
    cpu = min(os.sched_getaffinity(0))
    few = round_trip_us(cpu, cpu, round_trips=200)
    many = round_trip_us(cpu, cpu, round_trips=20_000)
    assert many < few * 10


def test_one_core_is_said_not_measured() -> None:
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(before)})
    try:
        assert probe() == {}
    finally:
        os.sched_setaffinity(0, before)
    assert described({}) == "not measured (fewer than two cores)"


def test_the_figures_read_as_words() -> None:
    assert described({"same_core_us": 25.1, "across_cores_us": 137.0, "unpinned_us": 90.2}) \
        == "25.1 us on one core, 137.0 across cores, 90.2 placed by the kernel"
