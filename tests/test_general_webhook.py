"""POST /webhooks/general/{name} through a real HTTP server and a real database."""

from __future__ import annotations

import asyncio
import gc
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import psycopg
import pytest

from hookledger.gc_tuning import GEN0_THRESHOLD
from tests.chat_live import wait_for
from tests.general_events import INVOICE, SPEC_EVENTS, encode, general_body
from tests.live import running_service
from tests.signing import general_header

SECRETS = {"primary": "whsec-primary-1", "backup": "whsec-backup-2", "third": "whsec-third-3"}


@pytest.fixture
def service(db_url: str) -> Iterator[str]:
    with running_service(db_url, general_secrets=",".join(f"{k}={v}" for k, v in
                                                          SECRETS.items()),
                         max_body_bytes=64 * 1024) as base:
        yield base


def post(base: str, name: str, raw: bytes, *, secret: str | None = None,
         headers: dict[str, str] | None = None) -> httpx.Response:
    sent = {"content-type": "application/json"}
    if secret is not None:
        sent["x-service-signature"] = general_header(secret, raw)
    sent.update(headers or {})
    return httpx.post(f"{base}/webhooks/general/{name}", content=raw, headers=sent, timeout=10)


def rows(db_url: str, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(db_url) as conn:
        return conn.execute(sql, params).fetchall()


@pytest.mark.parametrize(("event", "code", "overrides", "outcome"), SPEC_EVENTS)
def test_every_spec_event_is_accepted_and_stored_normalised(
        service: str, db_url: str, event: str, code: int, overrides: dict[str, Any],
        outcome: str) -> None:
    reference = f"REF-{event}-{code}"
    raw = encode(general_body(event, code, reference=reference, **overrides))
    answer = post(service, "primary", raw, secret=SECRETS["primary"])
    assert answer.status_code == 200, answer.text
    assert answer.json()["duplicate"] is False
    [(stream, event_type, source, payload, facts, raw_body, verified_by, occurred)] = rows(
        db_url, "SELECT stream, event_type, source, payload, facts, raw_body, verified_by, "
                "occurred_at FROM hookledger.ledger")
    assert event_type == event and source == "general" and verified_by == "primary"
    assert stream.endswith(":" + reference)
    assert bytes(raw_body) == raw
    assert payload["code"] == code
    assert facts["outcome"] == outcome and facts["code"] == code
    # the instant, whatever zone the session writes it in (PGTZ, a role's timezone)
    assert occurred == datetime(2026, 11, 22, 5, 30, tzinfo=UTC)
    if overrides.get("transaction_id") == "-1":
        assert facts["transaction_id"] is None
    if "invoice" in overrides:
        assert facts["invoice"]["amount_due"] == str(overrides["invoice"]["amountDue"])


def test_the_same_event_through_all_three_endpoints_is_one_ledger_event(
        service: str, db_url: str) -> None:
    raw = encode(general_body("payment.confirmed", 91000, reference="R-3X"))
    answers = [post(service, name, raw, secret=secret) for name, secret in SECRETS.items()]
    assert [a.status_code for a in answers] == [200, 200, 200]
    assert [a.json()["duplicate"] for a in answers] == [False, True, True]
    assert len({a.json()["position"] for a in answers}) == 1
    assert rows(db_url, "SELECT count(*) FROM hookledger.ledger") == [(1,)]


def test_an_invoice_saved_back_to_an_earlier_state_ends_in_that_state(
        service: str, db_url: str) -> None:
    """1000, then 1200, then 1000 again: the third save equals the first but for its time,
    and it is the invoice's current state (once answered as a duplicate and never kept)."""
    def saved(total: int, due: int, timestamp: str) -> httpx.Response:
        raw = encode(general_body(
            "invoice.updated", 93001, reference="INV-BACK", service="Invoicing", amount=total,
            timestamp=timestamp, invoice={**INVOICE, "invoiceNo": "INV-BACK", "total": total,
                                          "amountPaid": 300, "amountDue": due}))
        return post(service, "primary", raw, secret=SECRETS["primary"])

    answers = [saved(1000, 700, "20261122080000"), saved(1200, 900, "20261122090000"),
               saved(1000, 700, "20261122100000")]
    assert [a.json()["duplicate"] for a in answers] == [False, False, False]
    assert wait_for(lambda: rows(
        db_url, "SELECT total, amount_paid, amount_due FROM hookledger.invoices "
                "WHERE invoice_no = 'INV-BACK' AND event_count = 3")) == [(1000, 300, 700)]


def test_a_signed_delivery_with_a_byte_order_mark_is_kept_and_projected(
        service: str, db_url: str) -> None:
    raw = b"\xef\xbb\xbf" + encode(general_body("payment.confirmed", 91000, reference="R-BOM"))
    answer = post(service, "primary", raw, secret=SECRETS["primary"])
    assert answer.status_code == 200, answer.text
    [(raw_body, reference)] = rows(db_url, "SELECT raw_body, payload->>'reference' "
                                           "FROM hookledger.ledger")
    assert bytes(raw_body) == raw and reference == "R-BOM"
    assert wait_for(lambda: rows(db_url, "SELECT outcome FROM hookledger.payments "
                                         "WHERE reference = 'R-BOM'")) == [("success",)]


def test_concurrent_copies_of_one_event_make_one_ledger_event(service: str, db_url: str) -> None:
    raw = encode(general_body("payment.confirmed", 91000, reference="R-RACE"))

    async def storm() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=10) as client:
            return await asyncio.gather(*(
                client.post(f"{service}/webhooks/general/{name}", content=raw,
                            headers={"x-service-signature": general_header(secret, raw)})
                for _ in range(10) for name, secret in SECRETS.items()))

    answers = asyncio.run(storm())
    assert all(a.status_code == 200 for a in answers)
    assert sum(not a.json()["duplicate"] for a in answers) == 1
    assert rows(db_url, "SELECT count(*) FROM hookledger.ledger") == [(1,)]


