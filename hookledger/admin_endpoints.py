"""The admin API's endpoints. Handlers reach the running service through ``app.state``."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from hookledger.admin_api import AdminRoute


async def status(request: Request) -> Response:
    """Where the ledger and the projector stand."""
    pool = request.app.state.runtime.pool
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT (SELECT coalesce(max(position), 0) FROM hookledger_private.ledger_events),"
            " (SELECT coalesce(min(position), 0) FROM "
            "hookledger_private.projection_checkpoints)")
        head, projected = await cur.fetchone()
    return JSONResponse({"ledger_head": head, "projected_to": projected,
                         "projector_leader": request.app.state.projector.is_leader})


STATUS_SCHEMA = {"type": "object", "properties": {
    "ledger_head": {"type": "integer"}, "projected_to": {"type": "integer"},
    "projector_leader": {"type": "boolean"}}}

ADMIN_ROUTES: list[AdminRoute] = [
    AdminRoute("/api/status", "GET", status, "Ledger head and projector position",
               response_schema=STATUS_SCHEMA),
]
