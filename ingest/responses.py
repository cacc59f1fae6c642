"""The answers a webhook endpoint gives (CONTRACT.md: 200, 400, 401, 413, 415, 503)."""

from __future__ import annotations

from starlette.responses import JSONResponse
from starlette.types import Receive, Scope, Send

from ledger import AppendResult


class Accepted:
    """The hot path's 200: the bytes and headers Starlette's ``Response(body,
    media_type="application/json")`` sends (content-length, then content-type), as two
    ready ASGI messages, without a response object or a json.dumps per delivery."""

    __slots__ = ("body",)
    status_code = 200
    media_type = "application/json"

    def __init__(self, body: bytes) -> None:
        self.body = body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-length", str(len(self.body)).encode()),
            (b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": self.body})


def accepted(result: AppendResult) -> Accepted:
    if result.spooled:
        return Accepted(b'{"status":"accepted","duplicate":false,"position":null,'
                        b'"spooled":true}')
    duplicate = "true" if result.duplicate else "false"
    return Accepted(
        f'{{"status":"accepted","duplicate":{duplicate},"position":{int(result.position)}}}'
        .encode())


def refused(status: int, reason: str) -> JSONResponse:
    return JSONResponse({"status": "refused", "reason": reason}, status_code=status)


def unavailable() -> JSONResponse:
    return JSONResponse(
        {"status": "unavailable", "reason": "ledger_unavailable"},
        status_code=503,
        headers={"Retry-After": "1"},
    )
