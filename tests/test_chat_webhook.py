"""POST /webhooks/chat/{phoneNumberId} through a real HTTP server and a real database."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import structlog
from psycopg_pool import AsyncConnectionPool

from hookledger import logs
from ingest.chat_api import webhook_path_warning, webhook_url_problem
from ingest.chat_secrets import ChatSecretStore, fingerprint
from tests.chat_events import PHONE, chat_header, encode, inbound, status
from tests.chat_live import wait_for
from tests.dbutil import refuse_event_type
from tests.live import running_service

SECRETS = {PHONE: "chat-secret-alpha-1", "2000000002": "chat-secret-beta-2",
           "3000000003": "chat-secret-gamma-3"}
GRACE = 600


@pytest.fixture
def service(db_url: str) -> Iterator[str]:
    with running_service(db_url, chat_secrets=SECRETS, rotation_grace_s=GRACE,
                         max_body_bytes=64 * 1024) as base:
        yield base


def post(base: str, phone: str, raw: bytes, *, secret: str | None = None,
         t: int | None = None, delivery_id: str | None = "dlv-1", attempt: int = 1,
         headers: dict[str, str] | dict[str, bytes] | None = None) -> httpx.Response:
    sent: dict[str, str | bytes] = {
        "content-type": "application/json", "user-agent": "service-chat-webhook/1.0",
        "x-service-attempt": str(attempt)}
    if delivery_id is not None:
        sent["x-service-delivery-id"] = delivery_id
    if secret is not None:
        sent["x-service-signature"] = chat_header(secret, raw, t or int(time.time()))
    sent.update(headers or {})
    return httpx.post(f"{base}/webhooks/chat/{phone}", content=raw, headers=sent, timeout=10)


def rows(db_url: str, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(db_url) as conn:
        return conn.execute(sql, params).fetchall()


def count(db_url: str) -> int:
    return int(rows(db_url, "SELECT count(*) FROM hookledger.ledger")[0][0])


def test_an_inbound_message_is_accepted_and_kept_with_source_chat(service: str,
                                                                  db_url: str) -> None:
    raw = encode(inbound("image"))
    answer = post(service, PHONE, raw, secret=SECRETS[PHONE], attempt=3)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["status"] == "accepted" and body["duplicate"] is False
    [(position, stream, event_type, source, raw_body, verified_by, endpoint, key, facts,
      occurred)] = rows(db_url, "SELECT position, stream, event_type, source, raw_body, "
                                "verified_by, endpoint, dedupe_key, facts, occurred_at "
                                "FROM hookledger.ledger")
    assert position == body["position"]
    assert (stream, event_type, source) == ("chat-message:wamid.IN1", "chat.message.received",
                                            "chat")
    assert bytes(raw_body) == raw
    assert verified_by == fingerprint(SECRETS[PHONE]) and endpoint == f"chat/{PHONE}"
    assert key == "chat:delivery:dlv-1"
    assert facts["attempt"] == 3 and facts["user_agent"] == "service-chat-webhook/1.0"
    assert facts["media_id"] == "media-image-1" and facts["code"] == 95003
    assert occurred == datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC)


def test_statuses_of_one_message_share_its_stream_and_unknown_types_are_kept(
        service: str, db_url: str) -> None:
    for i, value in enumerate(["sent", "read", "delivered"]):
        raw = encode(status(value))
        assert post(service, PHONE, raw, secret=SECRETS[PHONE],
                    delivery_id=f"st-{i}").status_code == 200
    raw = encode({"type": "reaction", "phoneNumberId": PHONE})
    assert post(service, PHONE, raw, secret=SECRETS[PHONE], delivery_id="x").status_code == 200
    assert rows(db_url, "SELECT stream, event_type, facts->>'code' FROM hookledger.ledger") == [
        ("chat-message:wamid.OUT1", "chat.message.sent", "95000"),
        ("chat-message:wamid.OUT1", "chat.message.read", "95002"),
        ("chat-message:wamid.OUT1", "chat.message.delivered", "95001"),
        (f"chat-unrecognised:{PHONE}", "chat.unrecognised", None),
    ]


def test_retries_of_one_delivery_id_are_one_ledger_event(service: str, db_url: str) -> None:
    """Attempts 1..5, each signed anew as the provider does, are answered duplicate after 1."""
    raw = encode(status("delivered"))
    answers = [post(service, PHONE, raw, secret=SECRETS[PHONE], delivery_id="evt-42",
                    attempt=attempt, t=int(time.time()) - attempt)
               for attempt in range(1, 6)]
    assert [a.status_code for a in answers] == [200] * 5
    assert [a.json()["duplicate"] for a in answers] == [False, True, True, True, True]
    assert len({a.json()["position"] for a in answers}) == 1
    assert count(db_url) == 1
    assert rows(db_url, "SELECT facts->>'attempt' FROM hookledger.ledger") == [("1",)]


@pytest.mark.slow
def test_a_retry_storm_keeps_exactly_one_event_per_delivery_id(service: str,
                                                               db_url: str) -> None:
    deliveries = 200
    retries = 4

    connections = 64
    sends = []
    for attempt in range(1, retries + 1):
        for n in range(deliveries):
            phone = list(SECRETS)[n % 3]
            sends.append((phone, n, attempt))
    random.Random(7).shuffle(sends)  # retries race their first attempts

    async def storm() -> list[httpx.Response]:
        # as many in flight as connections, as a sender's pool has: 800 requests queued on
        # httpx's pool at once starve its event loop (its queue is scanned per release),
        # leaving connections idle for seconds between requests
        gate = asyncio.Semaphore(connections)
        limits = httpx.Limits(max_connections=connections)
        async with httpx.AsyncClient(timeout=30, limits=limits) as client:
            async def send(phone: str, n: int, attempt: int) -> httpx.Response:
                raw = encode(status("read", message_id=f"wamid.S{n}", phone=phone))
                async with gate:
                    return await client.post(
                        f"{service}/webhooks/chat/{phone}", content=raw, headers={
                            "x-service-signature": chat_header(SECRETS[phone], raw,
                                                               int(time.time())),
                            "x-service-delivery-id": f"storm-{n}",
                            "x-service-attempt": str(attempt)})
            return await asyncio.gather(*(send(*each) for each in sends))

    answers = asyncio.run(storm())
    assert {a.status_code for a in answers} == {200}
    assert sum(not a.json()["duplicate"] for a in answers) == deliveries
    assert count(db_url) == deliveries
    assert rows(db_url, "SELECT count(DISTINCT dedupe_key) FROM hookledger.ledger") == [
        (deliveries,)]


def test_numbers_never_verify_with_each_others_secret(service: str, db_url: str) -> None:
    numbers = list(SECRETS)
    for phone in numbers:
        for other in numbers:
            raw = encode(status("sent", phone=phone, message_id=f"m-{phone}"))
            answer = post(service, phone, raw, secret=SECRETS[other],
                          delivery_id=f"{phone}-{other}")
            if other == phone:
                assert answer.status_code == 200
            else:
                assert answer.status_code == 401
                assert answer.json()["reason"] == "bad_signature"
    assert rows(db_url, "SELECT endpoint, verified_by FROM hookledger.ledger") == [
        (f"chat/{p}", fingerprint(SECRETS[p])) for p in numbers]
    assert count(db_url) == 3


def insert_retired(db_url: str, phone: str, secret: str, retired_ago: timedelta) -> None:
    retired_at = datetime.now(UTC) - retired_ago
    with psycopg.connect(db_url) as conn:
        conn.execute(
            "INSERT INTO hookledger_private.chat_secrets "
            "(phone_number_id, secret, label, source, created_at, retired_at) "
            "VALUES (%s, %s, %s, 'bootstrap', %s, %s)",
            (phone, secret, fingerprint(secret), retired_at - timedelta(days=1), retired_at))


def test_a_retired_secret_verifies_inside_the_grace_period_and_not_after(
        service: str, db_url: str) -> None:
    insert_retired(db_url, PHONE, "recently-retired-secret", timedelta(seconds=GRACE - 60))
    insert_retired(db_url, PHONE, "long-retired-secret", timedelta(seconds=GRACE + 60))
    raw = encode(inbound())
    recent = post(service, PHONE, raw, secret="recently-retired-secret", delivery_id="a")
    old = post(service, PHONE, raw, secret="long-retired-secret", delivery_id="b")
    current = post(service, PHONE, raw, secret=SECRETS[PHONE], delivery_id="c")
    assert recent.status_code == 200 and current.status_code == 200
    assert old.status_code == 401 and old.json()["reason"] == "bad_signature"
    assert rows(db_url, "SELECT verified_by FROM hookledger.ledger ORDER BY position") == [
        (fingerprint("recently-retired-secret"),), (fingerprint(SECRETS[PHONE]),)]


def rotate(db_url: str, phone: str, new_secret: str) -> None:
    """Store a rotated secret as the CLI will, from outside the service's process."""
    async def run() -> None:
        async with AsyncConnectionPool(db_url, min_size=1, max_size=1, open=False,
                                       kwargs={"autocommit": True}) as pool:
            await ChatSecretStore(pool, grace_s=GRACE).store_rotated(
                phone, new_secret, datetime.now(UTC))
    asyncio.run(run())


