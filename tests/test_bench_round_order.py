"""The bench alternates which contender goes first, round by round."""

from __future__ import annotations

from bench.ingest_bench import round_order


def test_the_last_round_keeps_the_order_and_the_others_alternate_back_from_it() -> None:
    orders = [round_order(r, 3, ["bare", "off", "ours"]) for r in range(3)]
    assert orders == [["bare", "off", "ours"], ["ours", "off", "bare"],
                      ["bare", "off", "ours"]]
    pairs = [round_order(r, 2, ["empty", "large"]) for r in range(2)]
    assert pairs == [["large", "empty"], ["empty", "large"]]  # each first once


def test_every_contender_runs_once_a_round_whatever_the_count() -> None:
    for rounds in range(1, 6):
        for r in range(rounds):
            assert sorted(round_order(r, rounds, [3, 1, 2])) == [1, 2, 3]
    assert round_order(0, 1, ["a", "b"]) == ["a", "b"]
