"""The most memory Python allocated inside a block: what a bounded read is judged by."""

from __future__ import annotations

import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def peak_bytes() -> Iterator[list[int]]:
    """Trace allocations for the block; once it ends, the list holds their peak in bytes
    (set even when the block raised, for a ``pytest.raises`` inside it)."""
    peak: list[int] = []
    tracemalloc.start()
    try:
        yield peak
    finally:
        peak.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
