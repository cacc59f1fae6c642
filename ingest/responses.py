"""The answers a webhook endpoint gives (CONTRACT.md: 200, 400, 401, 413, 415, 503)."""

from __future__ import annotations

from starlette.responses import JSONResponse

from ledger import AppendResult


def accepted(result: AppendResult) -> JSONResponse:
    return JSONResponse(
        {"status": "accepted", "duplicate": result.duplicate, "position": result.position}
    )


def refused(status: int, reason: str) -> JSONResponse:
    return JSONResponse({"status": "refused", "reason": reason}, status_code=status)


def unavailable() -> JSONResponse:
    return JSONResponse(
        {"status": "unavailable", "reason": "ledger_unavailable"},
        status_code=503,
        headers={"Retry-After": "1"},
    )
