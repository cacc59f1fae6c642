"""The schedule inside serve: started with the API configured, visible in /metrics, and a
failing API or database never ends it."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx

from reconcile.client import ReferenceClient
from reconcile.runner import PassResult, Reconciler
from reconcile.scheduler import ReconcileScheduler
from sandbox.faults import FaultSettings
from sandbox.runner import running_sandbox
from tests.live import running_service
from tests.reconcile_helpers import API_KEY, CountingState, body, expect, rows

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
