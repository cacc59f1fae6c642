"""The collector's settings while serving are the process's: restored by the last service
to stop, in whatever order several services in one process stop."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from hookledger.gc_tuning import GEN0_THRESHOLD, tuned_for_serving


@pytest.fixture
def default_collector() -> Iterator[tuple[int, int, int]]:
    before = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    try:
        yield gc.get_threshold()
    finally:
        gc.set_threshold(*before)


def test_services_stopping_out_of_order_leave_the_process_as_it_was(
        default_collector: tuple[int, int, int]) -> None:
    first, second = tuned_for_serving(), tuned_for_serving()
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)  # the first to start stops first: the second still serves
    assert gc.get_threshold() == (GEN0_THRESHOLD, 10, 10)
    assert gc.get_freeze_count() > 0
    second.__exit__(None, None, None)
    assert gc.get_threshold() == default_collector
    assert gc.get_freeze_count() == 0


def test_a_process_with_automatic_collection_off_keeps_it_off() -> None:
    before = gc.get_threshold()
    gc.set_threshold(0, 10, 10)
    try:
        with tuned_for_serving():
            assert gc.get_threshold()[0] == 0
        assert gc.get_threshold() == (0, 10, 10)
    finally:
        gc.set_threshold(*before)
