"""A payment recovered under the merchant's spelling, then delivered under the provider's.

Registered as CASE-1, its webhook lost, the provider's record (spelled case-1) recovered it
under CASE-1. When the webhook then arrives after all, as case-1, the same money is in
``payments`` twice, and the recovered row's ``missing_webhook`` ("fulfil it") never closes:
nothing ties the two rows together but the recovery's ``provider_reference``.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from sandbox.runner import running_sandbox
from tests.reconcile_helpers import CountingState, body, deliver, expect, reconcile, rows
from tests.test_reconcile_pass import NO_BACKOFF, discrepancies, person_resolves

CASES = [
    ("collection", "payments", body("payment.confirmed", 91000, reference="case-1",
                                    amount=100), ("payment.confirmed", 91000)),
    ("payout", "payouts", body("payout.confirmed", 92000, reference="case-1", amount=100,
                               service="Disbursement"),
     ("payout.confirmed", 92000)),
]


@pytest.mark.parametrize(("kind", "view", "record", "webhook"), CASES,
                         ids=[c[0] for c in CASES])
def test_a_late_webhook_under_the_providers_spelling_is_found_as_recorded_twice(
        db_url: str, kind: str, view: str, record: dict[str, Any],
        webhook: tuple[str, int]) -> None:
    state = CountingState()
    for spelling in ("CASE-1", "case-1"):  # the provider answers either
        state.put_record(spelling, record)
    expect(db_url, "CASE-1", kind, 100)
    with running_sandbox(state=state) as api:
        assert reconcile(db_url, api.url).recovered == ["CASE-1"]
        deliver(db_url, webhook[0], webhook[1], reference="case-1", amount=100,
                **({"service": "Disbursement"} if kind == "payout" else {}))
        assert rows(db_url, f"SELECT reference, recovered FROM hookledger.{view} "
                            f"ORDER BY reference") == [("CASE-1", True), ("case-1", False)]
        found = reconcile(db_url, api.url, **NO_BACKOFF, recheck_limit=0)
        again = reconcile(db_url, api.url, **NO_BACKOFF)
    assert [(d["kind"], d["subject"], d["reference"]) for d in found.detected] == [
        ("recorded_twice", kind, "CASE-1")]
    assert again.detected == []
    # the recovery's "fulfil it" is settled by the webhook that arrived after all
    assert [(r["kind"], r["reference"]) for r in found.resolved] == [
        ("missing_webhook", "CASE-1")]
    assert found.resolved[0]["reason"].startswith("under case-1: the late webhook arrived")
    assert discrepancies(db_url) == [("recorded_twice", kind, "CASE-1", Decimal(100))]
    [(found_id, detail, risk)] = rows(
        db_url, "SELECT id, detail, amount_at_risk FROM hookledger.discrepancies "
                "WHERE kind = 'recorded_twice' AND status = 'open'")
    assert "case-1" in detail and "CASE-1" in detail and risk == Decimal(100)

    person_resolves(db_url, found_id, kind, "CASE-1", "counted once, fulfilled once")
    with running_sandbox(state=state) as api:
        later = reconcile(db_url, api.url, **NO_BACKOFF)
    assert later.detected == []
    assert ("recorded_twice", kind, "CASE-1", Decimal(100)) not in discrepancies(db_url)


def test_the_same_spelling_or_no_row_under_the_other_is_nothing(db_url: str) -> None:
    """A recovery whose record is spelled as asked, or whose other spelling no webhook
    brought, leaves nothing counted twice."""
    state = CountingState()
    state.put_record("SAME-1", body("payment.confirmed", 91000, reference="SAME-1",
                                    amount=100))
    state.put_record("CASE-2", body("payment.confirmed", 91000, reference="case-2",
                                    amount=100))
    expect(db_url, "SAME-1", "collection", 100)
    expect(db_url, "CASE-2", "collection", 100)
    with running_sandbox(state=state) as api:
        assert sorted(reconcile(db_url, api.url).recovered) == ["CASE-2", "SAME-1"]
        deliver(db_url, "payment.confirmed", 91000, reference="case-9", amount=100)
        result = reconcile(db_url, api.url)
    assert not [d for d in result.detected if d["kind"] == "recorded_twice"]
    assert rows(db_url, "SELECT count(*) FROM hookledger.discrepancies "
                        "WHERE kind = 'recorded_twice'") == [(0,)]


def test_a_late_webhook_that_disagrees_leaves_the_recovery_open_beside_it(
        db_url: str) -> None:
    state = CountingState()
    for spelling in ("CASE-3", "case-3"):
        state.put_record(spelling, body("payment.confirmed", 91000, reference="case-3",
                                        amount=100))
    expect(db_url, "CASE-3", "collection", 100)
    with running_sandbox(state=state) as api:
        assert reconcile(db_url, api.url).recovered == ["CASE-3"]
        deliver(db_url, "payment.failed", 91050, reference="case-3", amount=100)
        found = reconcile(db_url, api.url, **NO_BACKOFF, recheck_limit=0)
    assert [d["kind"] for d in found.detected] == ["recorded_twice"] and not found.resolved
    assert [(k, r) for k, _, r, _ in discrepancies(db_url)] == [
        ("missing_webhook", "CASE-3"), ("recorded_twice", "CASE-3")]


def test_a_refund_under_the_providers_spelling_settles_the_recoverys_fulfil_it(
        db_url: str) -> None:
    """The success was recovered under CASE-4; its webhook came as case-4 after all, and
    then the refund's. Comparing the rows' outcomes (refunded, success) left "fulfil it"
    open beside the refund: it is settled as a refund under the same spelling settles it."""
    state = CountingState()
    for spelling in ("CASE-4", "case-4"):
        state.put_record(spelling, body("payment.confirmed", 91000, reference="case-4",
                                        amount=100))
    expect(db_url, "CASE-4", "collection", 100)
    with running_sandbox(state=state) as api:
        assert reconcile(db_url, api.url).recovered == ["CASE-4"]
        deliver(db_url, "payment.confirmed", 91000, reference="case-4", amount=100)
        deliver(db_url, "payment.refunded", 91010, reference="case-4", amount=100)
        found = reconcile(db_url, api.url, **NO_BACKOFF, recheck_limit=0)
    assert [d["kind"] for d in found.detected] == ["recorded_twice"]
    assert [(r["kind"], r["reference"], r["reason"]) for r in found.resolved] == [
        ("missing_webhook", "CASE-4",
         "under case-4: a later webhook moved it on to refunded (see recorded_twice)")]
    assert [(k, r) for k, _, r, _ in discrepancies(db_url)] == [("recorded_twice", "CASE-4")]


def test_a_recovered_row_confirmed_by_its_own_webhook_is_not_counted_twice(
        db_url: str) -> None:
    """CASE-5 was recovered from the record spelled case-5, then webhooks came under both
    spellings: the provider sent two, so they are two payments, and CASE-5 is no longer
    the provider's record alone."""
    state = CountingState()
    for spelling in ("CASE-5", "case-5"):
        state.put_record(spelling, body("payment.confirmed", 91000, reference="case-5",
                                        amount=100))
    expect(db_url, "CASE-5", "collection", 100)
    with running_sandbox(state=state) as api:
        assert reconcile(db_url, api.url).recovered == ["CASE-5"]
        deliver(db_url, "payment.confirmed", 91000, reference="CASE-5", amount=100)
        deliver(db_url, "payment.confirmed", 91000, reference="case-5", amount=100)
        assert rows(db_url, "SELECT reference, recovered FROM hookledger.payments "
                            "ORDER BY reference") == [("CASE-5", False), ("case-5", False)]
        result = reconcile(db_url, api.url, **NO_BACKOFF, recheck_limit=0)
    assert not [d for d in result.detected if d["kind"] == "recorded_twice"]
    assert rows(db_url, "SELECT count(*) FROM hookledger.discrepancies "
                        "WHERE kind = 'recorded_twice'") == [(0,)]


