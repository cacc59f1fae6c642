"""Hostile requests, correctly signed so that they reach the parser: each one is a 4xx with
a recorded reason, never a 500, and nothing of it reaches the ledger. A signed JSON object
is not hostile, whether its fields cannot be read or jsonb cannot hold it: it is kept,
flagged, and reported.

A correctly signed JSON object is accepted whatever its Content-Type: the signature is the
proof, the provider never retries, and refusing a genuine delivery over a header would lose
it. Unsigned requests are refused 401 before anything else (test_general_webhook).
"""

from __future__ import annotations

import gzip
import json
import re
import socket
import time
from collections.abc import Iterator

import pytest

from tests.chat_live import wait_for
from tests.dbutil import refuse_event_type
from tests.general_events import encode, general_body
from tests.live import running_service
from tests.test_general_webhook import SECRETS, post, rows

GOOD = general_body("payment.confirmed", 91000, reference="HOSTILE")


@pytest.fixture
def service(db_url: str) -> Iterator[str]:
    with running_service(db_url, general_secrets=",".join(f"{k}={v}" for k, v in
                                                          SECRETS.items()),
                         max_body_bytes=64 * 1024) as base:
        yield base


def replace(field: str, raw_value: str) -> bytes:
    """The good body with one field's JSON text replaced (to write what json.dumps won't)."""
    body = dict(GOOD)
    body[field] = "@@"
    return json.dumps(body).replace('"@@"', raw_value).encode()


HOSTILE = [
    ("invalid UTF-8", b'{"reference": "\xff\xfe", "event": "payment.confirmed"}',
     "invalid_utf8"),
    ("NaN", replace("amount", "NaN"), "invalid_json"),
    ("Infinity", replace("amount", "-Infinity"), "invalid_json"),
    ("a JSON array", b"[]", "not_an_object"),
    ("empty body", b"", "invalid_json"),
    # what jsonb could not hold is kept only in a body that is one JSON object
    ("an array holding a repeated key", b'[{"a": 1, "a": 2}]', "not_an_object"),
    ("an array holding a huge integer", b"[" + b"9" * 5000 + b"]", "not_an_object"),
    ("an array nested past the reader", b"[" * 5000 + b"]" * 5000, "not_an_object"),
    ("a repeated key, the object unclosed", b'{"customer": {"a": 1, "a": 2}', "invalid_json"),
    ("a repeated key beside NaN", replace("customer", '{"a": 1, "a": 2}, "x": NaN'),
     "invalid_json"),
]

# Signed JSON objects that jsonb cannot hold as they are: kept by their raw bytes as
# general.malformed (reference read leniently when it is text jsonb can hold), never refused.
UNSTORABLE = [
    ("deeply nested", b'{"a": ' + b"[" * 5000 + b"]" * 5000 + b"}", "too_deep", None),
    ("huge number", replace("amount", "1e999999"), "number_out_of_range", "HOSTILE"),
    ("huge integer", replace("amount", "9" * 5000), "number_out_of_range", "HOSTILE"),
    ("more decimal places than numeric holds", replace("amount", "1500." + "0" * 17000),
     "number_out_of_range", "HOSTILE"),
    ("duplicate keys", replace("reference", '"A", "reference": "HOSTILE"'),
     "duplicate_json_key", "HOSTILE"),
    # strict reading passes the mark over; the lenient reading found no reference behind it
    ("a byte order mark, then duplicate keys",
     b"\xef\xbb\xbf" + replace("reference", '"A", "reference": "HOSTILE"'),
     "duplicate_json_key", "HOSTILE"),
    # past Decimal's own exponent range: answered 400 invalid_json once, and lost
    ("an exponent past Decimal's range", replace("amount", "1e99999999999999999999"),
     "number_out_of_range", "HOSTILE"),
    # the repeated key stops strict reading first; reading it leniently then raised (a 500)
    ("a repeated key, then such an exponent",
     replace("customer", '{"a": 1, "a": 2}, "x": 1E-99999999999999999999'),
     "duplicate_json_key", "HOSTILE"),
    ("NUL in the reference", replace("reference", '"A\\u0000B"'), "nul_character", None),
    ("lone surrogate in the reference", replace("reference", '"\\ud800"'), "invalid_unicode",
     None),
    # mending would invent an id the provider never sent (ingest.text_repair)
    ("half an emoji in the transaction id", replace("transactionId", '"TX-\\ud83d"'),
     "invalid_unicode", "HOSTILE"),
    ("half an emoji in a name, a NUL in the reference",
     json.dumps(dict(GOOD, reference="H@NUL", customer={"firstname": "Asha @HALF"}))
     .replace("@NUL", "\\u0000").replace("@HALF", "\\ud83d").encode(),
     "nul_character", None),
]


