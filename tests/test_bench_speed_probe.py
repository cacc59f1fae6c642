"""The issue's yardsticks put beside every benchmark run (bench/speed_probe.py)."""

from __future__ import annotations

import orjson

from bench.deliveries import delivery
from bench.speed_probe import described, probe


def test_both_steps_are_timed_per_call() -> None:
    few = probe(calls=200, repeats=2)
    many = probe(calls=20_000, repeats=2)
    assert set(few) == set(many) == {"hmac_sha256_1kb_us", "orjson_parse_1kb_us"}
    assert all(0 < value < 1_000 for value in [*few.values(), *many.values()])
    # a hundred times the calls must not make each a hundred times dearer
    assert all(many[name] < few[name] * 10 for name in few)


def test_the_yardstick_is_the_benchs_own_one_kb_delivery() -> None:
    body = delivery("speed-probe", 1)
    assert 900 <= len(body) <= 1_100
    assert orjson.loads(body)["event"] == "payment.confirmed"


def test_the_figures_read_against_the_issues_machine() -> None:
    assert described({"hmac_sha256_1kb_us": 5.0, "orjson_parse_1kb_us": 3.0}) == (
        "HMAC-SHA256 of 1 KB 5.0 us, orjson parse of 1 KB 3.0 us "
        "(the issue's machine: about 2 us each; 2.0x that)")
    assert described({}) == "not measured"