def test_distinct_events_on_one_reference_are_all_kept(service: str, db_url: str) -> None:
    invoice = {"invoiceNo": "INV-9", "total": 900, "currency": "TZS"}
    sequence = [
        general_body("invoice.created", 93000, reference="INV-9", amount=900,
                     invoice={**invoice, "amountPaid": 0, "amountDue": 900}),
        general_body("invoice.updated", 93001, reference="INV-9", amount=900,
                     invoice={**invoice, "amountPaid": 300, "amountDue": 600}),
        general_body("invoice.updated", 93001, reference="INV-9", amount=900,
                     invoice={**invoice, "amountPaid": 600, "amountDue": 300}),
        general_body("invoice.paid", 93002, reference="INV-9", amount=900,
                     invoice={**invoice, "amountPaid": 900, "amountDue": 0}),
        general_body("payment.confirmed", 91000, reference="PAY-9"),
        general_body("payment.refunded", 91010, reference="PAY-9"),
    ]
    for body in sequence:
        answer = post(service, "primary", encode(body), secret=SECRETS["primary"])
        assert answer.json()["duplicate"] is False
    assert rows(db_url, "SELECT event_type FROM hookledger.ledger") == [
        ("invoice.created",), ("invoice.updated",), ("invoice.updated",), ("invoice.paid",),
        ("payment.confirmed",), ("payment.refunded",)]


@pytest.mark.parametrize("code", [91010, 91055, 93050, 93003, 93001])
def test_an_invoice_event_whose_code_contradicts_it_is_told_to_a_person(
        service: str, db_url: str, code: int) -> None:
    """``invoice.paid`` carrying a refund's code, a failure's, or another invoice event's (a
    cancellation's, a re-save's): the invoice is read from its block (paid, settled), and
    the code's other word is a finding, as a payment's or an SMS's is. It was flagged in
    ``facts`` only, where no person looks, and another invoice event's code not at all."""
    raw = encode(general_body("invoice.paid", code, reference="INV-CODE", service="Invoicing",
                              amount=50000, invoice={**INVOICE, "invoiceNo": "INV-CODE",
                                                     "amountPaid": 50000, "amountDue": 0}))
    assert post(service, "primary", raw, secret=SECRETS["primary"]).status_code == 200
    assert wait_for(lambda: rows(db_url, "SELECT status, settled, conflicted "
                                         "FROM hookledger.invoices WHERE invoice_no = "
                                         "'INV-CODE'")) == [("paid", True, True)]
    [(kind, subject, detail)] = wait_for(lambda: rows(
        db_url, "SELECT kind, subject, detail FROM hookledger.discrepancies "
                "WHERE reference = 'INV-CODE'"))
    assert (kind, subject) == ("conflicting_events", "invoice")
    assert f"code {code} contradicts event invoice.paid" in detail


