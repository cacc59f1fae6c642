"""The admin API: bearer token required, compared exactly, and an OpenAPI document."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

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
    assert answers["/api/expectations"] >= {"200", "201", "400", "408", "409", "413"}
    assert answers["/api/chat/{phone_number_id}/rotate-secret"] >= {
        "200", "400", "409", "500", "502", "503"}
