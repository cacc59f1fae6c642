"""The admin API's endpoints. Handlers reach the running service through ``app.state``."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from hookledger.admin_api import CONNECTION_TIMEOUT_S, AdminRoute
from ingest.chat_rotation import ROTATE_RESPONSE_SCHEMA, admin_rotate_secret
from projections.live import leader_query


async def status(request: Request) -> Response:
    """Where the ledger and the projector stand."""
    pool = request.app.state.runtime.pool
    leader_sql, leader_params = leader_query(request.app.state.projector_name)
    async with pool.connection(timeout=CONNECTION_TIMEOUT_S) as conn:
        cur = await conn.execute(
            "SELECT (SELECT coalesce(max(position), 0) FROM hookledger_private.ledger_events),"
            " (SELECT coalesce(min(position), 0) FROM "
            "hookledger_private.projection_checkpoints)")
        head, projected = await cur.fetchone()
        # asked of PostgreSQL, so it is true whichever process of this serve projects
        cur = await conn.execute(leader_sql, leader_params)
        (leader,) = await cur.fetchone()
    return JSONResponse({"ledger_head": head, "projected_to": projected,
                         "projector_leader": bool(leader)})


STATUS_SCHEMA = {"type": "object", "properties": {
    "ledger_head": {"type": "integer"}, "projected_to": {"type": "integer"},
    "projector_leader": {"type": "boolean"}}}

ADMIN_ROUTES: list[AdminRoute] = [
    AdminRoute("/api/status", "GET", status, "Ledger head and projector position",
               response_schema=STATUS_SCHEMA),
]

ADMIN_ROUTES.append(AdminRoute(
    "/api/chat/{phone_number_id}/rotate-secret", "POST", admin_rotate_secret,
    "Rotate a number's chat secret through the provider and keep it (answers its label only)",
    responses={200: "rotated and stored", 400: "not a valid phone number id",
               409: "a rotation of this number is already running (rotation_in_progress)",
               500: "issued but not stored: rescued to a 0600 file (see rescued_to; "
                    "command is the shell line that stores it)",
               502: "the provider refused or answered unusably; one that rotated without "
                    "the secret where it was looked for is kept in a 0600 file (see "
                    "rescued_to, fields and command)",
               503: "API not configured, provider unavailable, or the database "
                    "unreachable (database_unavailable)"},
    response_schema=ROTATE_RESPONSE_SCHEMA))

from reconcile.api import post_expectation  # noqa: E402
from reconcile.expectations import REQUEST_SCHEMA as EXPECTATION_SCHEMA  # noqa: E402
from reconcile.expectations import RESPONSE_SCHEMA as EXPECTATION_RESPONSE  # noqa: E402

ADMIN_ROUTES.append(AdminRoute(
    "/api/expectations", "POST", post_expectation,
    "Register an initiated collection, payout or SMS, so that a webhook that never comes is "
    "noticed",
    request_schema=EXPECTATION_SCHEMA,
    responses={201: "registered", 200: "already registered alike (idempotent)",
               400: "invalid body, or the caller left mid-body (client_disconnected)",
               408: "the body arrived too slowly (body_timeout)",
               409: "reference already expected with another kind or amount",
               413: "body too large"},
    response_schema=EXPECTATION_RESPONSE))
