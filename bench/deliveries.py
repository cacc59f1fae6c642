"""The general delivery every benchmark sends: one place, so that the load and the machine's
speed probe (bench/speed_probe.py) time the same bytes."""

from __future__ import annotations

import json


def delivery(tag: str, i: int) -> bytes:
    """A distinct, realistic collection webhook of about 1 KB."""
    return json.dumps({
        "timestamp": "20261122083000", "reference": f"{tag}-{i:09d}",
        "customerReference": f"order-{i}", "amount": 1000 + i % 97_000, "type": "CHARGE",
        "merchantAccountId": "merchant-account-0001", "status": "SUCCESSFUL",
        "customer": {"firstname": "Asha", "lastname": "Mushi",
                     "phoneNumber": "255712345678", "mno": "Operator"},
        "transactionId": f"TX{i:012d}", "event": "payment.confirmed",
        "service": "Collection", "code": 91000,
        "message": "Payment received for order " + "x" * 300,
        "narration": "Goods and services, order lines " + "y" * 240,
    }, separators=(",", ":")).encode()
