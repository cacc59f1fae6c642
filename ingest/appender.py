"""Group commit: concurrent deliveries share one append transaction.

Each request hands its event to the appender and waits for its own result. One flush runs at
a time per process (appends are serialised in the database anyway): while it commits, new
events queue, and the next flush takes all of them in one multi-row statement and one
commit. Under light load a lone event is flushed at once, so no latency is added; under
heavy load a batch forms by itself while the previous commit is in flight. An optional
``max_wait_s`` lets a flush linger for more events when the queue is small. A request is
answered only after the transaction holding its event has committed, or its event is in
the spool (on disk, fsynced), which the drainer appends later.

Two bounds keep an answer inside the sender's window when the database is slow: a flush
held past ``stall_s`` is handed to the spool (:meth:`BatchingAppender._held`), and so is
everyone queued once the first of them has waited ``queue_wait_s`` (a database answering
each batch just inside ``stall_s`` made the last of a long queue wait for all of them).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

import structlog

from ingest.spool import Spool, encode_event
from ledger import AppendResult, LedgerError, LedgerUnavailable, NewEvent

log = structlog.get_logger("hookledger.ingest")

AppendMany = Callable[[Sequence[NewEvent]], Awaitable[list[AppendResult]]]
# how long close() waits for held statements to be cancelled (psycopg 3.3: up to about 10 s)
STOP_HELD_S = 11.0


def answered_within(append_many: AppendMany, seconds: float) -> AppendMany:
    """``append_many`` that gives up after ``seconds`` with :class:`LedgerUnavailable`:
    for the spool's drainer, which would otherwise wait on a silent database for as long
    as TCP retries. (The appender bounds its flushes itself, with a timer: a task around
    each flush, as here, put its statement one event-loop turn later, about 5% of ingest.)

    The statement is not waited for when given up on: cancelling it waits for psycopg to
    cancel it on the server and close the connection (up to ten seconds more on a dead
    network). It is left to end in the background. Should it commit after all, the
    spooled copy drains as a duplicate of it.
    """
    stalled: set[asyncio.Task[list[AppendResult]]] = set()

    def forget(task: asyncio.Task[list[AppendResult]]) -> None:
        stalled.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.info("appender.stalled_append_ended", error=type(exc).__name__)

    async def bounded(events: Sequence[NewEvent]) -> list[AppendResult]:
        task = asyncio.ensure_future(append_many(events))
        try:
            await asyncio.wait((task,), timeout=seconds)
        except asyncio.CancelledError:
            task.cancel()
            raise
        if task.done():
            return task.result()
        task.cancel()
        stalled.add(task)  # kept referenced until it ends
        task.add_done_callback(forget)
        log.error("appender.database_stalled", events=len(events), seconds=seconds)
        raise LedgerUnavailable(f"the database did not answer within {seconds:g} s")

    return bounded


class BatchingAppender:
    """Gathers concurrent appends into batches for one committing writer."""

    def __init__(self, append_many: AppendMany, *, max_batch: int = 256,
                 max_wait_s: float = 0.0, spool: Spool | None = None,
                 on_spooled: Callable[[], None] | None = None,
                 on_batch: Callable[[int], None] | None = None,
                 stall_s: float | None = None, queue_wait_s: float | None = None,
                 caught_up: Callable[[float], Awaitable[bool]] | None = None) -> None:
        self._append_many = append_many
        self._spool = spool
        # the drainer's SpoolDrainer.caught_up: whether a batch behind a backlog may wait
        # for it to drain, rather than go to the spool too (see _behind_backlog)
        self._caught_up = caught_up
        self._on_spooled = on_spooled
        self._on_batch = on_batch  # told each committed batch's size (a metric)
        self._max_batch = max_batch
        self._max_wait_s = max_wait_s
        self._queue: list[tuple[NewEvent, asyncio.Future[AppendResult]]] = []
        # when each queued event arrived (the loop's clock), beside ``_queue``: past
        # ``queue_wait_s`` for the first of them, the queue goes to the spool
        self._arrived: list[float] = []
        self._batch_arrived = 0.0  # when the oldest event of the batch being flushed came
        self._queue_wait_s = queue_wait_s
        # a flush the database has held past ``stall_s``: its task is left to end alone
        # (detached), its callers answered from the spool by the task that replaces it
        self._stall_s = stall_s
        self._stalled: list[tuple[NewEvent, asyncio.Future[AppendResult]]] = []
        self._flushing: list[tuple[NewEvent, asyncio.Future[AppendResult]]] = []
        self._detached: set[asyncio.Task[None]] = set()
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self.batches = 0
        self.events = 0
        self.spooled = 0

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="hookledger-appender")

    async def close(self) -> None:
        """Flush what is queued, then stop."""
        self._closing = True
        self._wakeup.set()
        while self._task is not None:  # the task may be replaced meanwhile (see _held)
            task = self._task
            await asyncio.wait((task,), timeout=0.2)
            if task is self._task and task.done():
                if self._detached:  # a held statement still being cancelled: let it end
                    await asyncio.wait(set(self._detached), timeout=STOP_HELD_S)
                await task
                return

    async def append(self, event: NewEvent) -> AppendResult:
        if self._closing or self._task is None or self._task.done():
            raise LedgerUnavailable("the appender is not running")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[AppendResult] = loop.create_future()
        self._queue.append((event, future))
        self._arrived.append(loop.time())
        self._wakeup.set()
        # No shield: the commit runs in the appender's own task, so a caller that goes away
        # cancels only its own future (which _settle then skips), never the batch; a shield
        # cost a second future and a loop turn per delivery.
        return await future

    async def _run(self) -> None:
        me = asyncio.current_task()
        try:
            while True:
                await self._wakeup.wait()
                self._wakeup.clear()
                if self._max_wait_s and not self._stalled \
                        and 0 < len(self._queue) < self._max_batch:
                    await asyncio.sleep(self._max_wait_s)
                while self._stalled or self._queue:
                    if self._stalled:  # a held flush's callers: before anyone queued after
                        stalled = [item for item in self._stalled if not _answered(item[1])]
                        self._stalled = []
                        await self._flush(stalled, spool_only=True)
                        continue
                    if self._overdue() and await self._spool_overdue():
                        continue
                    batch = self._queue[: self._max_batch]
                    self._batch_arrived = self._arrived[0]
                    del self._queue[: self._max_batch]
                    del self._arrived[: self._max_batch]
                    await self._flush(batch)
                    if me is not self._task:
                        return  # held past stall_s: another task took over meanwhile
                if self._closing:
                    return
        finally:
            # cancelled (or worse): whoever is still queued would otherwise wait for ever
            if me is self._task:
                for _, future in self._stalled + self._queue:
                    _settle(future, exc=LedgerUnavailable("the appender stopped"))
                self._stalled.clear()
                self._queue.clear()
                self._arrived.clear()

    def _overdue(self) -> bool:
        """Whether the first queued event has waited ``queue_wait_s`` behind flushes, past
        the ``max_wait_s`` it lingers by choice (waited out on top of the spool's bounds):
        counted in, a linger of a third of the stall time sent every lone delivery to the
        spool, the database healthy."""
        return (self._queue_wait_s is not None and self._spool is not None
                and bool(self._arrived)
                and self._queue_wait_left(self._arrived[0]) <= 0)

    def _queue_wait_left(self, arrived: float) -> float:
        """What is left of ``queue_wait_s`` (past ``max_wait_s``) to an event that arrived
        at ``arrived`` (the loop's clock)."""
        waited = asyncio.get_running_loop().time() - arrived
        return (self._queue_wait_s or 0.0) + self._max_wait_s - waited

    async def _spool_overdue(self) -> bool:
        """Hand the whole queue to the spool, in order, and answer it: its first event has
        waited ``queue_wait_s`` behind slow flushes, and the rest would wait for the same
        ones. The spool's backlog then takes what comes next, ahead of the database, until
        the drainer has caught up (the order kept). Whether it did: with a disk that cannot
        take them they go back to the front of the queue, for the database, and are not
        tried on the disk again until they have waited as long once more."""
        waiting, self._queue = self._queue, []
        waited = asyncio.get_running_loop().time() - self._arrived[0]
        self._arrived = []
        self._flushing = waiting
        try:
            if await self._to_spool(waiting, refuse=False):
                log.error("appender.queue_overdue", events=len(waiting),
                          waited_s=round(waited, 3), queue_wait_s=self._queue_wait_s)
                return True
        except asyncio.CancelledError:
            for _, future in waiting:
                _settle(future, exc=LedgerUnavailable("append cancelled"))
            raise
        except Exception:
            log.exception("appender.spool_failed", events=len(waiting))
        # one the spool could not encode was answered refused (its caller keeps it as
        # unstorable): committed as well, it would be in the ledger twice
        waiting = [item for item in waiting if not _answered(item[1])]
        now = asyncio.get_running_loop().time()
        self._queue[:0] = waiting
        self._arrived[:0] = [now] * len(waiting)
        return False

    async def _flush(self, batch: list[tuple[NewEvent, asyncio.Future[AppendResult]]], *,
                     spool_only: bool = False) -> None:
        """Commit one batch and answer its callers, whatever goes wrong on the way: an
        exception escaping here would end the appender's task, and every delivery after it
        would wait for an answer that never comes."""
        self._flushing = batch
        try:
            if spool_only:  # a held flush's callers (only ever handed over with a spool)
                await self._to_spool(batch)
            else:
                await self._commit(batch)
        except asyncio.CancelledError:  # e.g. in the spool's write
            if asyncio.current_task() not in self._detached:  # else they are the new task's
                for _, future in batch:
                    _settle(future, exc=LedgerUnavailable("append cancelled"))
            raise
        except Exception:
            for _, future in batch:
                _settle(future, exc=LedgerUnavailable("append failed"))
            log.exception("appender.flush_failed", events=len(batch))

    async def _append_or_held(self, events: list[NewEvent]) -> list[AppendResult]:
        """``append_many``, with a timer: past ``stall_s`` the flush is handed over
        (:meth:`_held`). A timer on the database call alone, not a task around it: a task
        per flush put the statement one event-loop turn later, about 5% of ingest
        (measured), and a slow spool write is no database holding a flush."""
        if self._stall_s is None or self._spool is None:
            return await self._append_many(events)
        timer = asyncio.get_running_loop().call_later(
            self._stall_s, self._held, asyncio.current_task(), self._flushing)
        try:
            return await self._append_many(events)
        finally:
            timer.cancel()

    def _held(self, stuck: asyncio.Task[None] | None,
              batch: list[tuple[NewEvent, asyncio.Future[AppendResult]]]) -> None:
        """The database has held this flush past ``stall_s`` (a partition or a frozen server
        sends no error: the statement waited for ever, and every delivery queued behind it,
        past the sender's window). A new task answers the flush's callers from the spool,
        then goes on with the queue, which the spool's backlog then takes at once. The held
        task is cancelled, not waited for: psycopg asks the server to cancel the statement
        and closes the connection if that has not ended it within about 10 s (3.3), so the
        connection goes back to the pool. Should the statement commit all the same, the
        spooled copies drain as its duplicates."""
        if stuck is None or stuck is not self._task or stuck.done():
            return
        self._detached.add(stuck)
        stuck.add_done_callback(self._detached.discard)
        self._stalled = [item for item in batch if not _answered(item[1])]
        log.error("appender.flush_held", events=len(self._stalled), seconds=self._stall_s)
        self._task = asyncio.create_task(self._run(), name="hookledger-appender")
        self._wakeup.set()
        stuck.cancel()

    async def _commit(self, batch: list[tuple[NewEvent, asyncio.Future[AppendResult]]]
                      ) -> None:
        if asyncio.current_task() in self._detached:
            return  # held past stall_s and taken over: its callers are answered elsewhere
        if await self._behind_backlog():
            if await self._to_spool(batch, refuse=False):
                return  # spooled events not yet drained go first: keep arrival order
            # (one the spool could not encode was answered refused: not committed too)
            batch = [item for item in batch if not _answered(item[1])]
            if not batch:
                return
        events = [event for event, _ in batch]
        # (with the spool unable to take them, a full disk, the database takes them ahead
        # of the backlog: out of order, rather than answered 503 and never sent again)
        try:
            results = await self._append_or_held(events)
        except LedgerUnavailable as exc:
            if asyncio.current_task() in self._detached:
                return  # its callers are the new task's now
            if self._spool is not None:
                await self._to_spool(batch)
                return
            for _, future in batch:
                _settle(future, exc=exc)
            return
        # (a cancellation passes on: _flush and _one_by_one answer the batch's callers)
        except Exception as exc:  # LedgerError included
            # The database refused the batch, or writing it failed in this process (a value
            # the writer cannot encode: a bug, but one event's). Either way one bad event
            # must not sink the others, which the general system would never send again:
            # retry each on its own, and fail only the one that fails alone.
            if asyncio.current_task() in self._detached:
                return
            if not isinstance(exc, LedgerError):
                log.exception("appender.event_failed", events=len(batch))
            if len(batch) > 1:
                await self._one_by_one(batch)
                return
            _settle(batch[0][1], exc=LedgerError(f"the ledger refused this event: {exc}"))
            return
        self.batches += 1
        self.events += len(batch)
        for (_, future), result in zip(batch, results, strict=True):
            _settle(future, result=result)
        if self._on_batch is not None:  # after the answers: they are committed whatever it does
            try:
                self._on_batch(len(batch))
            except Exception:
                log.exception("appender.on_batch_failed")

    async def _behind_backlog(self) -> bool:
        """Whether records this process spooled are not in the ledger yet, so that a batch
        must follow them into the spool to keep the order. With a drainer to ask, a small
        backlog it is draining is waited for while the batch waits in memory
        (:meth:`ingest.spool_drain.SpoolDrainer.caught_up`), for what is left of the
        batch's ``queue_wait_s``: the wait and the flush after it stay within the bound a
        queue behind slow flushes has (four thirds of the stall time)."""
        if self._spool is None or not self._spool.backlog:
            return False
        if self._caught_up is None:
            return True
        return not await self._caught_up(max(self._queue_wait_left(self._batch_arrived), 0.0))

    async def _one_by_one(self, batch: list[tuple[NewEvent, asyncio.Future[AppendResult]]]
                          ) -> None:
        """Each event of a failed batch on its own: whatever one of them meets, the rest are
        still tried, and a cancellation answers every one not yet answered."""
        for index, item in enumerate(batch):
            self._flushing = batch[index:]  # what a hand-over (_held) takes: the rest
            try:
                await self._commit([item])
            except asyncio.CancelledError:
                if asyncio.current_task() not in self._detached:
                    for _, future in batch[index:]:
                        _settle(future, exc=LedgerUnavailable("append cancelled"))
                raise
            except Exception:
                _settle(item[1], exc=LedgerUnavailable("append failed"))
                log.exception("appender.flush_failed", events=1)

    async def _to_spool(self, batch: list[tuple[NewEvent, asyncio.Future[AppendResult]]],
                        *, refuse: bool = True) -> bool:
        """Spool the batch and answer it. When the disk cannot take it, ``refuse`` answers
        it unavailable (neither the database nor the disk: now it is 503); else it is left
        unanswered, for the caller to try the database. An event it cannot encode is
        refused alone (:func:`_spoolable`). Whether it was spooled (or answered)."""
        assert self._spool is not None
        try:
            await asyncio.to_thread(self._spool.write, [event for event, _ in batch])
        except OSError as exc:
            log.error("appender.spool_failed", events=len(batch), error=type(exc).__name__)
            if refuse:
                for _, future in batch:
                    _settle(future, exc=LedgerUnavailable(f"spool failed: {type(exc).__name__}"))
            return False
        except Exception:
            # not the disk: an event the spool cannot encode (a bug, but one event's), met
            # before a byte is written. It sank the whole batch (answered 503, lost), where
            # the database's way fails it alone (_commit): so it does here too
            rest = _spoolable(batch)
            if len(rest) == len(batch):
                raise
            log.exception("appender.event_failed", events=len(batch) - len(rest))
            return await self._to_spool(rest, refuse=refuse) if rest else True
        self.spooled += len(batch)
        for _, future in batch:
            _settle(future, result=AppendResult(0, duplicate=False, spooled=True))
        if self._on_spooled is not None:
            self._on_spooled()
        return True


def _spoolable(batch: list[tuple[NewEvent, asyncio.Future[AppendResult]]]
               ) -> list[tuple[NewEvent, asyncio.Future[AppendResult]]]:
    """The items of ``batch`` whose event the spool can encode. Each other one's caller
    hears it refused (a :class:`LedgerError`, not unavailable), as the database's way says
    it, so ingest keeps the delivery by its raw bytes rather than answer 503."""
    rest: list[tuple[NewEvent, asyncio.Future[AppendResult]]] = []
    for event, future in batch:
        try:
            encode_event(event)
        except Exception as exc:  # noqa: BLE001 - whatever the encoder meets is that event's
            _settle(future, exc=LedgerError(f"the spool cannot encode this event: {exc}"))
        else:
            rest.append((event, future))
    return rest


def _answered(future: asyncio.Future[AppendResult]) -> bool:
    """Settled with a result or an error; a caller that went away (cancelled) is not, and
    its event is still kept."""
    return future.done() and not future.cancelled()


def _settle(future: asyncio.Future[AppendResult], *, result: AppendResult | None = None,
            exc: BaseException | None = None) -> None:
    if future.done():
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        assert result is not None
        future.set_result(result)