@pytest.mark.parametrize(("raw", "reason", "reference"),
                         [(raw, reason, ref) for _, raw, reason, ref in UNSTORABLE],
                         ids=[name for name, _, _, _ in UNSTORABLE])
def test_a_signed_object_jsonb_cannot_hold_is_kept_by_its_raw_bytes_and_reported(
        service: str, db_url: str, raw: bytes, reason: str, reference: str | None) -> None:
    answer = post(service, "primary", raw, secret=SECRETS["primary"])
    assert answer.status_code == 200, answer.text
    assert answer.json()["duplicate"] is False
    [(event_type, stored, payload, facts, stream)] = rows(
        db_url, "SELECT event_type, raw_body, payload, facts, stream FROM hookledger.ledger "
                "WHERE source = 'general'")  # not the projector's discrepancy for it
    assert (event_type, bytes(stored)) == ("general.malformed", raw)
    assert payload["unstorable"] is True and payload["reason"] == reason
    assert (facts["reason"], facts["reference"]) == (reason, reference)
    if reference:
        assert stream == "collection:HOSTILE"
    again = post(service, "primary", raw, secret=SECRETS["primary"])  # resent byte for byte
    assert again.status_code == 200 and again.json()["duplicate"] is True
    if b'"payloadSignature"' in raw:  # through another URL: only payloadSignature differs
        other = re.sub(rb'"payloadSignature": "[^"]*"', b'"payloadSignature": "b4ckup"', raw)
        assert other != raw
        via_backup = post(service, "backup", other, secret=SECRETS["backup"])
        assert via_backup.status_code == 200 and via_backup.json()["duplicate"] is True
    assert rows(db_url, "SELECT count(*) FROM hookledger.rejected_deliveries") == [(0,)]
    found = wait_for(lambda: rows(
        db_url, "SELECT kind, reference FROM hookledger.discrepancies"))
    assert found == [("malformed_delivery", reference or "")]



def test_half_an_emoji_in_a_customer_name_is_mended_and_the_payment_kept(
        service: str, db_url: str) -> None:
    """A name cut in the middle of an emoji only describes the customer: the payment is
    read and projected with U+FFFD in its place, the raw bytes kept exactly, and the same
    event through another URL is still one event."""
    raw = json.dumps(dict(GOOD, customer=dict(GOOD["customer"], firstname="Asha @HALF"),
                          message="Paid \x00")).replace("@HALF", "\\ud83d").encode()
    assert b"\\ud83d" in raw and b"\\u0000" in raw
    answer = post(service, "primary", raw, secret=SECRETS["primary"])
    assert answer.status_code == 200 and answer.json()["duplicate"] is False, answer.text
    [(event_type, stored, payload, facts, stream)] = rows(
        db_url, "SELECT event_type, raw_body, payload, facts, stream FROM hookledger.ledger "
                "WHERE source = 'general'")
    assert (event_type, bytes(stored), stream) == ("payment.confirmed", raw,
                                                   "collection:HOSTILE")
    assert facts["repaired_fields"] == ["customer.firstname", "message"]
    assert "unstorable" not in facts and "malformed" not in facts
    assert payload["customer"]["firstname"] == "Asha \ufffd"
    assert payload["message"] == "Paid \ufffd"
    assert payload["amount"] == GOOD["amount"]  # numbers as sent, not rewritten
    other = re.sub(rb'"payloadSignature": "[^"]*"', b'"payloadSignature": "b4ckup"', raw)
    via_backup = post(service, "backup", other, secret=SECRETS["backup"])
    assert via_backup.status_code == 200 and via_backup.json()["duplicate"] is True
    assert wait_for(lambda: rows(
        db_url, "SELECT reference, outcome FROM hookledger.payments")) == [
        ("HOSTILE", "success")]
    assert rows(db_url, "SELECT count(*) FROM hookledger.discrepancies") == [(0,)]

