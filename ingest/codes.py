"""The provider's webhook codes (``9 S OO``) and event names, from the delivery spec.

A code's last two digits give its band: 00-49 success, 50-99 failure. A code not listed is
read by its band; a published code keeps its meaning for ever.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Outcome = Literal["success", "failure", "refunded", "pending"]


@dataclass(frozen=True, slots=True)
class CodeInfo:
    code: int
    event: str
    meaning: str
    retry: str = "-"


SERVICE_BY_DIGIT = {1: "Collection", 2: "Disbursement", 3: "Invoicing", 4: "Bulk SMS", 5: "Chat"}

# event name -> (service, subject kind used as the ledger stream prefix)
GENERAL_EVENTS: dict[str, tuple[str, str]] = {
    "payment.confirmed": ("Collection", "collection"),
    "payment.failed": ("Collection", "collection"),
    "payment.refunded": ("Collection", "collection"),
    "payout.approved": ("Disbursement", "payout"),
    "payout.confirmed": ("Disbursement", "payout"),
    "payout.failed": ("Disbursement", "payout"),
    "invoice.created": ("Invoicing", "invoice"),
    "invoice.updated": ("Invoicing", "invoice"),
    "invoice.paid": ("Invoicing", "invoice"),
    "invoice.cancelled": ("Invoicing", "invoice"),
    "sms.delivered": ("Bulk SMS", "sms"),
    "sms.failed": ("Bulk SMS", "sms"),
}

_FAILED_COLLECTION = [
    (50, "Failed at the operator, no detail", "-"),
    (51, "Customer cancelled the prompt", "only if the customer asks"),
    (52, "Customer did not confirm in time", "yes"),
    (53, "Insufficient customer balance", "not immediately"),
    (54, "PIN not accepted", "only if the customer asks"),
    (55, "Operator rejected the request", "-"),
    (56, "Operator did not answer in time", "yes"),
    (57, "Number not reachable on that network", "no"),
    (58, "Transaction limit reached", "not immediately"),
    (59, "Customer account barred or closed", "no"),
    (60, "Operator treated it as a duplicate",
     "no; first check the payment by reference, an earlier attempt may have been paid"),
    (61, "Service could not reach the operator", "yes"),
    (62, "Service float insufficient; contact support", "-"),
]
_FAILED_PAYOUT = [
    (50, "Failed, no detail"), (51, "Customer cancelled"), (52, "Not confirmed in time"),
    (53, "Insufficient balance"), (54, "PIN not accepted"), (55, "Operator rejected the payout"),
    (56, "Operator did not answer in time"), (57, "Recipient not reachable on that network"),
    (58, "Transaction limit reached"), (59, "Recipient account barred or closed"),
    (60, "Operator treated it as a duplicate"), (61, "Service could not reach the operator"),
    (62, "Service float insufficient; contact support"),
]

CODES: dict[int, CodeInfo] = {
    c.code: c
    for c in [
        CodeInfo(91000, "payment.confirmed", "Paid in full"),
        CodeInfo(91001, "payment.confirmed", "Part paid; compare amount with the amount requested"),
        CodeInfo(91010, "payment.refunded", "Refunded or reversed"),
        *(CodeInfo(91000 + o, "payment.failed", m, r) for o, m, r in _FAILED_COLLECTION),
        CodeInfo(92000, "payout.confirmed", "Completed"),
        CodeInfo(92002, "payout.approved", "Approved and debited from the wallet"),
        *(CodeInfo(92000 + o, "payout.failed", m) for o, m in _FAILED_PAYOUT),
        CodeInfo(93000, "invoice.created", "Invoice created"),
        CodeInfo(93001, "invoice.updated", "Invoice changed"),
        CodeInfo(93002, "invoice.paid", "Invoice paid in full"),
        CodeInfo(93003, "invoice.cancelled", "Invoice cancelled"),
        CodeInfo(94000, "sms.delivered", "Reached the handset"),
        CodeInfo(94050, "sms.failed", "Not delivered, no detail"),
        CodeInfo(94055, "sms.failed", "Operator rejected the message"),
        CodeInfo(94056, "sms.failed", "Operator gave up before delivery"),
        CodeInfo(95000, "chat.message.sent", "Accepted by the chat platform"),
        CodeInfo(95001, "chat.message.delivered", "Delivered to the handset"),
        CodeInfo(95002, "chat.message.read", "Read by the recipient"),
        CodeInfo(95003, "chat.message.received", "Inbound message from a customer"),
        CodeInfo(95050, "chat.message.failed", "Failed, no recognised cause"),
        CodeInfo(95057, "chat.message.failed", "Number cannot receive chat messages"),
        CodeInfo(95058, "chat.message.failed", "Chat platform rate limit reached"),
        CodeInfo(95059, "chat.message.failed", "Account locked or restricted"),
        CodeInfo(95063, "chat.message.failed",
                 "24-hour service window closed; the customer must be reached with an "
                 "approved template"),
        CodeInfo(95064, "chat.message.failed", "Recipient opted out, or the platform withheld it"),
        CodeInfo(95065, "chat.message.failed",
                 "Template rejected, missing, or parameters mismatched"),
        CodeInfo(95066, "chat.message.failed",
                 "Billing problem on the business account; contact support"),
    ]
}


def is_failure_code(code: int) -> bool:
    """``code % 100 >= 50`` is a failure, for listed and unlisted codes alike."""
    return code % 100 >= 50


def outcome_of_event(event: str) -> Outcome:
    if event.endswith(".failed"):
        return "failure"
    if event == "payment.refunded":
        return "refunded"
    if event == "payout.approved":
        return "pending"
    return "success"


def outcome(event: str, code: int | None) -> Outcome:
    """The outcome, in this order: a code's failure band; a listed code of the event's own
    service that reads as something other than a success keeps that meaning (92002 on
    ``payout.failed`` is an approved payout in flight, 91010 on ``payment.confirmed`` a
    refund); a success-band code of the event's own service on a ``*.failed`` event is a
    success (the code is the contract); else the event name.

    A listed success code never turns a refund or an approval into a success, nor does a
    success code of another service (92000, a payout completed, says nothing of a
    collection) turn a failure into one: the reading that does not call money settled
    stands. Every contradiction is flagged (:func:`code_contradicts_event`) for a person."""
    by_event = outcome_of_event(event)
    if code is None:
        return by_event
    if is_failure_code(code):
        return "failure"
    by_code = _listed_outcome(event, code)
    if by_code is not None and by_code != "success":
        return by_code
    if by_event == "failure" and _of_service(event, code):
        return "success"
    return by_event


def code_contradicts_event(event: str, code: int | None) -> bool:
    """Whether the code and the event name say different things (whichever was read), which
    a person should hear about: a success code on a ``*.failed`` event too, whatever its
    service, and a listed code of another service whose own event says something else
    (91010, a refund, on ``payout.confirmed``; 92002, a payout approved, on
    ``payment.confirmed``; 93003, an invoice cancelled, on ``payment.confirmed``): it
    reads by the event name, but it is not that event's code."""
    by_event = outcome_of_event(event)
    if code is None:
        return False
    listed = _listed_outcome(event, code)
    return (outcome(event, code) != by_event or (listed is not None and listed != by_event)
            or (by_event == "failure" and not is_failure_code(code))
            or _foreign_listed_code(event, code) or _sibling_listed_code(event, code))


