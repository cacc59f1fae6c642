"""The cyclic garbage collector's settings while a ``serve`` process runs.

Reference counting frees what a delivery or a fold allocates as soon as it is done; the
cyclic collector only has to find reference cycles, which the request and fold paths make
few of. Two settings keep it from working for nothing:

* **Freeze start-up objects.** The ~100k objects built before serving live as long as the
  process; left to the collector, every full collection rescanned them and paused a worker
  for 50-70 ms under load (p99 latency), against under 6 ms frozen.
* **A larger generation-0 threshold.** At CPython's default (700 net container
  allocations) a worker under load still ran a generation-0 collection every few dozen
  deliveries, because the deliveries in flight hold that many containers between them:
  about 490 collections taking 0.27 s of one worker in a 12 s ingest run. At
  :data:`GEN0_THRESHOLD` the same run collected nothing, and the process's memory is
  unchanged (cycles are still collected, after 20,000 allocations instead of 700).
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

GEN0_THRESHOLD = 20_000

# The collector's settings belong to the process, and tests run several services in one:
# the first to start saves them, the last to stop restores them, whatever the order.
_lock = threading.Lock()
_serving = 0
_saved: tuple[int, int, int] = (0, 0, 0)


@contextmanager
def tuned_for_serving() -> Iterator[None]:
    """Freeze what exists now and collect generation 0 less often; undone when the last
    service of the process stops, so nothing is pinned, and nothing else in the process is
    changed, past the service. A process that turned automatic collection off (threshold 0)
    keeps it off."""
    global _serving, _saved
    with _lock:
        if _serving == 0:
            _saved = gc.get_threshold()
            gen0, *older = _saved
            gc.set_threshold(gen0 and max(GEN0_THRESHOLD, gen0), *older)
        _serving += 1
        gc.freeze()
    try:
        yield
    finally:
        with _lock:
            _serving -= 1
            if _serving == 0:
                gc.set_threshold(*_saved)
                gc.unfreeze()
