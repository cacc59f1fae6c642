"""The schedule inside serve: started with the API configured, visible in /metrics, and a
failing API or database never ends it."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psycopg
from prometheus_client import CollectorRegistry

from reconcile.client import ReferenceClient
from reconcile.metrics import ReconcileMetrics
from reconcile.report_files import replace_atomically
from reconcile.runner import RECONCILE_LOCK_KEY, PassResult, Reconciler
from reconcile.scheduler import ReconcileScheduler
from sandbox.faults import FaultSettings
from sandbox.runner import running_sandbox
from tests.live import running_service
from tests.reconcile_helpers import (
    API_KEY,
    CountingState,
    body,
    deliver,
    expect,
    rows,
    scheduled_pass_counted,
    scheduler_firing_now,
)

TOKEN = "admin-token-for-scheduler-tests"


def test_serve_reconciles_on_its_schedule_and_shows_it_in_metrics(db_url: str,
                                                                 tmp_path: Path) -> None:
    state = CountingState()
    state.record_general(body("payment.confirmed", 91000, reference="SCH-1", amount=800))
    expect(db_url, "SCH-1", "collection", 800)
    with running_sandbox(state=state) as api, running_service(
            db_url, api_base_url=api.url, api_key=API_KEY, admin_token=TOKEN,
            reconcile_interval_s=1, home=tmp_path, report_interval_s=1) as base:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not rows(
                db_url, "SELECT 1 FROM hookledger.discrepancies"):
            time.sleep(0.2)
        time.sleep(1.5)  # one more pass updates the gauges; a report is written
        text = httpx.get(f"{base}/metrics").text
    assert 'hookledger_discrepancies_open{kind="missing_webhook"} 1.0' in text
    assert 'hookledger_reconcile_repaired_total{subject="collection"} 1.0' in text
    assert "hookledger_oldest_unchecked_expectation_seconds" in text
    assert API_KEY not in text and TOKEN not in text
    assert state.asked["SCH-1"] == 1
    assert (tmp_path / "reports" / "latest.html").exists()


def test_a_failing_api_or_database_never_ends_the_schedule(db_url: str) -> None:
    async def go(api_url: str) -> tuple[PassResult | None, PassResult | None]:
        client = ReferenceClient(api_url, API_KEY, timeout_s=0.2, max_attempts=2,
                                 backoff_base_s=0.01)
        broken_db = Reconciler("postgresql://nobody@127.0.0.1:1/none", client)
        scheduler = ReconcileScheduler(Reconciler(db_url, client), client, interval_s=60,
                                       database_url=db_url)
        failing = await scheduler.run_once()
        scheduler._reconciler = broken_db
        crashed = await scheduler.run_once()
        await scheduler.shutdown()
        return failing, crashed

    expect(db_url, "F-1", "collection", 5)
    with running_sandbox(faults=FaultSettings(error_rate=1.0, timeout_rate=0.5,
                                              hang_s=1.0)) as api:
        failing, crashed = asyncio.run(go(api.url))
    assert failing is not None and failing.errors  # recorded, not raised
    assert crashed is None


def test_without_the_api_serve_still_writes_reports_of_what_the_projector_finds(
        db_url: str, tmp_path: Path) -> None:
    deliver(db_url, "payment.confirmed", 91000, reference="NOAPI-1", amount=300)
    deliver(db_url, "payment.failed", 91050, reference="NOAPI-1", amount=300)
    latest = tmp_path / "reports" / "latest.json"

    def written() -> dict[str, Any]:
        return json.loads(latest.read_text()) if latest.exists() else {"open": []}

    with running_service(db_url, home=tmp_path, report_interval_s=1):
        deadline = time.monotonic() + 20  # until a report after the projector's finding
        while time.monotonic() < deadline and not written()["open"]:
            time.sleep(0.2)
    report = written()
    assert [(d["kind"], d["reference"]) for d in report["open"]] == [
        ("conflicting_events", "NOAPI-1")]


def test_workers_writing_one_report_at_once_never_leave_a_partial_file(
        tmp_path: Path) -> None:
    target = tmp_path / "latest.json"
    contents = [bytes([ord("a") + n]) * 200_000 for n in range(2)]
    failures: list[BaseException] = []

    def writer(data: bytes) -> None:
        try:
            for _ in range(100):
                replace_atomically(target, data)
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion
            failures.append(exc)

    threads = [threading.Thread(target=writer, args=(data,)) for data in contents]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    assert target.read_bytes() in contents
    assert [p.name for p in tmp_path.iterdir()] == ["latest.json"]  # no temporary left


def test_a_provider_that_answers_nothing_shows_in_the_metrics(db_url: str) -> None:
    """A wrong API key or a provider outage: every lookup failed, yet the metrics said
    passes ran and nothing was wrong. The failed lookups are counted by error now, and
    the time of the last pass that ran shows a process whose passes stopped."""
    from prometheus_client import CollectorRegistry


    registry = CollectorRegistry()

    async def go(api_url: str) -> None:
        client = ReferenceClient(api_url, API_KEY, timeout_s=0.5, max_attempts=1,
                                 backoff_base_s=0.01)
        await scheduled_pass_counted(db_url, client, registry)

    for n in range(3):
        expect(db_url, f"DOWN-{n}", "collection", 5)
    started = time.time()
    with running_sandbox(faults=FaultSettings(error_rate=1.0)) as api:
        asyncio.run(go(api.url))
    errors = [s for m in registry.collect() for s in m.samples
              if s.name == "hookledger_reconcile_lookup_errors_total"]
    assert sum(s.value for s in errors) == 3 and all(s.labels["error"] for s in errors)
    last = registry.get_sample_value("hookledger_reconcile_last_pass_timestamp_seconds")
    assert last is not None and last >= started


def test_stopping_mid_pass_ends_the_pass_quietly_and_lets_go_of_its_session(
        db_url: str, caplog: Any) -> None:
    """``serve`` stopped while a pass waits on the provider: the pass was left running
    into the event loop's end, cancelled there, and logged as a failed job with a
    ``CancelledError`` traceback. Shutdown now ends the pass itself, before it returns."""
    state = CountingState()
    expect(db_url, "SLOW-1", "collection", 5)

    def held() -> int:  # the reconciliation lock in this database: held by a pass's session
        high, low = divmod(RECONCILE_LOCK_KEY, 1 << 32)
        return int(rows(
            db_url, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted "
                    "AND database = (SELECT oid FROM pg_database "
                    "WHERE datname = current_database()) "
                    "AND classid = %s AND objid = %s AND objsubid = 1", high, low)[0][0])

    async def go(api_url: str) -> tuple[list[asyncio.Task[Any]], int]:
        client = ReferenceClient(api_url, API_KEY, timeout_s=30, max_attempts=1)
        scheduler = scheduler_firing_now(db_url, client, interval_s=3600)
        deadline = time.monotonic() + 20
        while not held() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert held() == 1
        await asyncio.sleep(0.5)  # the pass is waiting on the provider now
        await scheduler.shutdown()
        left = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        return left, held()

    caplog.set_level(logging.DEBUG)
    with running_sandbox(state=state, faults=FaultSettings(latency_ms=10_000)) as api:
        started = time.monotonic()
        left, holding = asyncio.run(go(api.url))
        took = time.monotonic() - started
    assert left == [] and holding == 0
    assert took < 8  # not the provider's 10 s
    assert state.asked["SLOW-1"] == 0  # never answered: the pass ended first
    assert not [r for r in caplog.records if r.name.startswith(("apscheduler", "hookledger"))
                and (r.levelno >= logging.ERROR or r.exc_info)]


def test_a_scheduled_pass_begins_once_an_interval_whichever_process_fires(db_url: str) -> None:
    """Each process's schedule fires its own pass; the lock only kept them apart in time,
    so N processes ran N passes an interval and asked the provider N times as fast. A
    manual pass (``hookledger reconcile``) is never held back."""
    state = CountingState()
    expect(db_url, "ONCE-1", "collection", 500)  # due at once, unknown to the provider

    async def go(api_url: str) -> list[bool | None]:
        client = ReferenceClient(api_url, API_KEY, timeout_s=2)
        first = ReconcileScheduler(Reconciler(db_url, client), client, interval_s=60,
                                   database_url=db_url)
        second = ReconcileScheduler(Reconciler(db_url, client, observer=losing), client,
                                    interval_s=60, database_url=db_url, metrics=losing)
        quick = ReconcileScheduler(Reconciler(db_url, client), client, interval_s=0.2,
                                   database_url=db_url)
        try:
            passes = [await first.run_once(), await second.run_once()]
            manual = await Reconciler(db_url, client).run_pass()
            await asyncio.sleep(0.3)  # more than 0.9 of the quick schedule's interval
            passes.append(await quick.run_once())
            return [None if p is None else p.skipped for p in passes] + [manual.skipped]
        finally:
            await client.aclose()

    registry = CollectorRegistry()
    losing = ReconcileMetrics.create(registry)
    with running_sandbox(state=state) as api:
        assert asyncio.run(go(api.url)) == [False, True, False, False]
    [(count, began)] = rows(db_url, "SELECT count(*), max(began_at) "
                                    "FROM hookledger_private.reconcile_schedule")
    assert count == 1
    # the process that lost the race still shows the state, and when the pass ran: its
    # gauges were never set, and an alert on the last pass's age fired on a healthy one
    open_now = dict(rows(db_url, "SELECT kind, count(*) FROM hookledger.discrepancies "
                                 "WHERE status = 'open' GROUP BY kind"))
    assert open_now and all(registry.get_sample_value(
        "hookledger_discrepancies_open", {"kind": kind}) == n for kind, n in open_now.items())
    last = registry.get_sample_value("hookledger_reconcile_last_pass_timestamp_seconds")
    assert last is not None and began.timestamp() - 60 < last <= began.timestamp()


def test_a_pass_outlasting_its_interval_is_said_once_an_interval_not_warned(
        db_url: str, caplog: Any) -> None:
    """A pass still running when the next fell due made APScheduler warn (``skipped:
    maximum number of running instances reached``) every interval: no fault, since late
    runs are coalesced, yet a warning an operator reads as one. It is an info line of
    ours now, saying how long the pass has run."""
    import structlog

    expect(db_url, "LONG-1", "collection", 5)

    async def go(api_url: str) -> None:
        client = ReferenceClient(api_url, API_KEY, timeout_s=30, max_attempts=1)
        scheduler = scheduler_firing_now(db_url, client, interval_s=1)
        await asyncio.sleep(3.5)  # the pass waits on the provider; two more fall due
        await scheduler.shutdown()

    caplog.set_level(logging.DEBUG)
    with running_sandbox(faults=FaultSettings(latency_ms=10_000)) as api, \
            structlog.testing.capture_logs() as logs:
        asyncio.run(go(api.url))
    still = [entry for entry in logs if entry["event"] == "reconcile.still_running"]
    assert len(still) >= 2 and all(entry["log_level"] == "info" for entry in still)
    assert still[0]["job"] == "pass" and still[0]["interval_s"] == 1.0
    assert 0 < still[-1]["running_s"] < 10
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING
                and "running instances" in r.getMessage()]


def test_a_mark_ahead_of_the_databases_clock_holds_no_scheduled_pass_back(
        db_url: str) -> None:
    """The last scheduled pass's beginning, as the database's clock had it: after a
    failover to a server whose clock is an hour behind, every scheduled pass was skipped
    for that hour, as if another process had just run it."""
    expect(db_url, "AHEAD-1", "collection", 500)
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("INSERT INTO hookledger_private.reconcile_schedule (job, began_at) "
                     "VALUES ('pass', clock_timestamp() + interval '1 hour')")

    async def go(api_url: str) -> PassResult | None:
        client = ReferenceClient(api_url, API_KEY, timeout_s=2)
        try:
            return await ReconcileScheduler(Reconciler(db_url, client), client,
                                            interval_s=60, database_url=db_url).run_once()
        finally:
            await client.aclose()

    with running_sandbox(state=CountingState()) as api:
        result = asyncio.run(go(api.url))
    assert result is not None and not result.skipped and result.checked == 1
    [(began,)] = rows(db_url, "SELECT began_at - clock_timestamp() "
                              "FROM hookledger_private.reconcile_schedule")
    assert began.total_seconds() <= 0  # the mark is this pass's now
