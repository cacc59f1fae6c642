"""How fast this machine runs the two steps the performance issue timed on its own.

The issue gives its machine's figures beside its goals: an HMAC-SHA256 of 1 KB and an
orjson parse of 1 KB took about 2 us each. The goals stated in absolute terms (p99 in ms,
events/s, seconds) were set on that machine; the same code on a machine of the same kind
has run at half that speed (the bare endpoint's CPU per delivery ranged 262-1,071 us
between days). Timing those two steps on the bench's own delivery, beside every run, says
which kind of day a table comes from, by the issue's own yardstick.
"""

from __future__ import annotations

import hashlib
import hmac
import statistics
import timeit
from collections.abc import Callable
from typing import Any

import orjson

from bench.deliveries import delivery

ISSUE_MACHINE_US = 2.0  # the performance issue's figure for each step
CALLS = 20_000
REPEATS = 5  # best of five: the machine's speed, not its interruptions


def _best_us(step: Callable[[], object], calls: int, repeats: int) -> float:
    return min(timeit.repeat(step, number=calls, repeat=repeats)) / calls * 1e6


def probe(calls: int = CALLS, repeats: int = REPEATS) -> dict[str, float]:
    """Microseconds per call, best of ``repeats`` runs of ``calls`` each."""
    body = delivery("speed-probe", 1)  # the bench's own 1 KB delivery
    key = b"k" * 32
    figures = {
        "hmac_sha256_1kb_us": _best_us(lambda: hmac.new(key, body, hashlib.sha256).digest(),
                                       calls, repeats),
        "orjson_parse_1kb_us": _best_us(lambda: orjson.loads(body), calls, repeats),
    }
    return {name: round(value, 2) for name, value in figures.items()}


def described(figures: dict[str, Any]) -> str:
    """The figures in words for the summary table, against the issue's machine."""
    if not figures:
        return "not measured"
    slower = statistics.mean(figures.values()) / ISSUE_MACHINE_US
    return (f"HMAC-SHA256 of 1 KB {figures['hmac_sha256_1kb_us']} us, orjson parse of 1 KB "
            f"{figures['orjson_parse_1kb_us']} us (the issue's machine: about "
            f"{ISSUE_MACHINE_US:g} us each; {slower:.1f}x that)")


if __name__ == "__main__":
    print(described(probe()))
