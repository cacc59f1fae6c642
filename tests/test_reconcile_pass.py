"""Reconciliation passes against the sandbox's real HTTP reference API and real PostgreSQL."""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
import pytest

from ledger import NewEvent
from reconcile import runner
from reconcile.findings import manual_resolution
from sandbox.faults import FaultSettings
from sandbox.runner import running_sandbox
from tests.dbutil import refuse_event_type
from tests.general_events import INVOICE
from tests.projection_events import kept_event
from tests.reconcile_helpers import (
    CountingState,
    append,
    body,
    deliver,
    expect,
    project,
    reconcile,
    rows,
)


def ts_ago(**delta: float) -> str:
    """A provider timestamp (its zone, no offset) that long ago."""
    return (datetime.now(UTC) - timedelta(**delta)).astimezone(
        ZoneInfo("Africa/Dar_es_Salaam")).strftime("%Y%m%d%H%M%S")


def discrepancies(url: str, status: str = "open") -> list[tuple[str, str, str, Decimal | None]]:
    return [tuple(r) for r in rows(  # type: ignore[misc]
        url, "SELECT kind, subject, reference, amount_at_risk FROM hookledger.discrepancies "
             "WHERE status = %s ORDER BY kind, reference", status)]


# a pass asks about one subject, and a subject not settled is due again at once
NO_BACKOFF: dict[str, Any] = {"retry_base": timedelta(0), "retry_cap": timedelta(0),
                              "max_subjects": 1}


def person_resolves(url: str, discrepancy_id: str, subject: str, reference: str,
                    reason: str) -> None:
    """``hookledger resolve``'s event, appended and projected."""
    asyncio.run(append_and_project(url, [manual_resolution(
        discrepancy_id, subject, reference, reason, datetime.now(UTC))]))


def test_a_dropped_payment_confirmed_is_found_as_missing_webhook_and_recovered_as_paid(
        db_url: str) -> None:
    state = CountingState()
    state.record_general(body("payment.confirmed", 91000, reference="C-1", amount=1500))
    expect(db_url, "C-1", "collection", 1500)
    with running_sandbox(state=state) as api:
        result = reconcile(db_url, api.url)
    assert result.recovered == ["C-1"]
    assert discrepancies(db_url) == [("missing_webhook", "collection", "C-1", Decimal(1500))]
    assert rows(db_url, "SELECT status, outcome, amount, recovered FROM hookledger.payments") == [
        ("SUCCESSFUL", "success", Decimal(1500), True)]
    assert rows(db_url, "SELECT resolved FROM hookledger.expectations") == [(True,)]
    checked = rows(db_url, "SELECT source, payload->>'result' FROM hookledger.ledger "
                           "WHERE event_type = 'reconcile.checked'")
    assert checked == [("reconciler", "recovered")]


def test_a_lost_webhook_of_a_reference_with_slashes_is_recovered(db_url: str) -> None:
    """``ORDER/2026/0001`` is asked as ``ORDER%2F2026%2F0001``, one path segment; the
    sandbox routed the decoded path, found no route for its three segments and answered a
    bare 404, so a merchant whose references hold a slash saw every lookup fail there and
    no lost webhook recovered."""
    state = CountingState()
    state.record_general(body("payment.confirmed", 91000, reference="ORDER/2026/0001",
                              amount=1500))
    expect(db_url, "ORDER/2026/0001", "collection", 1500)
    with running_sandbox(state=state) as api:
        result = reconcile(db_url, api.url)
    assert (result.recovered, result.errors) == (["ORDER/2026/0001"], {})
    assert discrepancies(db_url) == [("missing_webhook", "collection", "ORDER/2026/0001",
                                      Decimal(1500))]


def test_a_late_webhook_that_agrees_resolves_the_missing_webhook(db_url: str) -> None:
    state = CountingState()
    state.record_general(body("payment.confirmed", 91000, reference="C-2", amount=700))
    expect(db_url, "C-2", "collection", 700)
    with running_sandbox(state=state) as api:
        reconcile(db_url, api.url)
        deliver(db_url, "payment.confirmed", 91000, reference="C-2", amount=700)
        assert rows(db_url, "SELECT recovered FROM hookledger.payments") == [(False,)]
        reconcile(db_url, api.url)
    assert discrepancies(db_url) == []
    assert [r[0] for r in discrepancies(db_url, "resolved")] == ["missing_webhook"]
    assert rows(db_url, "SELECT resolved_at >= detected_at FROM hookledger.discrepancies") == [
        (True,)]


def test_a_refund_webhook_after_a_recovered_success_resolves_its_missing_webhook(
        db_url: str) -> None:
    """The lost payment.confirmed never comes (the general system never resends); the
    refund's own webhook does. The finding that said "fulfil" is resolved, not left open
    with the whole amount at risk while the subject is settled and never asked again."""
    state = CountingState()
    state.record_general(body("payment.confirmed", 91000, reference="C-R", amount=800))
    expect(db_url, "C-R", "collection", 800)
    with running_sandbox(state=state) as api:
        reconcile(db_url, api.url)
        assert discrepancies(db_url) == [("missing_webhook", "collection", "C-R", Decimal(800))]
        state.record_general(body("payment.refunded", 91010, reference="C-R", amount=800))
        deliver(db_url, "payment.refunded", 91010, reference="C-R", amount=800)
        reconcile(db_url, api.url)
    assert discrepancies(db_url) == []
    assert rows(db_url, "SELECT resolution FROM hookledger.discrepancies") == [
        ("a later webhook moved it on to refunded",)]
    assert rows(db_url, "SELECT outcome, recovered FROM hookledger.payments") == [
        ("refunded", False)]


def test_status_and_amount_mismatches_are_found_and_never_override_the_webhook(
        db_url: str) -> None:
    state = CountingState()
    state.record_general(body("payment.confirmed", 91000, reference="S-1", amount=900))
    state.record_general(body("payment.confirmed", 91000, reference="A-1", amount=1000))
    deliver(db_url, "payment.failed", 91053, reference="S-1", amount=0, status="FAILED",
            transaction_id="-1")
    deliver(db_url, "payment.confirmed", 91000, reference="A-1", amount=1200)
    with running_sandbox(state=state) as api:
        reconcile(db_url, api.url)
    assert discrepancies(db_url) == [("amount_mismatch", "collection", "A-1", Decimal(200)),
                                     ("status_mismatch", "collection", "S-1", Decimal(900))]
    assert rows(db_url, "SELECT reference, outcome, recovered FROM hookledger.payments "
                        "ORDER BY reference") == [("A-1", "success", False),
                                                  ("S-1", "failure", False)]


def test_an_unresolved_collection_after_the_window_and_an_unknown_reference(
        db_url: str) -> None:
    state = CountingState()
    state.put_record("U-1", {"reference": "U-1", "status": "PENDING", "amount": 500,
                             "service": "Collection", "type": "CHARGE"})
    expect(db_url, "U-1", "collection", 500)
    expect(db_url, "N-1", "collection", 250)
    expect(db_url, "FRESH-1", "collection", 250, minutes_ago=0)  # inside the window
    with running_sandbox(state=state) as api:
        reconcile(db_url, api.url)
        assert discrepancies(db_url) == [("unknown_at_provider", "collection", "N-1",
                                          Decimal(250)),
                                         ("unresolved", "collection", "U-1", Decimal(500))]
        assert "FRESH-1" not in state.asked
        # the provider resolves it; the next due check agrees and resolves "unresolved"
        state.record_general(body("payment.confirmed", 91000, reference="U-1", amount=500))
        rows_before = state.asked["U-1"]
        rows(db_url, "UPDATE hookledger_private.reconcile_subjects "  # time passes
                     "SET next_check_at = now() - interval '1 second' RETURNING 1")
        reconcile(db_url, api.url)
    assert state.asked["U-1"] == rows_before + 1
    assert ("unresolved", "collection", "U-1", Decimal(500)) in discrepancies(db_url, "resolved")


def test_an_expectation_dated_ahead_of_the_clock_is_waited_for_from_its_registration(
        db_url: str) -> None:
    """An ``initiated_at`` in the future (a client's clock ahead, a typo'd year) was waited
    for until then: with 2099 its lost webhook was never looked for, and the gauge of the
    oldest unchecked expectation read 0 meanwhile."""
    state = CountingState()
    state.record_general(body("payment.confirmed", 91000, reference="AHEAD-1", amount=700))
    expect(db_url, "AHEAD-1", "collection", 700, minutes_ago=-60 * 24 * 365 * 70)
    with running_sandbox(state=state) as api:
        reconcile(db_url, api.url)  # registered just now: inside the window still
        assert "AHEAD-1" not in state.asked
        result = reconcile(db_url, api.url, now=datetime.now(UTC) + timedelta(minutes=10))
    assert result.recovered == ["AHEAD-1"]
    assert discrepancies(db_url) == [("missing_webhook", "collection", "AHEAD-1",
                                      Decimal(700))]


