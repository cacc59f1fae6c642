"""The admin API under ``/api``: bearer-token auth, JSON in and out, an OpenAPI document.

Routes are declared as :class:`AdminRoute` values (path, method, handler, schemas), so the
OpenAPI document at ``/api/openapi.json`` is generated from the same list that routes
requests and cannot drift from it. Every route but the document itself requires
``Authorization: Bearer $HOOKLEDGER_ADMIN_TOKEN``, compared in constant time; with no token
configured the API refuses everything (401), as CONTRACT.md says.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
import structlog
from psycopg_pool import PoolTimeout
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

Handler = Callable[[Request], Awaitable[Response]]
OPENAPI_PATH = "/api/openapi.json"
# how long an admin handler waits for a pooled connection (pool.connection(timeout=...)):
# the pool's own 30 s default, kept for ingest, outlasts the caller, who then hears a 500
CONNECTION_TIMEOUT_S = 5.0
RETRY_AFTER_S = 5
UNAVAILABLE = {503: "the database is unreachable (database_unavailable, with Retry-After)"}

log = structlog.get_logger("hookledger.admin_api")


@dataclass(frozen=True)
class AdminRoute:
    """One admin endpoint and what the OpenAPI document says about it."""

    path: str  # e.g. "/api/expectations"
    method: str  # "GET", "POST", ...
    handler: Handler
    summary: str
    request_schema: dict[str, Any] | None = None
    responses: dict[int, str] = field(default_factory=lambda: {200: "OK"})
    response_schema: dict[str, Any] | None = None


def _authorised(request: Request, token: str | None) -> bool:
    if not token:
        return False
    header = request.headers.get("authorization", "")
    scheme, _, presented = header.partition(" ")
    if scheme.lower() != "bearer" or not presented:
        return False
    return hmac.compare_digest(presented.strip().encode(), token.encode())


def unauthorised() -> JSONResponse:
    return JSONResponse({"error": "unauthorised"}, status_code=401,
                        headers={"WWW-Authenticate": "Bearer"})


def bad_request(detail: str) -> JSONResponse:
    return JSONResponse({"error": "bad_request", "detail": detail}, status_code=400)


def database_unavailable() -> JSONResponse:
    return JSONResponse({"error": "database_unavailable"}, status_code=503,
                        headers={"Retry-After": str(RETRY_AFTER_S)})


def guarded(handler: Handler, token: str | None) -> Handler:
    async def guard(request: Request) -> Response:
        if not _authorised(request, token):
            return unauthorised()
        try:
            return await handler(request)
        except (PoolTimeout, psycopg.OperationalError, psycopg.InterfaceError,
                # a read-only server (a standby, the old primary after a failover) cannot
                # write now, but it or its successor will: a 500 said not to retry
                psycopg.errors.ReadOnlySqlTransaction) as exc:
            # a database gone is the caller's to retry, not a bug: no traceback; the error's
            # type only, as its text can name the server and user
            log.warning("admin_api.database_unavailable", path=request.url.path,
                        error=type(exc).__name__)
            return database_unavailable()

    return guard


def openapi_document(routes: Sequence[AdminRoute]) -> dict[str, Any]:
    paths: dict[str, Any] = {}
    for route in routes:
        operation: dict[str, Any] = {
            "summary": route.summary,
            "security": [{"bearer": []}],
            "responses": {
                str(status): ({"description": text, "content": {"application/json": {
                    "schema": route.response_schema}}}
                    if status < 300 and route.response_schema else {"description": text})
                for status, text in {**UNAVAILABLE, **route.responses,
                                     401: "missing or wrong token"}.items()
            },
        }
        params = [part[1:-1] for part in route.path.split("/") if part.startswith("{")]
        if params:
            operation["parameters"] = [
                {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
                for name in params]
        if route.request_schema is not None:
            operation["requestBody"] = {"required": True, "content": {
                "application/json": {"schema": route.request_schema}}}
        paths.setdefault(route.path, {})[route.method.lower()] = operation
    return {
        "openapi": "3.0.3",
        "info": {"title": "hookledger admin API", "version": "1"},
        "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
        "paths": paths,
    }


def admin_routes(routes: Sequence[AdminRoute], token: str | None) -> list[Route]:
    """Starlette routes for the admin API, guarded, plus its OpenAPI document."""
    document = openapi_document(routes)

    async def openapi(_: Request) -> Response:
        return JSONResponse(document)

    return [Route(OPENAPI_PATH, openapi, methods=["GET"])] + [
        Route(r.path, guarded(r.handler, token), methods=[r.method]) for r in routes]