def test_after_a_rotation_the_new_secret_verifies_at_once_and_the_old_one_still(
        service: str, db_url: str) -> None:
    raw = encode(inbound())
    assert post(service, PHONE, raw, secret=SECRETS[PHONE], delivery_id="r0").status_code == 200

    rotate(db_url, PHONE, "chat-secret-alpha-rotated")
    rotated_at = time.monotonic()
    while True:  # the service's cache lets a rotation in within about a second
        answer = post(service, PHONE, raw, secret="chat-secret-alpha-rotated",
                      delivery_id="r1")
        if answer.status_code == 200 or time.monotonic() - rotated_at > 5:
            break
        time.sleep(0.1)
    assert answer.status_code == 200
    assert time.monotonic() - rotated_at < 2.5
    assert post(service, PHONE, raw, secret=SECRETS[PHONE], delivery_id="r2").status_code == 200


@pytest.mark.parametrize(("phone", "headers", "raw", "sign_with", "status", "reason"), [
    ("4040404040", {}, encode(inbound()), SECRETS[PHONE], 401, "unknown_phone_number"),
    ("not..valid", {}, encode(inbound()), SECRETS[PHONE], 401, "unknown_phone_number"),
    (PHONE, {}, encode(inbound()), None, 401, "missing_signature"),
    (PHONE, {"x-service-signature": "garbage"}, encode(inbound()), None, 401,
     "malformed_signature"),
    (PHONE, {"x-service-signature": "v1=" + "a" * 64}, encode(inbound()), None, 401,
     "missing_timestamp"),
    (PHONE, {"x-service-signature": "t=1,t=2,v1=" + "a" * 64}, encode(inbound()), None, 401,
     "duplicate_timestamp"),
    (PHONE, {"x-service-signature": "t=1,v1=" + "a" * 64 + ",v1=" + "b" * 64},
     encode(inbound()), None, 401, "multiple_v1"),
    (PHONE, {"x-service-signature": "t=x,v1=" + "a" * 64}, encode(inbound()), None, 401,
     "malformed_timestamp"),
    (PHONE, {"x-service-signature": "t=1"}, encode(inbound()), None, 401, "missing_v1"),
    (PHONE, {"x-service-signature": "t=1,v1=" + "z" * 64}, encode(inbound()), None, 401,
     "malformed_v1"),
    (PHONE, {"x-service-signature": "t=1,v1=abc"}, encode(inbound()), None, 401,
     "wrong_length_v1"),
    (PHONE, {}, encode(inbound()), "some-other-secret", 401, "bad_signature"),
    (PHONE, {}, encode(inbound(phone="2000000002")), SECRETS[PHONE], 400,
     "phone_number_mismatch"),
    (PHONE, {}, b"not json", SECRETS[PHONE], 400, "invalid_json"),
    (PHONE, {"content-encoding": "gzip"}, encode(inbound()), SECRETS[PHONE], 415,
     "unsupported_content_encoding"),
    (PHONE, {"content-encoding": "gzip"}, encode(inbound()), "some-other-secret", 401,
     "bad_signature"),
    (PHONE, {}, b'{"pad":"' + b"x" * 70_000 + b'"}', SECRETS[PHONE], 413, "body_too_large"),
])
def test_refusals_are_answered_and_recorded_with_their_reason(
        service: str, db_url: str, phone: str, headers: dict[str, str], raw: bytes,
        sign_with: str | None, status: int, reason: str) -> None:
    answer = post(service, phone, raw, secret=sign_with, headers=headers)
    assert answer.status_code == status
    assert answer.json() == {"status": "refused", "reason": reason}
    assert count(db_url) == 0
    [(endpoint, got, verified, http_status)] = rows(
        db_url, "SELECT endpoint, reason, verified, http_status "
                "FROM hookledger.rejected_deliveries")
    assert (endpoint, got, http_status) == (f"chat/{phone}", reason, status)
    assert verified is (status in (400, 415))


