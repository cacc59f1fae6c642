"""Bodies for every event of the spec's general event table, written out by hand."""

from __future__ import annotations

import json
from typing import Any

CUSTOMER = {"firstname": "Asha", "lastname": "Mushi", "phoneNumber": "255712345678",
            "mno": "Operator"}


def general_body(event: str, code: int, *, reference: str, amount: Any = 1000,
                 status: str = "SUCCESSFUL", service: str = "Collection",
                 transaction_id: str | None = "TX-1", invoice: dict[str, Any] | None = None,
                 timestamp: str = "20261122083000", type_: str = "CHARGE",
                 customer_reference: str = "order-1") -> dict[str, Any]:
    body: dict[str, Any] = {
        "timestamp": timestamp, "reference": reference, "customerReference": customer_reference,
        "amount": amount, "type": type_, "merchantAccountId": "shop", "status": status,
        "customer": CUSTOMER, "event": event, "service": service,
        "message": f"message for {code}", "code": code, "payloadSignature": "deprecated",
    }
    if transaction_id is not None:
        body["transactionId"] = transaction_id
    if invoice is not None:
        body["invoice"] = invoice
    return body


INVOICE = {"invoiceNo": "INV-1", "total": 50000, "amountPaid": 0, "amountDue": 50000,
           "currency": "TZS", "dueDate": "2026-12-31", "paymentReference": "99123"}

# (event, code, overrides, expected outcome)
SPEC_EVENTS: list[tuple[str, int, dict[str, Any], str]] = [
    ("payment.confirmed", 91000, {}, "success"),
    ("payment.confirmed", 91001, {"status": "PARTIAL", "amount": 400}, "success"),
    ("payment.failed", 91051, {"status": "CANCELLED", "amount": 0, "transaction_id": "-1"},
     "failure"),
    ("payment.failed", 91060, {"status": "FAILED", "amount": 0, "transaction_id": "-1"},
     "failure"),
    ("payment.refunded", 91010, {"status": "REVERSED"}, "refunded"),
    ("payout.approved", 92002, {"service": "Disbursement", "type_": "PAYOUT",
                                "status": "APPROVED"}, "pending"),
    ("payout.confirmed", 92000, {"service": "Disbursement", "type_": "PAYOUT"}, "success"),
    ("payout.failed", 92053, {"service": "Disbursement", "type_": "PAYOUT", "status": "FAILED",
                              "amount": 0, "transaction_id": "-1"}, "failure"),
    ("invoice.created", 93000, {"service": "Invoicing", "amount": 50000, "invoice": INVOICE},
     "success"),
    ("invoice.updated", 93001, {"service": "Invoicing", "amount": 50000,
                                "invoice": {**INVOICE, "amountPaid": 20000, "amountDue": 30000}},
     "success"),
    ("invoice.paid", 93002, {"service": "Invoicing", "amount": 50000,
                             "invoice": {**INVOICE, "amountPaid": 50000, "amountDue": 0,
                                         "paidDate": "2026-11-22T05:30:00.000Z"}}, "success"),
    ("invoice.cancelled", 93003, {"service": "Invoicing", "status": "CANCELLED", "amount": 50000,
                                  "invoice": INVOICE}, "success"),
    ("sms.delivered", 94000, {"service": "Bulk SMS", "amount": 0, "status": "DELIVERED",
                              "customer_reference": "255712345678"}, "success"),
    ("sms.failed", 94055, {"service": "Bulk SMS", "amount": 0, "status": "REJECTED",
                           "customer_reference": "255712345678"}, "failure"),
    ("sms.failed", 94099, {"service": "Bulk SMS", "amount": 0, "status": "UNKNOWN"}, "failure"),
]


def encode(body: dict[str, Any]) -> bytes:
    return json.dumps(body).encode()