@pytest.mark.parametrize("spelled", ["91055.0", "9.1055e4", "91055.000"])
def test_a_code_written_as_a_whole_number_with_a_fraction_is_that_code(
        service: str, db_url: str, spelled: str) -> None:
    """JSON has one number type: 91055.0 is the integer 91055 (as JSON Schema has it, and
    as a chat error code is read). It made the failure malformed, in no projection."""
    raw = encode(general_body("payment.failed", 91055, reference="R-CODE", amount=0,
                              status="FAILED", transaction_id="-1")).replace(
        b'"code": 91055', f'"code": {spelled}'.encode())
    assert spelled.encode() in raw
    assert post(service, "primary", raw, secret=SECRETS["primary"]).status_code == 200
    assert rows(db_url, "SELECT event_type, facts->'code' FROM hookledger.ledger") == [
        ("payment.failed", 91055)]
    assert wait_for(lambda: rows(db_url, "SELECT outcome, code FROM hookledger.payments "
                                         "WHERE reference = 'R-CODE'")) == [("failure", 91055)]


@pytest.mark.parametrize("spelled", ["0.00000000000000000000", "0E-20", "0e20"])
def test_an_amount_of_zero_with_many_decimals_is_zero(service: str, db_url: str,
                                                      spelled: str) -> None:
    """A failure's amount is 0, however many decimal places its encoder wrote: it read as
    out of range for money (the exponent of nothing), and the failure was malformed."""
    raw = encode(general_body("payment.failed", 91051, reference="R-ZERO", amount=0,
                              status="CANCELLED", transaction_id="-1")).replace(
        b'"amount": 0', f'"amount": {spelled}'.encode())
    assert spelled.encode() in raw
    assert post(service, "primary", raw, secret=SECRETS["primary"]).status_code == 200
    assert rows(db_url, "SELECT event_type FROM hookledger.ledger") == [("payment.failed",)]
    assert wait_for(lambda: rows(db_url, "SELECT outcome, amount FROM hookledger.payments "
                                         "WHERE reference = 'R-ZERO'")) == [("failure", 0)]


def test_a_ping_or_unknown_event_is_answered_200_and_kept_flagged(service: str,
                                                                   db_url: str) -> None:
    for raw in (b'{"test": true}', encode({"event": "payment.teleported", "reference": "X"})):
        assert post(service, "backup", raw, secret=SECRETS["backup"]).status_code == 200
    kept = rows(db_url, "SELECT event_type, facts->>'recognised' FROM hookledger.ledger")
    assert kept == [("general.unrecognised", "false"), ("general.unrecognised", "false")]


@pytest.mark.parametrize(("name", "raw", "headers", "status", "reason"), [
    ("primary", b'{"a":1}', {}, 401, "missing_signature"),
    ("primary", b'{"a":1}', {"x-service-signature": "sha256=nothex"}, 401,
     "malformed_signature"),
    ("primary", b'{"a":1}', {"x-service-signature": general_header("wrong", b'{"a":1}')}, 401,
     "bad_signature"),
    ("nobody", b'{"a":1}', {"x-service-signature": general_header("x", b'{"a":1}')}, 401,
     "unknown_endpoint"),
])
def test_unverified_deliveries_are_refused_and_recorded(
        service: str, db_url: str, name: str, raw: bytes, headers: dict[str, str], status: int,
        reason: str) -> None:
    answer = post(service, name, raw, headers=headers)
    assert answer.status_code == status
    assert answer.json() == {"status": "refused", "reason": reason}
    assert rows(db_url, "SELECT count(*) FROM hookledger.ledger") == [(0,)]
    [(endpoint, got_reason, sha, verified)] = rows(
        db_url,
        "SELECT endpoint, reason, body_sha256, verified FROM hookledger.rejected_deliveries")
    assert (endpoint, got_reason, verified) == (f"general/{name}", reason, False)
    assert len(sha) == 64


