"""Reading a verified general (system A) body into normalised facts. Pure.

What a careless reading gets wrong, and what this module does instead:

* amounts are exact ``Decimal`` (never float), kept as text in the facts;
* ``timestamp`` (``yyyymmddHHMMss``, no zone) is read in the configured provider zone; the
  raw text is kept beside it;
* ``transactionId`` ``-1`` (or ``"-1"``) means "no receipt": stored as absent;
* the outcome comes from the code (``code % 100 >= 50`` is a failure, listed or not; a
  listed code of the event's service that is no success keeps its listed meaning, so 92002
  on ``payout.failed`` is an approved payout still in flight), else from the event name,
  never from ``message`` text; a code that says otherwise than the event name is flagged
  (``code_event_conflict``);
* an invoice block's amounts are read from the block (``amount`` on an invoice event is
  the invoice TOTAL, never money received); a block on ``payment.confirmed`` (a part
  payment against an invoice) is read too;
* an event name that is not in the spec's table, or none at all (the dashboard's ping), is
  kept and flagged ``recognised: false`` under event type ``general.unrecognised``, so that
  no projection applies it blindly;
* a listed event whose fields cannot be read (no ``timestamp``, an ``amount`` sent as text)
  is still a signed JSON object the provider will never send again: it is kept too, as
  ``general.malformed`` with the reason, under a key of its own (:func:`malformed_key`),
  never projected, and reported as a discrepancy. That is for the fields a state is
  decided on (reference, event, time, amounts, code, the invoice block's amounts); a field
  that only describes (names, phone number, message, status word, transaction id...) sent
  as a number is read as its text, and one that cannot be read at all is left out and
  named in ``unread_fields``: a payment whose customer's phone number came as a number is
  still a payment, and was missing from every view;
* ``payloadSignature`` is deprecated and never trusted.

The dedupe key
--------------
One reference legitimately carries several events (confirmed then refunded; created, many
updates, paid), so the reference alone is not a dedupe key. A duplicate is *the same event
about the same subject in the same state*. The key is the SHA-256 of the body's canonical
form (keys sorted, numbers normalised so ``1000`` and ``1000.00`` agree) **without** the
fields that can differ between copies of one event: ``payloadSignature`` (per delivery) and
``message`` (may be reworded or translated). So the same event arriving through all three
registered URLs is one ledger event, while any change of state (event, status, code, amount,
invoice amounts, transaction id...) is a new one.

``timestamp`` stays in the key. It tells a return to an earlier state from a copy of it: an
invoice re-saved from total 1000 to 1200 and back to 1000 sends a third ``invoice.updated``
whose every other field equals the first's, and without its time that state (the invoice's
current one) was taken for a duplicate and never kept. A copy restamped by the provider
(the spec's "repeated callbacks") becomes a second event instead, and it is not free: the
folds go by provider time, so a copy stamped after a later state cannot be told from a
return to its own state and counts as the current one. Where the spec rules a return out,
the fold says so: an invoice is created once, before anything else happens to it, so an
``invoice.created`` never outranks another event of its invoice, whatever its time
(``projections.general_folds``), and a restamped one no longer reopens a paid invoice. A
restamped ``invoice.paid`` or ``invoice.cancelled`` (each fires once) after a re-save still
brings its state back: only the earliest copy's time tells, which no per-event order knows.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

from ingest.codes import CODES, GENERAL_EVENTS, code_contradicts_event, outcome
from ingest.errors import BodyError
from ingest.json_body import number_text, plain_zero, whole_number
from ingest.unstorable import lenient_object, raw_digest, storable_text
from ledger.instants import storable_instant
from ledger.jsonenc import dump_bytes

UNRECOGNISED_EVENT_TYPE = "general.unrecognised"
MALFORMED_EVENT_TYPE = "general.malformed"
# not ``timestamp``: it is what tells a return to an earlier state from a copy (see above)
VOLATILE_FIELDS = frozenset({"payloadSignature", "message"})
MAX_TEXT = 512  # a reference or name longer than this is not a real one
MAX_MESSAGE = 4096  # the human-readable line may be long (a translation), not unbounded


@dataclass(frozen=True, slots=True)
class GeneralDelivery:
    """A verified general delivery, read."""

    event_type: str
    stream: str
    dedupe_key: str
    occurred_at: datetime | None
    facts: dict[str, Any]


def _canonical(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _canonical(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int | Decimal):
        return {"#n": number_text(value)}
    return value


def canonical_text(value: Any) -> bytes:
    """Sorted keys, no spaces, UTF-8: the bytes a dedupe key hashes. Never change them, or a
    redelivery of an event already kept would no longer be known as one.

    The ledger's own deterministic writer gives exactly what ``json.dumps(sort_keys=True,
    separators=(",", ":"), ensure_ascii=False)`` writes for canonical values (a property
    test holds them equal), several times faster.
    """
    return dump_bytes(value)


def _digest(body: dict[str, Any], leave_out: frozenset[str]) -> str:
    significant = {k: v for k, v in body.items() if k not in leave_out}
    return hashlib.sha256(canonical_text(_canonical(significant))).hexdigest()


def dedupe_key(body: dict[str, Any]) -> str:
    return "general:" + _digest(body, VOLATILE_FIELDS)


# -- typed field readers: each raises BodyError naming the field ---------------------------

def _text(body: dict[str, Any], key: str, *, required: bool = False,
          where: str = "") -> str | None:
    value = body.get(key)
    if value is None:
        if required:
            raise BodyError("missing_field", f"{where}{key} is required")
        return None
    if not isinstance(value, str):
        raise BodyError("invalid_field", f"{where}{key} must be a string")
    if len(value) > MAX_TEXT:
        raise BodyError("invalid_field", f"{where}{key} is longer than {MAX_TEXT}")
    return value


MONEY_DIGITS = 15  # an amount's digits either side of the point, at most


def _number(body: dict[str, Any], key: str, *, required: bool = False,
            where: str = "") -> Decimal | None:
    value = body.get(key)
    if value is None:
        if required:
            raise BodyError("missing_field", f"{where}{key} is required")
        return None
    if isinstance(value, bool) or not isinstance(value, int | Decimal):
        raise BodyError("invalid_field", f"{where}{key} must be a number")
    amount = Decimal(value)
    if amount < 0:
        raise BodyError("invalid_field", f"{where}{key} must not be negative")
    if not amount:
        # the exponent of zero tells nothing: 0E-20 (a failure's amount, written with twenty
        # decimals) read as out of range, and the failure as malformed
        return plain_zero(amount, MONEY_DIGITS)
    if abs(amount.adjusted()) > MONEY_DIGITS:
        raise BodyError("invalid_field", f"{where}{key} is out of range for money")
    return amount


def _code(body: dict[str, Any]) -> int | None:
    """The code, an integer: JSON has one number type, so ``91055.0`` is the integer 91055
    (as JSON Schema reads it, and a chat error code is read); it made a signed failure
    malformed, in no projection. A fraction that is not zero is refused."""
    value = body.get("code")
    if value is None:
        return None
    value = whole_number(value, 5)
    if isinstance(value, bool) or not isinstance(value, int):
        raise BodyError("invalid_field", "code must be an integer")
    if not 90000 <= value <= 99999:
        raise BodyError("invalid_field", "code must be a five-digit webhook event code")
    return value


def _object(body: dict[str, Any], key: str) -> dict[str, Any] | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise BodyError("invalid_field", f"{key} must be an object")
    return value


def parse_timestamp(raw: str, zone: ZoneInfo) -> datetime:
    """``yyyymmddHHMMss`` in the provider's zone, as an aware datetime."""
    if len(raw) != 14 or not (raw.isascii() and raw.isdigit()):
        raise BodyError("invalid_field", "timestamp must be yyyymmddHHMMss")
    try:  # slicing, not strptime: a tenth of the cost, on every delivery
        moment = datetime(int(raw[0:4]), int(raw[4:6]), int(raw[6:8]), int(raw[8:10]),
                          int(raw[10:12]), int(raw[12:14]), tzinfo=zone)
    except ValueError as exc:
        raise BodyError("invalid_field", "timestamp is not a real date and time") from exc
    if not storable_instant(moment):
        raise BodyError("invalid_field", "timestamp is not between 1900 and 9997")
    return moment