def test_a_trailing_slash_is_the_same_number(service: str, db_url: str) -> None:
    """Starlette answered it 307 and kept nothing of it."""
    raw = encode(inbound())
    answer = post(service, PHONE + "/", raw, secret=SECRETS[PHONE])
    assert answer.status_code == 200, answer.text
    assert answer.json()["duplicate"] is False
    assert post(service, PHONE, raw, secret=SECRETS[PHONE]).json()["duplicate"] is True
    assert rows(db_url, "SELECT endpoint FROM hookledger.ledger") == [(f"chat/{PHONE}",)]
    assert rows(db_url, "SELECT count(*) FROM hookledger.rejected_deliveries") == [(0,)]


@pytest.mark.parametrize("path", ["", f"{PHONE}/x", f"{PHONE}//"])
def test_a_path_under_the_prefix_that_names_no_number_is_refused_and_recorded(
        service: str, db_url: str, path: str) -> None:
    answer = post(service, path, encode(inbound()), secret=SECRETS[PHONE])
    assert answer.status_code == 401 and "location" not in answer.headers
    assert answer.json() == {"status": "refused", "reason": "unknown_phone_number"}
    assert count(db_url) == 0
    assert rows(db_url, "SELECT endpoint, reason FROM hookledger.rejected_deliveries") == [
        (f"chat/{path}", "unknown_phone_number")]



