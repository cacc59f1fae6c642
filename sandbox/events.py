"""Builders for every delivery body of the spec's event tables. Pure: no clock, no I/O.

General (system A) bodies follow the spec's field table and the rules that are easy to get
wrong: invoice events carry the invoice TOTAL in ``amount``; failures carry amount 0 and
``transactionId`` "-1"; SMS carries amount 0, the message id as ``reference`` and the
recipient as ``customerReference``; a part payment is ``payment.confirmed`` 91001 with an
invoice block; ``timestamp`` is ``yyyymmddHHMMss`` in Africa/Dar_es_Salaam. Amounts are
``Decimal`` and are written exactly by :mod:`sandbox.jsonenc`.

Chat (system B) bodies: an inbound ``message`` (text, or image/document/audio/video with a
media id) and a ``status`` (sent, delivered, read, failed with ``errors[0]``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

from sandbox.codes import (
    CHAT_ERRORS,
    CHAT_STATUSES,
    DEFAULT_CODE,
    GENERAL_CODES,
    GENERAL_EVENT_SERVICE,
    MEDIA_KINDS,
)

PROVIDER_ZONE = ZoneInfo("Africa/Dar_es_Salaam")
NO_RECEIPT = "-1"
ZERO = Decimal(0)
DEFAULT_MERCHANT = "sandbox-shop"


class EventError(ValueError):
    """An event cannot be built as asked (unknown name, code of another event...)."""


def provider_timestamp(at: datetime) -> str:
    """``yyyymmddHHMMss`` in the provider's zone; ``at`` must be aware."""
    if at.tzinfo is None:
        raise EventError("times must be timezone-aware")
    return at.astimezone(PROVIDER_ZONE).strftime("%Y%m%d%H%M%S")


def iso_utc_millis(at: datetime) -> str:
    """ISO 8601 UTC with milliseconds, as ``paidDate`` is written."""
    if at.tzinfo is None:
        raise EventError("times must be timezone-aware")
    return at.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True, slots=True)
class Customer:
    firstname: str
    lastname: str
    phone_number: str  # international digits, no plus sign
    mno: str

    def as_json(self) -> dict[str, Any]:
        return {"firstname": self.firstname, "lastname": self.lastname,
                "phoneNumber": self.phone_number, "mno": self.mno}


DEFAULT_CUSTOMER = Customer("Asha", "Mushi", "255712345678", "Vodacom")


@dataclass(frozen=True, slots=True)
class Invoice:
    """An invoice as the provider holds it; ``amount_due`` follows from total and paid."""

    invoice_no: str
    total: Decimal
    amount_paid: Decimal
    due_date: date
    payment_reference: str
    currency: str = "TZS"
    paid_date: datetime | None = None

    @property
    def amount_due(self) -> Decimal:
        return max(self.total - self.amount_paid, ZERO)

    @property
    def settled(self) -> bool:
        return self.amount_due == 0

    def paying(self, amount: Decimal) -> Invoice:
        return replace(self, amount_paid=self.amount_paid + amount)

    def block(self) -> dict[str, Any]:
        block: dict[str, Any] = {
            "invoiceNo": self.invoice_no,
            "total": self.total,
            "amountPaid": self.amount_paid,
            "amountDue": self.amount_due,
            "currency": self.currency,
            "dueDate": self.due_date.isoformat(),
            "paymentReference": self.payment_reference,
        }
        if self.paid_date is not None:
            block["paidDate"] = iso_utc_millis(self.paid_date)
        return block


