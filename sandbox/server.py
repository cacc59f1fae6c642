"""The sandbox's HTTP API: the provider's side of the endpoints hookledger calls.

Every ``/api/v1/*`` answer is the envelope ``{success, code, message, data}``, written with
exact numbers, and passes through the fault switches first. API codes are from the spec's
1xxx (core payments) and 4xxxx (authentication) ranges; they never overlap with 9xxxx
webhook codes:

========  ==========================================================
1000      success
1400      bad request (body not JSON, no URL field...)
1404      not found (unknown reference, media id)
40101     missing or wrong ``apiToken``
50003     injected 5xx (fault switch);  50429 injected 429;  50004 injected timeout
========  ==========================================================

Routes:

* ``GET  /api/v1/payment/reference/{reference}``: the authoritative record; ``data`` uses the
  general body's field names (``reference``, ``status``, ``amount``, ``event``, ``code``,
  ``transactionId``, ``customerReference``, ``service``, ``type``, ``timestamp``,
  ``invoice``...).
* ``POST /api/v1/waba/webhook-secrets/{phoneNumberId}/rotate``: ``data.secret`` is the
  new secret, returned this once.
* ``PATCH /api/v1/waba/phone-numbers/{id}``: body field ``webhookUrl`` (also accepted:
  ``webhook_url``, ``url``); ``data`` echoes ``id`` and ``webhookUrl``.
* ``GET  /api/v1/waba/messages/{id}/media``: the media bytes, content type by media kind.
* ``GET|POST|DELETE /_sandbox/faults``: read, change (JSON object of switches), clear.

Every ``/api/v1/*`` route wants the API key in header ``apiToken`` (``40101``, HTTP 401,
without it); the fault switches come first, as a proxy's would.

Numbers not yet connected are connected on first use (this is a sandbox).
"""

from __future__ import annotations

import asyncio
import functools
import gzip
import json
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from decimal import Decimal
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from sandbox import jsonenc
from sandbox.faults import Faults, FaultSettings
from sandbox.state import SandboxState

URL_FIELDS = ("webhookUrl", "webhook_url", "url")
Handler = Callable[[Request], Awaitable[Response]]


