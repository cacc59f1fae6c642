"""Fetching inbound media in the background, off the request path, with the ledger as state.

An inbound image/document/audio/video message (``chat.message.received`` with
``facts.media_id``) names media the provider serves at ``GET /api/v1/waba/messages/{id}/media``.
The webhook is answered without it (15 s window); this worker fetches it afterwards.

No table of its own: what still needs fetching is derived from the ledger. Each outcome is a
ledger event in stream ``chat-media:<media id>`` (source ``media``):

* ``chat.media.fetched`` (dedupe ``media:fetched:<id>``): stored; done for good.
* ``chat.media.failed`` (dedupe ``media:failed:<id>:<attempt>``): attempt N failed; attempt
  N+1 is due ``retry_base_s * 2**(N-1)`` (capped) after it. Only failures that say something
  about the media (the API refused it, or answered what is no media) count toward giving
  up: after ``max_attempts`` of those the media is given up. An API that gave no usable
  answer (``retryable``: connection, timeout, 429, 5xx), like an API refusing our key (401,
  403: a wrong, missing or expired one) or a home that could not store it (a full disk),
  said nothing about the media; counting it
  gave up every media message that arrived during half a minute of outage or rate limiting,
  and nothing ever fetched them again. Those attempts go on at the capped delay, up to
  :data:`OUTAGE_ATTEMPTS` more: about twelve hours at the 300 s cap (the provider's own
  retry horizon for chat), never for ever.

The dedupe keys make each outcome idempotent, so two workers (two service processes) racing
on one media id add one ``fetched`` event and one ``failed`` event per attempt number at most;
the content-addressed store makes their writes of the same bytes harmless.

Bytes go to ``<home>/media/<sha256[:2]>/<sha256>``: written to a temporary file in the same
folder, fsynced, renamed over, folder fsynced. The ``fetched`` event is appended only after
that, so an event never names bytes that are not durably there.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import structlog
from psycopg_pool import AsyncConnectionPool

from ingest.chat_api import ChatApi, ChatApiError
from ingest.chat_body import MEDIA_KINDS
from ingest.durable import durable_folder, fsync_folder
from ledger import LedgerStore, NewEvent
from ledger.jsonenc import dumps
from ledger.sqlfiles import load
from ledger.store import translated_errors

log = structlog.get_logger("hookledger.chat_media")

SOURCE = "media"
FETCHED = "chat.media.fetched"
FAILED = "chat.media.failed"
MEDIA_DIR = "media"


@dataclass(frozen=True, slots=True)
class StoredMedia:
    sha256: str
    size: int
    path: str  # relative to home


class MediaStore:
    """Content-addressed files under ``<home>/media``."""

    def __init__(self, home: Path) -> None:
        self.home = home

    def put(self, content: bytes) -> StoredMedia:
        """Store ``content`` durably (idempotent); return where it is."""
        digest = hashlib.sha256(content).hexdigest()
        relative = Path(MEDIA_DIR) / digest[:2] / digest
        target = self.home / relative
        if not (target.exists() and target.stat().st_size == len(content)):
            # the media folder and its new two-character folder, durably: fsynced inside
            # a folder whose name a power cut lost, the file was gone with it, while the
            # ``chat.media.fetched`` event named it
            durable_folder(target.parent)
            fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".part-")
            try:
                with os.fdopen(fd, "wb") as out:
                    out.write(content)
                    out.flush()
                    os.fsync(out.fileno())
                os.replace(tmp, target)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
                raise
            fsync_folder(target.parent)
        return StoredMedia(digest, len(content), relative.as_posix())


@dataclass(frozen=True, slots=True)
class Pending:
    """A received media message and what has happened to its media so far."""

    position: int
    media_id: str
    message_id: str | None
    phone_number_id: str | None
    fetched: bool
    failures: int
    last_failed_at: datetime | None
    refusals: int  # the failures that count toward giving up (not ``retryable`` ones)


OUTAGE_ATTEMPTS = 150  # retryable failures a media rides out beyond ``max_attempts``
MAX_DOUBLINGS = 62  # far past any cap; 2**1024 times a float overflowed
# answers refusing who asks, not what is asked: counted toward giving up, a key mistyped,
# rotated or expired gave up every media that arrived until it was put right, a few
# seconds after each, and none was ever fetched again
KEY_REFUSED = frozenset({401, 403})
AUTHENTICATION_CODES = range(40000, 50000)  # the spec's 4xxxx, whatever the HTTP status


def key_refused_code(code: int | None) -> bool:
    """An envelope code of the authentication service: the API's HTTP statuses are not in
    the spec, so a refused key may come as a 200 or 400 carrying 40101 as well as a 401."""
    return code is not None and code in AUTHENTICATION_CODES


def backoff(failures: int, base_s: float, cap_s: float) -> float:
    """Seconds to wait after the ``failures``-th failure before the next attempt.

    Bounded before it is multiplied: an API away for days has failed a media a thousand
    times (those failures never give it up), and the float product then overflowed,
    failing every poll of the worker, for every media."""
    return min(cap_s, base_s * 2 ** min(MAX_DOUBLINGS, max(0, failures - 1)))


def given_up(failures: int, refusals: int, max_attempts: int) -> bool:
    """After ``max_attempts`` failures that concern the media, or an outage outlasting
    :data:`OUTAGE_ATTEMPTS` more attempts."""
    return refusals >= max_attempts or failures >= max_attempts + OUTAGE_ATTEMPTS


def plan(rows: Sequence[Pending], *, now: datetime, max_attempts: int, base_s: float,
         cap_s: float) -> tuple[list[Pending], dict[int, datetime]]:
    """Pure: the rows due now (one per media id), and when to look again at each row not
    settled yet (fetched, or given up), by its position; a settled row is never looked at
    again. A row due now is looked at again at once, to read what its fetch recorded."""
    due: list[Pending] = []
    seen: set[str] = set()
    again: dict[int, datetime] = {}
    for row in rows:
        if row.fetched or given_up(row.failures, row.refusals, max_attempts):
            continue
        next_at = now
        if row.failures and row.last_failed_at is not None:
            next_at = max(now, row.last_failed_at
                          + timedelta(seconds=backoff(row.failures, base_s, cap_s)))
        again[row.position] = next_at
        if next_at <= now and row.media_id not in seen:
            seen.add(row.media_id)
            due.append(row)
    return due, again


def fetched_event(row: Pending, stored: StoredMedia, content_type: str,
                  now: datetime) -> NewEvent:
    payload = {"media_id": row.media_id, "message_id": row.message_id,
               "phone_number_id": row.phone_number_id, "sha256": stored.sha256,
               "size": stored.size, "content_type": content_type, "path": stored.path,
               "attempt": row.failures + 1, "fetched_at": now}
    text = dumps(payload)
    return NewEvent(stream=f"chat-media:{row.media_id}", event_type=FETCHED, source=SOURCE,
                    dedupe_key=f"media:fetched:{row.media_id}", payload_json=text,
                    received_at=now, facts=payload)


def failed_event(row: Pending, reason: str, detail: str | None, now: datetime,
                 *, final: bool, retryable: bool = False) -> NewEvent:
    attempt = row.failures + 1
    payload = {"media_id": row.media_id, "message_id": row.message_id,
               "phone_number_id": row.phone_number_id, "attempt": attempt,
               "reason": reason, "detail": detail, "final": final, "retryable": retryable,
               "failed_at": now}
    text = dumps(payload)
    return NewEvent(stream=f"chat-media:{row.media_id}", event_type=FAILED, source=SOURCE,
                    dedupe_key=f"media:failed:{row.media_id}:{attempt}", payload_json=text,
                    received_at=now, facts=payload)


class MediaFetcher:
    """The background worker: poll the ledger, fetch what is due, record each outcome."""

    def __init__(self, *, pool: AsyncConnectionPool, ledger: LedgerStore, api: ChatApi,
                 store: MediaStore, poll_s: float = 2.0, max_attempts: int = 5,
                 retry_base_s: float = 1.0, retry_cap_s: float = 300.0, batch: int = 200,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self._pool = pool
        self._ledger = ledger
        self._api = api
        self._store = store
        self._poll_s = poll_s
        self._max_attempts = max_attempts
        self._base_s = retry_base_s
        self._cap_s = retry_cap_s
        self._batch = batch
        self._clock = clock
        # every row up to here has been read once; those not settled then are in _again,
        # with when to look at them next: a media still being retried holds up nothing else
        self._read_up_to = 0
        self._again: dict[int, datetime] = {}
        self._stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="hookledger-chat-media")

    async def stop(self, timeout_s: float = 5.0) -> None:
        """Stop polling; a fetch in flight gets ``timeout_s`` to finish, then is cancelled."""
        self._stopping.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._task), timeout_s)
            except TimeoutError:
                self._task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._task
        await self._api.aclose()

    async def _run(self) -> None:
        while not self._stopping.is_set():
            more = False
            try:
                _, more = await self._poll()
            except Exception as exc:  # noqa: BLE001 - the worker outlives a bad poll
                log.warning("chat_media.poll_failed", error=type(exc).__name__)
            if more:  # catching up (after a start, or a burst): the next batch at once
                await asyncio.sleep(0)
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), self._poll_s)

    async def _pending(self, again: list[int]) -> list[Pending]:
        async with translated_errors(), self._pool.connection() as conn:
            cur = await conn.execute(load("ingest", "chat_media_pending"), {
                "after": self._read_up_to, "again": again, "kinds": sorted(MEDIA_KINDS),
                "limit": self._batch})
            rows = await cur.fetchall()
        return [Pending(*row) for row in rows]

    async def run_once(self) -> int:
        """One poll: fetch everything due now. Returns how many were due (a stop can cut
        the fetches short)."""
        return (await self._poll())[0]

    async def _poll(self) -> tuple[int, bool]:
        """One poll: how many were due, and whether a full batch of new rows was read (more
        may be waiting)."""
        now = self._clock()
        again = sorted(p for p, at in self._again.items() if at <= now)
        rows = await self._pending(again)
        new = [row for row in rows if row.position > self._read_up_to]
        due, waiting = plan(rows, now=now, max_attempts=self._max_attempts,
                            base_s=self._base_s, cap_s=self._cap_s)
        for position in again:  # looked at: settled ones drop out, the rest are timed anew
            self._again.pop(position, None)
        self._again.update(waiting)
        if new:
            self._read_up_to = new[-1].position
        for row in due:
            if self._stopping.is_set():
                break
            await self._fetch(row)
        return len(due), len(new) >= self._batch

    async def _fetch(self, row: Pending) -> None:
        bound: dict[str, Any] = {"media_id": row.media_id, "attempt": row.failures + 1}
        try:
            media = await self._api.fetch_media(row.media_id)
            stored = await asyncio.to_thread(self._store.put, media.content)
        except (ChatApiError, OSError) as exc:
            reason = exc.reason if isinstance(exc, ChatApiError) else "storage"
            detail = exc.detail if isinstance(exc, ChatApiError) else type(exc).__name__
            # our own disk failing (full, a broken folder) or our key refused says nothing
            # about the media: waited out as an outage is, not counted toward giving it up
            retryable = isinstance(exc, OSError) or exc.retryable \
                or exc.status in KEY_REFUSED or key_refused_code(exc.code)
            final = given_up(row.failures + 1, row.refusals + (0 if retryable else 1),
                             self._max_attempts)
            await self._ledger.append([failed_event(row, reason, detail, self._clock(),
                                                    final=final, retryable=retryable)])
            log.warning("chat_media.failed", reason=reason, detail=detail, final=final,
                        **bound)
            return
        except Exception as exc:  # noqa: BLE001 - one media's surprise must not stop the rest
            # escaped, it failed the poll with no outcome recorded: the same media was tried
            # again every poll and every later one waited for good. Counted toward giving up
            final = given_up(row.failures + 1, row.refusals + 1, self._max_attempts)
            await self._ledger.append([failed_event(row, "internal", type(exc).__name__,
                                                    self._clock(), final=final)])
            log.error("chat_media.failed", reason="internal", error=type(exc).__name__,
                      final=final, **bound)
            return
        await self._ledger.append([fetched_event(row, stored, media.content_type,
                                                 self._clock())])
        log.info("chat_media.fetched", sha256=stored.sha256, size=stored.size, **bound)

