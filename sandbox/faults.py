"""Fault switches for the sandbox API, settable at start and at run time.

Each switch does one thing, to ``/api/v1/*`` answers only (``/_sandbox/*`` is never
faulted, so tests can always turn faults off):

* ``latency_ms``: every answer waits this long first;
* ``trickle_ms``: every answer's body is sent one byte at a time, this many ms apart (each
  read well within a client's timeout, the whole answer far past it);
* ``error_count`` / ``error_rate``: answer ``error_status`` (a 5xx) with an error envelope;
* ``rate_limit_count`` / ``rate_limit_rate``: answer 429 with ``Retry-After: retry_after_s``;
* ``timeout_count`` / ``timeout_rate``: hang ``hang_s`` seconds (longer than a client
  waits), then answer 504;
* ``malformed_count`` / ``malformed_rate``: answer 200 with a broken envelope:
  ``malformed_kind`` ``non_json`` (an HTML page labelled JSON), ``missing_fields``
  (JSON without ``code``, ``message`` and ``data``), ``bad_encoding`` (labelled gzip, but
  not gzip: the client cannot even read it) or ``loose_envelope`` (the real answer, done,
  with ``code`` left out and ``message`` null: a success the documented shape does not
  quite hold) or ``gzip_bomb`` (labelled ``gzip, gzip``: under a kilobyte sent, 256 MiB of
  zeros once both layers are undone, as a hostile server or a broken proxy could send).

Counts are used up first, one answer each; rates then apply per answer, drawn from a
random generator seeded with ``seed``. When several would fire, the first of timeout,
error, rate limit, malformed wins.
"""

from __future__ import annotations

import random
import threading
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Literal

Action = Literal["timeout", "error", "rate_limit", "malformed"]
ACTIONS: tuple[Action, ...] = ("timeout", "error", "rate_limit", "malformed")
MALFORMED_KINDS = ("non_json", "missing_fields", "bad_encoding", "loose_envelope",
                   "gzip_bomb")


@dataclass(frozen=True, slots=True)
class FaultSettings:
    latency_ms: int = 0
    trickle_ms: int = 0
    error_count: int = 0
    error_rate: float = 0.0
    error_status: int = 503
    rate_limit_count: int = 0
    rate_limit_rate: float = 0.0
    retry_after_s: int = 1
    timeout_count: int = 0
    timeout_rate: float = 0.0
    hang_s: float = 60.0
    malformed_count: int = 0
    malformed_rate: float = 0.0
    malformed_kind: Literal["non_json", "missing_fields", "bad_encoding",
                            "loose_envelope", "gzip_bomb"] = "non_json"
    seed: int = 0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name.endswith("_rate") and not 0.0 <= value <= 1.0:
                raise ValueError(f"{f.name} must be between 0 and 1")
            if (f.name.endswith(("_count", "_ms", "_s")) and value < 0):
                raise ValueError(f"{f.name} must not be negative")
        if not 500 <= self.error_status <= 599:
            raise ValueError("error_status must be a 5xx status")
        if self.malformed_kind not in MALFORMED_KINDS:
            raise ValueError("malformed_kind must be non_json, missing_fields, bad_encoding, "
                             "loose_envelope or gzip_bomb")

    @classmethod
    def from_json(cls, data: dict[str, Any], base: FaultSettings | None = None
                  ) -> FaultSettings:
        """Settings from a JSON object (unknown keys refused), over ``base``."""
        known = {f.name: f.type for f in fields(cls)}
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise ValueError(f"unknown fault switch(es): {', '.join(unknown)}")
        changes: dict[str, Any] = {}
        for key, value in data.items():
            if isinstance(value, bool) or not isinstance(value, int | float | str):
                raise ValueError(f"{key} has the wrong type")
            if key == "malformed_kind":
                changes[key] = str(value)
            elif key.endswith("_rate") or key == "hang_s":
                changes[key] = float(value)
            else:
                changes[key] = int(value)
        return replace(base or cls(), **changes)


@dataclass(frozen=True, slots=True)
class Decision:
    latency_ms: int
    action: Action | None


def decide(settings: FaultSettings, remaining: dict[Action, int], rng: random.Random
           ) -> tuple[Decision, dict[Action, int]]:
    """Pure: the fault for the next answer, and the counts left afterwards."""
    left = dict(remaining)
    rates: dict[Action, float] = {
        "timeout": settings.timeout_rate, "error": settings.error_rate,
        "rate_limit": settings.rate_limit_rate, "malformed": settings.malformed_rate,
    }
    for action in ACTIONS:
        if left.get(action, 0) > 0:
            left[action] -= 1
            return Decision(settings.latency_ms, action), left
    # draw once per switch, always, so one switch's rate does not shift another's draws
    draws = {action: rng.random() for action in ACTIONS}
    for action in ACTIONS:
        if draws[action] < rates[action]:
            return Decision(settings.latency_ms, action), left
    return Decision(settings.latency_ms, None), left


class Faults:
    """The live switches of one sandbox server (thread-safe)."""

    def __init__(self, settings: FaultSettings | None = None) -> None:
        self._lock = threading.Lock()
        self.counters: dict[str, int] = {}
        self.configure(settings or FaultSettings())

    def configure(self, settings: FaultSettings) -> None:
        """Replace every switch (counts start again from the new settings)."""
        with self._lock:
            self._settings = settings
            self._rng = random.Random(settings.seed)
            self._remaining: dict[Action, int] = {
                "timeout": settings.timeout_count, "error": settings.error_count,
                "rate_limit": settings.rate_limit_count, "malformed": settings.malformed_count,
            }

    def set(self, **changes: Any) -> FaultSettings:
        """Change some switches, keeping the others: ``faults.set(error_count=2)``."""
        settings = FaultSettings.from_json(changes, self.settings)
        self.configure(settings)
        return settings

    def clear(self) -> None:
        self.configure(FaultSettings())

    @property
    def settings(self) -> FaultSettings:
        with self._lock:
            return self._settings

    def next(self) -> Decision:
        with self._lock:
            decision, self._remaining = decide(self._settings, self._remaining, self._rng)
            key = decision.action or "none"
            self.counters[key] = self.counters.get(key, 0) + 1
            return decision

    def describe(self) -> dict[str, Any]:
        with self._lock:
            return {"settings": asdict(self._settings),
                    "remaining": dict(self._remaining), "answered": dict(self.counters)}
