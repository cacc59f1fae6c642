"""Helpers for reconciliation tests: ledger appends, expectations, a reconciler on a sandbox."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from ledger import LedgerStore, NewEvent
from projections.projector import project_batch
from reconcile.client import ReferenceClient
from reconcile.runner import PassConfig, PassResult, Reconciler
from reconcile.scheduler import ReconcileScheduler
from sandbox.state import SandboxState
from tests.general_events import general_body
from tests.projection_events import kept_event

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

API_KEY = "sandbox-api-key"


class CountingState(SandboxState):
    """A sandbox state that counts how often each reference is asked about (server side)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.asked: Counter[str] = Counter()
        self._count_lock = threading.Lock()

    def record(self, reference: str) -> dict[str, Any] | None:
        with self._count_lock:
            self.asked[reference] += 1
        return super().record(reference)


def body(event: str, code: int, **kwargs: Any) -> dict[str, Any]:
    return {k: v for k, v in general_body(event, code, **kwargs).items()
            if k != "payloadSignature"}


async def append(url: str, events: list[NewEvent]) -> None:
    async with AsyncConnectionPool(url, kwargs={"autocommit": True}, open=False) as pool:
        await LedgerStore(pool).append(events)


async def project(url: str) -> None:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        while await project_batch(conn):
            pass


def deliver(url: str, event: str, code: int, **kwargs: Any) -> None:
    """A webhook as ingest would append it, then projected."""
    asyncio.run(_deliver(url, kept_event(event, code, **kwargs)))


async def _deliver(url: str, new: NewEvent) -> None:
    await append(url, [new])
    await project(url)


def expect(url: str, reference: str, kind: str, amount: int | str, *,
           minutes_ago: int = 10) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT hookledger.expect(%s, %s, %s::numeric, now() - %s::interval)",
                     (reference, kind, str(amount), f"{minutes_ago} minutes"))


def reconcile(url: str, api: str, *, timeout_s: float = 2.0, max_attempts: int = 3,
              concurrency: int = 8, now: datetime | None = None, **config: Any
              ) -> PassResult:
    """One pass on the sandbox at ``api``; ``now`` pretends the clock reads that."""
    async def go() -> PassResult:
        async with ReferenceClient(api, API_KEY, timeout_s=timeout_s, connect_timeout_s=1,
                                   max_attempts=max_attempts, backoff_base_s=0.01,
                                   backoff_cap_s=0.05, concurrency=concurrency,
                                   seed=1) as client:
            cfg = PassConfig(**{"recheck_age": timedelta(days=3650), **config})
            return await Reconciler(url, client, cfg).run_pass(now=now)
    return asyncio.run(go())


def rows(url: str, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(sql, params).fetchall()


async def scheduled_pass_counted(url: str, client: ReferenceClient,
                                 registry: CollectorRegistry) -> None:
    """One scheduled pass with ``client``, its metrics in ``registry``; the scheduler shut
    down after it."""
    from reconcile.metrics import ReconcileMetrics

    scheduler = ReconcileScheduler(Reconciler(url, client), client, interval_s=60,
                                   database_url=url, metrics=ReconcileMetrics.create(registry))
    await scheduler.run_once()
    await scheduler.shutdown()


def scheduler_firing_now(url: str, client: ReferenceClient, interval_s: float
                         ) -> ReconcileScheduler:
    """A started schedule whose first pass falls due at once (a running event loop)."""
    scheduler = ReconcileScheduler(Reconciler(url, client), client, interval_s=interval_s,
                                   database_url=url)
    scheduler.start()
    job = scheduler.scheduler.get_job("reconcile")
    assert job is not None
    job.modify(next_run_time=datetime.now(UTC))
    return scheduler