def test_a_pending_payout_stamped_ahead_of_the_clock_is_waited_for_from_its_arrival(
        db_url: str) -> None:
    """A ``payout.approved`` whose ``timestamp`` is ahead of the clock (the provider's clock
    a day fast, a zone misread) was waited for from that time: its payout window counted
    from the day after, and a year 2099 stamp was never asked about at all."""
    fields: dict[str, Any] = {"reference": "PO-AHEAD", "amount": 900, "service": "Disbursement",
                              "type_": "PAYOUT", "status": "APPROVED",
                              "timestamp": ts_ago(days=-1)}
    deliver(db_url, "payout.approved", 92002, **fields)
    state = CountingState()
    state.record_general(body("payout.approved", 92002, **fields))
    window = {"payout_window": timedelta(hours=1)}
    with running_sandbox(state=state) as api:
        reconcile(db_url, api.url, **window)  # just arrived: inside the window still
        assert "PO-AHEAD" not in state.asked
        reconcile(db_url, api.url, now=datetime.now(UTC) + timedelta(hours=2), **window)
    assert state.asked["PO-AHEAD"] == 1
    assert discrepancies(db_url) == [("unresolved", "payout", "PO-AHEAD", Decimal(900))]


def test_timeouts_500s_and_429s_are_retried_and_finally_recorded_without_a_crash(
        db_url: str) -> None:
    state = CountingState()
    for ref in ("R-1", "R-2", "R-3"):
        state.record_general(body("payment.confirmed", 91000, reference=ref, amount=100))
        expect(db_url, ref, "collection", 100)
    faults = FaultSettings(timeout_count=1, error_count=1, rate_limit_count=1, hang_s=2.0,
                           retry_after_s=1)
    with running_sandbox(state=state, faults=faults) as api:
        result = reconcile(db_url, api.url, timeout_s=0.3, max_attempts=4, concurrency=1)
        assert sorted(result.recovered) == ["R-1", "R-2", "R-3"]
        api.faults.configure(FaultSettings(error_rate=1.0))
        expect(db_url, "R-4", "collection", 100)
        failed = reconcile(db_url, api.url, max_attempts=2)
        api.faults.configure(FaultSettings(malformed_rate=1.0))
        expect(db_url, "R-5", "collection", 100)
        malformed = reconcile(db_url, api.url, max_attempts=2)
    assert failed.errors == {"server_error": 1}
    assert malformed.errors == {"malformed_envelope": 1}
    recorded = rows(db_url, "SELECT payload->>'reference', payload->>'error', "
                            "(payload->>'attempts')::int FROM hookledger.ledger "
                            "WHERE payload->>'result' = 'error' ORDER BY 1")
    assert recorded == [("R-4", "server_error", 2), ("R-5", "malformed_envelope", 2)]
    assert rows(db_url, "SELECT count(*) FROM hookledger.discrepancies WHERE reference IN "
                        "('R-4', 'R-5')") == [(0,)]


def test_two_reconcilers_on_one_database_never_ask_about_a_subject_twice(db_url: str) -> None:
    state = CountingState()
    for i in range(60):
        state.record_general(body("payment.confirmed", 91000, reference=f"T-{i}", amount=10))
        expect(db_url, f"T-{i}", "collection", 10)
    with running_sandbox(state=state, faults=FaultSettings(latency_ms=20)) as api:
        async def both() -> None:
            await asyncio.gather(asyncio.to_thread(reconcile, db_url, api.url),
                                 asyncio.to_thread(reconcile, db_url, api.url))
        asyncio.run(both())
        reconcile(db_url, api.url)
    assert len(state.asked) == 60
    assert set(state.asked.values()) == {1}
    assert rows(db_url, "SELECT count(*) FROM hookledger.discrepancies") == [(60,)]


def test_a_payment_whose_webhook_could_not_be_read_is_recovered_from_the_provider(
        db_url: str) -> None:
    """The only webhook of C-M1 carried its amount as text: kept as general.malformed, in
    no view. Reconciliation asks the provider, and the payment appears, recovered."""
    state = CountingState()
    state.record_general(body("payment.confirmed", 91000, reference="C-M1", amount=2500))
    deliver(db_url, "payment.confirmed", 91000, reference="C-M1", amount="2500")
    assert rows(db_url, "SELECT event_type FROM hookledger.ledger ORDER BY position") == [
        ("general.malformed",), ("discrepancy.detected",)]
    assert discrepancies(db_url) == [("malformed_delivery", "collection", "C-M1", None)]
    with running_sandbox(state=state) as api:
        result = reconcile(db_url, api.url)
    assert result.recovered == ["C-M1"]
    assert rows(db_url, "SELECT outcome, amount, recovered FROM hookledger.payments") == [
        ("success", Decimal(2500), True)]
    assert discrepancies(db_url) == [
        ("malformed_delivery", "collection", "C-M1", None),
        ("missing_webhook", "collection", "C-M1", Decimal(2500))]


def test_a_malformed_delivery_after_the_payment_was_checked_is_asked_about_at_once(
        db_url: str) -> None:
    """C-M2 was confirmed, checked and agreed; its refund's webhook cannot be read. The
    refund is learned from the provider on the next pass, not when a backoff expires."""
    state = CountingState()
    state.record_general(body("payment.confirmed", 91000, reference="C-M2", amount=900))
    deliver(db_url, "payment.confirmed", 91000, reference="C-M2", amount=900)
    with running_sandbox(state=state) as api:
        reconcile(db_url, api.url)
        assert discrepancies(db_url) == []
        state.record_general(body("payment.refunded", 91010, reference="C-M2", amount=900))
        deliver(db_url, "payment.refunded", 91010, reference="C-M2", amount="900")
        assert discrepancies(db_url) == [("malformed_delivery", "collection", "C-M2", None)]
        result = reconcile(db_url, api.url)
    assert result.recovered == ["C-M2"]
    assert rows(db_url, "SELECT outcome FROM hookledger.payments") == [("refunded",)]


def test_a_malformed_delivery_without_a_readable_reference_is_never_looked_up(
        db_url: str) -> None:
    deliver(db_url, "payment.confirmed", 91000, reference=["not", "text"])  # type: ignore[arg-type]
    assert discrepancies(db_url) == [("malformed_delivery", "collection", "", None)]
    with running_sandbox(state=CountingState()) as api:
        result = reconcile(db_url, api.url)
    assert result.checked == 0


def test_a_404_without_the_apis_envelope_is_an_error_never_an_unknown_payment(
        db_url: str) -> None:
    """A wrong base URL (or a proxy) answers 404 for everything: taken for "the provider has
    no such payment", it would tell someone to charge the customer again."""
    expect(db_url, "N-404", "collection", 250)
    with running_sandbox(state=CountingState()) as api:
        wrong = reconcile(db_url, api.url + "/not-the-api", max_attempts=2)
        assert wrong.errors == {"malformed_envelope": 1} and wrong.detected == []
        assert discrepancies(db_url) == []
        rows(db_url, "UPDATE hookledger_private.reconcile_subjects "  # time passes
                     "SET next_check_at = now() - interval '1 second' RETURNING 1")
        right = reconcile(db_url, api.url)  # the API's own 404 (envelope code 1404)
    assert [d["kind"] for d in right.detected] == ["unknown_at_provider"]
    assert discrepancies(db_url) == [("unknown_at_provider", "collection", "N-404",
                                      Decimal(250))]


def test_a_payout_the_provider_calls_reversed_is_reported_and_the_pass_goes_on(
        db_url: str) -> None:
    """No payout webhook carries a reversal, so there is nothing to recover it as: it is a
    discrepancy for a person, and the other subjects of the pass are still checked."""
    state = CountingState()
    state.put_record("PO-REV", {"reference": "PO-REV", "status": "REVERSED", "amount": 700,
                                "service": "Disbursement", "type": "DISBURSEMENT"})
    state.record_general(body("payment.confirmed", 91000, reference="C-OK", amount=100))
    expect(db_url, "PO-REV", "payout", 700)
    expect(db_url, "C-OK", "collection", 100)
    with running_sandbox(state=state) as api:
        result = reconcile(db_url, api.url)
    assert result.recovered == ["C-OK"] and result.errors == {}
    assert discrepancies(db_url) == [
        ("missing_webhook", "collection", "C-OK", Decimal(100)),
        ("status_mismatch", "payout", "PO-REV", Decimal(700))]