def general_body(*, event: str, reference: str, amount: Decimal, at: datetime,
                 code: int | None = None, status: str | None = None,
                 customer: Customer = DEFAULT_CUSTOMER, customer_reference: str | None = None,
                 transaction_id: str | None = None, invoice: Invoice | None = None,
                 message: str | None = None, merchant: str = DEFAULT_MERCHANT
                 ) -> dict[str, Any]:
    """One general body; ``code``/``status``/``message`` default from the spec's tables."""
    if event not in GENERAL_EVENT_SERVICE:
        raise EventError(f"unknown general event {event!r}")
    if isinstance(amount, float):
        raise EventError("amounts are Decimal, never float")
    code = DEFAULT_CODE[event] if code is None else code
    known = GENERAL_CODES.get(code)
    if known is not None and known[0] != event:
        raise EventError(f"code {code} belongs to {known[0]}, not {event}")
    service, mode = GENERAL_EVENT_SERVICE[event]
    default_status = known[1] if known else ("FAILED" if code % 100 >= 50 else "SUCCESSFUL")
    body: dict[str, Any] = {
        "timestamp": provider_timestamp(at),
        "reference": reference,
    }
    if customer_reference is not None:
        body["customerReference"] = customer_reference
    body |= {
        "amount": Decimal(amount),
        "type": mode,
        "merchantAccountId": merchant,
        "status": status or default_status,
        "customer": customer.as_json(),
    }
    if transaction_id is not None:
        body["transactionId"] = transaction_id
    body |= {
        "event": event,
        "service": service,
        "message": message or (known[2] if known else f"Outcome {code}"),
        "code": code,
        "payloadSignature": "deprecated-unsigned",
    }
    if invoice is not None:
        body["invoice"] = invoice.block()
    return body


# -- one builder per row of the general event table -------------------------------------

def payment_confirmed(reference: str, amount: Decimal, at: datetime, *, transaction_id: str,
                      customer: Customer = DEFAULT_CUSTOMER, customer_reference: str | None = None,
                      part: bool = False, invoice: Invoice | None = None,
                      status: str | None = None) -> dict[str, Any]:
    """91000 paid in full, or 91001 part paid (a part payment against an invoice carries
    the invoice block, as the provider actually sends it)."""
    return general_body(event="payment.confirmed", reference=reference, amount=amount, at=at,
                        code=91001 if part else 91000, status=status, customer=customer,
                        customer_reference=customer_reference, transaction_id=transaction_id,
                        invoice=invoice)


def payment_failed(reference: str, code: int, at: datetime, *,
                   customer: Customer = DEFAULT_CUSTOMER,
                   customer_reference: str | None = None) -> dict[str, Any]:
    """A failure: amount 0 and transactionId "-1" (no receipt)."""
    return general_body(event="payment.failed", reference=reference, amount=ZERO, at=at,
                        code=code, customer=customer, customer_reference=customer_reference,
                        transaction_id=NO_RECEIPT)


def payment_refunded(reference: str, amount: Decimal, at: datetime, *, transaction_id: str,
                     customer: Customer = DEFAULT_CUSTOMER,
                     customer_reference: str | None = None) -> dict[str, Any]:
    return general_body(event="payment.refunded", reference=reference, amount=amount, at=at,
                        code=91010, customer=customer, customer_reference=customer_reference,
                        transaction_id=transaction_id)


def payout_approved(reference: str, amount: Decimal, at: datetime, *,
                    customer: Customer = DEFAULT_CUSTOMER,
                    customer_reference: str | None = None) -> dict[str, Any]:
    return general_body(event="payout.approved", reference=reference, amount=amount, at=at,
                        code=92002, customer=customer, customer_reference=customer_reference)


def payout_confirmed(reference: str, amount: Decimal, at: datetime, *, transaction_id: str,
                     customer: Customer = DEFAULT_CUSTOMER,
                     customer_reference: str | None = None) -> dict[str, Any]:
    return general_body(event="payout.confirmed", reference=reference, amount=amount, at=at,
                        code=92000, customer=customer, customer_reference=customer_reference,
                        transaction_id=transaction_id)


def payout_failed(reference: str, code: int, at: datetime, *,
                  customer: Customer = DEFAULT_CUSTOMER,
                  customer_reference: str | None = None) -> dict[str, Any]:
    """A failed payout (already refunded to the wallet): amount 0, transactionId "-1"."""
    return general_body(event="payout.failed", reference=reference, amount=ZERO, at=at,
                        code=code, customer=customer, customer_reference=customer_reference,
                        transaction_id=NO_RECEIPT)