def test_the_bare_prefix_is_refused_and_recorded(service: str, db_url: str) -> None:
    """``/webhooks/chat`` with no number: once Starlette's 404, kept nowhere."""
    raw = encode(inbound())
    answer = httpx.post(f"{service}/webhooks/chat", content=raw, timeout=10, headers={
        "x-service-signature": chat_header(SECRETS[PHONE], raw, int(time.time())),
        "x-service-delivery-id": "dlv-bare"})
    assert answer.status_code == 401
    assert answer.json() == {"status": "refused", "reason": "unknown_phone_number"}
    assert rows(db_url, "SELECT endpoint, reason FROM hookledger.rejected_deliveries") == [
        ("chat/", "unknown_phone_number")]

def test_a_known_type_with_unreadable_fields_is_kept_flagged_and_reported(
        service: str, db_url: str) -> None:
    """The platform would send it five times and then give up: it is kept, once."""
    raw = encode(inbound(message_id="wamid.BAD", timestamp=5))
    for _ in range(2):
        answer = post(service, PHONE, raw, secret=SECRETS[PHONE],
                      headers={"x-service-delivery-id": "dlv-bad-1"})
        assert answer.status_code == 200, answer.text
    [(event_type, stored, facts, stream)] = rows(
        db_url, "SELECT event_type, raw_body, facts, stream FROM hookledger.ledger "
                "WHERE source = 'chat'")  # not the projector's discrepancy for it
    assert (event_type, bytes(stored), stream) == ("chat.malformed", raw,
                                                   "chat-message:wamid.BAD")
    assert (facts["reason"], facts["malformed"], facts["kind"]) == ("invalid_field", True,
                                                                     "message")
    assert rows(db_url, "SELECT count(*) FROM hookledger.rejected_deliveries") == [(0,)]
    found = wait_for(lambda: rows(
        db_url, "SELECT kind, subject, reference FROM hookledger.discrepancies"))
    assert found == [("malformed_delivery", "chat", "wamid.BAD")]
    assert rows(db_url, "SELECT count(*) FROM hookledger.chat_messages") == [(0,)]


