"""A measuring thread that runs for the length of a ``with`` block around a load.

The bench reads several things beside a load (resident memory, the disk's fsync latency,
the whole machine's CPU); each reader differs only in what its thread does, so the thread's
start, the signal that the block has ended, and the join live here once.
"""

from __future__ import annotations

import threading
from typing import Self


class Sampler:
    """Runs :meth:`_run` in a daemon thread while the ``with`` block runs; the thread ends
    when ``self._stop`` is set (use ``self._stop.wait(seconds)`` as its clock)."""

    thread_name = "bench-sampler"

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Self:
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        raise NotImplementedError
