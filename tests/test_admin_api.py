"""The admin API: bearer token required, compared exactly, and an OpenAPI document."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import httpx
import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tests.dbutil import database_read_only
from tests.live import running_service

TOKEN = "admin-token-0123456789"


@pytest.fixture
def service(db_url: str) -> Iterator[str]:
    with running_service(db_url, admin_token=TOKEN) as base:
        yield base


@pytest.mark.parametrize("header", [None, "", "Bearer", f"Bearer {TOKEN}x", f"Basic {TOKEN}",
                                    f"Bearer {TOKEN[:-1]}", TOKEN])
def test_missing_or_wrong_tokens_are_refused(service: str, header: str | None) -> None:
    headers = {"authorization": header} if header is not None else {}
    answer = httpx.get(f"{service}/api/status", headers=headers)
    assert answer.status_code == 401
    assert TOKEN not in answer.text


def test_the_right_token_is_let_in(service: str) -> None:
    answer = httpx.get(f"{service}/api/status", headers={"authorization": f"Bearer {TOKEN}"})
    assert answer.status_code == 200
    assert set(answer.json()) == {"ledger_head", "projected_to", "projector_leader"}


def test_without_a_configured_token_everything_is_refused(db_url: str) -> None:
    with running_service(db_url) as base:
        assert httpx.get(f"{base}/api/status",
                         headers={"authorization": "Bearer None"}).status_code == 401


def test_the_openapi_document_lists_every_route(service: str) -> None:
    document = httpx.get(f"{service}/api/openapi.json").json()
    assert document["openapi"].startswith("3.")
    assert "/api/status" in document["paths"]
    assert TOKEN not in httpx.get(f"{service}/api/openapi.json").text
    # every answer a route gives is listed, so a client generated from the document knows
    # it (408 for a trickled body and 409 for a rotation already running were not)
    answers = {path: set(document["paths"][path]["post"]["responses"])
               for path in ("/api/expectations", "/api/chat/{phone_number_id}/rotate-secret")}
    assert answers["/api/expectations"] >= {"200", "201", "400", "408", "409", "413", "503"}
    assert "503" in document["paths"]["/api/status"]["get"]["responses"]
    assert answers["/api/chat/{phone_number_id}/rotate-secret"] >= {
        "200", "400", "409", "500", "502", "503"}


@contextlib.contextmanager
def database_gone(db_url: str) -> Iterator[None]:
    """The service's database refuses new connections and its open ones are cut: a server
    that went away, as far as the service can tell."""
    name = conninfo_to_dict(db_url)["dbname"]
    with psycopg.connect(make_conninfo(db_url, dbname="postgres"), autocommit=True) as conn:
        conn.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS false").format(
            sql.Identifier(name)))
        try:
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                         "WHERE datname = %s", (name,))
            yield
        finally:
            conn.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS true").format(
                sql.Identifier(name)))


@pytest.mark.parametrize(("method", "path", "body"), [
    ("GET", "/api/status", None),
    ("POST", "/api/expectations", {"reference": "GONE-1", "kind": "collection",
                                   "amount": "1000"})])
def test_a_database_gone_is_answered_503_at_once(
        db_url: str, method: str, path: str, body: dict[str, str] | None) -> None:
    """Before, the pool's broken connection or its 30 s wait for a new one ended in a 500
    with a traceback, after the client had most likely given up: a client registering
    expectations inline needs a prompt 503 it can retry on."""
    with running_service(db_url, admin_token=TOKEN) as base, database_gone(db_url):
        for _ in range(3):  # the first may meet a cut connection, a later one waits for one
            started = time.monotonic()
            answer = httpx.request(method, f"{base}{path}", json=body, timeout=60,
                                   headers={"authorization": f"Bearer {TOKEN}"})
            assert answer.status_code == 503, answer.text
            assert answer.json()["error"] == "database_unavailable"
            assert int(answer.headers["retry-after"]) > 0
            assert time.monotonic() - started < 10


def test_a_read_only_database_is_answered_503_not_500(db_url: str) -> None:
    """Expectations cannot be written now but will be once a primary answers: a 500 with a
    traceback told the caller its request was at fault, not to retry it."""
    with running_service(db_url, admin_token=TOKEN) as base, database_read_only(db_url):
        for n in range(3):  # the first may meet a cut connection
            answer = httpx.post(f"{base}/api/expectations", timeout=60,
                                json={"reference": f"RO-{n}", "kind": "collection",
                                      "amount": "1000"},
                                headers={"authorization": f"Bearer {TOKEN}"})
            assert answer.status_code == 503, answer.text
            assert answer.json()["error"] == "database_unavailable"
    assert not any(reference.startswith("RO-") for (reference,) in psycopg.connect(
        db_url, autocommit=True).execute("SELECT reference FROM hookledger.expectations"))