def _described(body: dict[str, Any], key: str, unread: list[str], *, where: str = "",
               limit: int = MAX_TEXT) -> str | None:
    """A field that only describes: a number is taken as its text; anything else that
    cannot be read (an object, a list, text past ``limit``) is left out and its name
    added to ``unread``, rather than costing the delivery (see the module's notes)."""
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, int | Decimal) and not isinstance(value, bool):
        value = number_text(value)
    if not isinstance(value, str) or len(value) > limit:
        unread.append(f"{where}{key}")
        return None
    return value


def _transaction_id(body: dict[str, Any], unread: list[str]) -> str | None:
    text = _described(body, "transactionId", unread)
    if text is None:
        return None
    text = text.strip()
    return None if text in ("", "-1") else text  # "-1": "no receipt issued", not an id


def _money(value: Decimal | None) -> str | None:
    return None if value is None else format(value, "f")


def _invoice_facts(block: dict[str, Any], unread: list[str]) -> dict[str, Any]:
    where = "invoice."
    return {
        "invoice_no": _text(block, "invoiceNo", where=where),
        "total": _money(_number(block, "total", where=where)),
        "amount_paid": _money(_number(block, "amountPaid", where=where)),
        "amount_due": _money(_number(block, "amountDue", where=where)),
        "currency": _described(block, "currency", unread, where=where),
        "due_date": _described(block, "dueDate", unread, where=where),
        "paid_date": _described(block, "paidDate", unread, where=where),
        "payment_reference": _described(block, "paymentReference", unread, where=where),
    }


