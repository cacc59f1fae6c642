"""The HTTP service: ingest routes, health, readiness and metrics, with their lifecycle.

This is part of the composition root: it wires ledger, ingest (and later projections and
reconciliation) together; nothing imports it but the command line and tests.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime

import structlog
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from psycopg_pool import AsyncConnectionPool
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from hookledger.admin_api import admin_routes
from hookledger.admin_endpoints import ADMIN_ROUTES
from hookledger.chat_commands import chat_api_factory
from hookledger.database import libpq_url
from hookledger.gc_tuning import tuned_for_serving
from hookledger.http_protocol import complete_body
from hookledger.settings import Settings
from ingest.appender import BatchingAppender, answered_within
from ingest.chat_api import CHAT_WEBHOOK_PATH
from ingest.chat_body import PLATFORM_ERROR_CAUSES
from ingest.chat_endpoint import ChatEndpoint
from ingest.chat_media import MediaFetcher, MediaStore
from ingest.chat_rotation import ChatOps
from ingest.chat_secrets import ChatSecretStore
from ingest.general_endpoint import GeneralEndpoint
from ingest.incoming import Incoming
from ingest.metrics import IngestMetrics
from ingest.responses import Accepted
from ingest.spool import Spool, database_folder
from ingest.spool_drain import SpoolDrainer
from ledger import LedgerStore
from ledger.store import database_identity, ready_to_append
from projections.live import LiveProjector, application_name

log = structlog.get_logger("hookledger.service")


@dataclass
class Runtime:
    """What lives as long as the service: connections, the appender, metrics."""

    pool: AsyncConnectionPool
    store: LedgerStore
    appender: BatchingAppender
    metrics: IngestMetrics
    spool: Spool


def app_from_environment() -> WebhookFastPath:
    """The app of one HTTP worker process of ``serve``."""
    import os

    from hookledger.cli import configure_logging, load_settings
    from hookledger.orphans import SUPERVISOR_PID_VARIABLE, end_with_supervisor

    supervisor = os.environ.get(SUPERVISOR_PID_VARIABLE)
    end_with_supervisor(int(supervisor) if supervisor else None)
    settings = load_settings()
    configure_logging(settings, warn=False)
    if settings.database_url is None:
        raise RuntimeError("a worker needs HOOKLEDGER_DATABASE_URL from its supervisor")
    # the supervisor runs the projector, under the name it handed down
    return create_app(settings, libpq_url(settings.database_url),
                      projector_name=os.environ.get(PROJECTOR_NAME_VARIABLE))


PROJECTOR_NAME_VARIABLE = "HOOKLEDGER_INTERNAL_PROJECTOR_NAME"


def live_projector(settings: Settings, database_url: str,
                   name: str | None = None) -> LiveProjector:
    return LiveProjector(database_url, batch_size=settings.projector_batch_size,
                         coalesce_s=settings.projector_coalesce_ms / 1000, name=name)


READY_CHECK_S = 3.0  # /readyz waits this long for the database's answer


async def _read_only(pool: AsyncConnectionPool) -> bool:
    async with pool.connection(timeout=2) as conn:
        cur = await conn.execute("SHOW transaction_read_only")
        return bool((await cur.fetchone() or ("off",))[0] == "on")


_abandoned: set[asyncio.Future[bool]] = set()  # held until they end


def _retrieved(task: asyncio.Future[bool]) -> None:
    """Read an abandoned check's end, so that asyncio logs no unretrieved exception."""
    _abandoned.discard(task)
    if not task.cancelled():
        task.exception()


def ingest_pool(database_url: str, max_size: int) -> AsyncConnectionPool:
    """The connections a worker appends, looks chat secrets up and records refusals with
    (not yet open).

    No statement is prepared on the server (``prepare_threshold=None``): psycopg prepares
    one after its fifth run on a connection, under a name kept by that server session.
    Behind a pooler in transaction mode (PgBouncer, which the README allows for appends),
    the next run may go to another session, where the name is missing or already taken:
    the append failed there as the event's fault, and deliveries were answered 503 or kept
    as ``general.malformed``. Planning the append each time costs the server about 65 us
    a statement (not under the append lock), against a commit's flush."""
    return AsyncConnectionPool(
        # two kept open, unless HOOKLEDGER_DB_POOL_SIZE allows only one: the pool refused
        # a largest size below its smallest, and no worker started
        database_url, min_size=min(2, max_size), max_size=max_size, open=False,
        kwargs={"autocommit": True, "application_name": "hookledger-ingest",
                "prepare_threshold": None},
        name="hookledger", configure=ready_to_append,
    )