OTHER_KINDS: list[tuple[str, str, dict[str, Any]]] = [
    # (the kind asked about, what the provider's record of that reference is)
    ("payout", "a collection", body("payment.confirmed", 91000, reference="K-1", amount=1500)),
    ("collection", "a payout",
     body("payout.confirmed", 92000, reference="K-1", amount=1500, service="Disbursement",
          type_="PAYOUT")),
    ("collection", "an invoice, whose amount is its total",
     body("invoice.updated", 93001, reference="K-1", amount=50000, service="Invoicing",
          status="PARTIAL",
          invoice={**INVOICE, "invoiceNo": "K-1", "amountPaid": 1500, "amountDue": 48500})),
    ("collection", "an SMS", body("sms.delivered", 94000, reference="K-1", amount=0,
                                  service="Bulk SMS", status="DELIVERED")),
]


@pytest.mark.parametrize(("kind", "record"), [(k, r) for k, _, r in OTHER_KINDS],
                         ids=[f"{k} asked, {what} answered" for k, what, _ in OTHER_KINDS])
def test_a_record_of_another_kind_is_reported_never_recovered_as_the_kind_asked(
        db_url: str, kind: str, record: dict[str, Any]) -> None:
    """The reference API answers every kind of record at one address. An expectation
    registered with the wrong kind, or a reference an invoice or SMS shares, must not put
    that record's state and amount into payments or payouts."""
    state = CountingState()
    state.record_general(record)
    expect(db_url, "K-1", kind, 1500)
    with running_sandbox(state=state) as api:
        result = reconcile(db_url, api.url)
    assert result.recovered == [] and result.errors == {}
    assert rows(db_url, "SELECT count(*) FROM hookledger.ledger "
                        "WHERE event_type = 'reconcile.recovered'") == [(0,)]
    assert rows(db_url, "SELECT (SELECT count(*) FROM hookledger.payments) "
                        "+ (SELECT count(*) FROM hookledger.payouts)") == [(0,)]
    assert discrepancies(db_url) == [("status_mismatch", kind, "K-1", Decimal(1500))]
    [(detail,)] = rows(db_url, "SELECT detail FROM hookledger.discrepancies")
    assert f"is not a {kind}" in detail and "nothing recovered" in detail


def test_a_person_resolving_an_other_kind_mismatch_is_not_reopened_by_later_passes(
        db_url: str) -> None:
    """The subject is still asked about after its backoff (the record may yet become the
    payout's), but the same other kind of record is not reported again once a person has
    looked at it."""
    state = CountingState()
    state.record_general(body("payment.confirmed", 91000, reference="K-9", amount=700))
    expect(db_url, "K-9", "payout", 700)
    with running_sandbox(state=state) as api:
        reconcile(db_url, api.url, **NO_BACKOFF)
        [(found, subject)] = rows(db_url, "SELECT id, subject FROM hookledger.discrepancies "
                                          "WHERE status = 'open'")
        person_resolves(db_url, found, subject, "K-9", "registered as a payout by mistake")
        later = reconcile(db_url, api.url, **NO_BACKOFF)
    assert later.checked == 1 and state.asked["K-9"] == 2 and later.detected == []
    assert discrepancies(db_url) == []
    assert discrepancies(db_url, "resolved") == [("status_mismatch", "payout", "K-9",
                                                  Decimal(700))]


def test_a_finding_a_person_resolved_is_not_reopened_by_the_next_check(
        db_url: str) -> None:
    """1,500 expected, 1,000 paid (recovered): a person accepts the short payment and
    resolves its amount_mismatch. No webhook can settle that finding, so every later check
    found it again and opened a new one, each hour for ever. The same finding stays
    resolved, and the subject is not asked about again until its row changes (a changed
    answer is news: see the pure test)."""
    state = CountingState()
    state.record_general(body("payment.confirmed", 91001, reference="Q-7", amount=1000,
                              status="PARTIAL"))
    expect(db_url, "Q-7", "collection", 1500)
    with running_sandbox(state=state) as api:
        reconcile(db_url, api.url, **NO_BACKOFF)
        [(found, subject)] = rows(db_url, "SELECT id, subject FROM hookledger.discrepancies "
                                          "WHERE status = 'open' AND kind = 'amount_mismatch'")
        person_resolves(db_url, found, subject, "Q-7", "the customer agreed to pay 1,000")
        later = reconcile(db_url, api.url, **NO_BACKOFF)
        assert later.checked == 1 and later.detected == []
        after = reconcile(db_url, api.url, **NO_BACKOFF)
    assert after.checked == 0 and state.asked["Q-7"] == 2
    assert [k for k, *_ in discrepancies(db_url)] == ["missing_webhook"]
    assert rows(db_url, "SELECT kind, amount_at_risk, resolved_by FROM "
                        "hookledger.discrepancies WHERE status = 'resolved'") == [
        ("amount_mismatch", Decimal(500), "admin")]


def test_a_payment_whose_record_was_an_invoice_at_first_is_recovered_once_it_is_paid(
        db_url: str) -> None:
    """Asked about too early, the reference answered with another kind's record; later the
    provider's record is the payment, whose webhook was lost. It is recovered, and the
    mismatch resolved by that check."""
    state = CountingState()
    state.record_general(body("invoice.created", 93000, reference="K-3", amount=5000,
                              service="Invoicing",
                              invoice={**INVOICE, "invoiceNo": "K-3", "total": 5000}))
    expect(db_url, "K-3", "collection", 5000)
    with running_sandbox(state=state) as api:
        first = reconcile(db_url, api.url, **NO_BACKOFF)
        state.record_general(body("payment.confirmed", 91000, reference="K-3", amount=5000))
        later = reconcile(db_url, api.url, **NO_BACKOFF)
    assert first.recovered == [] and later.recovered == ["K-3"]
    assert rows(db_url, "SELECT outcome, amount, recovered FROM hookledger.payments") == [
        ("success", Decimal(5000), True)]
    assert ("status_mismatch", "collection", "K-3", Decimal(5000)) in discrepancies(
        db_url, "resolved")
    assert discrepancies(db_url) == [("missing_webhook", "collection", "K-3", Decimal(5000))]


async def append_and_project(url: str, events: list[NewEvent]) -> None:
    await append(url, events)
    await project(url)


def test_a_pending_payout_is_not_completed_by_a_collections_record(db_url: str) -> None:
    """No expectation at all: a payout known by its approval webhook, whose reference the
    provider answers with a collection's record, stays pending and is reported."""
    deliver(db_url, "payout.approved", 92002, reference="K-2", amount=900,
            service="Disbursement", type_="PAYOUT", status="APPROVED")
    state = CountingState()
    state.record_general(body("payment.confirmed", 91000, reference="K-2", amount=900))
    with running_sandbox(state=state) as api:
        result = reconcile(db_url, api.url, payout_window=timedelta(0))
    assert result.recovered == []
    assert rows(db_url, "SELECT outcome, last_event, recovered FROM hookledger.payouts") == [
        ("pending", "payout.approved", False)]
    assert discrepancies(db_url) == [("status_mismatch", "payout", "K-2", Decimal(900))]


def test_a_part_payment_against_an_invoice_is_still_recovered_as_a_collection(
        db_url: str) -> None:
    """A part payment of an invoice is a collection (payment.confirmed, 91001) that may
    name the Invoicing service and carry the invoice block: it is recovered as one."""
    state = CountingState()
    state.record_general(body(
        "payment.confirmed", 91001, reference="PP-1", amount=1500, service="Invoicing",
        status="PARTIAL", invoice={**INVOICE, "amountPaid": 1500, "amountDue": 48500}))
    expect(db_url, "PP-1", "collection", 1500)
    with running_sandbox(state=state) as api:
        result = reconcile(db_url, api.url)
    assert result.recovered == ["PP-1"]
    assert rows(db_url, "SELECT reference, outcome, amount, recovered FROM hookledger.payments"
                ) == [("PP-1", "success", Decimal(1500), True)]
    # the record's invoice block reaches the invoice, as the lost webhook's would have
    assert rows(db_url, "SELECT invoice_no, status, amount_paid, amount_due, settled "
                        "FROM hookledger.invoices") == [
        ("INV-1", "partially_paid", Decimal(1500), Decimal(48500), False)]


