"""Helpers for chat tests against the real sandbox API and a real hookledger server."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import psycopg
import pytest
import structlog

from hookledger import logs
from tests.chat_events import chat_header

API_KEY = "test-api-key-7f3a9c1e"
ADMIN_TOKEN = "test-admin-token-41b8d2"


def rows(db_url: str, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(db_url, autocommit=True) as conn:
        return conn.execute(sql, params).fetchall()


def execute(db_url: str, sql: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(sql)


def post_chat(base: str, phone: str, raw: bytes, secret: str, *,
              delivery_id: str) -> httpx.Response:
    headers = {"content-type": "application/json", "x-service-delivery-id": delivery_id,
               "x-service-attempt": "1",
               "x-service-signature": chat_header(secret, raw, int(time.time()))}
    return httpx.post(f"{base}/webhooks/chat/{phone}", content=raw, headers=headers,
                      timeout=10)


def wait_for(predicate: Callable[[], Any], timeout_s: float = 15.0,
             every_s: float = 0.05) -> Any:
    """Poll until ``predicate()`` is truthy; return its value (fail after the timeout)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s} s")
        time.sleep(every_s)


@pytest.fixture
def json_logs() -> Iterator[None]:
    """JSON logs on stderr with NO masker, so a leak in our code shows up in the capture."""
    logs.configure(fmt="json", level="debug", secrets=[], cache=False)
    yield
    structlog.reset_defaults()


def cli_env(db_url: str, api_url: str, home: str, **extra: str) -> dict[str, str]:
    env = {"HOOKLEDGER_DATABASE_URL": db_url, "HOOKLEDGER_API_BASE_URL": api_url,
           "HOOKLEDGER_API_KEY": API_KEY, "HOOKLEDGER_HOME": home,
           "HOOKLEDGER_LOG_FORMAT": "json"}
    env.update(extra)
    return env