def _sibling_listed_code(event: str, code: int) -> bool:
    """A listed code of another event of the same family: the invoice codes all read as a
    success, so 93003 (cancelled) on ``invoice.paid`` said nothing by its outcome, though a
    receiver branching on the code cancels the invoice. (In the other families such a code
    reads otherwise than its event, and is flagged for that already.)"""
    listed = CODES.get(code)
    return (listed is not None and _family(listed.event) == _family(event)
            and listed.event != event)


def _foreign_listed_code(event: str, code: int) -> bool:
    """A listed code of another family whose event is not of the same kind: not a success
    of another service on a success (92000 on ``payment.confirmed`` says the same), nor a
    failure on a failure (a reason keeps its last two digits across services), nor a
    payment's confirmation on an invoice event other than its cancellation (the spec: a
    payment against an invoice reports its outcome with the Collection codes); a refund's
    code on ``invoice.paid``, or a payment's on ``invoice.cancelled``, is flagged."""
    listed = CODES.get(code)
    if listed is None or _family(listed.event) == _family(event):
        return False
    if _family(event) == "invoice" and _family(listed.event) == "payment":
        return not (listed.event == "payment.confirmed" and event != "invoice.cancelled")
    if outcome_of_event(listed.event) == outcome_of_event(event) == "failure":
        return False
    return not (_plain_success(listed.event) and _plain_success(event))


def _plain_success(event: str) -> bool:
    """An event that reports something done and settled: ``*.confirmed``, ``*.delivered``,
    ``*.paid`` and the like, not a refund, an approval, a failure or a cancellation."""
    return (outcome_of_event(event) == "success"
            and not event.endswith((".cancelled", ".created", ".updated", ".received")))


def _of_service(event: str, code: int) -> bool:
    """Whether ``code``'s service digit (the S of 9 S OO) is the event's service's."""
    listed = GENERAL_EVENTS.get(event)
    return listed is not None and SERVICE_BY_DIGIT.get(code // 1000 % 10) == listed[0]


def _listed_outcome(event: str, code: int) -> Outcome | None:
    """What a listed code of the event's own service means by itself, or None."""
    listed = CODES.get(code)
    if listed is None or _family(listed.event) != _family(event):
        return None
    return outcome_of_event(listed.event)


def _family(event: str) -> str:
    return event.partition(".")[0]
