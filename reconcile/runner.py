"""One reconciliation pass: settle, pick what is due, ask the provider, record findings.

A pass holds a PostgreSQL advisory lock (``pg_try_advisory_lock`` on the connection it
works on) for its whole length, so that across every ``serve`` process and ``hookledger
reconcile`` at most one pass runs at a time per database: a second one returns at once,
skipped. A session the server ends takes the lock and the pass with it. Work
is taken in chunks; each chunk's results commit in one transaction together with the
``reconcile_subjects`` bookkeeping, so an interrupted pass resumes where it stopped and no
subject is asked twice in one pass unless its row changed while the pass asked about it.
``max_subjects`` and ``rate_per_s`` pace a backlog.

A pass stops asking at the first lookup whose API key the provider refuses (a 401, a 403
without the API's envelope, an authentication code: :data:`~reconcile.client.KEY_REFUSED`):
lookups already sent finish and are kept, none starts after it, and the subjects left
unanswered (the refused ones too) stay due, unmarked, for the next pass. Asked on, each was
one more refusal of the key, and each was put into backoff, so that once the key was put
right they waited it out.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol
from zoneinfo import ZoneInfo

import psycopg
import structlog

from ledger import AppendResult, NewEvent
from ledger.store import (
    append_in,
    end_if_idle,
    end_if_idle_in_transaction,
    positions_by_key,
    ready_to_append,
)
from projections.folding import Discrepancy
from projections.general_folds import cancelled_with_money
from projections.projector import catch_up, ready_for_folding
from reconcile import store
from reconcile.cancelled_invoices import judge_cancelled
from reconcile.checks import Local, Verdict, decide, same_amounts, settle
from reconcile.client import KEY_REFUSED, STOPPED, Lookup, sleep_unless
from reconcile.errors import ApiKeyRefused
from reconcile.findings import (
    checked_event,
    detected_event,
    recovered_event,
    resolved_event,
    row_finding_event,
)
from reconcile.recorded_twice import arrived_after_all, recorded_twice


@dataclass(frozen=True, slots=True)
class Resolution:
    """A finding a pass resolves from what a projection row shows."""

    id: str
    kind: str
    subject: str
    reference: str
    reason: str


RECONCILE_LOCK_KEY = 0x686F6F6B7265636F  # "hookreco"
log = structlog.get_logger("hookledger.reconcile")


class Lookups(Protocol):
    async def lookup(self, reference: str, *, stop: asyncio.Event | None = None
                     ) -> Lookup: ...


class PassObserver(Protocol):
    """What a pass reports to (metrics); every method is optional in effect."""

    def recovered(self, subject: str, count: int) -> None: ...
    def after_pass(self, open_by_kind: dict[str, int], oldest_unchecked: datetime | None,
                   lags: Sequence[float]) -> None: ...


# a subject's bookkeeping row: subject, reference, checked at, position seen, next check,
# result, pass
Mark = tuple[str, str, datetime, int, datetime | None, str, str]
# what the database refuses of an event's values, as opposed to being away
REFUSALS = (psycopg.DataError, psycopg.IntegrityError)


@dataclass(frozen=True, slots=True)
class Span:
    """Where one subject's events are in a chunk's, and its backoff should they be refused."""

    subject: str
    reference: str
    start: int
    end: int
    backoff: timedelta
    detected: tuple[int, int]  # its findings' range in the pass result's lists
    resolved: tuple[int, int]
    result: str  # its verdict, as counted in the pass result
    nth: int = 1  # which check of the subject in this pass


GIVE_UP_CHECKS = 30  # a young subject's first day of checks: 1, 2 ... 32 minutes apart, hourly


# a subject is asked up to this fraction of the retry base before its backoff ends, so that
# the pass an interval on, starting a little sooner than the last one picked, includes it
RETRY_EARLY = 0.1


@dataclass(frozen=True)
class PassConfig:
    window: timedelta = timedelta(seconds=90)
    payout_window: timedelta = timedelta(hours=24)
    recheck_age: timedelta = timedelta(hours=24)
    recheck_limit: int = 500
    # a success a check agreed with is asked again this often (0: never) while younger than
    # recheck_age, since a lost payment.refunded changes nothing local to notice
    refund_recheck: timedelta = timedelta(hours=6)
    max_subjects: int = 5000
    chunk_size: int = 500
    rate_per_s: float = 0.0  # 0: only the client's concurrency bounds the pace
    retry_base: timedelta = timedelta(seconds=60)
    retry_cap: timedelta = timedelta(hours=1)
    # A subject a check leaves unsettled (no record at the provider, still pending there) is
    # asked again after its backoff, hourly at most for its first day (by its ``since``),
    # daily after that, and once it is ``give_up_after`` old no more until its row changes
    # or a new finding names it (``None``: for ever), if it was asked
    # :data:`GIVE_UP_CHECKS` times by then (one first asked when already old, an
    # expectation registered late, is asked daily for some weeks) and its window has
    # passed (a window longer than the give-up age is waited out). Asked hourly for ever, each
    # initiation that never reached the provider cost 24 lookups and ledger events a day
    # without end, and enough of them crowded every pass.
    slow_after: timedelta = timedelta(days=1)
    slow_cap: timedelta = timedelta(days=1)
    give_up_after: timedelta | None = timedelta(days=30)
    # the server ends the pass's session once it is idle this long, so a session a network
    # blip left behind lets go of the reconciliation lock; the pass speaks every quarter of it
    idle_session_s: float = 60.0
    zone: ZoneInfo = field(default_factory=lambda: ZoneInfo("Africa/Dar_es_Salaam"))

    def window_of(self, subject: str) -> timedelta:
        """How long a subject may stay unsettled before it is flagged: the resolution window
        for a collection, the payout window for a payout."""
        return self.window if subject == "collection" else self.payout_window


@dataclass
class PassResult:
    pass_id: str
    skipped: bool = False
    checked: int = 0
    results: Counter[str] = field(default_factory=Counter)
    detected: list[dict[str, Any]] = field(default_factory=list)
    resolved: list[dict[str, Any]] = field(default_factory=list)
    recovered: list[str] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    given_up: int = 0  # unsettled subjects past ``give_up_after``, no longer asked
    seconds: float = 0.0
    # skipped because this interval's scheduled pass already began then, in any process
    ran_at: datetime | None = None
    # how often each (subject, reference) was asked in this pass: more than once when its
    # row changed during the pass's look, and each check's events are keyed apart
    asked: Counter[tuple[str, str]] = field(default_factory=Counter)
    # why the pass stopped asking before it was through ("key_refused"), and what said so
    # (the first refused lookup's status and API code; never the key)
    stopped: str | None = None
    stopped_by: str | None = None
    left_due: int = 0  # subjects it picked and left due unanswered when it stopped

    def summary(self) -> list[str]:
        if self.skipped:
            return ["another reconciliation pass is running; skipped"]
        lines = [f"checked {self.checked} subject(s) in {self.seconds:.1f} s: "
                 + (", ".join(f"{k} {n}" for k, n in sorted(self.results.items())) or "none")]
        if self.stopped == KEY_REFUSED:
            lines.append(f"  stopped: the provider refused the API key ({self.stopped_by}); "
                         f"{self.left_due} subject(s) it had picked stay due unanswered, as "
                         "does every subject it had not reached")
        for d in self.detected:
            # in digits: a provider's amount is kept as it spelled it, 1E+3 perhaps
            risk = "-" if d["amount_at_risk"] is None else format(d["amount_at_risk"], "f")
            lines.append(f"  detected {d['kind']:<20} {d['subject']:<10} {d['reference']:<24}"
                         f" at risk {risk}  {d['detail']}")
        for r in self.resolved:
            lines.append(f"  resolved {r['kind']:<20} {r['subject']:<10} {r['reference']:<24}"
                         f" {r['reason']}")
        if self.errors:
            lines.append("  API errors (asked again later): " + ", ".join(
                f"{k} {n}" for k, n in sorted(self.errors.items())))
        if self.given_up:
            lines.append(f"  {self.given_up} subject(s) unsettled past the give-up age: "
                         "not asked again until they change")
        return lines


def retry_cap(cfg: PassConfig, age: timedelta) -> timedelta:
    """The longest backoff of a subject unsettled for ``age``: see :class:`PassConfig`."""
    return cfg.retry_cap if age < cfg.slow_after else max(cfg.retry_cap, cfg.slow_cap)


class _Pacer:
    def __init__(self, rate_per_s: float) -> None:
        self._interval = 1.0 / rate_per_s if rate_per_s > 0 else 0.0
        self._next = time.monotonic()
        self._lock = asyncio.Lock()

    async def wait(self, stop: asyncio.Event) -> None:
        """One's turn of the pace, or at once when ``stop`` is set: the lookups queued
        behind a refused key each waited their turn only to ask nothing."""
        if not self._interval:
            return
        async with self._lock:
            if stop.is_set():
                return
            now = time.monotonic()
            if self._next > now:
                await sleep_unless(stop, self._next - now)
            self._next = max(self._next, now) + self._interval


async def _scheduled_pass_began(conn: store.Connection,
                                at_most_every: timedelta) -> datetime | None:
    """When a scheduled pass began within ``at_most_every`` (by the database's clock, the
    one every process shares), or None, this one's beginning then marked. Called under the
    pass lock. Every process's scheduler fires a pass each interval, and the lock alone only
    kept them from running at once: N processes ran up to N passes an interval, asking the
    provider's API up to N times as fast as one. A mark ahead of the clock (a failover to a
    server whose clock is behind, a clock stepped back) counts as no mark: it held every
    scheduled pass back until the clock caught up with it."""
    cur = await conn.execute(
        "INSERT INTO hookledger_private.reconcile_schedule AS s (job, began_at) "
        "VALUES ('pass', clock_timestamp()) ON CONFLICT (job) DO UPDATE "
        "SET began_at = EXCLUDED.began_at "
        "WHERE s.began_at <= EXCLUDED.began_at - %s OR s.began_at > EXCLUDED.began_at "
        "RETURNING 1", (at_most_every,))
    if await cur.fetchone() is not None:
        return None
    cur = await conn.execute("SELECT began_at FROM hookledger_private.reconcile_schedule "
                             "WHERE job = 'pass'")
    row = await cur.fetchone()
    return row[0] if row else None


class Reconciler:
    """Runs passes against one database with one reference-API client."""

    def __init__(self, url: str, client: Lookups, config: PassConfig | None = None,
                 observer: PassObserver | None = None) -> None:
        self._url = url
        self._client = client
        self.config = config or PassConfig()
        self._observer = observer
        self._lag_position = -1

    async def run_pass(self, *, now: datetime | None = None,
                       at_most_every: timedelta | None = None) -> PassResult:
        """One pass, unless another holds the lock (``skipped``); with ``at_most_every``
        (a scheduled pass), also skipped when a scheduled pass began within it, whichever
        process ran it (:func:`_scheduled_pass_began`; ``ran_at`` says when)."""
        result = PassResult(pass_id=uuid.uuid4().hex[:12])
        started = time.perf_counter()
        # the lock is held by the session the pass works in, and released when it closes:
        # held by a session of its own, idle all along, it went when the server ended that
        # one (idle_session_timeout, a proxy), and the pass went on beside the next
        async with await psycopg.AsyncConnection.connect(self._url, autocommit=True) as conn:
            # before the lock: a session the server never ends could hold it for hours
            await end_if_idle(conn, self.config.idle_session_s)
            await end_if_idle_in_transaction(conn)  # a pass appends: never hold that idle
            cur = await conn.execute("SELECT pg_try_advisory_lock(%s)", (RECONCILE_LOCK_KEY,))
            row = await cur.fetchone()
            if not (row and row[0]):
                result.skipped = True
                return result
            if at_most_every is not None:
                result.ran_at = await _scheduled_pass_began(conn, at_most_every)
                if result.ran_at is not None:
                    # this interval's pass ran (most likely in another process): this
                    # process's gauges still show the state now, not as of its last own
                    # pass, which a process losing every race never runs
                    result.skipped = True
                    await self._observe(conn)
                    return result
            await ready_to_append(conn)  # a pass appends
            await ready_for_folding(conn)  # and folds (catch_up), as the projector does
            await self._pass(conn, result, now)
            await self._observe(conn)
        result.seconds = time.perf_counter() - started
        if result.stopped == KEY_REFUSED:
            log.error("reconcile.key_refused", pass_id=result.pass_id,
                      detail=result.stopped_by, checked=result.checked,
                      left_due=result.left_due,
                      reason="the provider refused the API key; the pass stopped asking")
        log.info("reconcile.pass", pass_id=result.pass_id, checked=result.checked,
                 detected=len(result.detected), resolved=len(result.resolved),
                 recovered=len(result.recovered), errors=sum(result.errors.values()),
                 stopped=result.stopped, seconds=round(result.seconds, 3))
        return result

    async def _catch_up(self, conn: store.Connection) -> None:
        """Project what is in the ledger first, so decisions read current rows."""
        await catch_up(conn)

    async def _pass(self, conn: store.Connection, result: PassResult,
                    now: datetime | None) -> None:
        cfg = self.config
        await self._catch_up(conn)
        await self._settle(conn, result, now or datetime.now(UTC))
        await self._cancelled_with_money(conn, result, now or datetime.now(UTC))
        await self._recorded_twice(conn, result, now or datetime.now(UTC))
        # the resolutions just appended, folded: a check must see them closed, or it takes
        # a finding they closed for one still open and never raises it again
        await self._catch_up(conn)
        done = rechecked = 0
        # backoffs are judged by this moment: a subject this pass asked is due again in it
        # only once its row changed, never because its backoff ended meanwhile
        began = now or datetime.now(UTC)
        stop = asyncio.Event()  # set by a refused key: the pass asks nothing more
        while done < cfg.max_subjects and not stop.is_set():
            moment = now or datetime.now(UTC)
            # the re-check allowance is the pass's: each chunk gets what earlier ones left
            due = await store.due_subjects(
                conn, now=moment, window=cfg.window, recheck_age=cfg.recheck_age,
                recheck_limit=max(cfg.recheck_limit - rechecked, 0),
                later_recheck=cfg.refund_recheck, early=cfg.retry_base * RETRY_EARLY,
                pass_began=began, limit=min(cfg.chunk_size, cfg.max_subjects - done))
            if not due:
                break
            await self._chunk(conn, due, result, moment, stop)
            done += len(due)
            rechecked += sum(1 for d in due if d.recheck)
            await self._catch_up(conn)

    async def _chunk(self, conn: store.Connection, due: Sequence[store.Due],
                     result: PassResult, now: datetime, stop: asyncio.Event) -> None:
        cfg = self.config
        views, positions = await store.local_views(conn, due)
        previous = await store.previous_checks(conn, due)
        pacer = _Pacer(cfg.rate_per_s)

        async def ask(reference: str) -> Lookup:
            await pacer.wait(stop)
            if stop.is_set():
                return Lookup(reference, "error", error=STOPPED)
            try:
                lookup = await self._client.lookup(reference, stop=stop)
            except Exception as exc:  # one lookup's bug must not end the pass
                log.exception("reconcile.lookup_failed", reference=reference)
                return Lookup(reference, "error", error="internal", detail=type(exc).__name__)
            if lookup.error == KEY_REFUSED:
                stop.set()  # (the client has set it already, before any other lookup ran)
            return lookup

        lookups = await self._speaking(conn, asyncio.gather(*(ask(d.reference) for d in due)))
        await self._spelled_elsewhere(conn, due, lookups, views)
        events: list[NewEvent] = []
        marks: list[Mark] = []
        recoveries: list[tuple[int, str, str]] = []
        spans: list[Span] = []
        unanswered = 0
        for d, lookup in zip(due, lookups, strict=True):
            if lookup.error in (KEY_REFUSED, STOPPED):
                # no answer to judge: left due, unmarked, with no event, so the next pass
                # asks it at once (marked, it waited its backoff after the key was put right)
                unanswered += 1
                if lookup.error == KEY_REFUSED:
                    result.errors[KEY_REFUSED] += 1  # a request the provider refused
                    if result.stopped is None:
                        result.stopped = KEY_REFUSED
                        result.stopped_by = (lookup.detail or "").removeprefix(
                            f"{ApiKeyRefused.__name__}: ")
                continue
            key = (d.subject, d.reference)
            tries = previous.get(key, 0)
            result.asked[key] += 1
            nth = result.asked[key]
            age = now - since if (since := views[key].since) is not None else timedelta(0)
            backoff = min(retry_cap(cfg, age), cfg.retry_base * (2 ** min(tries, 16)))
            sizes = (len(events), len(recoveries), len(result.detected), len(result.resolved))
            try:
                verdict = self._judge(d, lookup, views[key], events, recoveries, result, now,
                                      nth=nth)
            except Exception:  # one subject's bug must not stop the others
                # its findings so far are dropped whole; it is asked again after a backoff
                del events[sizes[0]:], recoveries[sizes[1]:]
                del result.detected[sizes[2]:], result.resolved[sizes[3]:]
                log.exception("reconcile.subject_failed", subject=d.subject,
                              reference=d.reference)
                result.errors["internal"] += 1
                result.results["error"] += 1  # so a pass of such failures alone exits 4
                marks.append((d.subject, d.reference, now, positions[key], now + backoff,
                              "error", result.pass_id))
                continue
            next_at = None if verdict.settled else now + backoff
            window = cfg.window_of(d.subject)
            if next_at is not None and verdict.result != "error" and tries + 1 >= GIVE_UP_CHECKS \
                    and cfg.give_up_after is not None and age >= max(cfg.give_up_after, window):
                next_at = None  # its open findings stay open, for a person
                result.given_up += 1
                log.info("reconcile.given_up", subject=d.subject, reference=d.reference,
                         result=verdict.result, days=age.days)
            marks.append((d.subject, d.reference, now, positions[key], next_at,
                          verdict.result, result.pass_id))
            spans.append(Span(d.subject, d.reference, sizes[0], len(events), backoff,
                              (sizes[2], len(result.detected)),
                              (sizes[3], len(result.resolved)), verdict.result, nth))
        repaired: list[tuple[str, str]] = []
        async with conn.transaction():
            appended = await self._append(conn, events, spans, marks, result, now)
            kept = [(subject, reference, done) for index, subject, reference in recoveries
                    # None: its subject's answer could not be kept (see _append)
                    if (done := appended[index]) is not None]
            # a webhook that came during the lookup was never seen by the check: its
            # subject is due again at once, once folded (the recovery's position would
            # have covered it, and the recovery settled the subject)
            unseen = await store.arrived_meanwhile(conn, [
                (subject, reference, positions[(subject, reference)], done.position)
                for subject, reference, done in kept])
            # the recovered event changes the row: that change needs no re-check
            seen_to = {(subject, reference): done.position for subject, reference, done in kept
                       if (subject, reference) not in unseen}
            marks = [(s, r, t, max(p, seen_to.get((s, r), p)),
                      now if (s, r) in unseen else n, res, pid)
                     for s, r, t, p, n, res, pid in marks]
            repaired += [(subject, reference) for subject, reference, done in kept
                         if not done.duplicate]
            await store.mark_checked(conn, marks)
        # told once committed: told inside, a commit that failed was counted and logged,
        # and counted again when the chunk was done again
        for subject, reference in repaired:
            result.recovered.append(reference)
            log.warning("reconcile.repaired", subject=subject, reference=reference,
                        reason="a webhook was lost; state recovered through the API")
            if self._observer:
                self._observer.recovered(subject, 1)
        result.checked += len(due) - unanswered
        result.left_due += unanswered

    @staticmethod
    async def _spelled_elsewhere(conn: store.Connection, due: Sequence[store.Due],
                                 lookups: Sequence[Lookup],
                                 views: dict[tuple[str, str], Local]) -> None:
        """Tell each view whose record the provider spells otherwise (``case-1`` asked as
        ``CASE-1``) whether a row already exists under that spelling."""
        spelled = {(d.subject, d.reference): lookup.record.reference
                   for d, lookup in zip(due, lookups, strict=True)
                   if lookup.record is not None and lookup.record.reference != d.reference}
        if not spelled:
            return
        known = await store.known_references(
            conn, [(subject, theirs) for (subject, _), theirs in spelled.items()])
        for (subject, ours), theirs in spelled.items():
            if (subject, theirs) in known:
                views[(subject, ours)] = dataclasses.replace(views[(subject, ours)],
                                                             known_as=theirs)

    async def _speaking(self, conn: store.Connection,
                        work: Awaitable[list[Lookup]]) -> list[Lookup]:
        """Await ``work`` (the provider's answers, minutes for a large chunk at a set pace)
        while the pass's session speaks every quarter of its idle limit, so the server,
        which ends a session idle that long, never ends a working pass's."""
        done = asyncio.Event()
        interval = max(0.05, self.config.idle_session_s / 4)

        async def beat() -> None:
            while not done.is_set():
                try:
                    await asyncio.wait_for(done.wait(), interval)
                except TimeoutError:
                    try:
                        await conn.execute("SELECT 1")
                    except psycopg.Error:
                        return  # the connection is gone: the pass's next statement says so

        beater = asyncio.create_task(beat())
        try:
            return await work
        finally:
            done.set()
            await beater  # never cancelled mid-statement: that could break the connection

    async def _append(self, conn: store.Connection, events: list[NewEvent],
                      spans: Sequence[Span], marks: list[Mark], result: PassResult,
                      now: datetime) -> list[AppendResult | None]:
        """The chunk's events in one statement; should the database refuse it, subject by
        subject, each in a savepoint.

        An answer holding what no rule here foresaw (the records are checked for what
        ``jsonb`` and ``numeric`` refuse) would otherwise fail the whole chunk, and since
        a subject that failed is asked first the next time, every pass after it: no other
        lost webhook would be recovered again. A refused subject's events are replaced by
        one ``reconcile.checked`` saying so, and it is asked again after its backoff.
        """
        try:
            async with conn.transaction():
                return list(await append_in(conn, events))
        except REFUSALS as exc:
            log.error("reconcile.chunk_refused", events=len(events), error=type(exc).__name__)
        appended: list[AppendResult | None] = [None] * len(events)
        dropped_detected: set[int] = set()
        dropped_resolved: set[int] = set()
        for span in spans:
            try:
                async with conn.transaction():
                    appended[span.start:span.end] = await append_in(
                        conn, events[span.start:span.end])
                continue
            except REFUSALS as exc:
                error = type(exc).__name__
            log.error("reconcile.answer_not_kept", subject=span.subject,
                      reference=span.reference, error=error)
            result.errors["unstorable_answer"] += 1
            refused = Lookup(span.reference, "error", error="unstorable_answer",
                             detail=f"the database refused what this answer gave ({error})")
            # outside a savepoint: should even this be refused, the refusal is not this
            # answer's, and the pass fails as any pass the database fails
            await append_in(conn, [checked_event(span.subject, refused, "error",
                                                 result.pass_id, now, nth=span.nth)])
            result.results[span.result] -= 1  # recorded as an error, not as judged
            result.results += Counter({"error": 1})  # (and a count of 0 leaves the summary)
            key = (span.subject, span.reference)
            dropped_detected.update(range(*span.detected))  # none of it was recorded
            dropped_resolved.update(range(*span.resolved))
            marks[:] = [(s, r, t, p, now + span.backoff, "error", pid) if (s, r) == key
                        else (s, r, t, p, n, res, pid) for s, r, t, p, n, res, pid in marks]
        result.detected[:] = [f for i, f in enumerate(result.detected) if i not in dropped_detected]
        result.resolved[:] = [f for i, f in enumerate(result.resolved) if i not in dropped_resolved]
        return appended

    def _judge(self, d: store.Due, lookup: Lookup, local: Local, events: list[NewEvent],
               recoveries: list[tuple[int, str, str]], result: PassResult,
               now: datetime, *, nth: int = 1) -> Verdict:
        """One subject's verdict, its events appended to ``events`` (and a recovery's index
        to ``recoveries``), its findings to ``result``."""
        cfg = self.config
        window = cfg.window_of(d.subject)
        verdict = decide(local, lookup, now=now, window=window)
        checked = checked_event(d.subject, lookup, verdict.result, result.pass_id, now,
                                nth=nth)
        events.append(checked)
        if verdict.recover is not None:
            recoveries.append((len(events), d.subject, d.reference))
            events.append(recovered_event(d.subject, verdict.recover, result.pass_id, now,
                                          cfg.zone, reference=d.reference))
        for found in verdict.detect:
            events.append(detected_event(d.subject, d.reference, found, result.pass_id,
                                         checked.dedupe_key, now, nth=nth))
            result.detected.append({"kind": found.kind, "subject": d.subject,
                                    "reference": d.reference, "detail": found.detail,
                                    "amount_at_risk": found.amount_at_risk})
        open_kinds = {o.id: o.kind for o in local.open}
        for discrepancy_id, reason in verdict.resolve:
            events.append(resolved_event(discrepancy_id, d.subject, d.reference, reason,
                                         result.pass_id, now))
            result.resolved.append({"kind": open_kinds.get(discrepancy_id, "?"),
                                    "subject": d.subject, "reference": d.reference,
                                    "reason": reason})
        result.results[verdict.result] += 1
        if lookup.error:
            result.errors[lookup.error] += 1
        return verdict

    async def _settle(self, conn: store.Connection, result: PassResult,
                      now: datetime) -> None:
        """Resolve open discrepancies that the projection now contradicts (late webhooks)."""
        events: list[NewEvent] = []
        for row in await store.open_for_settling(conn):
            view = None if not row["known"] else {
                "subject": row["subject"], "outcome": row["outcome"], "amount": row["amount"],
                "recovered": row["recovered"], "settled": row["settled"],
                "amount_paid": row["amount_paid"]}
            reason = settle(row["kind"], row["facts"] or {}, view)
            if reason is None:
                continue
            events.append(resolved_event(row["id"], row["subject"], row["reference"], reason,
                                         result.pass_id, now))
            result.resolved.append({"kind": row["kind"], "subject": row["subject"],
                                    "reference": row["reference"], "reason": reason})
        if events:
            async with conn.transaction():
                await append_in(conn, events)

    async def _cancelled_with_money(self, conn: store.Connection, result: PassResult,
                                    now: datetime) -> None:
        """Invoices cancelled with money received that no cancellation's block showed
        (:mod:`reconcile.cancelled_invoices`): found from the row, one open finding per
        invoice at the amount it shows now."""
        invoices = await store.cancelled_with_money(conn)
        recorded = await positions_by_key(conn, [
            cancelled_with_money(i.number, i.received).dedupe_key for i in invoices])
        found: list[tuple[Discrepancy, int]] = []
        superseded: list[tuple[str, str, str]] = []
        for invoice in invoices:
            verdict = judge_cancelled(invoice.number, invoice.received, invoice.earlier,
                                      recorded, invoice.paid_in_at)
            if verdict.found is not None:
                found.append((verdict.found, invoice.cause_position))
            reason = (f"the invoice now shows {same_amounts(str(invoice.received))} "
                      f"received")
            superseded.extend((i, invoice.number, reason) for i in verdict.superseded)
        await self._record_row_findings(conn, result, now, found, [
            Resolution(i, "cancelled_invoice_paid", "invoice", number, reason)
            for i, number, reason in superseded])

    async def _recorded_twice(self, conn: store.Connection, result: PassResult,
                              now: datetime) -> None:
        """Payments recovered under one spelling that webhooks then brought under the
        provider's (:mod:`reconcile.recorded_twice`): each pair told once."""
        pairs = await store.recorded_twice(conn)
        findings = [(recorded_twice(pair), pair.cause_position) for pair in pairs]
        recorded = await positions_by_key(conn, [d.dedupe_key for d, _ in findings])
        new = [(d, cause) for d, cause in findings if d.dedupe_key not in recorded]
        settled = [(pair, i, reason) for pair in pairs
                   for i, reason in arrived_after_all(pair)]
        told = await self._record_row_findings(conn, result, now, new, [
            Resolution(i, "missing_webhook", pair.subject, pair.reference, reason)
            for pair, i, reason in settled])
        for d in told:
            log.warning("reconcile.recorded_twice", subject=d.subject, reference=d.reference,
                        detail=d.detail)

    @staticmethod
    async def _record_row_findings(conn: store.Connection, result: PassResult, now: datetime,
                                   found: Sequence[tuple[Discrepancy, int]],
                                   resolutions: Sequence[Resolution]) -> list[Discrepancy]:
        """Append what a pass found from projection rows (each with the position of its
        cause) and the findings it resolves, in one transaction; count in ``result`` what
        was new (the projector may have recorded a finding meanwhile). The findings
        recorded now are returned."""
        if not found and not resolutions:
            return []
        async with conn.transaction():
            appended = await append_in(conn, [
                *(row_finding_event(d, result.pass_id, now, cause) for d, cause in found),
                *(resolved_event(r.id, r.subject, r.reference, r.reason, result.pass_id, now)
                  for r in resolutions)])
        told = [d for (d, _), outcome in zip(found, appended[:len(found)], strict=True)
                if not outcome.duplicate]
        result.detected.extend({"kind": d.kind, "subject": d.subject, "reference": d.reference,
                                "detail": d.detail, "amount_at_risk": d.amount_at_risk}
                               for d in told)
        result.resolved.extend({"kind": r.kind, "subject": r.subject, "reference": r.reference,
                                "reason": r.reason}
                               for r, outcome in zip(resolutions, appended[len(found):],
                                                     strict=True)
                               if not outcome.duplicate)
        return told

    async def _observe(self, conn: store.Connection) -> None:
        await self._catch_up(conn)
        if self._observer is None:
            return
        if self._lag_position < 0:  # start from the head: lags of new arrivals only
            cur = await conn.execute("SELECT coalesce(max(position), 0) FROM "
                                     "hookledger_private.ledger_events")
            row = await cur.fetchone()
            self._lag_position = int(row[0]) if row else 0
            lags: list[float] = []
        else:
            self._lag_position, lags = await store.arrival_lags(conn, self._lag_position)
        self._observer.after_pass(await store.open_by_kind(conn),
                                  await store.oldest_unchecked_expectation(conn), lags)
