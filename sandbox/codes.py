"""The spec's event and code tables, as the sender needs them (which status word goes
with which code). Deliberately not shared with ``ingest/codes.py``."""

from __future__ import annotations

from typing import Literal

System = Literal["general", "chat"]

# event -> (service, payment mode)
GENERAL_EVENT_SERVICE: dict[str, tuple[str, str]] = {
    "payment.confirmed": ("Collection", "CHARGE"),
    "payment.failed": ("Collection", "CHARGE"),
    "payment.refunded": ("Collection", "CHARGE"),
    "payout.approved": ("Disbursement", "PAYOUT"),
    "payout.confirmed": ("Disbursement", "PAYOUT"),
    "payout.failed": ("Disbursement", "PAYOUT"),
    "invoice.created": ("Invoicing", "CHARGE"),
    "invoice.updated": ("Invoicing", "CHARGE"),
    "invoice.paid": ("Invoicing", "CHARGE"),
    "invoice.cancelled": ("Invoicing", "CHARGE"),
    "sms.delivered": ("Bulk SMS", "CHARGE"),
    "sms.failed": ("Bulk SMS", "CHARGE"),
}

_FAILURE_REASONS: dict[int, tuple[str, str]] = {  # last two digits -> (status word, meaning)
    50: ("FAILED", "Failed at the operator, no detail"),
    51: ("USER_REJECTED", "Customer cancelled the prompt"),
    52: ("EXPIRED", "Customer did not confirm in time"),
    53: ("FAILED", "Insufficient customer balance"),
    54: ("FAILED", "PIN not accepted"),
    55: ("REJECTED", "Operator rejected the request"),
    56: ("FAILED", "Operator did not answer in time"),
    57: ("FAILED", "Number not reachable on that network"),
    58: ("REJECTED", "Transaction limit reached"),
    59: ("REJECTED", "Account barred or closed"),
    60: ("REJECTED", "Operator treated it as a duplicate"),
    61: ("FAILED", "Service could not reach the operator"),
    62: ("FAILED", "Service float insufficient; contact support"),
}

# code -> (event, status word, message)
GENERAL_CODES: dict[int, tuple[str, str, str]] = {
    91000: ("payment.confirmed", "SUCCESSFUL", "Payment received in full"),
    91001: ("payment.confirmed", "PARTIAL", "Part payment received"),
    91010: ("payment.refunded", "REFUNDED", "Payment refunded"),
    92000: ("payout.confirmed", "SUCCESSFUL", "Payout completed"),
    92002: ("payout.approved", "APPROVED", "Payout approved and debited from the wallet"),
    93000: ("invoice.created", "PENDING", "Invoice created"),
    93001: ("invoice.updated", "PENDING", "Invoice changed"),
    93002: ("invoice.paid", "PAID", "Invoice paid in full"),
    93003: ("invoice.cancelled", "CANCELLED", "Invoice cancelled"),
    94000: ("sms.delivered", "DELIVERED", "Message reached the handset"),
    94050: ("sms.failed", "FAILED", "Message not delivered"),
    94055: ("sms.failed", "REJECTED", "Operator rejected the message"),
    94056: ("sms.failed", "EXPIRED", "Operator gave up before delivery"),
}
for _offset, (_status, _meaning) in _FAILURE_REASONS.items():
    GENERAL_CODES[91000 + _offset] = ("payment.failed", _status, _meaning)
    GENERAL_CODES[92000 + _offset] = ("payout.failed", _status, _meaning)

COLLECTION_FAILURE_CODES = tuple(sorted(c for c, v in GENERAL_CODES.items()
                                        if v[0] == "payment.failed"))
PAYOUT_FAILURE_CODES = tuple(sorted(c for c, v in GENERAL_CODES.items()
                                    if v[0] == "payout.failed"))
SMS_FAILURE_CODES = (94050, 94055, 94056)

# the code each event carries when none is asked for
DEFAULT_CODE: dict[str, int] = {
    "payment.confirmed": 91000, "payment.failed": 91050, "payment.refunded": 91010,
    "payout.approved": 92002, "payout.confirmed": 92000, "payout.failed": 92050,
    "invoice.created": 93000, "invoice.updated": 93001, "invoice.paid": 93002,
    "invoice.cancelled": 93003, "sms.delivered": 94000, "sms.failed": 94050,
}

CHAT_EVENTS = ("chat.message.received", "chat.message.sent", "chat.message.delivered",
               "chat.message.read", "chat.message.failed")
CHAT_STATUSES = ("sent", "delivered", "read", "failed")
CHAT_STATUS_CODE = {"sent": 95000, "delivered": 95001, "read": 95002, "received": 95003}

# 95xxx failure code -> (the chat platform's own errors[0].code, errors[0].title).
# The spec names only the 95xxx meanings; the platform codes below are the sandbox's choice.
CHAT_ERRORS: dict[int, tuple[int, str]] = {
    95050: (131000, "Something went wrong"),
    95057: (131026, "Message undeliverable: number cannot receive chat messages"),
    95058: (130429, "Rate limit hit"),
    95059: (131031, "Business account locked or restricted"),
    95063: (131047, "Re-engagement message: more than 24 hours since the customer replied"),
    95064: (131050, "Recipient opted out, or the platform withheld the message"),
    95065: (132001, "Template does not exist or parameters mismatched"),
    95066: (131042, "Business eligibility payment issue"),
}

MEDIA_KINDS: dict[str, str] = {  # message.type -> content type served by the media endpoint
    "image": "image/jpeg",
    "document": "application/pdf",
    "audio": "audio/ogg",
    "video": "video/mp4",
}
