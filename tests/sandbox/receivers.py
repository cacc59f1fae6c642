"""A real HTTP receiver for tests: records every request, answers what it is told to."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from sandbox.runner import serve_asgi


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Recorder:
    url: str = ""
    received: list[Received] = field(default_factory=list)
    statuses: list[int] = field(default_factory=list)  # answers to give, in order; then 200
    lock: threading.Lock = field(default_factory=threading.Lock)


@contextmanager
def recording_receiver() -> Iterator[Recorder]:
    recorder = Recorder()

    async def receive(request: Request) -> Response:
        body = await request.body()
        with recorder.lock:
            recorder.received.append(Received(request.url.path, dict(request.headers), body))
            status = recorder.statuses.pop(0) if recorder.statuses else 200
        return JSONResponse({"status": status}, status_code=status)

    app = Starlette(routes=[Route("/{path:path}", receive, methods=["POST"])])
    with serve_asgi(app) as url:
        recorder.url = url
        yield recorder
