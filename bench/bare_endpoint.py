"""The baseline: what a merchant would write instead of hookledger.

Starlette and a psycopg async pool; check the HMAC, insert one row per request in
autocommit (or, with ``BARE_EXPLICIT_TRANSACTION=1``, in an explicit transaction), answer.
No normalising, no dedupe, no raw bytes kept apart, no projections. Run it as the issue's
figures were taken: ``uvicorn bench.bare_endpoint:app --workers 2``, with
``BARE_DATABASE_URL`` and ``BARE_SECRET`` set; ``bench.ingest_bench`` does all of that.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
from collections.abc import AsyncIterator

from psycopg_pool import AsyncConnectionPool
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

TABLE_DDL = """CREATE TABLE IF NOT EXISTS bare_deliveries (
    id bigserial PRIMARY KEY, received_at timestamptz NOT NULL DEFAULT now(), body jsonb NOT NULL)
"""
INSERT = "INSERT INTO bare_deliveries (body) VALUES (%s::jsonb)"


@contextlib.asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    pool = AsyncConnectionPool(os.environ["BARE_DATABASE_URL"], min_size=8, max_size=16,
                               kwargs={"autocommit": True}, open=False)
    await pool.open(wait=True)
    app.state.pool = pool
    app.state.secret = os.environ["BARE_SECRET"].encode()
    app.state.explicit = os.environ.get("BARE_EXPLICIT_TRANSACTION") == "1"
    yield
    await pool.close()


async def webhook(request: Request) -> Response:
    body = await request.body()
    expected = "sha256=" + hmac.new(request.app.state.secret, body, hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, request.headers.get("x-service-signature", "")):
        return JSONResponse({"error": "bad signature"}, status_code=401)
    async with request.app.state.pool.connection() as conn:
        if request.app.state.explicit:
            async with conn.transaction():
                await conn.execute(INSERT, (body.decode(),))
        else:
            await conn.execute(INSERT, (body.decode(),))
    return JSONResponse({"ok": True})


app = Starlette(routes=[Route("/webhooks/general/{name}", webhook, methods=["POST"])],
                lifespan=lifespan)