def create_app(settings: Settings, database_url: str, *,
               projector_name: str | None = None) -> WebhookFastPath:
    """The service. Without ``projector_name`` it runs its own live projector; with one,
    another process of the same ``serve`` does, under that name."""
    metrics = IngestMetrics.create()
    holder: dict[str, Runtime] = {}
    admin_token = settings.admin_token.get_secret_value() if settings.admin_token else None

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # everything started is released in reverse order, whatever fails on the way
        async with contextlib.AsyncExitStack() as stack:
            pool = ingest_pool(database_url, settings.db_pool_size)
            await pool.open(wait=True, timeout=30)
            stack.push_async_callback(pool.close)
            store = LedgerStore(pool, acquire_timeout_s=settings.append_timeout_s)
            async with pool.connection() as conn:
                identity = await database_identity(conn)
            spool_home = settings.home / "spool"
            spool = Spool(database_folder(spool_home, identity), legacy=spool_home)
            for folder, count in spool.elsewhere().items():
                log.warning("spool.other_database_files", folder=str(folder), files=count,
                            this_database=str(spool.folder),
                            hint="deliveries another database's processes will drain; if "
                                 "this is the same ledger restored elsewhere, move them here")
            stack.callback(spool.close)
            drainer = SpoolDrainer(spool, answered_within(store.append, settings.append_stall_s))
            drainer.start()
            stack.push_async_callback(drainer.stop)
            appender = BatchingAppender(store.append, max_batch=settings.append_max_batch,
                                        max_wait_s=settings.append_max_wait_ms / 1000,
                                        spool=spool, on_spooled=drainer.nudge,
                                        on_batch=metrics.batch_size.observe,
                                        stall_s=settings.append_stall_s,
                                        queue_wait_s=settings.append_stall_s / 3,
                                        caught_up=drainer.caught_up)
            appender.start()
            stack.push_async_callback(appender.close)
            holder["runtime"] = Runtime(pool, store, appender, metrics, spool)
            app.state.runtime = holder["runtime"]
            known_secrets = [value.encode() for value in settings.secret_values()]
            app.state.general = GeneralEndpoint(
                secrets={k: v.get_secret_value().encode() for k, v in
                         settings.general_secrets.items()},
                zone=settings.zone, max_body_bytes=settings.max_body_bytes,
                body_timeout_s=settings.body_timeout_s,
                appender=appender, pool=pool, metrics=metrics,
                rejected_keep=settings.rejected_keep, answer_within_s=settings.append_stall_s,
                known_secrets=known_secrets)
            chat_secrets = ChatSecretStore(pool, grace_s=settings.rotation_grace_s,
                                           answer_within_s=settings.append_stall_s)
            await chat_secrets.bootstrap(
                {k: v.get_secret_value() for k, v in settings.chat_secrets.items()},
                datetime.now(UTC))
            app.state.chat = ChatEndpoint(
                secrets=chat_secrets, tolerance_s=settings.chat_tolerance_s,
                max_body_bytes=settings.max_body_bytes, appender=appender, pool=pool,
                body_timeout_s=settings.body_timeout_s,
                metrics=metrics, rejected_keep=settings.rejected_keep,
                error_causes={**PLATFORM_ERROR_CAUSES, **settings.chat_error_causes},
                answer_within_s=settings.append_stall_s, known_secrets=known_secrets)
            chat_api = chat_api_factory(settings)
            app.state.chat_ops = ChatOps(chat_secrets, store, settings.home, chat_api)
            if projector_name is None and settings.projector:
                projector = live_projector(settings, database_url)
                app.state.projector_name = projector.name
                projector_task = asyncio.create_task(projector.run(),
                                                     name="hookledger-projector")

                async def stop_projector() -> None:
                    projector.stop()  # the batch in flight commits: stops at a batch boundary
                    await projector_task

                stack.push_async_callback(stop_projector)
            else:  # projected by the supervisor, or elsewhere (HOOKLEDGER_PROJECTOR=off)
                app.state.projector_name = projector_name or application_name()
            # media is fetched off the request path, from the ledger (unless another does)
            if chat_api is not None and settings.chat_media:
                media = MediaFetcher(
                    pool=pool, ledger=store, api=chat_api(), store=MediaStore(settings.home),
                    poll_s=settings.chat_media_poll_s,
                    max_attempts=settings.chat_media_max_attempts,
                    retry_base_s=settings.chat_media_retry_base_s)
                media.start()
                stack.push_async_callback(media.stop)
            if settings.api_base_url:  # reconciliation runs only when the API is configured
                from reconcile.metrics import ReconcileMetrics
                from reconcile.runner import Reconciler
                from reconcile.scheduler import ReconcileScheduler
                from reconcile.wiring import (
                    client_from,
                    config_from,
                    report_keep,
                    report_windows,
                )

                reconcile_metrics = ReconcileMetrics.create(metrics.registry)
                client = client_from(settings)
                app.state.reconciler = ReconcileScheduler(
                    Reconciler(database_url, client, config_from(settings), reconcile_metrics),
                    client, interval_s=settings.reconcile_interval_s,
                    database_url=database_url, reports_dir=settings.home / "reports",
                    report_interval_s=settings.report_interval_s, metrics=reconcile_metrics,
                    report_windows=report_windows(settings), report_keep=report_keep(settings))
                app.state.reconciler.start()
                stack.push_async_callback(app.state.reconciler.shutdown)
            elif settings.report_interval_s > 0:  # no API: reports of what the projector finds
                from reconcile.scheduler import ReconcileScheduler
                from reconcile.wiring import report_keep, report_windows

                app.state.reports = ReconcileScheduler(
                    None, None, interval_s=settings.reconcile_interval_s,
                    database_url=database_url, reports_dir=settings.home / "reports",
                    report_interval_s=settings.report_interval_s,
                    report_windows=report_windows(settings), report_keep=report_keep(settings))
                app.state.reports.start()
                stack.push_async_callback(app.state.reports.shutdown)
            log.info("service.started", general_webhooks=sorted(settings.general_secrets),
                     chat_numbers=len(settings.chat_secrets))
            # what exists now lives as long as the service: not rescanned (see gc_tuning)
            stack.enter_context(tuned_for_serving())
            yield
        log.info("service.stopped", batches=appender.batches, events=appender.events)

    async def general_webhook(request: Request) -> Response:
        return await request.app.state.general(request)

    async def chat_webhook(request: Request) -> Response:
        return await request.app.state.chat(request)

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "alive"})

    async def readyz(request: Request) -> Response:
        runtime = holder.get("runtime")
        if runtime is None:
            return JSONResponse({"status": "starting"}, status_code=503)
        spooled = runtime.spool.depth()
        check = asyncio.ensure_future(_read_only(runtime.pool))
        try:
            await asyncio.wait({check}, timeout=READY_CHECK_S)
        finally:
            if not check.done():
                # a connection whose packets vanish answers nothing until TCP gives up
                # (hours): answered now, the check is cancelled behind the answer
                # (psycopg's cancel of a query waits up to about 10 s, then closes it)
                check.cancel()
                _abandoned.add(check)
                check.add_done_callback(_retrieved)
        if check.cancelled() or not check.done():
            return JSONResponse({"status": "unready", "database": "timeout",
                                 "spool_bytes": spooled}, status_code=503)
        try:
            read_only = check.result()
        except Exception as exc:  # noqa: BLE001 - any failure means "not ready"
            return JSONResponse({"status": "unready", "database": type(exc).__name__,
                                 "spool_bytes": spooled}, status_code=503)
        if read_only:  # a standby: deliveries go to the spool until a primary answers
            return JSONResponse({"status": "unready", "database": "read_only",
                                 "spool_bytes": spooled}, status_code=503)
        return JSONResponse({"status": "ready", "database": "ok", "spool_bytes": spooled})

    async def metrics_endpoint(request: Request) -> Response:
        runtime = holder.get("runtime")
        if runtime is not None:
            metrics.spool_bytes.set(runtime.spool.depth())
        return PlainTextResponse(generate_latest(metrics.registry),
                                 media_type=CONTENT_TYPE_LATEST)

    app = Starlette(
        routes=[
            Route("/webhooks/general/{name}", general_webhook, methods=["POST"]),
            Route("/webhooks/chat/{phone_number_id}", chat_webhook, methods=["POST"]),
            Route("/healthz", healthz, methods=["GET"]),
            Route("/readyz", readyz, methods=["GET"]),
            Route("/metrics", metrics_endpoint, methods=["GET"]),
            *admin_routes(ADMIN_ROUTES, admin_token),
        ],
        lifespan=lifespan,
    )
    # its 307 to the path without the slash is a plain-http URL (behind TLS too) that the
    # general system never follows nor retries, and nothing of the delivery is kept:
    # webhook paths are taken with a trailing slash by WebhookFastPath instead
    app.router.redirect_slashes = False
    return WebhookFastPath(app)