def read_invoice_block(value: Any) -> tuple[dict[str, Any], list[str]]:
    """An invoice block read as a webhook's is, and the descriptive fields left unread: the
    reconciler reads a provider record's block with it, so that a record and a delivery
    of one state never say different things about the invoice. Raises :class:`BodyError`
    (no object, a number or an invoice number that cannot be read) as a delivery's would."""
    if not isinstance(value, dict):
        raise BodyError("invalid_field", "invoice must be an object")
    unread: list[str] = []
    return _invoice_facts(value, unread), unread


def _customer_facts(body: dict[str, Any], unread: list[str]) -> dict[str, Any]:
    block = body.get("customer")
    if block is None:
        return {}
    if not isinstance(block, dict):
        unread.append("customer")
        return {}
    where = "customer."
    return {
        "first_name": _described(block, "firstname", unread, where=where),
        "last_name": _described(block, "lastname", unread, where=where),
        "phone_number": _described(block, "phoneNumber", unread, where=where),
        "mno": _described(block, "mno", unread, where=where),
    }


def read_general(body: dict[str, Any], zone: ZoneInfo) -> GeneralDelivery:
    """Normalise a verified body; raise :class:`BodyError` when a known event is malformed."""
    key = dedupe_key(body)
    event = body.get("event")
    if not isinstance(event, str) or event not in GENERAL_EVENTS:
        return _unrecognised(body, event, key)

    service, subject = GENERAL_EVENTS[event]
    reference = _text(body, "reference", required=True)
    assert reference is not None
    if not reference.strip():
        raise BodyError("invalid_field", "reference must not be empty")
    raw_timestamp = _text(body, "timestamp", required=True)
    assert raw_timestamp is not None
    occurred_at = parse_timestamp(raw_timestamp, zone)
    amount = _number(body, "amount", required=True)
    code = _code(body)
    invoice = _object(body, "invoice")
    known = CODES.get(code) if code is not None else None
    unread: list[str] = []

    facts: dict[str, Any] = {
        "recognised": True,
        "event": event,
        "service": service,
        "subject": subject,
        "reference": reference,
        "customer_reference": _described(body, "customerReference", unread),
        "amount": _money(amount),
        "type": _described(body, "type", unread),
        "merchant_account_id": _described(body, "merchantAccountId", unread),
        # on an invoice event the status word can cancel the invoice: decided on, strict
        "status": (_text(body, "status") if subject == "invoice"
                   else _described(body, "status", unread)),
        "code": code,
        "code_known": known is not None,
        "outcome": outcome(event, code),
        "code_event_conflict": code_contradicts_event(event, code),
        "transaction_id": _transaction_id(body, unread),
        "message": _described(body, "message", unread, limit=MAX_MESSAGE),
        "timestamp_raw": raw_timestamp,
        "occurred_at": occurred_at.isoformat(),
        "customer": _customer_facts(body, unread),
        "invoice": _invoice_facts(invoice, unread) if invoice is not None else None,
    }
    if unread:
        facts["unread_fields"] = unread
    return GeneralDelivery(event, f"{subject}:{reference}", key, occurred_at, facts)


