"""The answers a webhook endpoint gives (CONTRACT.md: 200, 400, 401, 413, 415, 503)."""

from __future__ import annotations

from starlette.responses import JSONResponse, Response

from ledger import AppendResult


def accepted(result: AppendResult) -> Response:
    """The hot path's answer, written out directly: the same JSON as JSONResponse gives,
    without a json.dumps per delivery."""
    if result.spooled:
        return Response('{"status":"accepted","duplicate":false,"position":null,'
                        '"spooled":true}', media_type="application/json")
    duplicate = "true" if result.duplicate else "false"
    return Response(
        f'{{"status":"accepted","duplicate":{duplicate},"position":{int(result.position)}}}',
        media_type="application/json")


def refused(status: int, reason: str) -> JSONResponse:
    return JSONResponse({"status": "refused", "reason": reason}, status_code=status)


def unavailable() -> JSONResponse:
    return JSONResponse(
        {"status": "unavailable", "reason": "ledger_unavailable"},
        status_code=503,
        headers={"Retry-After": "1"},
    )
