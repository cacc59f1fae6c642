"""The SQL views after a sandbox scenario agree with the sandbox's ground truth."""

from __future__ import annotations

import time
from decimal import Decimal
from typing import Any

import psycopg
import pytest

from sandbox import jsonenc
from sandbox.run import run_plan
from sandbox.scenario import make_plan
from tests.live import running_service

GENERAL = {"primary": "whsec-views-1", "backup": "whsec-views-2", "third": "whsec-views-3"}
CHAT = {"100001": "chat-views-1", "100002": "chat-views-2", "100003": "chat-views-3"}

VIEWS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    # truth section: (view, key column, compared fields)
    "payments": ("payments", "reference", ("status", "outcome", "amount", "code",
                                           "transaction_id", "customer_reference",
                                           "invoice_no")),
    "payouts": ("payouts", "reference", ("status", "outcome", "amount", "code",
                                         "transaction_id", "refunded_to_wallet")),
    "invoices": ("invoices", "invoice_no", ("status", "total", "amount_paid", "amount_due",
                                            "settled", "currency", "payment_reference")),
    "sms": ("sms_messages", "message_id", ("status", "recipient", "code")),
    "chat_messages": ("chat_messages", "message_id", ("phone_number_id", "contact_wa_id",
                                                      "direction", "type", "status", "code",
                                                      "error_code", "error_title",
                                                      "media_id")),
}


def normal(value: Any) -> Any:
    if isinstance(value, int | float | Decimal) and not isinstance(value, bool):
        return Decimal(str(value)).normalize()
    return value


def caught_up(db_url: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    with psycopg.connect(db_url, autocommit=True) as conn:
        while time.monotonic() < deadline:
            head, done = conn.execute(
                "SELECT (SELECT coalesce(max(position), 0) FROM hookledger.ledger),"
                " (SELECT min(position) FROM hookledger_private.projection_checkpoints)"
            ).fetchone()  # type: ignore[misc]
            if done >= head:
                return
            time.sleep(0.05)
    raise AssertionError("the projector did not catch up")


def view_rows(db_url: str, view: str, key: str, fields: tuple[str, ...]
              ) -> dict[str, dict[str, Any]]:
    with psycopg.connect(db_url) as conn:
        cur = conn.execute(f"SELECT {key}, {', '.join(fields)} FROM hookledger.{view}")
        return {row[0]: {f: normal(v) for f, v in zip(fields, row[1:], strict=True)}
                for row in cur.fetchall()}


def touched_by_drops(truth: dict[str, Any]) -> set[str]:
    """References whose state an undelivered event changes (dropped, or sent only with a
    bad signature), including the invoice a lost part payment paid."""
    refs = {g["reference"] for g in truth["general_events"] if not g["delivered"]}
    for reference in list(refs):
        invoice_no = truth["payments"].get(reference, {}).get("invoice_no")
        if invoice_no:
            refs.add(invoice_no)
    return refs


def run_scenario(db_url: str, scenario: str, seed: int) -> dict[str, Any]:
    plan = make_plan(scenario, seed, endpoints=tuple(GENERAL))
    with running_service(db_url, general_secrets=",".join(f"{k}={v}" for k, v in
                                                          GENERAL.items()),
                         chat_secrets=",".join(f"{k}={v}" for k, v in CHAT.items())) as base:
        run_plan(plan, to=base, general_secrets=GENERAL, chat_secrets=CHAT, retry_scale=1e-5)
        caught_up(db_url)
    return jsonenc.loads(jsonenc.dumps(plan.truth))  # type: ignore[no-any-return]


@pytest.mark.parametrize(("scenario", "seed"), [("clean", 5), ("faulty", 42)])
def test_views_match_the_ground_truth_for_every_subject_not_dropped(
        db_url: str, scenario: str, seed: int) -> None:
    truth = run_scenario(db_url, scenario, seed)
    skip = touched_by_drops(truth)
    if scenario == "clean":
        assert not skip
    compared = 0
    for section, (view, key, fields) in VIEWS.items():
        rows = view_rows(db_url, view, key, fields)
        for subject, expected in truth[section].items():
            if subject in skip:
                continue
            if section == "sms" and expected["status"] == "pending":
                assert subject not in rows  # never terminal: no webhook, no row
                continue
            want = {f: normal(expected.get(f)) for f in fields}
            if want.get("error_code") is not None:  # the platform's code, kept as text
                want["error_code"] = str(expected["error_code"])
            assert rows.get(subject) == want, f"{view} {subject}"
            compared += 1
    threads = view_rows(db_url, "chat_threads", "contact_wa_id",
                        ("phone_number_id", "profile_name", "last_inbound_at"))
    for thread in truth["chat_threads"]:
        got = threads[thread["contact_wa_id"]]
        assert got["phone_number_id"] == thread["phone_number_id"]
        assert got["profile_name"] == thread["profile_name"]
        assert got["last_inbound_at"].isoformat() == thread["last_inbound_at"]
    assert compared > 50
