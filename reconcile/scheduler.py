"""The reconciliation schedule inside ``serve``: APScheduler, one pass per cluster at a time.

An ``AsyncIOScheduler`` runs a pass every ``HOOKLEDGER_RECONCILE_INTERVAL_S`` (one instance
per process, late runs coalesced) and writes a report every ``report_interval_s`` under
``HOOKLEDGER_HOME/reports/``. Across processes a pass is guarded by the reconciler's
advisory lock (:mod:`reconcile.runner`): a second ``serve`` skips while one runs, and when
one began within most of an interval (migration 0017's marker). Any error
in a pass is logged and counted; it never stops the schedule.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import structlog
from apscheduler.events import EVENT_JOB_MAX_INSTANCES, JobSubmissionEvent
from apscheduler.schedulers.asyncio import AsyncIOScheduler

from reconcile.client import ReferenceClient
from reconcile.metrics import ReconcileMetrics
from reconcile.report import Windows
from reconcile.report_files import write_scheduled_report
from reconcile.runner import PassResult, Reconciler

log = structlog.get_logger("hookledger.reconcile")

# how long shutdown waits for a cancelled pass to close its session and HTTP request: a
# moment, normally. psycopg cancelling a statement on a server that does not answer takes
# up to 10 s, which is not waited out (serve's whole stop stays inside a container's usual
# 10 s grace); the server ends such a session, and its lock, once it sees it gone
STOP_WAIT_S = 5.0
# A scheduled pass begins only when no scheduled pass, of any process, began within this
# share of the interval: one pass an interval in all, whatever the number of processes
# (each fires its own), with room for the schedulers' own drift
SCHEDULED_SHARE = 0.9


class _StillRunningSaidOurWay(logging.Filter):
    """APScheduler's own warning for a run that falls due while the last still runs
    (``Execution of job ... skipped: maximum number of running instances``) is said as
    ``reconcile.still_running`` instead: a pass outlasting its interval is no fault (late
    runs are coalesced), and a warning every interval read as one."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "maximum number of running instances" not in record.getMessage()


SCHEDULER_LOG = logging.getLogger("apscheduler.scheduler")
SCHEDULER_LOG.addFilter(_StillRunningSaidOurWay())


class ReconcileScheduler:
    """Passes and reports; without a reconciler (no API configured) only reports, so the
    discrepancies the projector finds (malformed deliveries, conflicting events, paid but
    unsettled invoices) are still written out."""

    def __init__(self, reconciler: Reconciler | None, client: ReferenceClient | None, *,
                 interval_s: float, database_url: str, reports_dir: Path | None = None,
                 report_interval_s: float = 0, metrics: ReconcileMetrics | None = None,
                 report_windows: Windows | None = None,
                 report_keep: timedelta | None = None) -> None:
        self._reconciler = reconciler
        self._report_keep = report_keep
        self._windows = report_windows
        self._client = client
        self._metrics = metrics
        self._url = database_url
        self._reports_dir = reports_dir
        self._report_interval = (timedelta(seconds=report_interval_s)
                                 if report_interval_s > 0 else None)
        self._interval = timedelta(seconds=interval_s)
        self.scheduler = AsyncIOScheduler(timezone=UTC)
        if reconciler is not None:
            first = datetime.now(UTC) + timedelta(seconds=min(interval_s, 5))
            self.scheduler.add_job(self.run_once, "interval", seconds=interval_s,
                                   id="reconcile", max_instances=1, coalesce=True,
                                   next_run_time=first, misfire_grace_time=None)
        if reports_dir is not None and report_interval_s > 0:
            self.scheduler.add_job(self.report_once, "interval", seconds=report_interval_s,
                                   id="report", max_instances=1, coalesce=True,
                                   misfire_grace_time=None)
        self.scheduler.add_listener(self._still_running, EVENT_JOB_MAX_INSTANCES)
        self.last: PassResult | None = None
        self._running: set[asyncio.Task[Any]] = set()
        self._began: dict[str, float] = {}  # job name: when its run in progress began
        self._stopping = False

    def start(self) -> None:
        self.scheduler.start()

    async def shutdown(self) -> None:
        """Stop the schedule and end a pass in progress before returning: left running, it
        was cancelled when the event loop closed, after the client it was using, and logged
        as a failed job with a ``CancelledError`` traceback. A pass ended midway loses
        nothing (what it appended is committed; the rest is asked again next time). A
        report's writing thread cannot be cancelled: it finishes, and the process waits
        for it as it ends."""
        self._stopping = True
        try:
            if self.scheduler.running:
                self.scheduler.shutdown(wait=False)  # cancels the jobs in progress
            for task in self._running:
                if not task.cancelling():
                    task.cancel()
            if self._running:
                await asyncio.wait(set(self._running), timeout=STOP_WAIT_S)
            if self._running:
                log.warning("reconcile.stop_timed_out", running=len(self._running),
                            waited_s=STOP_WAIT_S)
        finally:
            if self._client is not None:
                await self._client.aclose()

    @contextlib.contextmanager
    def _job(self, name: str) -> Iterator[None]:
        """A job's run, ended quietly when shutdown cancels it."""
        task = asyncio.current_task()
        assert task is not None
        self._running.add(task)
        self._began[name] = time.monotonic()
        try:
            yield
        except asyncio.CancelledError:
            if not self._stopping:
                raise
            while task.uncancel():  # APScheduler's shutdown and ours may both cancel it
                pass
            log.info("reconcile.stopped", job=name)
        finally:
            self._running.discard(task)
            self._began.pop(name, None)

    def _still_running(self, event: JobSubmissionEvent) -> None:
        job = "pass" if event.job_id == "reconcile" else event.job_id
        began = self._began.get(job)
        log.info("reconcile.still_running", job=job,
                 running_s=None if began is None else round(time.monotonic() - began, 1),
                 interval_s=(self._interval if job == "pass" else self._report_interval
                             or self._interval).total_seconds())

    async def run_once(self) -> PassResult | None:
        if self._reconciler is None:
            return None
        with self._job("pass"):
            return await self._run_pass(self._reconciler)
        return None  # stopped

    async def _run_pass(self, reconciler: Reconciler) -> PassResult | None:
        try:
            result = await reconciler.run_pass(at_most_every=self._interval * SCHEDULED_SHARE)
        except Exception as exc:  # noqa: BLE001 - a pass must never end the schedule
            log.error("reconcile.pass_failed", error=type(exc).__name__)
            if self._metrics:
                self._metrics.passes.labels(outcome="failed").inc()
            return None
        if self._metrics:
            # a pass that stopped at a refused API key is no pass that ran through
            outcome = "skipped" if result.skipped else (result.stopped or "ran")
            self._metrics.passes.labels(outcome=outcome).inc()
            for error, count in result.errors.items():
                self._metrics.lookup_errors.labels(error=error).inc(count)
            if not result.skipped:
                self._metrics.last_pass.set_to_current_time()
            elif result.ran_at is not None:  # the interval's pass, run by another process
                self._metrics.last_pass.set(result.ran_at.timestamp())
        self.last = result
        return result

    async def report_once(self) -> Any:
        with self._job("report"):
            return await self._write_report()
        return None  # stopped

    async def _write_report(self) -> Any:
        assert self._reports_dir is not None
        try:
            return await write_scheduled_report(self._url, self._reports_dir, self._windows,
                                                keep=self._report_keep,
                                                interval=self._report_interval)
        except Exception as exc:  # noqa: BLE001
            log.error("reconcile.report_failed", error=type(exc).__name__,
                      cause=getattr(exc, "strerror", None))  # "No space left on device"
            return None