def test_both_spellings_registered_is_told_as_possibly_two_and_resolves_nothing(
        db_url: str) -> None:
    """The merchant registered CASE-6 and case-6; the provider answered CASE-6 with the
    record spelled case-6, whose webhook then came. Either one payment was registered
    twice or CASE-6 was recovered from another payment's record: a person must look, and
    CASE-6's "fulfil it" must not be closed by case-6's webhook."""
    state = CountingState()
    state.put_record("CASE-6", body("payment.confirmed", 91000, reference="case-6",
                                    amount=100))
    expect(db_url, "CASE-6", "collection", 100)
    expect(db_url, "case-6", "collection", 100)
    with running_sandbox(state=state) as api:
        first = reconcile(db_url, api.url)
        assert "CASE-6" in first.recovered
        deliver(db_url, "payment.confirmed", 91000, reference="case-6", amount=100)
        found = reconcile(db_url, api.url, **NO_BACKOFF, recheck_limit=0)
    told = [d for d in (*first.detected, *found.detected) if d["kind"] == "recorded_twice"]
    assert [(d["reference"]) for d in told] == ["CASE-6"]
    assert "registered as an expectation of its own" in told[0]["detail"]
    assert not [r for r in (*first.resolved, *found.resolved)
                if r["kind"] == "missing_webhook"]
    assert ("missing_webhook", "collection", "CASE-6", Decimal(100)) in discrepancies(db_url)


def test_two_recoveries_and_no_webhook_are_not_counted_as_webhooks(db_url: str) -> None:
    """Both spellings registered, no webhook for either, the provider answering both from
    the record spelled case-7: two recovered rows, and no webhook anywhere. Told as
    "webhooks have brought case-7", with CASE-7's finding closed as if one had arrived."""
    state = CountingState()
    for spelling in ("CASE-7", "case-7"):
        state.put_record(spelling, body("payment.confirmed", 91000, reference="case-7",
                                        amount=100))
    expect(db_url, "CASE-7", "collection", 100)
    expect(db_url, "case-7", "collection", 100)
    with running_sandbox(state=state) as api:
        first = reconcile(db_url, api.url)
        assert sorted(first.recovered) == ["CASE-7", "case-7"]
        again = reconcile(db_url, api.url, **NO_BACKOFF, recheck_limit=0)
    assert not [d for d in (*first.detected, *again.detected) if d["kind"] == "recorded_twice"]
    assert not [r for r in (*first.resolved, *again.resolved)
                if r["kind"] == "missing_webhook"]