def test_numeric_descriptive_fields_are_projected_not_kept_malformed(
        service: str, db_url: str) -> None:
    """A ``failed`` status whose ``recipient_id`` and an inbound message whose ``wabaId``
    came as JSON numbers were ``chat.malformed``: the message stayed ``sent`` and the
    customer's 24-hour window never opened. Both only describe: read as their text."""
    now = int(time.time())
    failed = status("failed", message_id="wamid.NUM", timestamp=str(now - 50),
                    errors=[{"code": 131026, "title": "Undeliverable"}])
    failed["status"]["recipient_id"] = 255700000033
    written = inbound(message_id="wamid.NUM.IN", timestamp=str(now - 60))
    written["wabaId"] = 2001234567
    written["contactWaId"] = written["message"]["from"] = "255700000033"
    sent = status("sent", message_id="wamid.NUM", timestamp=str(now - 100))
    for i, body in enumerate([sent, failed, written]):
        answer = post(service, PHONE, encode(body), secret=SECRETS[PHONE],
                      delivery_id=f"dlv-num-{i}")
        assert answer.status_code == 200, answer.text
    assert rows(db_url, "SELECT event_type, facts->>'waba_id' FROM hookledger.ledger "
                        "WHERE source = 'chat' ORDER BY position") == [
        ("chat.message.sent", "waba-1"), ("chat.message.failed", "waba-1"),
        ("chat.message.received", "2001234567")]
    message = wait_for(lambda: rows(
        db_url, "SELECT status, code, contact_wa_id FROM hookledger.chat_messages "
                "WHERE message_id = 'wamid.NUM' AND status = 'failed'"))
    assert message == [("failed", 95057, "255700000033")]
    thread = wait_for(lambda: rows(
        db_url, "SELECT contact_wa_id, window_open, last_message_id "
                "FROM hookledger.chat_threads"))
    assert thread == [("255700000033", True, "wamid.NUM.IN")]
    assert rows(db_url, "SELECT count(*) FROM hookledger.discrepancies "
                        "WHERE kind = 'malformed_delivery'") == [(0,)]


@pytest.mark.parametrize("unusable", [b"x" * 300, "d\u00e9livery".encode("latin-1"), b"d-\t-1"])
def test_an_unusable_delivery_id_is_kept_once_keyed_by_the_body(
        service: str, db_url: str, unusable: bytes) -> None:
    """A 400 would be resent five times and then dropped by the platform: the event is kept,
    and its copies still fold into one by the body's digest."""
    raw = encode(inbound(message_id="wamid.ODDID"))
    answers = [post(service, PHONE, raw, secret=SECRETS[PHONE],
                    headers={"x-service-delivery-id": unusable}, attempt=attempt)
               for attempt in (1, 2)]
    assert [a.status_code for a in answers] == [200, 200], answers[0].text
    assert [a.json()["duplicate"] for a in answers] == [False, True]
    [(key, facts)] = rows(db_url, "SELECT dedupe_key, facts FROM hookledger.ledger")
    assert key == "chat:body:" + facts["content_sha256"]
    assert (facts["delivery_id"], facts["delivery_id_unusable"]) == (None, True)
    assert rows(db_url, "SELECT count(*) FROM hookledger.rejected_deliveries") == [(0,)]


def test_half_an_emoji_in_a_message_text_is_mended_and_opens_the_window(
        service: str, db_url: str) -> None:
    """Half an emoji (a lone surrogate, which jsonb cannot hold) in the text and in the
    customer's name only describes the message: it is read with U+FFFD in its place, and
    the customer who just wrote has an open window, as for any inbound message."""
    body = inbound(message_id="wamid.HALF", text={"body": "Asante @HALF"},
                   timestamp=str(int(time.time())))
    body["profileName"] = "Asha @HALF"
    raw = encode(body).replace(b"@HALF", b"\\ud83d")
    answers = [post(service, PHONE, raw, secret=SECRETS[PHONE]) for _ in range(2)]
    assert [a.status_code for a in answers] == [200, 200], answers[0].text
    assert [a.json()["duplicate"] for a in answers] == [False, True]
    [(event_type, stored, facts)] = rows(
        db_url, "SELECT event_type, raw_body, facts FROM hookledger.ledger "
                "WHERE source = 'chat'")
    assert (event_type, bytes(stored)) == ("chat.message.received", raw)
    assert facts["repaired_fields"] == ["message.text.body", "profileName"]
    assert (facts["body"], facts["profile_name"]) == ("Asante \ufffd", "Asha \ufffd")
    assert wait_for(lambda: rows(
        db_url, "SELECT profile_name, window_open FROM hookledger.chat_threads")) == [
        ("Asha \ufffd", True)]
    assert rows(db_url, "SELECT body FROM hookledger.chat_messages") == [("Asante \ufffd",)]