Answer = Response | Accepted

# path prefix -> (path parameter, the endpoint's name on app.state)
WEBHOOK_ROUTES = (("/webhooks/general/", "name", "general"),
                  (CHAT_WEBHOOK_PATH, "phone_number_id", "chat"))


class WebhookFastPath:
    """Hands webhook POSTs straight to their endpoint; everything else goes to Starlette.

    A delivery is the one request that comes thousands of times a second, and Starlette's
    middleware and router cost a tenth of a worker's time on it (measured with py-spy); its
    endpoint reads an :class:`Incoming` rather than a Starlette ``Request``. The
    routes are the same (``{param}`` is one non-empty path segment, as Starlette matches
    it), and so is the behaviour on a bug: logged, answered 500. Every other POST path
    under a webhook prefix goes to that endpoint too (see :func:`_one_segment`): Starlette
    answered it, and the prefix itself without its slash, with an unrecorded 404 or 307,
    and the general system never sends a delivery again. Other methods, lifespan and every
    other route go through Starlette.
    """

    def __init__(self, app: Starlette) -> None:
        self.app = app
        self.state = app.state  # tests and the admin API reach the service through it

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            path: str = scope["path"]
            for prefix, param, name in WEBHOOK_ROUTES:
                # the prefix without its slash too: a provider set up with the bare
                # ``/webhooks/general`` got Starlette's unrecorded 404, and every delivery
                # it sent there was lost without a trace
                if path.startswith(prefix) or path == prefix[:-1]:
                    value = path[len(prefix):]
                    endpoint = getattr(self.app.state, name, None)
                    if endpoint is None:  # not started
                        break
                    if not value or "/" in value:  # off the normal path only
                        value = _one_segment(value)
                    await self._deliver(endpoint, param, value, scope, receive, send)
                    return
        await self.app(scope, receive, send)

    async def _deliver(self, endpoint: Callable[[Incoming], Awaitable[Answer]], param: str,
                       value: str, scope: Scope, receive: Receive, send: Send) -> None:
        scope["app"] = self.app
        path_params = scope["path_params"] = {param: value}
        response: Answer
        try:
            response = await endpoint(
                Incoming(scope, receive, path_params, complete_body(receive)))
        except Exception:
            log.exception("request.failed", path=scope["path"])
            response = PlainTextResponse("Internal Server Error", status_code=500)
        await response(scope, receive, send)


def _one_segment(value: str) -> str:
    """The path parameter of ``prefix + value`` when ``value`` is not one plain segment.

    One trailing slash is dropped (``main/`` is ``main``): senders and proxies add one, and
    Starlette's answer was a redirect the general system never follows. Anything else is
    returned as it is: empty or holding a ``/``, it names no endpoint (general names and
    chat numbers are single segments, checked at start and on lookup), so the endpoint
    refuses it as an unknown name and records it like any other refusal.
    """
    if value.endswith("/"):
        name = value[:-1]
        if name and "/" not in name:
            return name
    return value