INVOICE_EVENT_CODE = {"invoice.created": 93000, "invoice.updated": 93001,
                      "invoice.paid": 93002, "invoice.cancelled": 93003}


def invoice_status(invoice: Invoice, *, cancelled: bool = False) -> str:
    """The provider's status word for an invoice (only CANCELLED is named by the spec)."""
    if cancelled:
        return "CANCELLED"
    if invoice.settled:
        return "PAID"
    return "PARTIAL" if invoice.amount_paid > 0 else "PENDING"


def invoice_event(event: str, invoice: Invoice, at: datetime, *,
                  customer: Customer = DEFAULT_CUSTOMER, cancelled: bool = False
                  ) -> dict[str, Any]:
    """Any ``invoice.*`` event: ``amount`` is the invoice TOTAL, on every one of them."""
    if event not in INVOICE_EVENT_CODE:
        raise EventError(f"{event!r} is not an invoice event")
    return general_body(event=event, reference=invoice.invoice_no, amount=invoice.total, at=at,
                        code=INVOICE_EVENT_CODE[event],
                        status=invoice_status(invoice, cancelled=cancelled), customer=customer,
                        invoice=invoice)


def sms_event(message_id: str, recipient: str, at: datetime, *, code: int = 94000,
              customer: Customer = DEFAULT_CUSTOMER) -> dict[str, Any]:
    """A terminal delivery report: amount 0, reference = message id, customerReference =
    recipient. 94000 is sms.delivered; anything else is sms.failed."""
    event = "sms.delivered" if code == 94000 else "sms.failed"
    return general_body(event=event, reference=message_id, amount=ZERO, at=at, code=code,
                        customer=customer, customer_reference=recipient)


# -- chat (system B) ----------------------------------------------------------------------

def _unix(at: datetime) -> str:
    if at.tzinfo is None:
        raise EventError("times must be timezone-aware")
    return str(int(at.timestamp()))


def chat_inbound(*, waba_id: str, phone_number_id: str, contact_wa_id: str, profile_name: str,
                 message_id: str, at: datetime, kind: str = "text", text: str | None = None,
                 media_id: str | None = None, caption: str | None = None) -> dict[str, Any]:
    """An inbound customer message (``type: message``); media kinds carry a media id."""
    message: dict[str, Any] = {"id": message_id, "from": contact_wa_id,
                               "timestamp": _unix(at), "type": kind}
    if kind == "text":
        message["text"] = {"body": text or ""}
    elif kind in MEDIA_KINDS:
        if not media_id:
            raise EventError(f"a {kind} message needs a media id")
        media: dict[str, Any] = {"id": media_id, "mime_type": MEDIA_KINDS[kind]}
        if caption:
            media["caption"] = caption
        message[kind] = media
    else:
        raise EventError(f"unknown chat message kind {kind!r}")
    return {"type": "message", "wabaId": waba_id, "phoneNumberId": phone_number_id,
            "contactWaId": contact_wa_id, "profileName": profile_name, "message": message}


def chat_status(*, waba_id: str, phone_number_id: str, message_id: str, status: str,
                at: datetime, recipient_id: str, failure_code: int | None = None
                ) -> dict[str, Any]:
    """A delivery status (``type: status``); a ``failed`` one carries ``errors[0]``
    chosen by its 95xxx ``failure_code`` (95050 when none is given)."""
    if status not in CHAT_STATUSES:
        raise EventError(f"unknown chat status {status!r}")
    body: dict[str, Any] = {
        "type": "status", "wabaId": waba_id, "phoneNumberId": phone_number_id,
        "status": {"id": message_id, "status": status, "timestamp": _unix(at),
                   "recipient_id": recipient_id},
    }
    if status == "failed":
        platform_code, title = CHAT_ERRORS[failure_code or 95050]
        body["errors"] = [{"code": platform_code, "title": title}]
    elif failure_code is not None:
        raise EventError("only a failed status carries an error")
    return body