def test_a_recovery_is_filed_under_the_reference_asked_whatever_the_provider_spells(
        db_url: str) -> None:
    state = CountingState()
    state.put_record("CASE-1", {"reference": "case-1", "status": "SUCCESSFUL", "amount": 100,
                                "event": "payment.confirmed", "code": 91000,
                                "service": "Collection", "type": "CHARGE"})
    expect(db_url, "CASE-1", "collection", 100)
    with running_sandbox(state=state) as api:
        result = reconcile(db_url, api.url)
    assert result.recovered == ["CASE-1"]
    assert rows(db_url, "SELECT reference, outcome, recovered FROM hookledger.payments") == [
        ("CASE-1", "success", True)]
    assert rows(db_url, "SELECT resolved FROM hookledger.expectations") == [(True,)]
    assert rows(db_url, "SELECT payload->>'provider_reference' FROM hookledger.ledger "
                        "WHERE event_type = 'reconcile.recovered'") == [("case-1",)]


def test_a_payment_webhooks_brought_in_the_providers_spelling_is_not_recovered_twice(
        db_url: str) -> None:
    """Registered as CASE-1, delivered by webhook as case-1, which the provider answers for
    CASE-1: recovering it under CASE-1 put the same money in payments twice, beside a
    missing_webhook no webhook could ever close. It is a finding for a person instead,
    and once they resolved it the expectation is not asked about every backoff."""
    state = CountingState()
    state.put_record("CASE-1", {"reference": "case-1", "status": "SUCCESSFUL", "amount": 100,
                                "event": "payment.confirmed", "code": 91000,
                                "service": "Collection", "type": "CHARGE"})
    deliver(db_url, "payment.confirmed", 91000, reference="case-1", amount=100)
    expect(db_url, "CASE-1", "collection", 100)
    with running_sandbox(state=state) as api:
        result = reconcile(db_url, api.url, **NO_BACKOFF, recheck_limit=0)
        assert result.recovered == []
        assert rows(db_url, "SELECT reference, recovered FROM hookledger.payments") == [
            ("case-1", False)]
        [(found, kind, detail)] = rows(
            db_url, "SELECT id, kind, detail FROM hookledger.discrepancies "
                    "WHERE status = 'open'")
        assert kind == "status_mismatch" and "as case-1" in detail
        person_resolves(db_url, found, "collection", "CASE-1", "the same payment")
        later = reconcile(db_url, api.url, **NO_BACKOFF, recheck_limit=0)
        after = reconcile(db_url, api.url, **NO_BACKOFF, recheck_limit=0)
    assert later.checked == 1 and later.detected == [] and after.checked == 0
    assert discrepancies(db_url) == []


def test_an_answer_about_another_reference_is_an_error_and_recovers_nothing(
        db_url: str) -> None:
    """A wrong mapping path or an API mix-up must not mark the asked payment paid."""
    state = CountingState()
    state.put_record("ASK-1", {"reference": "OTHER-9", "status": "SUCCESSFUL", "amount": 100,
                               "event": "payment.confirmed", "code": 91000,
                               "service": "Collection", "type": "CHARGE"})
    expect(db_url, "ASK-1", "collection", 100)
    with running_sandbox(state=state) as api:
        result = reconcile(db_url, api.url)
    assert result.recovered == [] and result.errors == {"mapping": 1}
    assert rows(db_url, "SELECT count(*) FROM hookledger.payments") == [(0,)]
    assert rows(db_url, "SELECT resolved FROM hookledger.expectations") == [(False,)]


