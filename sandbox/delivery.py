"""Sending deliveries over HTTP, as the provider does. I/O lives here, nowhere else.

* General (system A): one POST, never retried (the provider never retries).
* Chat (system B): retried after a non-2xx, a timeout or a refused connection, on the spec's
  schedule (1m, 5m, 30m, 2h, 12h after the first failure) scaled by ``retry_scale`` so that
  tests take milliseconds. The spec says both "retried at 1m, 5m, 30m, 2h, 12h" and
  "dead-lettered after 5 attempts"; the sandbox reads the five times as five *retries*
  (attempts 2 to 6, ``X-Service-Attempt`` counting from 1) and dead-letters when the 12h one
  fails. A delivery is signed with the number's secret *as it was when it was queued*:
  deliveries already queued when a secret is rotated keep the old one; each attempt carries
  a fresh ``t``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Literal

import httpx

from sandbox.signing import chat_headers, general_headers

RETRY_OFFSETS_S: tuple[float, ...] = (60, 300, 1800, 7200, 43200)
DEFAULT_RETRY_SCALE = 1e-4  # 1 minute -> 6 ms, 12 hours -> 4.3 s
GENERAL_TIMEOUT_S = 30.0
CHAT_TIMEOUT_S = 15.0
STALE_BY_S = 3600  # how far in the past a deliberately stale chat signature is dated

Fault = Literal["bad_signature", "stale"]


@dataclass(frozen=True, slots=True)
class Answer:
    """What the receiver said to one attempt (status 0: no HTTP answer at all)."""

    status: int
    body: str
    error: str | None = None

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


async def post_general(client: httpx.AsyncClient, url: str, body: bytes, secret: str,
                       *, timeout_s: float = GENERAL_TIMEOUT_S) -> Answer:
    """One general delivery, signed with ``secret``; never retried."""
    try:
        response = await client.post(url, content=body, headers=general_headers(secret, body),
                                     timeout=timeout_s)
    except httpx.HTTPError as exc:
        return Answer(0, "", type(exc).__name__)
    return Answer(response.status_code, response.text)


def retry_delays(scale: float) -> list[float]:
    """Seconds to wait before each retry, from the spec's offsets after the first failure."""
    offsets = [o * scale for o in RETRY_OFFSETS_S]
    return [b - a for a, b in zip([0.0, *offsets[:-1]], offsets, strict=True)]


@dataclass
class ChatDelivery:
    """One chat event on its way to a number's webhook, with what happened to it."""

    delivery_id: str
    phone_number_id: str
    url: str
    body: bytes
    secret: str  # the number's secret when the delivery was queued
    first_attempt_fault: Fault | None = None
    lost_attempts: int = 0  # attempts that vanish in transit before one reaches the receiver
    wrong_secret: str = "not-the-number-secret"
    answers: list[tuple[int, Answer]] = field(default_factory=list)
    state: Literal["queued", "delivered", "dead"] = "queued"

    def headers(self, attempt: int, now: int) -> dict[str, str]:
        fault = self.first_attempt_fault if attempt == self.lost_attempts + 1 else None
        secret = self.wrong_secret if fault == "bad_signature" else self.secret
        t = now - STALE_BY_S if fault == "stale" else now
        return chat_headers(secret, self.body, timestamp=t, delivery_id=self.delivery_id,
                            attempt=attempt)


async def deliver_chat(client: httpx.AsyncClient, delivery: ChatDelivery, *,
                       retry_scale: float = DEFAULT_RETRY_SCALE,
                       timeout_s: float = CHAT_TIMEOUT_S,
                       clock: Callable[[], float] = time.time) -> ChatDelivery:
    """Attempt until a 2xx or dead-lettering; bounded by the schedule's length."""
    delays = retry_delays(retry_scale)
    for attempt in range(1, len(delays) + 2):
        if attempt <= delivery.lost_attempts:
            answer = Answer(0, "", "lost_in_transit")
        else:
            try:
                response = await client.post(
                    delivery.url, content=delivery.body,
                    headers=delivery.headers(attempt, int(clock())), timeout=timeout_s)
                answer = Answer(response.status_code, response.text)
            except httpx.HTTPError as exc:
                answer = Answer(0, "", type(exc).__name__)
        delivery.answers.append((attempt, answer))
        if answer.ok:
            delivery.state = "delivered"
            return delivery
        if attempt <= len(delays):
            await asyncio.sleep(delays[attempt - 1])
    delivery.state = "dead"
    return delivery


class ChatDispatcher:
    """A background sender of queued chat deliveries (its own thread and event loop).

    ``pause()`` holds deliveries in the queue (so a test can rotate a secret while some
    are queued); ``resume()`` releases them; ``drain()`` waits until all are settled.
    """

    def __init__(self, *, retry_scale: float = DEFAULT_RETRY_SCALE) -> None:
        self.retry_scale = retry_scale
        self._loop = asyncio.new_event_loop()
        self._released = threading.Event()
        self._released.set()
        self._pending: list[Future[ChatDelivery]] = []
        self.deliveries: list[ChatDelivery] = []
        self.dead_without_url: list[str] = []
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="sandbox-chat-dispatcher")
        self._thread.start()
        self._client = httpx.AsyncClient()

    def submit(self, delivery: ChatDelivery) -> Future[ChatDelivery]:
        self.deliveries.append(delivery)
        future = asyncio.run_coroutine_threadsafe(self._run(delivery), self._loop)
        self._pending.append(future)
        return future

    async def _run(self, delivery: ChatDelivery) -> ChatDelivery:
        while not self._released.is_set():
            await asyncio.sleep(0.005)
        return await deliver_chat(self._client, delivery, retry_scale=self.retry_scale)

    def pause(self) -> None:
        self._released.clear()

    def resume(self) -> None:
        self._released.set()

    def drain(self, timeout_s: float = 30.0) -> None:
        """Wait until every submitted delivery is delivered or dead (bounded)."""
        deadline = time.monotonic() + timeout_s
        for future in list(self._pending):
            future.result(timeout=max(0.0, deadline - time.monotonic()))

    def close(self) -> None:
        self.resume()
        for future in self._pending:
            future.cancel()
        asyncio.run_coroutine_threadsafe(self._client.aclose(), self._loop).result(timeout=5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._loop.close()