def read_general_or_malformed(body: dict[str, Any], zone: ZoneInfo) -> GeneralDelivery:
    """Like :func:`read_general`, but a listed event that cannot be read is kept as
    ``general.malformed`` rather than refused: the body is a signed JSON object, and the
    general system never sends it again."""
    try:
        return read_general(body, zone)
    except BodyError as exc:
        return _malformed(body, exc)


def _usable_reference(body: dict[str, Any]) -> str | None:
    reference = body.get("reference")
    usable = isinstance(reference, str) and reference.strip() and len(reference) <= MAX_TEXT
    return reference if usable else None


def malformed_key(body: dict[str, Any]) -> str:
    """A malformed copy's own key: everything but ``payloadSignature`` counts, so the same
    copy through all three URLs is one event, while a later readable copy of that event
    (whose timestamp or message may differ) is never taken for a duplicate of it."""
    return "general:malformed:" + _digest(body, frozenset({"payloadSignature"}))


def _malformed(body: dict[str, Any], error: BodyError) -> GeneralDelivery:
    event = body.get("event")
    return _kept_malformed(malformed_key(body), error, event if isinstance(event, str) else None,
                           _usable_reference(body))


# the per-URL field, as text, to the end of its JSON string: escapes included, since an
# encoder may write a base64 signature's ``/`` as ``\/`` (PHP's does), and a value cut at
# the escape left each URL's copy a key of its own
_PAYLOAD_SIGNATURE = re.compile(rb'"payloadSignature"\s*:\s*"(?:[^"\\]|\\.)*"', re.DOTALL)


def unstorable_general(raw: bytes, error: BodyError) -> GeneralDelivery:
    """A signed JSON object strict reading refused (:mod:`ingest.unstorable`), kept as
    ``general.malformed``. Its key is the digest of the raw bytes with ``payloadSignature``
    blanked: the same delivery through each of the three URLs is one event, as
    :func:`malformed_key` makes it for readable bodies."""
    body = lenient_object(raw)
    unsigned = _PAYLOAD_SIGNATURE.sub(b'"payloadSignature":""', raw)
    return _kept_malformed("general:malformed:raw:" + raw_digest(unsigned), error,
                           storable_text(body.get("event"), MAX_TEXT),
                           storable_text(body.get("reference"), MAX_TEXT), unstorable=True)


def _kept_malformed(key: str, error: BodyError, event: str | None, reference: str | None, *,
                    unstorable: bool = False) -> GeneralDelivery:
    """A ``general.malformed`` event, filed with the payment (or invoice...) it is about
    when event and reference can be read, so its story stays in one stream."""
    subject = GENERAL_EVENTS[event][1] if event in GENERAL_EVENTS else None
    facts = {
        "recognised": False,
        "malformed": True,
        **({"unstorable": True} if unstorable else {}),
        "reason": error.reason,
        "detail": error.detail,
        "event": event,
        "subject": subject,
        "reference": reference,
    }
    digest = key.rsplit(":", 1)[1]
    stream = (f"{subject}:{reference}" if subject and reference
              else f"malformed:{reference or digest[:16]}")
    return GeneralDelivery(MALFORMED_EVENT_TYPE, stream, key, None, facts)


def _unrecognised(body: dict[str, Any], event: Any, key: str) -> GeneralDelivery:
    reference = _usable_reference(body)
    facts = {
        "recognised": False,
        "event": event if isinstance(event, str) else None,
        "reference": reference,
    }
    stream = f"unrecognised:{reference}" if reference else f"unrecognised:{key[8:24]}"
    return GeneralDelivery(UNRECOGNISED_EVENT_TYPE, stream, key, None, facts)