def test_a_signed_event_the_database_refuses_is_kept_by_its_raw_bytes_not_lost(
        service: str, db_url: str) -> None:
    """Strict reading is meant to catch all the database would refuse; should it miss a
    case, the signed delivery (which the general system never resends) is kept as
    unstorable rather than answered 503. A payment sent beside it in the same moment is
    appended as usual."""
    refuse_event_type(db_url, "payment.confirmed")
    raw = encode(GOOD)
    answer = post(service, "primary", raw, secret=SECRETS["primary"])
    assert answer.status_code == 200, answer.text
    [(event_type, stored, payload, facts, stream)] = rows(
        db_url, "SELECT event_type, raw_body, payload, facts, stream FROM hookledger.ledger "
                "WHERE source = 'general'")
    assert (event_type, bytes(stored), stream) == (
        "general.malformed", raw, "collection:HOSTILE")
    assert payload["reason"] == facts["reason"] == "refused_by_database"
    assert "refused for the test" in facts["detail"] and facts["unstorable"] is True
    again = post(service, "primary", raw, secret=SECRETS["primary"])
    assert again.status_code == 200 and again.json()["duplicate"] is True
    other = encode(general_body("payment.refunded", 91010, reference="OTHER"))
    assert post(service, "primary", other, secret=SECRETS["primary"]).json()[
        "duplicate"] is False
    assert rows(db_url, "SELECT event_type FROM hookledger.ledger WHERE source = 'general' "
                        "ORDER BY position") == [("general.malformed",), ("payment.refunded",)]


# Signed JSON objects of a listed event whose fields cannot be read: the general system
# never sends them again, so they are kept (flagged, never projected), not refused.
UNREADABLE_FIELDS = [
    ("amount of the wrong type", replace("amount", '{"value": 10}'), "invalid_field"),
    ("amount as text", replace("amount", '"1000"'), "invalid_field"),
    ("code of the wrong type", replace("code", '"ninety-one"'), "invalid_field"),
    ("timestamp not a date", replace("timestamp", '"20261399256199"'), "invalid_field"),
    ("no timestamp", json.dumps({k: v for k, v in GOOD.items() if k != "timestamp"}).encode(),
     "missing_field"),
    ("reference of the wrong type", replace("reference", "[1, 2]"), "invalid_field"),
]


@pytest.mark.parametrize(("raw", "reason"), [(raw, reason) for _, raw, reason in HOSTILE],
                         ids=[name for name, _, _ in HOSTILE])
def test_a_signed_hostile_body_is_400_with_its_reason(service: str, db_url: str, raw: bytes,
                                                      reason: str) -> None:
    answer = post(service, "primary", raw, secret=SECRETS["primary"])
    assert answer.status_code == 400, answer.text
    assert answer.json() == {"status": "refused", "reason": reason}
    assert rows(db_url, "SELECT count(*) FROM hookledger.ledger") == [(0,)]
    assert rows(db_url, "SELECT reason, verified FROM hookledger.rejected_deliveries") == [
        (reason, True)]


@pytest.mark.parametrize(("raw", "reason"),
                         [(raw, reason) for _, raw, reason in UNREADABLE_FIELDS],
                         ids=[name for name, _, _ in UNREADABLE_FIELDS])