def test_a_trailing_slash_is_the_same_endpoint(service: str, db_url: str) -> None:
    """Starlette answered it 307 to a plain-http URL and kept nothing; the general system
    never retries, so a provider configured with the slash lost every delivery."""
    raw = encode(general_body("payment.confirmed", 91000, reference="R-SLASH"))
    answer = post(service, "primary/", raw, secret=SECRETS["primary"])
    assert answer.status_code == 200, answer.text
    assert answer.json()["duplicate"] is False
    again = post(service, "primary", raw, secret=SECRETS["primary"])
    assert again.status_code == 200 and again.json()["duplicate"] is True
    assert rows(db_url, "SELECT endpoint, verified_by FROM hookledger.ledger") == [
        ("general/primary", "primary")]
    assert rows(db_url, "SELECT count(*) FROM hookledger.rejected_deliveries") == [(0,)]


@pytest.mark.parametrize(("name", "endpoint"), [
    ("", "general/"),
    ("primary/x", "general/primary/x"),
    ("primary//", "general/primary//"),
    ("nobody/", "general/nobody"),
])
def test_a_path_under_the_prefix_that_names_no_endpoint_is_refused_and_recorded(
        service: str, db_url: str, name: str, endpoint: str) -> None:
    """Once an unrecorded 404 (or 307): now the unknown-name refusal, kept with its body."""
    raw = encode(general_body("payment.confirmed", 91000, reference="R-LOST"))
    answer = post(service, name, raw, secret=SECRETS["primary"])
    assert answer.status_code == 401 and "location" not in answer.headers
    assert answer.json() == {"status": "refused", "reason": "unknown_endpoint"}
    assert rows(db_url, "SELECT count(*) FROM hookledger.ledger") == [(0,)]
    [(got_endpoint, reason, prefix)] = rows(
        db_url, "SELECT endpoint, reason, body_prefix FROM hookledger.rejected_deliveries")
    assert (got_endpoint, reason, bytes(prefix)) == (endpoint, "unknown_endpoint", raw)



def test_the_prefix_without_its_slash_is_refused_and_recorded(service: str,
                                                              db_url: str) -> None:
    """A provider set up with ``/webhooks/general`` and no name: once Starlette's 404, kept
    nowhere; now the unknown-name refusal, with the body that names what was lost."""
    raw = encode(general_body("payment.confirmed", 91000, reference="R-BARE"))
    answer = httpx.post(f"{service}/webhooks/general", content=raw, timeout=10, headers={
        "x-service-signature": general_header(SECRETS["primary"], raw)})
    assert answer.status_code == 401
    assert answer.json() == {"status": "refused", "reason": "unknown_endpoint"}
    [(endpoint, reason, prefix)] = rows(
        db_url, "SELECT endpoint, reason, body_prefix FROM hookledger.rejected_deliveries")
    assert (endpoint, reason, bytes(prefix)) == ("general/", "unknown_endpoint", raw)
    assert httpx.get(f"{service}/webhooks/general").status_code == 404

def test_no_route_redirects_a_trailing_slash(service: str) -> None:
    for path in ("/healthz", "/readyz", "/metrics"):
        assert httpx.get(f"{service}{path}").status_code == 200
        assert httpx.get(f"{service}{path}/").status_code == 404
    assert httpx.get(f"{service}/webhooks/general/primary/").status_code == 404
    assert httpx.get(f"{service}/webhooks/general/primary").status_code == 405


@pytest.mark.parametrize(("raw", "reason"), [
    (b"[1, 2, 3]", "not_an_object"),
    (b"not json", "invalid_json"),
])
def test_verified_but_unusable_bodies_get_400_with_a_reason(service: str, db_url: str,
                                                            raw: bytes, reason: str) -> None:
    answer = post(service, "primary", raw, secret=SECRETS["primary"])
    assert answer.status_code == 400 and answer.json()["reason"] == reason
    assert rows(db_url, "SELECT count(*) FROM hookledger.ledger") == [(0,)]
    [(got, verified, prefix)] = rows(
        db_url, "SELECT reason, verified, body_prefix FROM hookledger.rejected_deliveries")
    assert (got, verified, bytes(prefix)) == (reason, True, raw)


