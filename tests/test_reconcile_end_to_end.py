"""End to end: a faulty sandbox scenario into a real hookledger, then reconciliation finds
every lost final state of a collection or payout (as missing_webhook, recovered), nothing
else, and the projections then agree with the ground truth."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import psycopg

from hookledger.demo import lost_last_states, reconcile_once, register_expectations
from sandbox import jsonenc
from sandbox.cli import state_for
from sandbox.run import run_plan
from sandbox.runner import running_sandbox
from sandbox.scenario import make_plan
from tests.live import running_service

GENERAL = {"primary": "whsec-rec-primary", "backup": "whsec-rec-backup"}


def test_reconciliation_finds_exactly_the_lost_deliveries_and_recovers_them(
        db_url: str) -> None:
    plan = make_plan("faulty", 7, endpoints=tuple(GENERAL), size=2)
    truth = jsonenc.loads(jsonenc.dumps(plan.truth))
    with running_service(db_url, general_secrets=",".join(f"{k}={v}" for k, v in
                                                          GENERAL.items())) as base:
        run_plan(plan, to=base, general_secrets=GENERAL, chat_secrets={}, retry_scale=1e-5)
    register_expectations(db_url, truth, datetime.now(UTC) - timedelta(minutes=10))
    with running_sandbox(state=state_for(plan)) as api:
        first = reconcile_once(db_url, api.url)
        second = reconcile_once(db_url, api.url)

    lost = lost_last_states(truth)
    dropped = {d["event_id"] for d in truth["dropped"]}
    assert dropped, "the faulty scenario drops deliveries"
    last_event = {}
    for event in truth["general_events"]:
        last_event[event["reference"]] = event["event_id"]
    # every lost final state is a dropped (or only badly signed) delivery of the truth
    bad = {b["id"] for b in truth["bad_signatures"] if b["system"] == "general"}
    assert {last_event[r] for _, r in lost} <= dropped | bad
    assert lost, "some final states were lost"

    with psycopg.connect(db_url) as conn:
        found = conn.execute("SELECT kind, subject, reference FROM hookledger.discrepancies "
                             "WHERE detected_by = 'reconciler'").fetchall()
        payments = {r: (o, Decimal(a), rec) for r, o, a, rec in conn.execute(
            "SELECT reference, outcome, amount, recovered FROM hookledger.payments")}
        payouts = {r: (o, Decimal(a), rec) for r, o, a, rec in conn.execute(
            "SELECT reference, outcome, amount, recovered FROM hookledger.payouts")}
    assert {(s, r) for k, s, r in found if k == "missing_webhook"} == lost
    assert {k for k, _, _ in found} <= {"missing_webhook"}, found  # nothing else
    assert sorted(first.recovered) == sorted(r for _, r in lost)
    assert second.recovered == [] and second.detected == []
    for reference, known in truth["payments"].items():
        assert payments[reference][:2] == (known["outcome"], Decimal(known["amount"]))
        assert payments[reference][2] == (("collection", reference) in lost)
    for reference, known in truth["payouts"].items():
        if ("payout", reference) in lost or known["outcome"] != "pending":
            assert payouts[reference][:2] == (known["outcome"], Decimal(known["amount"]))
        assert payouts.get(reference, (None, None, False))[2] == (("payout", reference) in lost)
