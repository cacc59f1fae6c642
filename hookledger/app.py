"""The HTTP service: ingest routes, health, readiness and metrics, with their lifecycle.

This is part of the composition root: it wires ledger, ingest (and later projections and
reconciliation) together; nothing imports it but the command line and tests.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import structlog
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from psycopg_pool import AsyncConnectionPool
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from hookledger.settings import Settings
from ingest.appender import BatchingAppender
from ingest.general_endpoint import GeneralEndpoint
from ingest.metrics import IngestMetrics
from ledger import LedgerStore

log = structlog.get_logger("hookledger.service")


@dataclass
class Runtime:
    """What lives as long as the service: connections, the appender, metrics."""

    pool: AsyncConnectionPool
    store: LedgerStore
    appender: BatchingAppender
    metrics: IngestMetrics = field(default_factory=IngestMetrics.create)


def create_app(settings: Settings, database_url: str) -> Starlette:
    metrics = IngestMetrics.create()
    holder: dict[str, Runtime] = {}

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        pool = AsyncConnectionPool(
            database_url, min_size=2, max_size=settings.db_pool_size, open=False,
            kwargs={"autocommit": True}, name="hookledger",
        )
        await pool.open(wait=True, timeout=30)
        store = LedgerStore(pool)
        appender = BatchingAppender(store.append, max_batch=settings.append_max_batch,
                                    max_wait_s=settings.append_max_wait_ms / 1000)
        appender.start()
        runtime = Runtime(pool, store, appender, metrics)
        holder["runtime"] = runtime
        general = GeneralEndpoint(
            secrets={k: v.get_secret_value().encode() for k, v in
                     settings.general_secrets.items()},
            zone=settings.zone, max_body_bytes=settings.max_body_bytes, appender=appender,
            pool=pool, metrics=metrics)
        app.state.general = general
        log.info("service.started", general_webhooks=sorted(settings.general_secrets))
        try:
            yield
        finally:
            await appender.close()
            await pool.close()
            log.info("service.stopped", batches=appender.batches, events=appender.events)

    async def general_webhook(request: Request) -> Response:
        return await request.app.state.general(request)

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "alive"})

    async def readyz(request: Request) -> Response:
        runtime = holder.get("runtime")
        if runtime is None:
            return JSONResponse({"status": "starting"}, status_code=503)
        try:
            async with runtime.pool.connection(timeout=2) as conn:
                await conn.execute("SELECT 1")
        except Exception as exc:  # noqa: BLE001 - any failure means "not ready"
            return JSONResponse({"status": "unready", "database": type(exc).__name__},
                                status_code=503)
        return JSONResponse({"status": "ready", "database": "ok"})

    async def metrics_endpoint(request: Request) -> Response:
        return PlainTextResponse(generate_latest(metrics.registry),
                                 media_type=CONTENT_TYPE_LATEST)

    return Starlette(
        routes=[
            Route("/webhooks/general/{name}", general_webhook, methods=["POST"]),
            Route("/healthz", healthz, methods=["GET"]),
            Route("/readyz", readyz, methods=["GET"]),
            Route("/metrics", metrics_endpoint, methods=["GET"]),
        ],
        lifespan=lifespan,
    )