def test_a_body_over_the_limit_is_413_and_never_reaches_the_ledger(service: str,
                                                                   db_url: str) -> None:
    raw = b'{"reference": "BIG-1", "pad": "' + b"x" * (70 * 1024) + b'"}'
    answer = post(service, "primary", raw, secret=SECRETS["primary"])
    assert answer.status_code == 413 and answer.json()["reason"] == "body_too_large"

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit applies while streaming
        for _ in range(200):
            yield b"y" * 4096

    streamed = httpx.post(f"{service}/webhooks/general/primary", content=chunks(), timeout=10)
    assert streamed.status_code == 413
    assert rows(db_url, "SELECT count(*) FROM hookledger.ledger") == [(0,)]
    # the general system never sends them again: their first kilobyte names what was lost
    [(reason, size, prefix), (streamed_reason, streamed_size, streamed_prefix)] = rows(
        db_url, "SELECT reason, body_size, body_prefix FROM hookledger.rejected_deliveries "
                "ORDER BY id")
    assert (reason, size, bytes(prefix)) == ("body_too_large", len(raw), raw[:1024])
    assert bytes(prefix).startswith(b'{"reference": "BIG-1"')
    assert (streamed_reason, bytes(streamed_prefix)) == ("body_too_large", b"y" * 1024)
    assert 64 * 1024 < streamed_size < 200 * 4096


def test_health_readiness_and_metrics(service: str) -> None:
    assert httpx.get(f"{service}/healthz").status_code == 200
    assert httpx.get(f"{service}/readyz").json()["status"] == "ready"
    raw = encode(general_body("payment.confirmed", 91000, reference="R-M"))
    post(service, "primary", raw, secret=SECRETS["primary"])
    post(service, "backup", raw, secret=SECRETS["backup"])
    post(service, "primary", raw)
    text = httpx.get(f"{service}/metrics").text
    assert 'hookledger_deliveries_accepted_total{system="general"} 1.0' in text
    assert 'hookledger_deliveries_duplicate_total{system="general"} 1.0' in text
    assert ('hookledger_deliveries_refused_total{reason="missing_signature",system="general"} 1.0'
            in text)
    assert "hookledger_append_seconds_count 2.0" in text
    # two deliveries were committed, one at a time: two batches holding two events in all
    assert "hookledger_append_batch_size_count 2.0" in text
    assert "hookledger_append_batch_size_sum 2.0" in text
    for secret in SECRETS.values():
        assert secret not in text


def test_the_answer_is_json_with_the_position(service: str, db_url: str) -> None:
    raw = encode(general_body("payment.confirmed", 91000, reference="R-J"))
    answer = post(service, "third", raw, secret=SECRETS["third"])
    assert answer.headers["content-type"].startswith("application/json")
    position = json.loads(answer.text)["position"]
    assert rows(db_url, "SELECT position FROM hookledger.ledger") == [(position,)]


def test_the_collector_is_tuned_while_serving_and_restored_after(db_url: str) -> None:
    """A full collection over the ~100k objects built at start-up paused a worker for tens
    of milliseconds under load; frozen, they are not rescanned, and released at shutdown.
    Generation 0 is collected less often while serving (see hookledger.gc_tuning), and the
    process's own setting is back once the service stops."""
    assert gc.get_freeze_count() == 0
    before = gc.get_threshold()
    with running_service(db_url, general_secrets="primary=whsec-primary-1") as service:
        frozen = gc.get_freeze_count()
        serving = gc.get_threshold()
        raw = encode(general_body("payment.confirmed", 5, reference="R-GC"))
        assert post(service, "primary", raw, secret="whsec-primary-1").status_code == 200
    assert frozen > 10_000
    assert serving == (max(GEN0_THRESHOLD, before[0]), *before[1:])
    assert gc.get_freeze_count() == 0
    assert gc.get_threshold() == before


def test_the_ingest_connections_are_named_for_pg_stat_activity(service: str,
                                                                 db_url: str) -> None:
    raw = encode(general_body("payment.confirmed", 91000, reference="REF-NAMED"))
    assert post(service, "primary", raw, secret=SECRETS["primary"]).status_code == 200
    [(named,)] = rows(db_url, "SELECT count(*) FROM pg_stat_activity WHERE "
                              "datname = current_database() AND "
                              "application_name = 'hookledger-ingest'")
    assert named >= 1  # the pool keeps its connections open: the append's is among them


def test_a_pool_of_one_connection_serves(db_url: str) -> None:
    """``HOOKLEDGER_DB_POOL_SIZE`` takes any size above 0, but the pool always opened two
    connections and refused a largest size below that: with 1 (a small managed database's
    connection limit) no worker started."""
    with running_service(db_url, general_secrets=f"primary={SECRETS['primary']}",
                         db_pool_size=1) as base:
        raw = encode(general_body("payment.confirmed", 91000, reference="REF-ONE"))
        assert post(base, "primary", raw, secret=SECRETS["primary"]).json()["position"] == 1
