"""``POST /api/expectations`` for the admin API (bearer auth is applied by the admin API)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from decimal import Decimal
from typing import cast

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from hookledger.admin_api import CONNECTION_TIMEOUT_S
from ingest.body import read_limited
from ingest.errors import BodyIncomplete, BodyTooLarge, BodyTooSlow
from ingest.incoming import DeliveryRequest
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
    # read as webhook bodies are: never more than the limit (a declared length over it is
    # refused unread), a body trickled for ever ends, and a caller gone mid-body is an
    # answer nobody reads, not an unhandled ClientDisconnect (500, a traceback in the log)
    try:
        # Starlette's Request has what it reads (headers.get, receive); its Headers
        # type differs from the protocol's only in get()'s overloads
        raw = await read_limited(cast(DeliveryRequest, request), MAX_BODY, head_bytes=0)
    except BodyTooLarge:
        return _error(413, "too_large", f"the body is over {MAX_BODY} bytes")
    except BodyTooSlow as exc:
        return _error(408, "body_timeout", exc.detail or "")
    except BodyIncomplete as exc:
        return _error(400, "client_disconnected", exc.detail or "")
    try:
        data = json.loads(raw, parse_float=Decimal)
        expectation = parse_expectation(data, now=datetime.now(UTC))
    except (ValueError, RecursionError, ArithmeticError):
        # (nested past what the JSON reader goes; a number past what Decimal holds raises
        # decimal.InvalidOperation, an ArithmeticError)
        return _error(400, "bad_request", "the body is not JSON")
    except ExpectationInvalid as exc:
        return _error(400, "bad_request", str(exc))
    pool = request.app.state.runtime.pool
    try:
        async with pool.connection(timeout=CONNECTION_TIMEOUT_S) as conn:
            created = await register(conn, expectation)
            if not created:  # answered as kept: the first registration's time and amount
                expectation = await registered(conn, expectation.reference) or expectation
    except ExpectationConflict as exc:
        return _error(409, "conflict", str(exc))
    except ExpectationInvalid as exc:
        return _error(400, "bad_request", str(exc))
    return JSONResponse({**expectation.as_json(), "created": created},
                        status_code=201 if created else 200)
