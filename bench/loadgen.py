"""A light HTTP/1.1 load generator: pre-built requests over keep-alive connections.

httpx costs about a millisecond of Python per request, too much to drive a server at a
steady rate from the same small machine. This writes pre-encoded requests on raw asyncio
streams and reads just the status line, headers and body. Open loop: request ``i`` is due
at ``start + i / rate`` whatever happened before, and its latency counts from when it was
due, so a slow server cannot hide its queueing (no coordinated omission).
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Answer:
    index: int
    due: float
    done: float
    status: int
    sent: float = 0.0  # when a connection was free to write it (due, unless all were busy)

    @property
    def latency(self) -> float:
        return self.done - self.due

    @property
    def queued(self) -> float:
        """How long it waited in the generator before being written (for a free
        connection, or for the generator's own event loop): the part of its latency that
        came from the generator, not the server."""
        return max(0.0, self.sent - self.due)


def post_request(host: str, path: str, body: bytes, headers: dict[str, str]) -> bytes:
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}", "Content-Type: application/json",
             f"Content-Length: {len(body)}"] + [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def _read_answer(reader: asyncio.StreamReader) -> int:
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    if length:
        await reader.readexactly(length)
    return status


async def run(host: str, port: int, requests: Sequence[bytes], *, rate: float | None,
              connections: int = 32,
              on_answer: Callable[[Answer], None] | None = None) -> list[Answer]:
    """Send every request once; ``rate`` None means as fast as the connections allow
    (closed loop: each latency then counts from the moment its request is written)."""
    queue: asyncio.Queue[tuple[int, float | None] | None] = asyncio.Queue()
    answers: list[Answer] = []
    start = time.perf_counter()

    async def schedule() -> None:
        for i in range(len(requests)):
            if rate is None:
                queue.put_nowait((i, None))
                continue
            due = start + i / rate
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            queue.put_nowait((i, due))
        for _ in range(connections):
            queue.put_nowait(None)

    async def worker() -> None:
        reader, writer = await asyncio.open_connection(host, port)
        try:
            while (item := await queue.get()) is not None:
                index, due = item
                sent = time.perf_counter()
                if due is None:
                    due = sent
                writer.write(requests[index])
                status = await _read_answer(reader)
                answer = Answer(index, due, time.perf_counter(), status, sent)
                answers.append(answer)
                if on_answer:
                    on_answer(answer)
        finally:
            writer.close()

    await asyncio.gather(schedule(), *(worker() for _ in range(connections)))
    return answers


@contextmanager
def collector_paused() -> Iterator[None]:
    """No cyclic garbage collection in the generator while it measures.

    A full pass over a soak's pre-built requests and answers took 70 to 90 ms (timed with
    ``gc.callbacks``): every request due meanwhile was sent late, and open-loop timing
    rightly counts that as latency, but it is the generator's, not the server's. What
    exists is frozen out of later passes and nothing runs until the load ends.
    """
    was_enabled = gc.isenabled()
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        gc.unfreeze()
        if was_enabled:
            gc.enable()


def percentile(values: Sequence[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(fraction * len(ordered)) - 1))]
