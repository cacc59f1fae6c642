"""Findings as ledger events (source ``reconciler``). Pure: builds :class:`NewEvent` values.

* ``reconcile.checked``: the provider's answer to one check (the mapped record, or the
  error), on the subject's stream, so history shows every question asked;
* ``reconcile.recovered``: a terminal state only the API told us (a lost webhook), in the
  webhook facts' shape, folded by the payment and payout projections (``recovered`` true)
  and, when it carries an invoice block, by the invoice projection;
* ``discrepancy.detected`` / ``discrepancy.resolved``: folded by ``discrepancies``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from ledger import NewEvent
from ledger.instants import storable_instant
from ledger.jsonenc import dumps
from projections.discrepancy_folds import DETECTED, RESOLVED
from projections.folding import Discrepancy
from projections.general_folds import RECOVERED_EVENT
from reconcile.checks import Detection
from reconcile.client import Lookup
from reconcile.records import RECOVERY_EVENT, ProviderRecord

SOURCE = "reconciler"
CHECKED = "reconcile.checked"


def _event(stream: str, event_type: str, key: str, payload: dict[str, Any], now: datetime,
           occurred_at: datetime | None = None) -> NewEvent:
    text = dumps(payload)
    return NewEvent(stream=stream, event_type=event_type, source=SOURCE, dedupe_key=key,
                    payload_json=text, received_at=now, facts=payload,
                    occurred_at=occurred_at)


def provider_time(raw: str | None, zone: ZoneInfo) -> datetime | None:
    """The record's ``yyyymmddHHMMss`` in the provider's zone, or None."""
    if not raw or len(raw) != 14 or not (raw.isascii() and raw.isdigit()):
        return None
    try:
        moment = datetime.strptime(raw, "%Y%m%d%H%M%S").replace(tzinfo=zone)
    except ValueError:
        return None
    return moment if storable_instant(moment) else None


def check_key(pass_id: str, nth: int = 1) -> str:
    """What a check's events are keyed by: its pass and, from a subject's second check in
    one pass on (its row changed while the pass looked it up), which check it is. Keyed by
    the pass alone, a second check's events were dropped as copies of the first's."""
    return pass_id if nth <= 1 else f"{pass_id}:{nth}"


def checked_event(subject: str, lookup: Lookup, result: str, pass_id: str,
                  now: datetime, *, nth: int = 1) -> NewEvent:
    payload = {
        "subject": subject, "reference": lookup.reference, "pass_id": pass_id,
        "result": result, "answer": lookup.kind, "error": lookup.error,
        "detail": lookup.detail, "api_code": lookup.api_code, "attempts": lookup.attempts,
        "record": lookup.record.as_json() if lookup.record else None,
    }
    return _event(f"{subject}:{lookup.reference}", CHECKED,
                  f"reconcile:checked:{subject}:{lookup.reference}:{check_key(pass_id, nth)}",
                  payload, now)


def recovered_event(subject: str, record: ProviderRecord, pass_id: str, now: datetime,
                    zone: ZoneInfo, reference: str | None = None) -> NewEvent:
    """The provider's terminal state as a webhook-shaped event, filed under ``reference``
    (the one asked about; the provider may spell its own differently, e.g. in case, and a
    recovery filed under that would leave the payment asked about unresolved), with the
    record's invoice block, which the invoice fold applies as the webhook's."""
    reference = reference or record.reference
    event = record.event if (record.event or "").split(".")[0] == (
        "payment" if subject == "collection" else "payout") else None
    event = event or RECOVERY_EVENT[(subject, record.outcome)]
    occurred = provider_time(record.timestamp, zone)
    payload: dict[str, Any] = {
        "subject": subject, "reference": reference, "provider_reference": record.reference,
        "event": event,
        "status": record.status, "outcome": record.outcome, "code": record.code,
        "amount": record.amount, "transaction_id": record.transaction_id,
        "customer_reference": record.customer_reference,
        "occurred_at": occurred.isoformat() if occurred else None, "recovered": True,
        "pass_id": pass_id,
        # the record's invoice block, read as a webhook's: its invoice is told of a part
        # payment or refund the webhook of which was lost. Always present (None: the record
        # had none), which tells these events from those kept before, which fold as they did
        "invoice": record.invoice,
    }
    if record.unread_fields:
        payload["unread_fields"] = list(record.unread_fields)
    key = (f"reconcile:recovered:{subject}:{reference}:{record.outcome}:"
           f"{record.status}:{record.amount}")
    return _event(f"{subject}:{reference}", RECOVERED_EVENT, key, payload, now)


def detected_event(subject: str, reference: str, found: Detection, pass_id: str,
                   evidence: str, now: datetime, *, nth: int = 1) -> NewEvent:
    payload = {
        **found.facts, "kind": found.kind, "subject": subject, "reference": reference,
        "detail": found.detail, "amount_at_risk": found.amount_at_risk,
        "evidence": [evidence], "detected_by": SOURCE, "cause_position": None,
        "pass_id": pass_id,
    }
    return _event(f"discrepancy:{subject}:{reference}", DETECTED,
                  f"discrepancy:{found.kind}:{subject}:{reference}:reconciler:"
                  f"{check_key(pass_id, nth)}",
                  payload, now)


def row_finding_event(found: Discrepancy, pass_id: str, now: datetime,
                      cause_position: int) -> NewEvent:
    """A finding a fold makes, made by a pass from the projection row instead (what the
    row says that no single event did), under the key the projector would use, so each is
    recorded once whoever finds it first."""
    payload = {
        "kind": found.kind, "subject": found.subject, "reference": found.reference,
        "detail": found.detail, "amount_at_risk": found.amount_at_risk,
        "evidence": list(found.evidence), "detected_by": SOURCE,
        "cause_position": cause_position, "pass_id": pass_id,
    }
    return _event(f"discrepancy:{found.subject}:{found.reference}", DETECTED,
                  found.dedupe_key, payload, now)


def manual_resolution(discrepancy_id: str, subject: str, reference: str, reason: str,
                      now: datetime) -> NewEvent:
    """A person's resolution (``hookledger resolve``): the same event a check appends, from
    source ``admin``, under the same key, so a discrepancy is resolved once whoever does it."""
    payload = {"id": discrepancy_id, "subject": subject, "reference": reference,
               "reason": reason, "resolved_by": "admin"}
    return NewEvent(stream=f"discrepancy:{subject}:{reference}", event_type=RESOLVED,
                    source="admin", dedupe_key=f"discrepancy:resolved:{discrepancy_id}",
                    payload_json=dumps(payload), received_at=now, facts=payload)


def resolved_event(discrepancy_id: str, subject: str, reference: str, reason: str,
                   pass_id: str, now: datetime) -> NewEvent:
    payload = {"id": discrepancy_id, "subject": subject, "reference": reference,
               "reason": reason, "resolved_by": SOURCE, "pass_id": pass_id}
    return _event(f"discrepancy:{subject}:{reference}", RESOLVED,
                  f"discrepancy:resolved:{discrepancy_id}", payload, now)