def test_a_bug_judging_one_subject_never_stops_the_others(
        db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever a record holds that no rule foresaw, the rest of the chunk is still checked
    and recovered, and the failing subject is counted an error (a pass of nothing else
    exits 4) and asked again after a backoff."""
    real = runner.decide

    def failing_on_one(local: Any, lookup: Any, **kwargs: Any) -> Any:
        if local.reference == "BUG-1":
            raise ValueError("no rule foresaw this record")
        return real(local, lookup, **kwargs)

    monkeypatch.setattr(runner, "decide", failing_on_one)
    state = CountingState()
    for ref in ("BUG-1", "OK-1"):
        state.record_general(body("payment.confirmed", 91000, reference=ref, amount=100))
        expect(db_url, ref, "collection", 100)
    with running_sandbox(state=state) as api:
        result = reconcile(db_url, api.url)
    assert result.recovered == ["OK-1"] and result.errors == {"internal": 1}
    assert result.results == {"recovered": 1, "error": 1}  # as the summary and exit code say
    assert discrepancies(db_url) == [("missing_webhook", "collection", "OK-1", Decimal(100))]
    assert rows(db_url, "SELECT reference, last_result, coalesce(next_check_at > now(), false) "
                        "FROM hookledger_private.reconcile_subjects ORDER BY reference") == [
        ("BUG-1", "error", True), ("OK-1", "recovered", False)]


def _time_passes(url: str) -> None:
    rows(url, "UPDATE hookledger_private.reconcile_subjects "
              "SET next_check_at = now() - interval '1 second' WHERE next_check_at IS NOT NULL "
              "RETURNING 1")


def test_a_recent_payment_the_provider_does_not_know_yet_is_asked_again_after_its_backoff(
        db_url: str) -> None:
    """The rolling re-check of a fresh success found no record inside the window: that
    settles nothing, so it is asked again, and past the window it is unknown_at_provider
    (it was asked once and never again)."""
    state = CountingState()
    deliver(db_url, "payment.confirmed", 91000, reference="F-1", amount=90000,
            timestamp=ts_ago(seconds=20))
    with running_sandbox(state=state) as api:
        first = reconcile(db_url, api.url)
        assert (state.asked["F-1"], first.detected) == (1, [])
        _time_passes(db_url)
        reconcile(db_url, api.url, window=timedelta(seconds=1))
    assert state.asked["F-1"] == 2
    assert discrepancies(db_url) == [("unknown_at_provider", "collection", "F-1",
                                      Decimal(90000))]


def test_a_webhook_calling_paid_a_payment_already_unknown_at_the_provider_is_told(
        db_url: str) -> None:
    """Registered, unknown at the provider after the window, then a webhook calls it paid
    and the provider still has no record: the open finding kept saying only that the
    provider has no record (the initiation most likely failed), at the amount expected,
    while the payments view said success at 90,000: the warning not to fulfil it, which
    the same finding made first-hand carries, was never given."""
    state = CountingState()
    expect(db_url, "N-9", "collection", 1500)
    with running_sandbox(state=state) as api:
        reconcile(db_url, api.url)
        assert discrepancies(db_url) == [("unknown_at_provider", "collection", "N-9",
                                          Decimal(1500))]
        deliver(db_url, "payment.confirmed", 91000, reference="N-9", amount=90000,
                timestamp=ts_ago(minutes=5))
        _time_passes(db_url)
        reconcile(db_url, api.url)
        _time_passes(db_url)
        again = reconcile(db_url, api.url)  # the same claim again is no news
    assert state.asked["N-9"] == 3 and again.detected == again.resolved == []
    assert rows(db_url, "SELECT detail, amount_at_risk FROM hookledger.discrepancies "
                        "WHERE status = 'open'") == [
        ("the provider has no record of collection N-9; yet its webhooks said success "
         "(SUCCESSFUL): do not fulfil or pay on it until the provider confirms",
         Decimal(90000))]
    assert rows(db_url, "SELECT resolution FROM hookledger.discrepancies "
                        "WHERE status = 'resolved'") == [
        ("superseded: its webhooks now say success",)]


def test_a_recheck_the_api_failed_is_asked_again_once_it_answers(db_url: str) -> None:
    state = CountingState()
    state.record_general(body("payment.confirmed", 91000, reference="E-1", amount=70000))
    deliver(db_url, "payment.confirmed", 91000, reference="E-1", amount=70000)
    with running_sandbox(state=state, faults=FaultSettings(error_rate=1.0)) as api:
        failed = reconcile(db_url, api.url, max_attempts=1)
        assert failed.errors and failed.checked == 1
        api.faults.configure(FaultSettings())
        _time_passes(db_url)
        again = reconcile(db_url, api.url)
    assert again.checked == 1 and not again.errors
    assert rows(db_url, "SELECT last_result, next_check_at FROM "
                        "hookledger_private.reconcile_subjects") == [("agrees", None)]


def test_a_backoff_ending_just_after_the_next_pass_starts_is_ended_for_that_pass(
        db_url: str) -> None:
    """A backoff is a multiple of the interval from the moment a pass picked its subjects;
    the pass an interval later picked a few milliseconds sooner after its own start, missed
    the subject by that much, and left a lost webhook a whole interval longer unrecovered."""
    state = CountingState()
    state.record_general(body("payment.confirmed", 91000, reference="E-2", amount=70000))
    deliver(db_url, "payment.confirmed", 91000, reference="E-2", amount=70000)
    start = datetime.now(UTC)
    with running_sandbox(state=state, faults=FaultSettings(error_rate=1.0)) as api:
        assert reconcile(db_url, api.url, max_attempts=1, now=start).errors
        api.faults.configure(FaultSettings())
        halfway = reconcile(db_url, api.url, now=start + timedelta(seconds=30))
        again = reconcile(db_url, api.url,
                          now=start + timedelta(seconds=60) - timedelta(milliseconds=30))
    assert (halfway.checked, again.checked, again.errors) == (0, 1, {})


def test_a_webhook_success_the_provider_still_calls_pending_stays_a_mismatch(
        db_url: str) -> None:
    """Final by webhook, pending at the provider past the window: once reported as
    unresolved, which the next pass closed at once ("a final state arrived": it had)."""
    state = CountingState()
    state.put_record("P-1", {"reference": "P-1", "status": "PENDING", "amount": 50000,
                             "service": "Collection", "type": "CHARGE"})
    deliver(db_url, "payment.confirmed", 91000, reference="P-1", amount=50000,
            timestamp=ts_ago(minutes=10))
    with running_sandbox(state=state) as api:
        reconcile(db_url, api.url)
        _time_passes(db_url)
        reconcile(db_url, api.url)
    assert state.asked["P-1"] == 2
    assert discrepancies(db_url) == [("status_mismatch", "collection", "P-1", Decimal(50000))]
    assert discrepancies(db_url, "resolved") == []


def test_a_late_webhook_for_more_than_the_provider_paid_keeps_the_shortfall_open(
        db_url: str) -> None:
    """1,500 expected, 1,000 paid at the provider (recovered), then a webhook claiming
    1,500: the webhook is no longer missing, but the shortfall stands (it was closed as
    agreeing, and nothing was at risk any more)."""
    state = CountingState()
    state.record_general(body("payment.confirmed", 91001, reference="Q-1", amount=1000,
                              status="PARTIAL"))
    expect(db_url, "Q-1", "collection", 1500)
    with running_sandbox(state=state) as api:
        reconcile(db_url, api.url)
        assert discrepancies(db_url) == [
            ("amount_mismatch", "collection", "Q-1", Decimal(500)),
            ("missing_webhook", "collection", "Q-1", Decimal(1000))]
        deliver(db_url, "payment.confirmed", 91000, reference="Q-1", amount=1500)
        reconcile(db_url, api.url)
    assert discrepancies(db_url) == [("amount_mismatch", "collection", "Q-1", Decimal(500))]
    assert [r[0] for r in discrepancies(db_url, "resolved")] == ["missing_webhook"]


def test_once_the_states_agree_only_the_amount_difference_stays_at_risk(db_url: str) -> None:
    state = CountingState()
    state.record_general(body("payment.confirmed", 91000, reference="S-2", amount=1500))
    deliver(db_url, "payment.failed", 91053, reference="S-2", amount=0, status="FAILED",
            transaction_id="-1", timestamp="20261122083000")
    with running_sandbox(state=state) as api:
        reconcile(db_url, api.url)
        assert discrepancies(db_url) == [("status_mismatch", "collection", "S-2",
                                          Decimal(1500))]
        deliver(db_url, "payment.confirmed", 91000, reference="S-2", amount=1400,
                timestamp="20261122083500")
        reconcile(db_url, api.url)
    # (a failure beside a success is the projector's conflicting_events, of its own)
    assert discrepancies(db_url) == [("amount_mismatch", "collection", "S-2", Decimal(100)),
                                     ("conflicting_events", "collection", "S-2", Decimal(1400))]
    assert [r[0] for r in discrepancies(db_url, "resolved")] == ["status_mismatch"]


def test_an_answer_the_client_cannot_even_decode_is_retried_and_the_pass_goes_on(
        db_url: str) -> None:
    """Labelled gzip but not gzip: httpx raises a decoding error, which once escaped the
    client and ended the pass, and every pass after it, on the same subject."""
    state = CountingState()
    for reference in ("OK-1", "BAD-1", "OK-2"):
        state.record_general(body("payment.confirmed", 91000, reference=reference, amount=10))
        expect(db_url, reference, "collection", 10)
    faults = FaultSettings(malformed_count=1, malformed_kind="bad_encoding")
    with running_sandbox(state=state, faults=faults) as api:
        result = reconcile(db_url, api.url, max_attempts=1, concurrency=1)
    assert result.checked == 3 and sum(result.errors.values()) == 1
    assert len(result.recovered) == 2


@pytest.mark.parametrize("bad", [
    {"customer_reference": "order\u00007"},  # a NUL: jsonb refuses it
    {"amount": "1E+999999"},  # past what a projection's numeric column takes
])
def test_a_record_the_ledger_cannot_keep_is_an_error_and_the_pass_goes_on(
        db_url: str, bad: dict[str, Any]) -> None:
    """Kept, such a record failed the append of its whole chunk, pass after pass (it was
    asked first each time): no other lost webhook was recovered again."""
    state = CountingState()
    state.record_general(body("payment.confirmed", 91000, reference="BAD-1",
                              **{"amount": 10, **bad}))
    state.record_general(body("payment.confirmed", 91000, reference="OK-1", amount=20))
    expect(db_url, "BAD-1", "collection", 10)
    expect(db_url, "OK-1", "collection", 20)
    with running_sandbox(state=state) as api:
        result = reconcile(db_url, api.url)
    assert result.recovered == ["OK-1"] and result.errors == {"mapping": 1}
    assert rows(db_url, "SELECT reference, outcome FROM hookledger.payments") == [
        ("OK-1", "success")]
    [(detail,)] = rows(db_url, "SELECT payload->>'detail' FROM hookledger.ledger "
                               "WHERE event_type = 'reconcile.checked' "
                               "AND payload->>'reference' = 'BAD-1'")
    assert detail.startswith("MappingError: ")


def test_a_record_with_a_negative_amount_is_an_error_never_negative_money(
        db_url: str) -> None:
    """A webhook with a negative amount is malformed, and so is a record's invoice block
    with one; the record's own amount was taken as it stood, and a refund written -1000
    was recovered over the confirmed payment: ``payments`` said refunded at -1000 TZS, and
    its missing_webhook put -1000 at risk, taking that much off a report's total."""
    state = CountingState()
    state.record_general(body("payment.refunded", 91010, reference="NEG-1", amount=-1000,
                              status="REFUNDED"))
    deliver(db_url, "payment.confirmed", 91000, reference="NEG-1", amount=1000,
            timestamp=ts_ago(hours=1))
    with running_sandbox(state=state) as api:
        result = reconcile(db_url, api.url)
    assert state.asked["NEG-1"] == 1
    assert (result.recovered, result.errors) == ([], {"mapping": 1})
    assert rows(db_url, "SELECT outcome, amount FROM hookledger.payments") == [
        ("success", Decimal(1000))]
    assert discrepancies(db_url) == []


def test_an_answer_the_database_still_refuses_fails_its_subject_not_the_pass(
        db_url: str) -> None:
    """Should the database refuse a chunk's events for a reason no check here foresaw, the
    subjects are appended one by one: the refused one is recorded as an error and asked
    again after its backoff, the others as usual."""
    refuse_event_type(db_url, "reconcile.recovered")
    state = CountingState()
    state.record_general(body("payment.confirmed", 91000, reference="LOST-1", amount=10))
    state.record_general(body("payment.confirmed", 91000, reference="SEEN-1", amount=20))
    expect(db_url, "LOST-1", "collection", 10)
    deliver(db_url, "payment.confirmed", 91000, reference="SEEN-1", amount=20)
    with running_sandbox(state=state) as api:
        result = reconcile(db_url, api.url)
        assert result.checked == 2 and result.errors == {"unstorable_answer": 1}
        assert result.results == {"agrees": 1, "error": 1}  # not "recovered"
        assert result.recovered == [] and result.detected == []
        assert rows(db_url, "SELECT reference, last_result, coalesce(next_check_at > now(), "
                            "false) FROM hookledger_private.reconcile_subjects "
                            "ORDER BY reference") == [("LOST-1", "error", True),
                                                      ("SEEN-1", "agrees", False)]
        assert rows(db_url, "SELECT payload->>'error' FROM hookledger.ledger WHERE "
                            "event_type = 'reconcile.checked' ORDER BY position") == [
            ("unstorable_answer",), (None,)]
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute("DROP TRIGGER test_refuse ON hookledger_private.ledger_events")
        _time_passes(db_url)
        again = reconcile(db_url, api.url)
    assert again.recovered == ["LOST-1"]
    assert discrepancies(db_url) == [("missing_webhook", "collection", "LOST-1", Decimal(10))]


def test_a_pass_that_lost_its_lock_never_runs_beside_another(db_url: str) -> None:
    """The pass held its advisory lock on a connection of its own, idle for the whole pass:
    when the server ended that session (``idle_session_timeout``, an administrator, a
    proxy dropping an idle connection), the lock went with it while the pass went on, on
    its other connection, and the next pass asked about the same subjects beside it: each
    lost webhook was reported twice (and the first pass failed at its very end)."""
    state = CountingState()
    references = [f"LK-{i}" for i in range(20)]
    for reference in references:
        state.record_general(body("payment.confirmed", 91000, reference=reference, amount=10))
        expect(db_url, reference, "collection", 10)
    failed: list[BaseException] = []

    def first(api_url: str) -> None:
        try:
            reconcile(db_url, api_url, concurrency=1)
        except Exception as exc:  # noqa: BLE001 - its session was ended under it
            failed.append(exc)

    with running_sandbox(state=state, faults=FaultSettings(latency_ms=100)) as api:
        thread = threading.Thread(target=first, args=(api.url,))
        thread.start()
        deadline = time.monotonic() + 30
        while len(state.asked) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        ended = rows(db_url, "SELECT pg_terminate_backend(pid, 10000) FROM pg_locks "
                             "WHERE locktype = 'advisory' AND granted AND objsubid = 1 "
                             "AND database = (SELECT oid FROM pg_database "
                             "WHERE datname = current_database()) "
                             "AND classid::bigint = %s AND objid::bigint = %s",
                     runner.RECONCILE_LOCK_KEY >> 32, runner.RECONCILE_LOCK_KEY & 0xFFFFFFFF)
        assert ended == [(True,)]
        second = reconcile(db_url, api.url, concurrency=4)
        thread.join(timeout=60)
    assert not second.skipped and second.checked == 20
    assert rows(db_url, "SELECT count(*), count(DISTINCT reference) FROM "
                        "hookledger.discrepancies") == [(20, 20)]
    assert rows(db_url, "SELECT count(*) FROM hookledger.ledger "
                        "WHERE event_type = 'reconcile.checked'") == [(20,)]


def lock_holders(url: str) -> int:
    return int(rows(url, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                         "AND granted AND objsubid = 1 AND database = (SELECT oid FROM "
                         "pg_database WHERE datname = current_database()) "
                         "AND classid::bigint = %s AND objid::bigint = %s",
                    runner.RECONCILE_LOCK_KEY >> 32,
                    runner.RECONCILE_LOCK_KEY & 0xFFFFFFFF)[0][0])


def test_a_pass_cut_off_by_a_network_blip_lets_go_of_the_lock_within_its_idle_limit(
        db_url: str) -> None:
    """The pass's session holds the reconciliation lock and sits idle while the provider
    answers. Cut off from its client, the server kept it, idle, until the kernel gave up
    on the socket (hours): every later pass, in every process, was skipped. The server now
    ends it once idle past the limit, while a working pass speaks often enough to keep it."""
    from tests.relay import SocketRelay

    state = CountingState()
    for n in range(3):
        state.record_general(body("payment.confirmed", 91000, reference=f"BLIP-{n}",
                                  amount=10))
        expect(db_url, f"BLIP-{n}", "collection", 10)
    relay = SocketRelay(db_url)
    failed: list[BaseException] = []

    def cut_pass(api_url: str) -> None:
        try:
            reconcile(relay.url, api_url, timeout_s=30, concurrency=1, idle_session_s=2.0)
        except Exception as exc:  # noqa: BLE001 - its connection is cut under it
            failed.append(exc)

    try:
        with running_sandbox(state=state, faults=FaultSettings(latency_ms=3000)) as api:
            thread = threading.Thread(target=cut_pass, args=(api.url,))
            thread.start()
            deadline = time.monotonic() + 30
            while not state.asked:
                assert time.monotonic() < deadline, "the first pass never asked"
                time.sleep(0.02)
            assert lock_holders(db_url) == 1
            relay.cut_clients()
            cut_at = time.monotonic()
            while lock_holders(db_url) and time.monotonic() - cut_at < 20:
                time.sleep(0.1)
            released = time.monotonic() - cut_at
            thread.join(timeout=60)
            second = reconcile(db_url, api.url, concurrency=4, timeout_s=30)
    finally:
        relay.close()
    assert released < 10, "the lingering session kept the reconciliation lock"
    assert not second.skipped and second.checked == 3
    assert failed  # the cut pass failed on its broken connection, as any pass would


def test_a_pass_whose_answers_take_longer_than_the_idle_limit_keeps_its_session(
        db_url: str) -> None:
    """The other side of the limit: lookups that take several times as long as it (a slow
    provider, a paced backlog) do not get a working pass's session ended."""
    state = CountingState()
    for n in range(3):
        state.record_general(body("payment.confirmed", 91000, reference=f"SLOW-{n}",
                                  amount=10))
        expect(db_url, f"SLOW-{n}", "collection", 10)
    with running_sandbox(state=state, faults=FaultSettings(latency_ms=1500)) as api:
        result = reconcile(db_url, api.url, concurrency=1, timeout_s=30, idle_session_s=1.0)
    assert not result.skipped and result.checked == 3 and sorted(result.recovered) == [
        "SLOW-0", "SLOW-1", "SLOW-2"]


def test_a_repair_is_counted_and_logged_only_once_its_chunk_committed(db_url: str) -> None:
    """Told inside the chunk's transaction, a repair whose commit failed was counted (the
    metric) and logged all the same, and again when the chunk was done again."""
    from reconcile.client import ReferenceClient
    from tests.reconcile_helpers import API_KEY

    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("CREATE FUNCTION hookledger_private.refuse_commit() RETURNS trigger "
                     "LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'commit refused'; END $$")
        conn.execute("CREATE CONSTRAINT TRIGGER refuse_at_commit AFTER INSERT OR UPDATE ON "
                     "hookledger_private.reconcile_subjects DEFERRABLE INITIALLY DEFERRED "
                     "FOR EACH ROW EXECUTE FUNCTION hookledger_private.refuse_commit()")
    state = CountingState()
    state.record_general(body("payment.confirmed", 91000, reference="NOCOMMIT-1", amount=5))
    expect(db_url, "NOCOMMIT-1", "collection", 5)
    told: list[tuple[str, int]] = []

    class Observer:
        def recovered(self, subject: str, count: int) -> None:
            told.append((subject, count))

        def after_pass(self, *_: Any) -> None:
            pass

    async def go(api_url: str) -> None:
        async with ReferenceClient(api_url, API_KEY, timeout_s=2) as client:
            await runner.Reconciler(db_url, client, runner.PassConfig(
                recheck_age=timedelta(days=3650)), Observer()).run_pass()

    with running_sandbox(state=state) as api, pytest.raises(psycopg.Error):
        asyncio.run(go(api.url))
    assert told == []
    assert rows(db_url, "SELECT count(*) FROM hookledger.ledger "
                        "WHERE event_type = 'reconcile.recovered'") == [(0,)]


def test_an_invoice_cancelled_with_money_received_is_open_until_the_money_goes_back(
        db_url: str) -> None:
    """Found by the projector as the deliveries arrive; a refund that carries the block
    (nothing received any more) settles it at the next pass, which needs no API."""
    block = {**INVOICE, "invoiceNo": "INV-X"}
    deliver(db_url, "payment.confirmed", 91001, reference="PAY-X", amount=20000,
            timestamp="20261122081000",
            invoice={**block, "amountPaid": 20000, "amountDue": 30000})
    deliver(db_url, "invoice.cancelled", 93003, reference="INV-X", amount=50000,
            service="Invoicing", timestamp="20261122082000",
            invoice={**block, "amountPaid": 20000, "amountDue": 30000})
    found = ("SELECT kind, amount_at_risk, status, resolution, resolved_by "
             "FROM hookledger.discrepancies WHERE subject = 'invoice'")
    assert rows(db_url, found) == [
        ("cancelled_invoice_paid", Decimal(20000), "open", None, None)]
    with running_sandbox(state=CountingState()) as api:
        reconcile(db_url, api.url)
        assert [r[2] for r in rows(db_url, found)] == ["open"]  # still held: not settled
        deliver(db_url, "payment.refunded", 91010, reference="PAY-X", amount=20000,
                status="REVERSED", timestamp="20261122090000",
                invoice={**block, "amountPaid": 0, "amountDue": 50000})
        reconcile(db_url, api.url)
    assert rows(db_url, found) == [("cancelled_invoice_paid", Decimal(20000), "resolved",
                                    "the money received was refunded", "reconciler")]


@pytest.mark.parametrize("payment_first", [False, True], ids=["in order", "payment first"])
def test_money_received_after_the_cancellation_is_found_by_the_next_pass(
        db_url: str, payment_first: bool) -> None:
    """A customer pays a cancelled invoice with its standing control number: the
    cancellation's block said nothing received, so its fold found nothing, and the
    payment's is no cancellation. The invoice's row says both (cancelled, 20000 received):
    the pass finds it there, once, under the key the projector would use for that amount,
    whatever order the two arrived in; a refund carrying the block settles it."""
    block = {**INVOICE, "invoiceNo": "INV-L"}
    cancel = ("invoice.cancelled", 93003, {
        "reference": "INV-L", "amount": 50000, "service": "Invoicing",
        "timestamp": "20261122082000",
        "invoice": {**block, "amountPaid": 0, "amountDue": 50000}})
    pay = ("payment.confirmed", 91001, {
        "reference": "PAY-L", "amount": 20000, "timestamp": "20261122083000",
        "invoice": {**block, "amountPaid": 20000, "amountDue": 30000}})
    for event, code, fields in ([pay, cancel] if payment_first else [cancel, pay]):
        deliver(db_url, event, code, **fields)
    found = ("SELECT kind, amount_at_risk, status, detected_by, resolution "
             "FROM hookledger.discrepancies WHERE subject = 'invoice'")
    assert rows(db_url, "SELECT status, amount_paid FROM hookledger.invoices") == [
        ("cancelled", Decimal(20000))]
    with running_sandbox(state=CountingState()) as api:
        reconcile(db_url, api.url)
        reconcile(db_url, api.url)
        assert rows(db_url, found) == [
            ("cancelled_invoice_paid", Decimal(20000), "open", "reconciler", None)]
        # the projector's own finding of that amount is the same one (a re-save saying so)
        deliver(db_url, "invoice.updated", 93001, reference="INV-L", amount=50000,
                service="Invoicing", timestamp="20261122084000", status="CANCELLED",
                invoice={**block, "amountPaid": 20000, "amountDue": 30000})
        assert len(rows(db_url, found)) == 1
        deliver(db_url, "payment.refunded", 91010, reference="PAY-L", amount=20000,
                status="REVERSED", timestamp="20261122090000",
                invoice={**block, "amountPaid": 0, "amountDue": 50000})
        reconcile(db_url, api.url)
    assert rows(db_url, found) == [("cancelled_invoice_paid", Decimal(20000), "resolved",
                                    "reconciler", "the money received was refunded")]


def test_a_person_resolved_cancelled_invoice_paid_is_not_found_again(db_url: str) -> None:
    block = {**INVOICE, "invoiceNo": "INV-D"}
    deliver(db_url, "invoice.cancelled", 93003, reference="INV-D", amount=50000,
            service="Invoicing", timestamp="20261122082000",
            invoice={**block, "amountPaid": 0, "amountDue": 50000})
    deliver(db_url, "payment.confirmed", 91001, reference="PAY-D", amount=20000,
            timestamp="20261122083000",
            invoice={**block, "amountPaid": 20000, "amountDue": 30000})
    with running_sandbox(state=CountingState()) as api:
        reconcile(db_url, api.url)
        [(found_id,)] = rows(db_url, "SELECT id FROM hookledger.discrepancies "
                                     "WHERE kind = 'cancelled_invoice_paid'")
        person_resolves(db_url, found_id, "invoice", "INV-D", "refunded by bank transfer")
        reconcile(db_url, api.url)
    assert rows(db_url, "SELECT status, resolved_by FROM hookledger.discrepancies "
                        "WHERE kind = 'cancelled_invoice_paid'") == [("resolved", "admin")]


def test_a_cancelled_invoice_keeps_one_finding_at_the_money_it_holds(db_url: str) -> None:
    """A part refund leaves less held: the finding moves to that amount (two open
    findings said the larger was still at risk). Refunded in full, then paid again with
    the control number: found again (the first finding's key was in the ledger, closed,
    and the second payment went unseen). A person's acceptance covers what they accepted
    and less, not more."""
    block = {**INVOICE, "invoiceNo": "INV-M"}
    deliver(db_url, "invoice.cancelled", 93003, reference="INV-M", amount=50000,
            service="Invoicing", timestamp="20261122082000",
            invoice={**block, "amountPaid": 0, "amountDue": 50000})

    def held(reference: str, paid: int, minute: int, event: str = "payment.confirmed",
             code: int = 91001) -> None:
        deliver(db_url, event, code, reference=reference, amount=20000,
                timestamp=f"202611220{minute:03d}00",
                invoice={**block, "amountPaid": paid, "amountDue": 50000 - paid})

    def findings() -> list[tuple[Any, ...]]:
        return [tuple(r) for r in rows(
            db_url, "SELECT amount_at_risk, status, resolved_by FROM hookledger.discrepancies "
                    "WHERE kind = 'cancelled_invoice_paid' ORDER BY detected_at, amount_at_risk")]

    with running_sandbox(state=CountingState()) as api:
        held("PAY-M1", 20000, 830)
        reconcile(db_url, api.url)
        held("PAY-M1", 15000, 840, "payment.refunded", 91010)  # 5000 back
        reconcile(db_url, api.url)
        assert findings() == [(Decimal(20000), "resolved", "reconciler"),
                              (Decimal(15000), "open", None)]
        held("PAY-M1", 0, 850, "payment.refunded", 91010)
        reconcile(db_url, api.url)
        held("PAY-M2", 15000, 900)  # paid again, the same amount
        reconcile(db_url, api.url)
        assert findings()[-1] == (Decimal(15000), "open", None)
        assert [f[1] for f in findings()] == ["resolved", "resolved", "open"]
        [(last,)] = rows(db_url, "SELECT id FROM hookledger.discrepancies WHERE status = 'open' "
                                 "AND kind = 'cancelled_invoice_paid'")
        person_resolves(db_url, last, "invoice", "INV-M", "kept as credit")
        held("PAY-M2", 10000, 910, "payment.refunded", 91010)  # less than accepted
        reconcile(db_url, api.url)
        assert [f[1] for f in findings()] == ["resolved", "resolved", "resolved"]
        held("PAY-M2", 0, 920, "payment.refunded", 91010)
        held("PAY-M3", 10000, 930)  # within what was accepted, but paid in since
        reconcile(db_url, api.url)
        assert findings()[-1] == (Decimal(10000), "open", None)
        held("PAY-M4", 30000, 940)  # more
        reconcile(db_url, api.url)
    assert findings()[-2:] == [(Decimal(10000), "resolved", "reconciler"),
                               (Decimal(30000), "open", None)]


class WebhookDuringLookup(CountingState):
    """A provider whose webhook for ``reference`` reaches the ledger while hookledger's
    lookup of it is in flight (appended, not yet projected)."""

    def __init__(self, url: str, reference: str, webhook: NewEvent) -> None:
        super().__init__()
        self._url, self._reference, self._webhook = url, reference, webhook
        self.sent = False

    def record(self, reference: str) -> dict[str, Any] | None:
        if reference == self._reference and not self.sent:
            self.sent = True
            sender = threading.Thread(target=asyncio.run,
                                      args=(append(self._url, [self._webhook]),))
            sender.start()
            sender.join()
        return super().record(reference)


def test_a_webhook_arriving_during_a_lookup_that_recovers_is_still_checked(
        db_url: str) -> None:
    """The pass recovers the provider's confirmation while the confirmation's own webhook
    arrives with another amount. The check never saw that webhook, so the subject is not
    marked seen past it: it is asked about again once the webhook is folded, and the amounts
    are found to differ (before, the recovery's position covered it, and only a rolling
    re-check could find it)."""
    deliver(db_url, "payout.approved", 92002, reference="PO-W", amount=1000,
            service="Disbursement", status="APPROVED", timestamp=ts_ago(hours=1))
    webhook = kept_event("payout.confirmed", 92000, reference="PO-W", amount=900,
                         service="Disbursement", timestamp=ts_ago(minutes=30))
    state = WebhookDuringLookup(db_url, "PO-W", webhook)
    state.record_general(body("payout.confirmed", 92000, reference="PO-W", amount=1000,
                              service="Disbursement", timestamp=ts_ago(minutes=30)))
    with running_sandbox(state=state) as api:
        first = reconcile(db_url, api.url)
        assert state.sent and first.recovered == ["PO-W"]
        asyncio.run(project(db_url))
        assert rows(db_url, "SELECT outcome, amount FROM hookledger.payouts") == [
            ("success", Decimal(900))]
        reconcile(db_url, api.url, recheck_limit=0)  # not left to the rolling re-check
    assert ("amount_mismatch", "payout", "PO-W", Decimal(100)) in discrepancies(db_url)


def test_a_subject_asked_again_in_the_same_pass_keeps_what_its_second_check_found(
        db_url: str) -> None:
    """A webhook calling paid a payment the provider has no record of arrives while the
    pass looks it up: the row changed, so a later chunk of the same pass asks again and
    supersedes the first finding with one warning not to fulfil it. Both checks' events
    were keyed by the pass alone, so the second's were taken for copies of the first's:
    the supersession was kept and its finding dropped, and no finding stayed open while
    the payments view said success (the pass's summary still printed the warning)."""
    expect(db_url, "N-W", "collection", 1500)
    webhook = kept_event("payment.confirmed", 91000, reference="N-W", amount=1500,
                         timestamp=ts_ago(minutes=5))
    state = WebhookDuringLookup(db_url, "N-W", webhook)
    with running_sandbox(state=state) as api:
        result = reconcile(db_url, api.url)
    assert state.sent and state.asked["N-W"] == 2
    told = [d["detail"] for d in result.detected]
    assert rows(db_url, "SELECT detail FROM hookledger.discrepancies WHERE status = 'open'"
                ) == [(told[-1],)]
    assert "do not fulfil" in told[-1]
    assert rows(db_url, "SELECT count(*) FROM hookledger.ledger "
                        "WHERE event_type = 'reconcile.checked'") == [(2,)]


def test_only_a_webhook_the_row_folds_counts_as_arrived_during_a_lookup(db_url: str) -> None:
    """A malformed copy on the stream is no change a check could see in the row: counted,
    every such recovery cost a lookup more."""
    async def spans_after(new: NewEvent) -> set[tuple[str, str]]:
        await append(db_url, [new])
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
            return await runner.store.arrived_meanwhile(
                conn, [("payout", "PO-M", 0, 10**9)])
    malformed = kept_event("payout.confirmed", 92000, reference="PO-M", amount="1000",
                           service="Disbursement")
    assert malformed.event_type == "general.malformed"
    assert asyncio.run(spans_after(malformed)) == set()
    confirmed = kept_event("payout.confirmed", 92000, reference="PO-M", amount=1000,
                           service="Disbursement")
    assert asyncio.run(spans_after(confirmed)) == {("payout", "PO-M")}


def test_a_subject_unsettled_for_a_month_is_no_longer_asked_until_it_changes(
        db_url: str) -> None:
    """An initiation that never reached the provider is asked about hourly, then daily, and
    once it is older than the give-up age (and was asked about a day's worth of times) no
    more: its finding stays open for a person, and a webhook about it makes it due again."""
    state = CountingState()
    expect(db_url, "DEAD-1", "collection", 100)
    start = datetime.now(UTC)
    with running_sandbox(state=state) as api:
        first = reconcile(db_url, api.url, now=start)
        assert (state.asked["DEAD-1"], first.given_up) == (1, 0)
        assert discrepancies(db_url) == [("unknown_at_provider", "collection", "DEAD-1",
                                          Decimal(100))]
        # a month of checks later (the 29 before this one stood for by their count)
        rows(db_url, "UPDATE hookledger_private.reconcile_subjects SET checks = 29 "
                     "RETURNING 1")
        month = reconcile(db_url, api.url, now=start + timedelta(days=31))
        assert (state.asked["DEAD-1"], month.given_up) == (2, 1)
        assert "1 subject(s) unsettled past the give-up age" in "\n".join(month.summary())
        assert rows(db_url, "SELECT next_check_at FROM hookledger_private.reconcile_subjects"
                    ) == [(None,)]
        reconcile(db_url, api.url, now=start + timedelta(days=40))
        assert state.asked["DEAD-1"] == 2
        assert [kind for kind, *_ in discrepancies(db_url)] == ["unknown_at_provider"]
        deliver(db_url, "payment.confirmed", 91000, reference="DEAD-1", amount=100)
        reconcile(db_url, api.url, now=start + timedelta(days=40))
        assert state.asked["DEAD-1"] == 3


def test_a_subject_unsettled_for_over_a_day_is_asked_daily_not_hourly(db_url: str) -> None:
    """Its backoff's cap grows from an hour to a day once it has been unsettled a day."""
    state = CountingState()
    expect(db_url, "YOUNG-1", "collection", 100)
    expect(db_url, "OLD-1", "collection", 100, minutes_ago=2 * 24 * 60)
    start = datetime.now(UTC)
    with running_sandbox(state=state) as api:
        reconcile(db_url, api.url, now=start)
        rows(db_url, "UPDATE hookledger_private.reconcile_subjects SET checks = 12, "
                     "next_check_at = %s RETURNING 1", start)
        later = start + timedelta(minutes=5)
        assert reconcile(db_url, api.url, now=later).given_up == 0
    assert rows(db_url, "SELECT reference, next_check_at - last_checked_at "
                        "FROM hookledger_private.reconcile_subjects ORDER BY reference") == [
        ("OLD-1", timedelta(days=1)), ("YOUNG-1", timedelta(hours=1))]


def test_a_subject_is_never_given_up_inside_its_window(db_url: str) -> None:
    """A payout window longer than the give-up age is waited out: given up at 31 days, the
    payout unknown at the provider would never have been flagged unresolved or unknown."""
    state = CountingState()
    expect(db_url, "PO-LONG", "payout", 100)
    start = datetime.now(UTC)
    with running_sandbox(state=state) as api:
        window = {"payout_window": timedelta(days=40)}
        assert reconcile(db_url, api.url, now=start, **window).given_up == 0
        rows(db_url, "UPDATE hookledger_private.reconcile_subjects SET checks = 29 "
                     "RETURNING 1")
        inside = reconcile(db_url, api.url, now=start + timedelta(days=31), **window)
        assert (state.asked["PO-LONG"], inside.given_up, discrepancies(db_url)) == (2, 0, [])
        after = reconcile(db_url, api.url, now=start + timedelta(days=41), **window)
        assert (state.asked["PO-LONG"], after.given_up) == (3, 1)
        assert [kind for kind, *_ in discrepancies(db_url)] == ["unknown_at_provider"]


def test_a_passs_printed_findings_write_the_amount_at_risk_in_digits() -> None:
    """``hookledger reconcile`` prints what a pass found: a missing_webhook's amount at risk
    is the provider's amount as it spelled it, and ``1E+3`` is no amount a person reads."""
    result = runner.PassResult("p")
    result.detected.append({"kind": "missing_webhook", "subject": "collection",
                            "reference": "R", "detail": "d",
                            "amount_at_risk": Decimal("1E+3")})
    result.detected.append({"kind": "unresolved", "subject": "collection",
                            "reference": "S", "detail": "d",
                            "amount_at_risk": Decimal("5E-7")})
    lines = result.summary()
    assert "at risk 1000 " in lines[1] and "at risk 0.0000005 " in lines[2]


def test_a_pass_longer_than_a_backoff_asks_no_subject_twice(db_url: str) -> None:
    """A subject a pass asked about is not due again within that pass when only its
    backoff has ended. Each chunk judged backoffs by its own moment, so a pass that took
    longer than the backoff (a slow provider, a backlog of thousands) asked its first
    chunks' subjects again, before those it had not asked yet, and spent its
    ``max_subjects`` on them (seen walking "Scaling out": 4,451 checks of 4,069
    subjects in one pass)."""
    state = CountingState()
    for reference in ("LONG-1", "LONG-2"):
        expect(db_url, reference, "collection", 1000)  # overdue, unknown to the provider
    with running_sandbox(state=state, faults=FaultSettings(latency_ms=400)) as api:
        result = reconcile(db_url, api.url, chunk_size=1, max_subjects=4,
                           retry_base=timedelta(milliseconds=300))
    assert (state.asked["LONG-1"], state.asked["LONG-2"]) == (1, 1)
    assert result.checked == 2