def test_a_chat_body_jsonb_cannot_hold_is_kept_by_its_raw_bytes_unless_for_another_number(
        service: str, db_url: str) -> None:
    """A NUL in the customer's id cannot be mended (it would file the message under an id
    the platform never sent), yet the platform would retry and then drop the delivery, so
    it is kept by its raw bytes."""
    raw = encode(inbound(message_id="wamid.HALF")).replace(b'"contactWaId":"255712345678"',
                                                           b'"contactWaId":"2557\\u0000"')
    assert b"\\u0000" in raw
    answers = [post(service, PHONE, raw, secret=SECRETS[PHONE]) for _ in range(2)]
    assert [a.status_code for a in answers] == [200, 200], answers[0].text
    assert [a.json()["duplicate"] for a in answers] == [False, True]
    [(event_type, stored, facts, stream)] = rows(
        db_url, "SELECT event_type, raw_body, facts, stream FROM hookledger.ledger "
                "WHERE source = 'chat'")  # not the projector's discrepancy for it
    assert (event_type, bytes(stored), stream) == ("chat.malformed", raw,
                                                   "chat-message:wamid.HALF")
    assert (facts["reason"], facts["unstorable"], facts["kind"]) == (
        "nul_character", True, "message")
    elsewhere = encode(inbound(phone="2000000002", text={"body": "\u0000"}))
    refused = post(service, PHONE, elsewhere, secret=SECRETS[PHONE], delivery_id="dlv-2")
    assert refused.status_code == 400 and refused.json()["reason"] == "phone_number_mismatch"
    assert rows(db_url, "SELECT count(*) FROM hookledger.ledger WHERE source = 'chat'") == [
        (1,)]


def test_a_chat_event_the_database_refuses_is_kept_by_its_raw_bytes_not_refused(
        service: str, db_url: str) -> None:
    """Should strict reading miss a body the database refuses, the delivery is kept as
    unstorable rather than answered 503 until the platform gives up on it."""
    refuse_event_type(db_url, "chat.message.received")
    raw = encode(inbound(message_id="wamid.REFUSED"))
    answer = post(service, PHONE, raw, secret=SECRETS[PHONE])
    assert answer.status_code == 200, answer.text
    [(event_type, stored, facts, stream)] = rows(
        db_url, "SELECT event_type, raw_body, facts, stream FROM hookledger.ledger "
                "WHERE source = 'chat'")
    assert (event_type, bytes(stored), stream) == ("chat.malformed", raw,
                                                   "chat-message:wamid.REFUSED")
    assert (facts["reason"], facts["unstorable"]) == ("refused_by_database", True)


def test_a_stale_but_genuine_delivery_is_refused_as_stale(service: str, db_url: str) -> None:
    """Refused, but recorded as the authentic delivery it is: verified, and its body kept
    past the 1 KiB an unverified one keeps."""
    raw = encode(inbound(text={"body": "x" * 3000}))
    for t in (int(time.time()) - 400, int(time.time()) + 400, int(time.time()) - 500):
        answer = post(service, PHONE, raw, secret=SECRETS[PHONE], t=t)
        assert answer.status_code == 401 and answer.json()["reason"] == "stale_timestamp"
    # the first copy whole; later copies (anyone holding one genuine delivery can replay
    # it stale for ever) as short as an unverified body, so a replay cannot fill the table
    assert rows(db_url, "SELECT reason, verified, octet_length(body_prefix), body_size "
                        "FROM hookledger.rejected_deliveries ORDER BY id") == [
        ("stale_timestamp", True, len(raw), len(raw)),
        ("stale_timestamp", True, 1024, len(raw)), ("stale_timestamp", True, 1024, len(raw))]
    assert count(db_url) == 0
    forged = post(service, PHONE, raw, secret="not-the-secret", t=int(time.time()) - 400)
    assert forged.json()["reason"] == "bad_signature"
    [(verified, kept)] = rows(db_url, "SELECT verified, octet_length(body_prefix) "
                                      "FROM hookledger.rejected_deliveries "
                                      "WHERE reason = 'bad_signature'")
    assert (verified, kept) == (False, 1024)