def test_a_signed_event_with_unreadable_fields_is_kept_flagged_and_never_projected(
        service: str, db_url: str, raw: bytes, reason: str) -> None:
    answer = post(service, "primary", raw, secret=SECRETS["primary"])
    assert answer.status_code == 200, answer.text
    assert answer.json()["duplicate"] is False
    [(event_type, stored, facts, stream, key)] = rows(
        db_url, "SELECT event_type, raw_body, facts, stream, dedupe_key FROM hookledger.ledger")
    assert (event_type, bytes(stored)) == ("general.malformed", raw)
    assert facts["reason"] == reason and facts["malformed"] is True
    assert facts["event"] == "payment.confirmed" and facts["subject"] == "collection"
    reference = facts["reference"]  # None when the reference itself is unreadable
    assert reference in ("HOSTILE", None)
    assert stream == ("collection:HOSTILE" if reference else f"malformed:{key[18:34]}")
    # the same delivery through another registered URL is the same event
    again = post(service, "backup", raw, secret=SECRETS["backup"])
    assert again.status_code == 200 and again.json()["duplicate"] is True
    assert rows(db_url, "SELECT count(*) FROM hookledger.rejected_deliveries") == [(0,)]
    found = wait_for(lambda: rows(
        db_url, "SELECT kind, subject, reference, detail FROM hookledger.discrepancies"))
    [(kind, subject, found_reference, detail)] = found
    assert (kind, subject, found_reference) == ("malformed_delivery", "collection",
                                                reference or "")
    assert reason in detail and "payment.confirmed" in detail
    assert rows(db_url, "SELECT count(*) FROM hookledger.payments") == [(0,)]


def test_a_readable_copy_after_a_malformed_one_is_its_own_event_and_projected(
        service: str, db_url: str) -> None:
    """A repeated callback may be stamped anew: the readable copy must not be taken for a
    duplicate of the unreadable one that came first."""
    first = post(service, "primary", replace("timestamp", '"yesterday"'),
                 secret=SECRETS["primary"])
    second = post(service, "primary", encode(GOOD), secret=SECRETS["primary"])
    assert first.status_code == second.status_code == 200
    assert second.json()["duplicate"] is False
    assert rows(db_url, "SELECT event_type, stream FROM hookledger.ledger WHERE source = "
                        "'general' ORDER BY position") == [
        ("general.malformed", "collection:HOSTILE"), ("payment.confirmed", "collection:HOSTILE")]
    assert wait_for(lambda: rows(db_url, "SELECT outcome FROM hookledger.payments")) == [
        ("success",)]


def test_a_gzip_body_is_415_even_when_signed(service: str, db_url: str) -> None:
    raw = gzip.compress(encode(GOOD))
    answer = post(service, "primary", raw, secret=SECRETS["primary"],
                  headers={"content-encoding": "gzip"})
    assert answer.status_code == 415
    assert rows(db_url, "SELECT count(*) FROM hookledger.ledger") == [(0,)]
    assert rows(db_url, "SELECT reason, verified FROM hookledger.rejected_deliveries") == [
        ("unsupported_content_encoding", True)]


def test_a_gzip_body_with_a_wrong_signature_is_401(service: str, db_url: str) -> None:
    """The contract answers a wrong signature 401, whatever else is wrong with the body."""
    raw = gzip.compress(encode(GOOD))
    answer = post(service, "primary", raw, secret="not-the-primary-secret",
                  headers={"content-encoding": "gzip"})
    assert answer.status_code == 401
    assert answer.json()["reason"] == "bad_signature"
    assert rows(db_url, "SELECT count(*) FROM hookledger.ledger") == [(0,)]


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded"])
def test_a_signed_json_body_is_kept_whatever_its_content_type(service: str, db_url: str,
                                                              content_type: str | None) -> None:
    raw = encode(GOOD)
    headers = {"content-type": content_type} if content_type else {"content-type": ""}
    answer = post(service, "primary", raw, secret=SECRETS["primary"], headers=headers)
    assert answer.status_code == 200
    assert rows(db_url, "SELECT count(*) FROM hookledger.ledger") == [(1,)]


