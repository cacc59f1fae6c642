"""A realistic mix of ledger events, made fast: real readings of template deliveries,
re-labelled per subject (reference, invoice number, message id).

Mix, by subject: collections 45% (confirmed; some part paid, refunded or failed), payouts
10% (approved, then confirmed or failed), invoices 10% (created, updates, a part payment,
paid), SMS 15% (delivered or failed), chat 20% (inbound message and sent/delivered/read
statuses, some failed). About 2.3 events per subject.
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from ingest.chat_body import DeliveryMeta, read_chat
from ingest.general_body import read_general
from ingest.json_body import parse_object
from ledger import NewEvent

EAT = ZoneInfo("Africa/Dar_es_Salaam")
BASE = datetime(2026, 11, 1, tzinfo=UTC)


def _general(event: str, code: int, **fields: Any) -> dict[str, Any]:
    body = {"timestamp": "20261101080000", "reference": "REF", "customerReference": "order",
            "amount": fields.pop("amount", 15000), "type": "CHARGE",
            "merchantAccountId": "shop", "status": fields.pop("status", "SUCCESSFUL"),
            "customer": {"firstname": "Asha", "lastname": "Mushi",
                         "phoneNumber": "255712345678", "mno": "Operator"},
            "transactionId": "TX", "event": event,
            "service": fields.pop("service", "Collection"), "message": "m", "code": code}
    body.update(fields)
    return body


def _template(body: dict[str, Any]) -> tuple[dict[str, Any], str]:
    raw = json.dumps(body).encode()
    parsed, text = parse_object(raw)
    read = read_general(parsed, EAT)
    return {"event_type": read.event_type, "facts": read.facts}, text


class Mix:
    def __init__(self, seed: int = 1) -> None:
        self.rng = random.Random(seed)
        inv = {"invoiceNo": "INV", "total": 90000, "currency": "TZS"}
        self.templates = {
            "confirmed": _template(_general("payment.confirmed", 91000)),
            "partial": _template(_general("payment.confirmed", 91001, amount=5000,
                                          status="PARTIAL")),
            "refunded": _template(_general("payment.refunded", 91010, status="REVERSED")),
            "failed": _template(_general("payment.failed", 91053, amount=0, transactionId="-1",
                                         status="FAILED")),
            "approved": _template(_general("payout.approved", 92002, service="Disbursement",
                                           type="PAYOUT")),
            "payout_ok": _template(_general("payout.confirmed", 92000, service="Disbursement")),
            "payout_failed": _template(_general("payout.failed", 92055, amount=0,
                                                service="Disbursement")),
            "inv_created": _template(_general("invoice.created", 93000, amount=90000,
                                              service="Invoicing",
                                              invoice={**inv, "amountPaid": 0,
                                                       "amountDue": 90000})),
            "inv_updated": _template(_general("invoice.updated", 93001, amount=90000,
                                              service="Invoicing",
                                              invoice={**inv, "amountPaid": 30000,
                                                       "amountDue": 60000})),
            "inv_part": _template(_general("payment.confirmed", 91001, amount=30000,
                                           invoice={**inv, "amountPaid": 30000,
                                                    "amountDue": 60000})),
            "inv_paid": _template(_general("invoice.paid", 93002, amount=90000,
                                           service="Invoicing",
                                           invoice={**inv, "amountPaid": 90000,
                                                    "amountDue": 0})),
            "sms_ok": _template(_general("sms.delivered", 94000, amount=0, service="Bulk SMS")),
            "sms_failed": _template(_general("sms.failed", 94050, amount=0,
                                             service="Bulk SMS")),
        }
        meta = DeliveryMeta(phone_number_id="100001", delivery_id="d", attempt=1)
        inbound = {"type": "message", "wabaId": "W", "phoneNumberId": "100001",
                   "contactWaId": "2557", "profileName": "Asha",
                   "message": {"id": "M", "from": "2557", "timestamp": "1793500000",
                               "type": "text", "text": {"body": "habari"}}}
        self.chat_templates = {"received": read_chat(inbound, meta)}
        for value in ("sent", "delivered", "read", "failed"):
            body = {"type": "status", "wabaId": "W", "phoneNumberId": "100001",
                    "status": {"id": "M", "status": value, "timestamp": "1793500000",
                               "recipient_id": "2557"}}
            self.chat_templates[value] = read_chat(body, meta)
        self.serial = 0

    def _general_event(self, name: str, reference: str, at: datetime,
                       invoice_no: str | None = None) -> NewEvent:
        template, text = self.templates[name]
        facts = copy.deepcopy(template["facts"])
        facts["reference"] = reference
        if invoice_no and facts.get("invoice"):
            facts["invoice"]["invoice_no"] = invoice_no
        subject = facts["subject"]
        self.serial += 1
        return NewEvent(stream=f"{subject}:{reference}", event_type=template["event_type"],
                        source="general", dedupe_key=f"bench:{self.serial}",
                        payload_json=text.replace('"REF"', json.dumps(reference), 1),
                        received_at=at, facts=facts, occurred_at=at, raw_body=text.encode())

    def _chat_event(self, name: str, message_id: str, at: datetime) -> NewEvent:
        template = self.chat_templates[name]
        facts = dict(template.facts)
        facts["message_id"] = message_id
        self.serial += 1
        return NewEvent(stream=f"chat-message:{message_id}", event_type=template.event_type,
                        source="chat", dedupe_key=f"bench:{self.serial}", payload_json="{}",
                        received_at=at, facts=facts, occurred_at=at)

    def subject(self, i: int) -> list[NewEvent]:
        at = BASE + timedelta(seconds=i)
        later = at + timedelta(seconds=30)
        roll = self.rng.random()
        g = self._general_event
        if roll < 0.45:
            ref = f"C{i}"
            kind = self.rng.random()
            if kind < 0.75:
                out = [g("confirmed", ref, at)]
                if self.rng.random() < 0.05:
                    out.append(g("refunded", ref, later))
                return out
            if kind < 0.85:
                return [g("partial", ref, at)]
            return [g("failed", ref, at)]
        if roll < 0.55:
            ref = f"O{i}"
            end = "payout_ok" if self.rng.random() < 0.8 else "payout_failed"
            return [g("approved", ref, at), g(end, ref, later)]
        if roll < 0.65:
            ref = f"I{i}"
            return [g("inv_created", ref, at, ref), g("inv_part", f"IP{i}", later, ref),
                    g("inv_updated", ref, later, ref),
                    g("inv_paid", ref, later + timedelta(seconds=60), ref)]
        if roll < 0.80:
            return [g("sms_ok" if self.rng.random() < 0.85 else "sms_failed", f"S{i}", at)]
        message = f"W{i}"
        if self.rng.random() < 0.3:
            return [self._chat_event("received", message, at)]
        statuses = ["sent", "delivered", "read"] if self.rng.random() < 0.9 else ["sent",
                                                                                   "failed"]
        return [self._chat_event(s, message, at + timedelta(seconds=k))
                for k, s in enumerate(statuses)]

    def events(self, total: int) -> Iterator[NewEvent]:
        made, i = 0, 0
        while made < total:
            for event in self.subject(i):
                if made >= total:
                    return
                yield event
                made += 1
            i += 1
