"""Scenarios are reproducible per seed, cover the spec's tables, and their ground truth is
what the sandbox's reference API answers."""

from __future__ import annotations

import hashlib
from collections import Counter
from decimal import Decimal
from typing import Any

import httpx
from hypothesis import given, settings
from hypothesis import strategies as st

from sandbox import jsonenc
from sandbox.cli import state_for
from sandbox.codes import (
    CHAT_ERRORS,
    COLLECTION_FAILURE_CODES,
    GENERAL_EVENT_SERVICE,
    PAYOUT_FAILURE_CODES,
    SMS_FAILURE_CODES,
)
from sandbox.runner import running_sandbox
from sandbox.scenario import FaultRates, make_plan
from sandbox.state import DEFAULT_API_KEY

ENDPOINTS = ("primary", "backup", "third")


def fingerprint(seed: int, scenario: str = "faulty") -> str:
    plan = make_plan(scenario, seed, endpoints=ENDPOINTS)
    parts = [jsonenc.dumps(plan.truth), jsonenc.dumps(plan.records)]
    parts += [f"{s.event_id}|{s.endpoint}|{s.bad_signature}|{s.send_at_ms}|{s.body.hex()}"
              for s in plan.general_sends]
    parts += [f"{s.delivery_id}|{s.lost_attempts}|{s.first_attempt_fault}|{s.body.hex()}"
              for s in plan.chat_sends]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def test_the_same_seed_gives_identical_deliveries_and_truth() -> None:
    assert fingerprint(11) == fingerprint(11)


def test_different_seeds_give_different_scenarios() -> None:
    assert fingerprint(11) != fingerprint(12)


def test_a_scenario_covers_every_event_and_every_code_of_the_tables() -> None:
    plan = make_plan("faulty", 5)
    general = [e.body for e in plan.events if e.system == "general"]
    assert {b["event"] for b in general} == set(GENERAL_EVENT_SERVICE)
    codes = {b["code"] for b in general}
    for code in (*COLLECTION_FAILURE_CODES, *PAYOUT_FAILURE_CODES, *SMS_FAILURE_CODES,
                 91000, 91001, 91010, 92000, 92002, 93000, 93001, 93002, 93003, 94000):
        assert code in codes, code
    chat = [e.body for e in plan.events if e.system == "chat"]
    kinds = {b["message"]["type"] for b in chat if b["type"] == "message"}
    assert kinds == {"text", "image", "document", "audio", "video"}
    statuses = {b["status"]["status"] for b in chat if b["type"] == "status"}
    assert statuses == {"sent", "delivered", "read", "failed"}
    errors = {b["errors"][0]["code"] for b in chat if "errors" in b}
    assert errors == {platform for platform, _ in CHAT_ERRORS.values()}
    assert len({b["phoneNumberId"] for b in chat}) == 3
    assert Counter(i["status"] for i in plan.truth["invoices"].values()).keys() == {
        "open", "partially_paid", "paid", "cancelled"}
    assert "pending" in {s["status"] for s in plan.truth["sms"].values()}


def test_a_clean_scenario_has_no_fault() -> None:
    plan = make_plan("clean", 3)
    counts = plan.truth["counts"]
    assert counts["dropped"] == counts["duplicates"] == counts["bad_signatures"] == 0
    assert counts["chat_lost_attempts"] == 0
    assert [s.send_at_ms for s in plan.general_sends] == sorted(
        s.send_at_ms for s in plan.general_sends)


def test_invoice_truth_is_settled_exactly_when_nothing_is_due() -> None:
    for invoice in make_plan("faulty", 9).truth["invoices"].values():
        assert invoice["amount_due"] == invoice["total"] - invoice["amount_paid"]
        assert invoice["settled"] == (invoice["amount_due"] == 0)
        assert (invoice["status"] == "paid") == invoice["settled"]


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000),
       drop=st.floats(0, 1), duplicate=st.floats(0, 1), bad=st.floats(0, 1),
       reorder=st.floats(0, 1))
def test_every_event_is_either_dropped_or_sent_once_plus_at_most_two_copies(
        seed: int, drop: float, duplicate: float, bad: float, reorder: float) -> None:
    """Whatever the fault rates, no event is lost from the books or copied past 3 endpoints."""
    rates = FaultRates(drop=drop, duplicate=duplicate, bad_signature=bad, reorder=reorder,
                       delay=0.5)
    plan = make_plan("faulty", seed, endpoints=ENDPOINTS, rates=rates)
    general_ids = [e.event_id for e in plan.events if e.system == "general"]
    dropped = {d["event_id"] for d in plan.truth["dropped"]}
    copies = Counter(s.event_id for s in plan.general_sends)
    assert set(copies) | dropped == set(general_ids) and not set(copies) & dropped
    assert all(1 <= n <= 3 for n in copies.values())
    originals = Counter(s.event_id for s in plan.general_sends if s.copy == 0)
    assert all(n == 1 for n in originals.values())
    for s in plan.general_sends:  # a copy is signed for its own endpoint, never the bad key
        assert s.endpoint in ENDPOINTS and (not s.bad_signature or s.copy == 0)
    delivered = {g["event_id"] for g in plan.truth["general_events"] if g["delivered"]}
    assert delivered == {s.event_id for s in plan.general_sends if not s.bad_signature}


def _api(url: str, reference: str) -> dict[str, Any]:
    answer = httpx.get(f"{url}/api/v1/payment/reference/{reference}", timeout=5,
                       headers={"apiToken": DEFAULT_API_KEY})
    assert answer.status_code == 200, reference
    envelope = jsonenc.loads(answer.text)
    assert envelope["success"] is True
    data: dict[str, Any] = envelope["data"]
    return data


def test_ground_truth_matches_the_reference_api_for_every_subject() -> None:
    plan = make_plan("faulty", 21, endpoints=ENDPOINTS)
    truth = plan.truth
    with running_sandbox(state=state_for(plan)) as api:
        for ref, want in truth["payments"].items():
            got = _api(api.url, ref)
            assert (got["status"], got["amount"], got["code"]) == (
                want["status"], want["amount"], want["code"]), ref
            assert (None if got.get("transactionId") == "-1" else got.get("transactionId")) \
                == want["transaction_id"]
            if want["invoice_no"]:
                assert got["invoice"]["invoiceNo"] == want["invoice_no"]
        for ref, want in truth["payouts"].items():
            got = _api(api.url, ref)
            assert (got["status"], got["amount"], got["code"]) == (
                want["status"], want["amount"], want["code"]), ref
        for no, want in truth["invoices"].items():
            block = _api(api.url, no)["invoice"]
            assert (block["total"], block["amountPaid"], block["amountDue"]) == (
                want["total"], want["amount_paid"], want["amount_due"]), no
            assert (block["amountDue"] == 0) == want["settled"]
        for message_id, want in truth["sms"].items():
            got = _api(api.url, message_id)
            assert got["customerReference"] == want["recipient"]
            expected = {"pending": "SENT", "delivered": "DELIVERED"}.get(want["status"])
            assert got["status"] == expected if expected else got["code"] == want["code"]
            assert got["amount"] == Decimal(0)
        dropped_refs = {d["reference"] for d in truth["dropped"]}
        for ref in dropped_refs:  # the API knows what was never delivered
            assert _api(api.url, ref)["reference"] == ref
