"""Draining the spool into the ledger once the database is back.

Runs in every ``serve`` process: it drains this process's sealed files and any file left
by a process that died (their locks went with them). Each file is appended in record
order, in batches, and deleted only when all of it is in the ledger; a crash halfway
re-appends the first part, which the ledger's dedupe key turns into duplicates.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator, Sequence
from typing import BinaryIO

import structlog

from ingest.accepting import kept_unstorable
from ingest.appender import AppendMany
from ingest.spool import QUARANTINE, Damage, Spool, read_records
from ledger import LedgerUnavailable, NewEvent

log = structlog.get_logger("hookledger.spool")

# at most this many bytes of bodies per drained chunk (one event may be larger alone). Each
# chunk must commit within HOOKLEDGER_APPEND_STALL_S, or it is given up and tried again the
# same way next round: 256 bodies of a megabyte could never drain, and while the backlog
# stands every new delivery is spooled behind it, so nothing would reach the ledger again
CHUNK_BYTES = 4 * 1024 * 1024


def event_bytes(event: NewEvent) -> int:
    """The bytes an event's append carries: its body, and its payload when it has its own."""
    return len(event.raw_body or b"") + len(event.payload_json or "")


def chunks(events: Sequence[NewEvent], *, max_events: int,
           max_bytes: int = CHUNK_BYTES) -> Iterator[list[NewEvent]]:
    """``events`` in order, in chunks of at most ``max_events`` and, unless one event alone
    is larger, ``max_bytes``."""
    chunk: list[NewEvent] = []
    size = 0
    for event in events:
        weight = event_bytes(event)
        if chunk and (len(chunk) >= max_events or size + weight > max_bytes):
            yield chunk
            chunk, size = [], 0
        chunk.append(event)
        size += weight
    if chunk:
        yield chunk


def _read_file(handle: BinaryIO, name: str) -> tuple[list[NewEvent], list[Damage]]:
    return read_records(handle.read(), name)


class SpoolDrainer:
    def __init__(self, spool: Spool, append_many: AppendMany, *, interval_s: float = 1.0,
                 batch_size: int = 256) -> None:
        self._spool = spool
        self._append_many = append_many
        self._interval_s = interval_s
        self._batch_size = batch_size
        self._wakeup = asyncio.Event()
        self._stop = asyncio.Event()
        self._round_ended = asyncio.Event()  # set as each round ends (see caught_up)
        self._reached = True  # whether the last round reached the database
        self._task: asyncio.Task[None] | None = None
        self.drained = 0
        self.damaged = 0
        self.quarantined = 0
        self.kept_unstorable = 0

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="hookledger-spool-drain")

    def nudge(self) -> None:
        self._wakeup.set()

    async def caught_up(self, within_s: float) -> bool:
        """Whether every record this process spooled is in the ledger, waiting at most
        ``within_s`` for drain rounds to get them there.

        For the appender, which sends a batch behind a backlog to the spool, so that the
        order holds. Under steady load every drain round found the records spooled during
        the round before it: the backlog never was empty when a batch came, and after an
        outage, however short, every delivery went through the spool for good. Waiting for
        the drainer (while new deliveries queue in memory, not in the spool) ends that.
        Not waited for, False at once, when the last round could not reach the database
        (an outage: the spool answers at once, as before) or the backlog is more than one
        chunk (a long drain: waiting would hold each batch until its bound)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within_s
        before = None
        while backlog := self._spool.backlog:
            remaining = deadline - loop.time()
            if not self._reached or backlog > self._batch_size or remaining <= 0 \
                    or backlog == before:  # a round took none of it (another holds it)
                return False
            before = backlog
            self._round_ended.clear()
            self.nudge()
            try:
                await asyncio.wait_for(self._round_ended.wait(), remaining)
            except TimeoutError:
                return False
        return True

    async def stop(self) -> None:
        self._stop.set()
        self._wakeup.set()
        if self._task is not None:
            await self._task

    async def drain_once(self) -> int:
        """Seal the file being written, then append every drainable file; return how many
        events were appended. Raises :class:`LedgerUnavailable` while the database is down.

        Sealed in a thread: sealing waits for a spool write in progress, fsync included, and
        on the event loop that wait held every connection of the worker."""
        await asyncio.to_thread(self._spool.seal)
        appended = 0
        for path, handle in self._spool.drainable():
            # in a thread: a file of a long outage is megabytes to read and decode, and on
            # the event loop that held every delivery this worker was answering meanwhile
            events, damage = await asyncio.to_thread(_read_file, handle, path.name)
            for d in damage:
                self.damaged += 1
                log.error("spool.damaged", file=d.file, offset=d.offset, length=d.length,
                          reason=d.reason)
            for chunk in chunks(events, max_events=self._batch_size):
                await self._append_chunk(chunk)
            self._spool.drained(path)
            appended += len(events)
            log.info("spool.drained", file=path.name, events=len(events))
        self.drained += appended
        return appended

    async def _append_chunk(self, chunk: list[NewEvent]) -> None:
        """Append a chunk; an event the ledger refuses for itself (not for being down) is
        kept as a direct append keeps it (:meth:`_keep_refused`), so one bad record never
        holds back the rest, nor the deliveries queued behind the backlog."""
        try:
            await self._append_many(chunk)
            return
        except LedgerUnavailable:
            raise
        except Exception:  # noqa: BLE001 - find the one that fails, below
            pass
        for event in chunk:
            try:
                await self._append_many([event])
            except LedgerUnavailable:
                raise
            except Exception as exc:  # noqa: BLE001 - kept another way, below
                await self._keep_refused(event, exc)

    async def _keep_refused(self, event: NewEvent, error: Exception) -> None:
        """An event the ledger refused, kept as unstorable by its raw bytes, as the direct
        append keeps it (``refused_by_database``): in the ledger, filed with its payment or
        message, and a ``malformed_delivery`` for someone to check. The quarantine file,
        which no view shows, is left for what even that cannot keep."""
        kept = kept_unstorable(event, error)
        if kept is not None:
            try:
                await self._append_many([kept])
            except LedgerUnavailable:
                raise
            except Exception:  # noqa: BLE001 - quarantined, below
                pass
            else:
                self.kept_unstorable += 1
                log.error("spool.refused_by_database", dedupe_key=event.dedupe_key,
                          kept_as=kept.dedupe_key, error=type(error).__name__)
                return
        self._spool.quarantine(event)
        self.quarantined += 1
        log.error("spool.quarantined", dedupe_key=event.dedupe_key,
                  error=type(error).__name__, file=QUARANTINE)

    async def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), timeout=self._interval_s)
            self._wakeup.clear()
            if self._stop.is_set():
                break
            try:  # the look at the folder too: an OSError there (EMFILE, EIO) ended this
                # task for good, and the backlog, and every delivery spooled behind it, with it
                if self._spool.depth() == 0:
                    continue
                appended = await self.drain_once()
                self._reached = True
                # more arrived while draining: keep going. Only after a round that drained
                # something: one whose files another process's drainer holds drained
                # nothing, and started again at once, a core's worth, for as long as it held
                if appended and self._spool.backlog:
                    self._wakeup.set()
            except LedgerUnavailable:
                self._reached = False  # still down: the next round tries again
            except Exception:
                log.exception("spool.drain_failed")
            finally:
                self._round_ended.set()
