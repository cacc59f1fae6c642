"""The sandbox API over real HTTP: reference records, rotation, webhook URL, media, faults."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal

import httpx
import pytest

from sandbox import events as ev
from sandbox import jsonenc
from sandbox.faults import FaultSettings
from sandbox.runner import Sandbox, running_sandbox
from sandbox.signing import chat_signature
from sandbox.state import media_bytes
from tests.sandbox.receivers import recording_receiver

API_KEY = "test-api-key"
AT = datetime(2026, 11, 22, 5, 30, tzinfo=UTC)


@pytest.fixture
def sandbox() -> Iterator[Sandbox]:
    with running_sandbox(api_key=API_KEY) as running:
        yield running


KEYED = {"apiToken": API_KEY}


def get(url: str, **kwargs: object) -> httpx.Response:
    return httpx.get(url, timeout=5, headers=KEYED, **kwargs)  # type: ignore[arg-type]


def test_sandbox_listens_on_loopback_only(sandbox: Sandbox) -> None:
    assert sandbox.url.startswith("http://127.0.0.1:")


def test_reference_api_returns_the_record_with_general_field_names(sandbox: Sandbox) -> None:
    body = ev.payment_confirmed("C-77", Decimal("12500.50"), AT, transaction_id="TX-9",
                                customer_reference="order-1")
    sandbox.state.record_general(body)
    answer = get(f"{sandbox.url}/api/v1/payment/reference/C-77")
    assert answer.status_code == 200
    envelope = jsonenc.loads(answer.text)
    assert envelope["success"] is True and envelope["code"] == 1000 and envelope["message"]
    data = envelope["data"]
    assert data["amount"] == Decimal("12500.50")  # exact, not a float
    assert b'"amount":12500.50' in answer.content
    for key in ("reference", "status", "event", "code", "transactionId", "customerReference",
                "service", "type", "timestamp"):
        assert data[key] == body[key]
    assert "payloadSignature" not in data


def test_reference_api_answers_not_found_for_an_unknown_reference(sandbox: Sandbox) -> None:
    answer = get(f"{sandbox.url}/api/v1/payment/reference/NOPE")
    assert answer.status_code == 404
    envelope = answer.json()
    assert envelope["success"] is False and 1000 <= envelope["code"] <= 1999
    assert set(envelope) == {"success", "code", "message", "data"}


@pytest.mark.parametrize(("method", "path"), [
    ("POST", "/api/v1/waba/webhook-secrets/100001/rotate"),
    ("GET", "/api/v1/payment/reference/C-77"),
    ("PATCH", "/api/v1/waba/phone-numbers/100004"),
    ("GET", "/api/v1/waba/messages/media-1/media"),
])
def test_every_api_route_refuses_a_missing_or_wrong_api_token(
        sandbox: Sandbox, method: str, path: str) -> None:
    """Asked for on the rotate call alone, a client that lost the header (or a wrong
    HOOKLEDGER_API_KEY) looked as if it worked against the sandbox."""
    sandbox.state.record_general(ev.payment_confirmed("C-77", Decimal(1500), AT,
                                                      transaction_id="TX-1"))
    sandbox.state.issue_media("media-1", "document")
    for headers in ({}, {"apiToken": "wrong"}):
        answer = httpx.request(method, f"{sandbox.url}{path}", headers=headers,
                               json={"webhookUrl": "http://127.0.0.1:9/hook"}, timeout=5)
        assert answer.status_code == 401 and answer.json()["code"] == 40101
    number = sandbox.state.number("100004")
    assert number is None or number.webhook_url != "http://127.0.0.1:9/hook"


def test_rotation_returns_a_new_secret_once_and_later_deliveries_use_it(
        sandbox: Sandbox) -> None:
    """Queued deliveries keep the old secret; deliveries queued after rotation use the new."""
    with recording_receiver() as receiver:
        old = sandbox.state.connect_number("100001", webhook_url=f"{receiver.url}/hook").secret
        status = ev.chat_status(waba_id="w", phone_number_id="100001", message_id="m1",
                                status="sent", at=AT, recipient_id="2557")
        sandbox.dispatcher.pause()
        sandbox.queue_chat("100001", status, delivery_id="before")
        answer = httpx.post(f"{sandbox.url}/api/v1/waba/webhook-secrets/100001/rotate",
                            headers={"apiToken": API_KEY}, timeout=5)
        assert answer.status_code == 200
        new = answer.json()["data"]["secret"]
        assert new and new != old
        sandbox.queue_chat("100001", status, delivery_id="after")
        sandbox.dispatcher.resume()
        sandbox.dispatcher.drain(10)
        by_id = {r.headers["x-service-delivery-id"]: r for r in receiver.received}
        for delivery_id, secret in (("before", old), ("after", new)):
            got = by_id[delivery_id]
            t = int(got.headers["x-service-signature"].split(",")[0][2:])
            assert got.headers["x-service-signature"] == chat_signature(secret, got.body, t)
        again = httpx.post(f"{sandbox.url}/api/v1/waba/webhook-secrets/100001/rotate",
                           headers={"apiToken": API_KEY}, timeout=5).json()["data"]["secret"]
        assert again != new  # each rotation issues a fresh secret; none is ever re-shown


def test_chat_deliveries_are_retried_with_increasing_attempt_numbers(sandbox: Sandbox) -> None:
    with recording_receiver() as receiver:
        receiver.statuses = [500, 503]
        sandbox.state.connect_number("100002", webhook_url=f"{receiver.url}/hook")
        body = ev.chat_status(waba_id="w", phone_number_id="100002", message_id="m2",
                              status="read", at=AT, recipient_id="2557")
        delivery = sandbox.queue_chat("100002", body, delivery_id="d-retry")
        sandbox.dispatcher.drain(10)
        assert delivery is not None and delivery.state == "delivered"
        assert [r.headers["x-service-attempt"] for r in receiver.received] == ["1", "2", "3"]
        assert {r.headers["x-service-delivery-id"] for r in receiver.received} == {"d-retry"}
        assert {r.headers["user-agent"] for r in receiver.received} == {
            "service-chat-webhook/1.0"}


def test_chat_delivery_is_dead_lettered_after_the_last_retry() -> None:
    with running_sandbox(retry_scale=1e-5) as sandbox, recording_receiver() as receiver:
        receiver.statuses = [500] * 10
        sandbox.state.connect_number("100003", webhook_url=f"{receiver.url}/hook")
        body = ev.chat_status(waba_id="w", phone_number_id="100003", message_id="m3",
                              status="sent", at=AT, recipient_id="2557")
        delivery = sandbox.queue_chat("100003", body, delivery_id="d-dead")
        sandbox.dispatcher.drain(15)
        assert delivery is not None and delivery.state == "dead"
        assert len(receiver.received) == 6  # the first attempt and five retries


def test_a_number_without_webhook_url_records_a_dead_delivery_never_sent(
        sandbox: Sandbox) -> None:
    sandbox.state.connect_number("100009")
    assert sandbox.queue_chat("100009", {"type": "status"}, delivery_id="d-none") is None
    assert sandbox.dispatcher.dead_without_url == ["d-none"]


@pytest.mark.parametrize("field", ["webhookUrl", "webhook_url", "url"])
def test_patch_phone_number_sets_the_webhook_url_under_each_accepted_name(
        sandbox: Sandbox, field: str) -> None:
    answer = httpx.patch(f"{sandbox.url}/api/v1/waba/phone-numbers/100004",
                         json={field: "http://127.0.0.1:9/hook"}, headers=KEYED, timeout=5)
    assert answer.status_code == 200 and answer.json()["data"]["webhookUrl"] == \
        "http://127.0.0.1:9/hook"
    number = sandbox.state.number("100004")
    assert number is not None and number.webhook_url == "http://127.0.0.1:9/hook"


def test_patch_phone_number_without_a_url_is_a_bad_request(sandbox: Sandbox) -> None:
    answer = httpx.patch(f"{sandbox.url}/api/v1/waba/phone-numbers/100004",
                         json={"other": "x"}, headers=KEYED, timeout=5)
    assert answer.status_code == 400 and answer.json()["success"] is False


def test_media_endpoint_serves_deterministic_bytes_of_the_media_kind(sandbox: Sandbox) -> None:
    sandbox.state.issue_media("media-1", "document")
    first = get(f"{sandbox.url}/api/v1/waba/messages/media-1/media")
    second = get(f"{sandbox.url}/api/v1/waba/messages/media-1/media")
    assert first.status_code == 200 and first.headers["content-type"] == "application/pdf"
    assert first.content == second.content == media_bytes("media-1")
    assert media_bytes("media-2") != first.content


def test_media_endpoint_answers_not_found_for_an_unissued_id(sandbox: Sandbox) -> None:
    answer = get(f"{sandbox.url}/api/v1/waba/messages/never/media")
    assert answer.status_code == 404 and answer.json()["code"] == 1404


# -- fault switches ----------------------------------------------------------------------

def test_latency_switch_delays_every_answer(sandbox: Sandbox) -> None:
    sandbox.faults.set(latency_ms=300)
    started = time.monotonic()
    answer = get(f"{sandbox.url}/api/v1/payment/reference/X")
    assert time.monotonic() - started >= 0.3 and answer.status_code == 404
    sandbox.faults.clear()
    started = time.monotonic()
    get(f"{sandbox.url}/api/v1/payment/reference/X")
    assert time.monotonic() - started < 0.3


def test_trickle_switch_sends_each_answer_a_byte_at_a_time(sandbox: Sandbox) -> None:
    sandbox.faults.set(trickle_ms=10)
    started = time.monotonic()
    answer = get(f"{sandbox.url}/api/v1/payment/reference/X")
    assert answer.status_code == 404 and answer.json()["code"] == 1404
    assert time.monotonic() - started >= 0.01 * len(answer.content)
    sandbox.faults.set(trickle_ms=10, error_count=1)
    assert get(f"{sandbox.url}/api/v1/payment/reference/X").json()["code"] == 50003


def test_error_count_switch_answers_exactly_that_many_5xx(sandbox: Sandbox) -> None:
    sandbox.faults.set(error_count=2, error_status=502)
    statuses = [get(f"{sandbox.url}/api/v1/payment/reference/X").status_code
                for _ in range(4)]
    assert statuses == [502, 502, 404, 404]


def test_error_rate_switch_answers_about_that_fraction_of_5xx(sandbox: Sandbox) -> None:
    sandbox.faults.set(error_rate=0.5, seed=3)
    with httpx.Client(timeout=5, headers=KEYED) as client:
        statuses = [client.get(f"{sandbox.url}/api/v1/payment/reference/X").status_code
                    for _ in range(60)]
    errors = statuses.count(503)
    assert 15 <= errors <= 45 and errors + statuses.count(404) == 60


def test_rate_limit_switch_answers_429_with_retry_after(sandbox: Sandbox) -> None:
    sandbox.faults.set(rate_limit_count=1, retry_after_s=7)
    limited = get(f"{sandbox.url}/api/v1/payment/reference/X")
    assert limited.status_code == 429 and limited.headers["retry-after"] == "7"
    assert limited.json()["success"] is False
    assert get(f"{sandbox.url}/api/v1/payment/reference/X").status_code == 404


def test_timeout_switch_hangs_longer_than_the_client_waits(sandbox: Sandbox) -> None:
    sandbox.faults.set(timeout_count=1, hang_s=1.5)
    with pytest.raises(httpx.ReadTimeout):
        httpx.get(f"{sandbox.url}/api/v1/payment/reference/X", timeout=0.3, headers=KEYED)
    assert get(f"{sandbox.url}/api/v1/payment/reference/X").status_code == 404


def test_malformed_non_json_switch_answers_a_body_that_is_not_json(sandbox: Sandbox) -> None:
    sandbox.faults.set(malformed_count=1, malformed_kind="non_json")
    answer = get(f"{sandbox.url}/api/v1/payment/reference/X")
    assert answer.status_code == 200
    with pytest.raises(ValueError):
        answer.json()


def test_malformed_missing_fields_switch_answers_an_incomplete_envelope(
        sandbox: Sandbox) -> None:
    sandbox.faults.set(malformed_count=1, malformed_kind="missing_fields")
    envelope = get(f"{sandbox.url}/api/v1/payment/reference/X").json()
    assert not {"code", "message", "data"} & set(envelope)


def test_faults_are_set_and_cleared_over_http_and_never_hit_the_control_route(
        sandbox: Sandbox) -> None:
    answer = httpx.post(f"{sandbox.url}/_sandbox/faults", json={"error_count": 1}, timeout=5)
    assert answer.status_code == 200 and answer.json()["data"]["remaining"]["error"] == 1
    assert httpx.get(f"{sandbox.url}/_sandbox/faults", timeout=5).status_code == 200
    assert get(f"{sandbox.url}/api/v1/payment/reference/X").status_code == 503
    httpx.post(f"{sandbox.url}/_sandbox/faults", json={"error_count": 1}, timeout=5)
    httpx.delete(f"{sandbox.url}/_sandbox/faults", timeout=5)
    assert get(f"{sandbox.url}/api/v1/payment/reference/X").status_code == 404


def test_unknown_fault_switches_are_refused(sandbox: Sandbox) -> None:
    answer = httpx.post(f"{sandbox.url}/_sandbox/faults", json={"explode": 1}, timeout=5)
    assert answer.status_code == 400


def test_faults_given_at_start_apply_from_the_first_answer() -> None:
    with running_sandbox(faults=FaultSettings(error_count=1)) as running:
        assert get(f"{running.url}/api/v1/payment/reference/X").status_code == 503
