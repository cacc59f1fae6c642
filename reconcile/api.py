"""``POST /api/expectations`` for the admin API (bearer auth is applied by the admin API)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from decimal import Decimal

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from reconcile.expectations import (
    ExpectationConflict,
    ExpectationInvalid,
    parse_expectation,
    register,
    registered,
)

MAX_BODY = 16 * 1024


def _error(status: int, error: str, detail: str) -> JSONResponse:
    return JSONResponse({"error": error, "detail": detail}, status_code=status)


async def post_expectation(request: Request) -> Response:
    raw = await request.body()
    if len(raw) > MAX_BODY:
        return _error(413, "too_large", f"the body is over {MAX_BODY} bytes")
    try:
        data = json.loads(raw, parse_float=Decimal)
        expectation = parse_expectation(data, now=datetime.now(UTC))
    except (ValueError, RecursionError):  # (nested past what the JSON reader goes)
        return _error(400, "bad_request", "the body is not JSON")
    except ExpectationInvalid as exc:
        return _error(400, "bad_request", str(exc))
    pool = request.app.state.runtime.pool
    try:
        async with pool.connection() as conn:
            created = await register(conn, expectation)
            if not created:  # answered as kept: the first registration's time and amount
                expectation = await registered(conn, expectation.reference) or expectation
    except ExpectationConflict as exc:
        return _error(409, "conflict", str(exc))
    except ExpectationInvalid as exc:
        return _error(400, "bad_request", str(exc))
    return JSONResponse({**expectation.as_json(), "created": created},
                        status_code=201 if created else 200)
