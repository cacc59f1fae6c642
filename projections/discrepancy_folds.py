"""The ``discrepancies`` projection: one row per discrepancy, open until a resolution.

Discrepancies are ledger events: ``discrepancy.detected`` (from the projector or the
reconciler) opens one, ``discrepancy.resolved`` (from the reconciler, when a later webhook
or check agrees, or from a person, ``hookledger resolve``) closes the one id it names, and
``resolved_by`` keeps which (the event's source): a check does not reopen what a person
resolved. A discrepancy's id is derived from the dedupe key of the event that detected it,
so it is the same after a rebuild and computable in SQL
(``left(encode(sha256(convert_to(dedupe_key, 'UTF8')), 'hex'), 24)``, see migration 0004).
"""

from __future__ import annotations

import hashlib
from typing import Any

from ledger import StoredEvent
from projections.folding import Discrepancy, decimal_or_none

Row = dict[str, Any]

DETECTED = "discrepancy.detected"
RESOLVED = "discrepancy.resolved"

SERVICE_OF_SUBJECT = {"collection": "Collection", "payout": "Disbursement",
                      "invoice": "Invoicing", "sms": "Bulk SMS", "chat": "Chat"}


def discrepancy_id(dedupe_key: str) -> str:
    return hashlib.sha256(dedupe_key.encode("utf-8")).hexdigest()[:24]


def discrepancy_keys(event: StoredEvent) -> list[str]:
    if event.event_type == DETECTED:
        return [discrepancy_id(event.dedupe_key)]
    if event.event_type == RESOLVED:
        return [str(event.facts["id"])]
    return []


def fold_discrepancy(row: Row | None, event: StoredEvent) -> tuple[Row, list[Discrepancy]]:
    facts = event.facts
    if event.event_type == DETECTED:
        subject = str(facts.get("subject") or "")
        extra = {k: v for k, v in facts.items() if k not in (
            "kind", "subject", "reference", "detail", "amount_at_risk", "evidence")}
        opened: Row = {
            "id": discrepancy_id(event.dedupe_key), "kind": facts.get("kind") or "unknown",
            "subject": subject, "service": SERVICE_OF_SUBJECT.get(subject, subject),
            "reference": facts.get("reference") or "", "detail": facts.get("detail") or "",
            "amount_at_risk": decimal_or_none(facts.get("amount_at_risk")),
            "status": "open", "detected_at": event.received_at, "resolved_at": None,
            "resolution": None, "resolved_by": None,
            "detected_by": facts.get("detected_by") or event.source,
            "facts": extra, "event_count": 0, "last_position": 0,
        }
        if row is not None and row["status"] == "resolved":  # resolution replayed first
            opened.update(status="resolved", resolved_at=row["resolved_at"],
                          resolution=row["resolution"], resolved_by=row.get("resolved_by"))
        state = opened
        if row is not None:
            state["event_count"] = row["event_count"]
            state["last_position"] = row["last_position"]
    else:
        base = dict(row) if row is not None else {
            "id": str(facts["id"]), "kind": "unknown", "subject": "", "service": "",
            "reference": "", "detail": "", "amount_at_risk": None, "status": "open",
            "detected_at": None,
            "resolved_at": None, "resolution": None, "resolved_by": None,
            "detected_by": None, "facts": {},
            "event_count": 0, "last_position": 0}
        state = base
        if state["status"] != "resolved":
            state["status"] = "resolved"
            state["resolved_at"] = event.received_at
            state["resolution"] = facts.get("reason")
            state["resolved_by"] = event.source  # admin (a person) or reconciler
    state["event_count"] += 1
    state["last_position"] = max(state["last_position"], event.position)
    return state, []