def test_an_unavailable_ledger_is_503_never_200(db_url: str, tmp_path: Path) -> None:
    """With no spool to take it either (a missing table is the database unavailable, and
    spooled when the spool can: test_spool)."""
    with running_service(db_url, chat_secrets=SECRETS, rotation_grace_s=GRACE,
                         home=tmp_path) as service:
        [spool] = (tmp_path / "spool").glob("db-*")
        spool.rmdir()
        spool.write_text("a file where the spool folder should be")  # even root cannot
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute("ALTER TABLE hookledger_private.ledger_events RENAME TO ledger_away")
            try:
                answer = post(service, PHONE, encode(inbound()), secret=SECRETS[PHONE])
            finally:
                conn.execute(
                    "ALTER TABLE hookledger_private.ledger_away RENAME TO ledger_events")
        assert answer.status_code == 503
        answer = post(service, PHONE, encode(inbound()), secret=SECRETS[PHONE])
        assert answer.status_code == 200 and answer.json()["duplicate"] is False


def test_chat_metrics_count_accepted_duplicates_and_refusals(service: str) -> None:
    raw = encode(inbound())
    post(service, PHONE, raw, secret=SECRETS[PHONE])
    post(service, PHONE, raw, secret=SECRETS[PHONE], attempt=2)
    post(service, PHONE, raw)
    post(service, "777", raw, secret=SECRETS[PHONE])
    text = httpx.get(f"{service}/metrics").text
    assert 'hookledger_deliveries_accepted_total{system="chat"} 1.0' in text
    assert 'hookledger_deliveries_duplicate_total{system="chat"} 1.0' in text
    assert ('hookledger_deliveries_refused_total{reason="missing_signature",system="chat"} 1.0'
            in text)
    assert ('hookledger_deliveries_refused_total{reason="unknown_phone_number",system="chat"}'
            ' 1.0' in text)
    for secret in SECRETS.values():
        assert secret not in text


@pytest.fixture
def json_logs(capsys: pytest.CaptureFixture[str]) -> Iterator[None]:
    logs.configure(fmt="json", level="debug", secrets=[], cache=False)  # no masker help
    yield
    structlog.reset_defaults()


def test_no_secret_in_logs_rejections_or_answers(
        db_url: str, json_logs: None, capsys: pytest.CaptureFixture[str]) -> None:
    secret = SECRETS[PHONE]
    answers = []
    with running_service(db_url, chat_secrets=SECRETS) as base:
        raw = encode(inbound())
        answers.append(post(base, PHONE, raw, secret=secret))
        answers.append(post(base, PHONE, raw, secret=secret, delivery_id=None))
        answers.append(post(base, PHONE, raw, headers={"x-service-signature": secret}))
        answers.append(post(base, PHONE, raw, secret=secret[:-1]))
        answers.append(post(base, PHONE, b"[]", secret=secret))
        answers.append(post(base, "2000000002", raw, secret=secret))
        rotate(db_url, PHONE, "rotated-secret-value-9")
    err = capsys.readouterr().err
    lines = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    events = {line["event"] for line in lines}
    assert {"chat_secret.bootstrapped", "chat_secret.rotated", "delivery.accepted",
            "delivery.refused"} <= events
    accepted = [line for line in lines if line["event"] == "delivery.accepted"]
    assert accepted[0]["verified_by"] == fingerprint(secret)
    assert accepted[0]["event_type"].startswith("chat.")
    stored = rows(db_url, "SELECT reason, detail, headers::text, body_prefix "
                          "FROM hookledger.rejected_deliveries")
    assert {r[0] for r in stored} == {"malformed_signature", "bad_signature", "not_an_object"}
    for value in [*SECRETS.values(), "rotated-secret-value-9"]:
        for where, text in [("logs", err), ("rejections", repr(stored)),
                            ("answers", "".join(a.text for a in answers))]:
            assert value not in text, (where, text[max(0, text.find(value) - 200):][:400])