def envelope(success: bool, code: int, message: str, data: dict[str, Any] | None = None,
             *, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    body = {"success": success, "code": code, "message": message, "data": data or {}}
    return Response(jsonenc.encode(body), status_code=status, headers=headers,
                    media_type="application/json")


def not_found(what: str) -> Response:
    return envelope(False, 1404, f"{what} not found", status=404)


BOMB_BYTES = 256 * 1024 * 1024


@functools.cache
def gzip_bomb() -> bytes:
    """:data:`BOMB_BYTES` of zeros gzipped twice (about 600 bytes), built once, a MiB at a
    time: what a client that undoes every layer before it counts holds all at once."""
    inner = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(1024 * 1024)
    once = b"".join(inner.compress(zeros) for _ in range(BOMB_BYTES // len(zeros)))
    return gzip.compress(once + inner.flush(), 9)


def _trickled(answer: Response, pause_s: float) -> Response:
    """The same answer, its body sent one byte at a time, ``pause_s`` apart."""
    content = bytes(answer.body)

    async def bytewise() -> AsyncIterator[bytes]:
        for index in range(len(content)):
            await asyncio.sleep(pause_s)
            yield content[index:index + 1]

    headers = {k: v for k, v in answer.headers.items() if k.lower() != "content-length"}
    return StreamingResponse(bytewise(), status_code=answer.status_code, headers=headers)


def _faulty(faults: Faults, handler: Handler) -> Handler:
    """Apply the fault switches in front of an API handler."""

    async def wrapped(request: Request) -> Response:
        answer = await faulted(request)
        trickle_ms = faults.settings.trickle_ms
        return _trickled(answer, trickle_ms / 1000) if trickle_ms else answer

    async def faulted(request: Request) -> Response:
        decision = faults.next()
        settings = faults.settings
        if decision.latency_ms:
            await asyncio.sleep(decision.latency_ms / 1000)
        if decision.action == "timeout":
            await asyncio.sleep(settings.hang_s)
            return envelope(False, 50004, "upstream timed out", status=504)
        if decision.action == "error":
            return envelope(False, 50003, "service unavailable (injected)",
                            status=settings.error_status)
        if decision.action == "rate_limit":
            return envelope(False, 50429, "too many requests (injected)", status=429,
                            headers={"Retry-After": str(settings.retry_after_s)})
        answer = await handler(request)
        if decision.action == "malformed":
            if settings.malformed_kind == "non_json":
                return Response(b"<html><body>502 Bad Gateway</body></html>",
                                media_type="application/json")
            if settings.malformed_kind == "bad_encoding":
                return Response(b"this is not gzip", media_type="application/json",
                                headers={"Content-Encoding": "gzip"})
            if settings.malformed_kind == "gzip_bomb":
                return Response(gzip_bomb(), media_type="application/json",
                                headers={"Content-Encoding": "gzip, gzip"})
            if settings.malformed_kind == "loose_envelope":
                loose = {key: value for key, value in json.loads(bytes(answer.body)).items()
                         if key != "code"}
                return Response(jsonenc.encode({**loose, "message": None}),
                                status_code=answer.status_code, media_type="application/json")
            return Response(jsonenc.encode({"success": True}), media_type="application/json")
        return answer

    return wrapped


def _keyed(state: SandboxState, handler: Handler) -> Handler:
    """Answer only a caller that sends the API key in ``apiToken``: the spec shows it on
    the rotate call and says nothing of the others' authentication, and a sandbox that
    asked for it nowhere else let a client that lost the header, or a wrong
    ``HOOKLEDGER_API_KEY``, look as if it worked."""

    async def keyed(request: Request) -> Response:
        if request.headers.get("apiToken") != state.api_key:
            return envelope(False, 40101, "invalid or missing apiToken", status=401)
        return await handler(request)

    return keyed


def create_app(state: SandboxState, faults: Faults) -> Starlette:
    async def payment_by_reference(request: Request) -> Response:
        reference = request.path_params["reference"]
        record = state.record(reference)
        if record is None:
            return not_found(f"payment {reference!r}")
        return envelope(True, 1000, "Success", record)

    async def rotate_secret(request: Request) -> Response:
        phone_number_id = request.path_params["phone_number_id"]
        secret = state.rotate(phone_number_id)
        return envelope(True, 1000, "Webhook secret rotated; it is shown only this once",
                        {"phoneNumberId": phone_number_id, "secret": secret})

    async def set_phone_number(request: Request) -> Response:
        phone_number_id = request.path_params["phone_number_id"]
        try:
            body = json.loads(await request.body())
        except ValueError:
            return envelope(False, 1400, "body must be a JSON object", status=400)
        url = next((body[f] for f in URL_FIELDS if isinstance(body, dict)
                    and isinstance(body.get(f), str)), None)
        if url is None:
            return envelope(False, 1400, "webhookUrl is required", status=400)
        number = state.set_webhook_url(phone_number_id, url)
        return envelope(True, 1000, "Phone number updated",
                        {"id": phone_number_id, "webhookUrl": number.webhook_url})

    async def media(request: Request) -> Response:
        found = state.media(request.path_params["media_id"])
        if found is None:
            return not_found("media")
        content, content_type = found
        return Response(content, media_type=content_type)

    async def faults_endpoint(request: Request) -> Response:
        if request.method == "DELETE":
            faults.clear()
        elif request.method == "POST":
            try:
                changes = json.loads(await request.body())
                if not isinstance(changes, dict):
                    raise ValueError("a JSON object of switches is expected")
                faults.configure(FaultSettings.from_json(changes, faults.settings))
            except ValueError as exc:
                return envelope(False, 1400, str(exc), status=400)
        described = faults.describe()
        described["settings"] = {k: Decimal(repr(v)) if isinstance(v, float) else v
                                 for k, v in described["settings"].items()}
        return envelope(True, 1000, "Fault switches", described)

    api = [
        # ``path``: the server decodes ``%2F`` before routing, so a reference holding a
        # slash (``ORDER/2026/0001``, sent as one segment) is several segments here
        Route("/api/v1/payment/reference/{reference:path}", payment_by_reference,
              methods=["GET"]),
        Route("/api/v1/waba/webhook-secrets/{phone_number_id}/rotate", rotate_secret,
              methods=["POST"]),
        Route("/api/v1/waba/phone-numbers/{phone_number_id}", set_phone_number,
              methods=["PATCH"]),
        Route("/api/v1/waba/messages/{media_id}/media", media, methods=["GET"]),
    ]
    routes = [Route(r.path, _faulty(faults, _keyed(state, r.endpoint)),
                    methods=list(r.methods or [])) for r in api]
    routes.append(Route("/_sandbox/faults", faults_endpoint, methods=["GET", "POST", "DELETE"]))
    return Starlette(routes=routes)
