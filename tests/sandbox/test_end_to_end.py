"""A faulty scenario into a real hookledger and real PostgreSQL, checked against the truth."""

from __future__ import annotations

from collections import Counter
from typing import Any

import httpx
import psycopg

from sandbox import jsonenc
from sandbox.run import run_plan
from sandbox.scenario import make_plan
from tests.live import running_service

GENERAL = {"primary": "whsec-e2e-primary", "backup": "whsec-e2e-backup",
           "third": "whsec-e2e-third"}
CHAT = {"100001": "chat-e2e-1", "100002": "chat-e2e-2", "100003": "chat-e2e-3"}


def _sorted(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _sorted(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_sorted(v) for v in value]
    return value


def canonical(body: dict[str, Any]) -> str:
    """jsonb reorders keys: compare bodies in a key-sorted, exact-number form."""
    return jsonenc.dumps(_sorted(body))


def rows(db_url: str, sql: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(db_url) as conn:
        return conn.execute(sql).fetchall()


def test_faulty_scenario_lands_each_delivered_event_once_and_refuses_bad_signatures(
        db_url: str) -> None:
    """Every delivered distinct general event is in the ledger once; dropped ones are absent;
    badly signed copies are in rejected_deliveries."""
    plan = make_plan("faulty", 42, endpoints=tuple(GENERAL))
    truth = jsonenc.loads(jsonenc.dumps(plan.truth))  # what the truth file would hold
    with running_service(db_url, general_secrets=",".join(f"{k}={v}" for k, v in
                                                          GENERAL.items()),
                         chat_secrets=",".join(f"{k}={v}" for k, v in CHAT.items())) as base:
        chat_exists = httpx.post(f"{base}/webhooks/chat/100001", content=b"{}",
                                 timeout=5).status_code != 404
        report = run_plan(plan, to=base, general_secrets=GENERAL,
                          chat_secrets=CHAT if chat_exists else {}, retry_scale=1e-5)

    ledger = rows(db_url, "SELECT payload::text FROM hookledger.ledger WHERE source = 'general'")
    stored = Counter(canonical(jsonenc.loads(text)) for (text,) in ledger)
    delivered = [g for g in truth["general_events"] if g["delivered"]]
    expected = Counter(canonical(g["body"]) for g in delivered)
    assert stored == expected
    assert all(n == 1 for n in stored.values())
    assert truth["dropped"], "a faulty scenario drops some deliveries"
    lost = [g for g in truth["general_events"] if not g["delivered"]]
    for g in lost:
        assert canonical(g["body"]) not in stored

    bad = [b for b in truth["bad_signatures"] if b["system"] == "general"]
    assert bad, "a faulty scenario sends some badly signed deliveries"
    rejected = rows(db_url, "SELECT endpoint, reason, body_sha256 FROM "
                            "hookledger.rejected_deliveries")
    rejected_general = Counter((e, s) for e, _r, s in rejected if e.startswith("general/"))
    assert rejected_general == Counter((f"general/{b['endpoint']}", b["body_sha256"])
                                       for b in bad)
    assert {r for e, r, _s in rejected if e.startswith("general/")} == {"bad_signature"}

    assert report.general["accepted"] == len(delivered)
    assert report.general["duplicate"] == truth["counts"]["duplicates"] - sum(
        1 for b in bad if any(g["event_id"] == b["id"] and g["copies"] > 1
                              for g in truth["general_events"]))
    assert report.general["refused"] == len(bad)
    if chat_exists:
        assert report.chat["events"] == truth["counts"]["chat_events"]
        assert report.chat["dead"] == 0