def test_chat_threads_show_the_24_hour_window_against_the_current_time(
        service: str, db_url: str) -> None:
    """A customer who wrote two hours ago can be answered free-form for 22 more hours; one
    who wrote 25 hours ago cannot (a reply would fail with 95063)."""
    now = int(time.time())
    for customer, ago_s in (("255700000011", 2 * 3600), ("255700000022", 25 * 3600)):
        body = inbound(message_id=f"wamid.win.{customer}", timestamp=str(now - ago_s))
        body["contactWaId"] = body["message"]["from"] = customer
        raw = encode(body)
        assert post(service, PHONE, raw, secret=SECRETS[PHONE],
                    delivery_id=f"dlv-win-{customer}").status_code == 200
    deadline = time.monotonic() + 10
    found: list[tuple[Any, ...]] = []
    while time.monotonic() < deadline and len(found) < 2:
        found = rows(db_url, "SELECT contact_wa_id, window_open, "
                             "extract(epoch FROM window_expires_at - now())::bigint, "
                             "extract(epoch FROM window_expires_at - last_inbound_at)::bigint "
                             "FROM hookledger.chat_threads ORDER BY contact_wa_id")
        time.sleep(0.05)
    (recent, open_, left, span), (old, open_old, left_old, span_old) = found
    assert (recent, open_, span) == ("255700000011", True, 24 * 3600)
    assert 22 * 3600 - 60 < left <= 22 * 3600
    assert (old, open_old, span_old) == ("255700000022", False, 24 * 3600)
    assert -3600 - 60 < left_old <= -3600


@pytest.mark.parametrize(("url", "warned"), [
    ("https://hooks.example/webhooks/chat/1098765432", False),
    ("https://hooks.example/tenant-a/webhooks/chat/1098765432", False),  # a proxy's prefix
    ("https://hooks.example/webhooks/chat/1098765432?x=1", False),
    ("http://127.0.0.1:8080/webhooks/chat/1098765432", False),
    ("https://hooks.example/webhooks/chat/2098765432", True),  # another number
    ("https://hooks.example/webhooks/chat/10987654321", True),
    ("https://hooks.example/x/webhooks/chat/x1098765432", True),
    ("https://hooks.example/webhooks/chat/1098765432/", False),  # taken as without the slash
    ("https://hooks.example/webhooks/chat/1098765432//", True),
    ("https://hooks.example/webhooks/chat/1098765432/x", True),
    ("https://hooks.example/webhooks/general/1098765432", True),
    ("https://hooks.example/chat", True),
    ("https://hooks.example", True),
])
def test_a_webhook_url_whose_path_names_another_number_is_warned_of(url: str,
                                                                   warned: bool) -> None:
    assert webhook_url_problem(url) is None
    warning = webhook_path_warning(url, "1098765432")
    assert (warning is not None) is warned
    if warning:
        assert "/webhooks/chat/1098765432" in warning


@pytest.mark.parametrize(("url", "allowed"), [
    ("http://127.0.0.1:8080/webhooks/chat/1", True),
    ("http://127.0.0.2/webhooks/chat/1", True),
    ("http://[::1]:8080/webhooks/chat/1", True),
    ("http://localhost/webhooks/chat/1", True),
    ("http://127.example.com/webhooks/chat/1", False),
    ("http://127.0.0.1.nip.io/webhooks/chat/1", False),
    ("https://127.example.com/webhooks/chat/1", True),
])
def test_only_a_loopback_host_may_take_plain_http(url: str, allowed: bool) -> None:
    """A name that merely starts with ``127.`` resolves anywhere: it was let through as
    loopback, so deliveries signed with the number's secret could go out in clear."""
    assert (webhook_url_problem(url) is None) == allowed
