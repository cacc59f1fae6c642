"""The benchmarks' disk probe: its figures follow the fsyncs it timed, and it really times them."""

from __future__ import annotations

import time
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from bench.disk_probe import STALL_S, DiskProbe, summarise

durations = st.lists(st.floats(min_value=0, max_value=5, allow_nan=False), max_size=500)


@given(durations)
def test_figures_bound_and_count_the_durations_in_any_order(seconds: list[float]) -> None:
    figures = summarise(seconds)
    assert figures == summarise(list(reversed(seconds)))
    assert figures.fsyncs == len(seconds)
    assert figures.stalls == sum(1 for d in seconds if d > STALL_S)
    if seconds:
        assert figures.max_ms == round(max(seconds) * 1000, 2)
        assert round(min(seconds) * 1000, 2) <= figures.p99_ms <= figures.max_ms
    else:
        assert (figures.p99_ms, figures.max_ms) == (0.0, 0.0)


def test_one_slow_fsync_in_a_hundred_is_a_stall_but_not_the_p99() -> None:
    figures = summarise([0.001] * 99 + [0.300])
    assert (figures.p99_ms, figures.max_ms, figures.stalls) == (1.0, 300.0, 1)


def test_the_probe_times_real_fsyncs_and_leaves_no_file(tmp_path: Path) -> None:
    with DiskProbe(tmp_path, interval_s=0.005) as probe:
        time.sleep(0.3)
    figures = probe.figures
    assert figures.fsyncs >= 5
    assert 0 < figures.p99_ms <= figures.max_ms
    assert list(tmp_path.iterdir()) == []