def test_slow_clients_get_408_and_never_hold_up_a_genuine_delivery(db_url: str) -> None:
    with running_service(db_url, general_secrets=f"primary={SECRETS['primary']}",
                         body_timeout_s=1.0) as base:
        host, port = base.removeprefix("http://").split(":")
        slow = []
        for _ in range(20):  # headers, then a body that never finishes
            sock = socket.create_connection((host, int(port)))
            sock.sendall(b"POST /webhooks/general/primary HTTP/1.1\r\nHost: x\r\n"
                         b"Content-Type: application/json\r\nContent-Length: 500\r\n\r\n{\"a")
            slow.append(sock)
        raw = encode(GOOD)
        started = time.monotonic()
        answer = post(base, "primary", raw, secret=SECRETS["primary"])
        assert answer.status_code == 200 and time.monotonic() - started < 1.0
        answers = []
        for sock in slow:
            sock.settimeout(10)
            answers.append(sock.recv(4096).split(b"\r\n", 1)[0])
            sock.close()
        assert set(answers) == {b"HTTP/1.1 408 Request Timeout"}
    assert rows(db_url, "SELECT count(*) FROM hookledger.ledger") == [(1,)]
    assert rows(db_url, "SELECT reason, count(*) FROM hookledger.rejected_deliveries "
                        "GROUP BY reason") == [("body_timeout", 20)]


@pytest.mark.parametrize("path", ["/webhooks/general/primary", "/webhooks/chat/15550001"])
def test_a_client_gone_mid_body_is_recorded_with_what_it_sent(db_url: str, path: str) -> None:
    """Not an unhandled error answered 500 and recorded nowhere: for the general system, which
    never sends again, the cut-off bytes are all that is left of the delivery to look up."""
    with running_service(db_url, general_secrets=f"primary={SECRETS['primary']}") as base:
        host, port = base.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\n".encode()
                         + b"Content-Type: application/json\r\nContent-Length: 500\r\n\r\n"
                         + b'{"reference": "CUT-1"')
            time.sleep(0.2)  # the body has started arriving when the client goes
        wait_for(lambda: rows(db_url, "SELECT count(*) FROM hookledger.rejected_deliveries"
                              ) == [(1,)])
        answer = post(base, "primary", encode(GOOD), secret=SECRETS["primary"])
        assert answer.status_code == 200  # and the service is as it was
    [(reason, body, detail)] = rows(
        db_url, "SELECT reason, convert_from(body_prefix, 'UTF8'), detail "
                "FROM hookledger.rejected_deliveries")
    assert reason == "client_disconnected" and body == '{"reference": "CUT-1"'
    assert detail == "the connection closed after 21 bytes of the body"
    assert rows(db_url, "SELECT count(*) FROM hookledger.ledger") == [(1,)]


def test_a_declared_length_past_what_the_table_counts_is_still_recorded(
        service: str, db_url: str) -> None:
    """HTTP allows lengths up to 2^64 - 1, ``body_size`` holds up to 2^63 - 1: the refusal
    was answered but never recorded (the insert failed), by anyone who asked."""
    host, port = service.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(b"POST /webhooks/general/primary HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Length: 18446744073709551615\r\n\r\n" + b'{"reference": "HUGE-1"')
        assert sock.recv(4096).startswith(b"HTTP/1.1 413 ")
    [(reason, size, prefix)] = rows(
        db_url, "SELECT reason, body_size, convert_from(body_prefix, 'UTF8') "
                "FROM hookledger.rejected_deliveries")
    assert (reason, size, prefix) == ("body_too_large", 2**63 - 1, '{"reference": "HUGE-1"')


def test_a_nul_in_the_path_is_refused_and_recorded_escaped(service: str, db_url: str) -> None:
    """``%00`` decodes to a NUL, which PostgreSQL text refuses: the refusal was answered
    but never recorded, and the NUL went to the log as it was."""
    raw = encode(GOOD)
    answer = post(service, "x%00y", raw, secret=SECRETS["primary"])
    assert answer.status_code == 401 and answer.json()["reason"] == "unknown_endpoint"
    assert rows(db_url, "SELECT endpoint, reason FROM hookledger.rejected_deliveries") == [
        ("general/x\\x00y", "unknown_endpoint")]
