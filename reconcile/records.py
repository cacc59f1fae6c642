"""The provider's payment record, and the configurable mapping from an API ``data`` object.

The spec does not give the shape of ``data`` (DOMAIN-NOTES 21); by default it is assumed to
use the general webhook body's field names, and each field can be pointed elsewhere with a
dotted path (``{"status": "payment.state"}``). Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any, Literal

from ingest.codes import CODES, GENERAL_EVENTS, is_failure_code, outcome_of_event
from ingest.codes import outcome as webhook_outcome
from ingest.errors import BodyError
from ingest.general_body import read_invoice_block
from ingest.json_body import plain_zero, whole_number
from ledger.jsonenc import jsonb_can_hold
from ledger.money import in_plain_digits
from reconcile.errors import MappingError

Outcome = Literal["success", "failure", "refunded", "pending"]
TERMINAL: frozenset[str] = frozenset({"success", "failure", "refunded"})
# the webhook event a recovered terminal state is folded as; a pair without one (a payout
# the provider calls REVERSED: no payout webhook carries that) is never recovered, only
# reported for a person to look at
RECOVERY_EVENT: dict[tuple[str, str], str] = {
    ("collection", "success"): "payment.confirmed", ("collection", "failure"): "payment.failed",
    ("collection", "refunded"): "payment.refunded", ("payout", "success"): "payout.confirmed",
    ("payout", "failure"): "payout.failed",
}

# the events of the records reconciliation reads (collections and payouts)
PAYMENT_EVENTS = frozenset(event for event, (_, kind) in GENERAL_EVENTS.items()
                           if kind in ("collection", "payout"))

# an amount's magnitude (below 10**16 TZS) and decimal places past which it is no money
MAX_AMOUNT_EXPONENT = 15
MAX_AMOUNT_PLACES = 100
# a code (the record's, the envelope's) as the projections' ``integer`` columns hold it;
# past it, a code was stored wrapped round, and read back from ``facts`` as a float or not
# at all by orjson
CODE_RANGE = range(-2**31, 2**31)

DEFAULT_PATHS: dict[str, str] = {
    "reference": "reference", "status": "status", "amount": "amount", "event": "event",
    "code": "code", "transaction_id": "transactionId",
    "customer_reference": "customerReference", "service": "service", "type": "type",
    "timestamp": "timestamp", "invoice": "invoice",
}

# Which kinds of record each field allows, by the spec's event table, the service digit S
# of a 9SOO code, its ``service`` values, and ``type`` (CHARGE or PAYOUT). The event and the
# code name one kind each; ``service`` and ``type`` are looser (a part payment against an
# invoice is a collection that may name the Invoicing service, and what ``type`` a refund's
# record carries the spec does not say), so they are read only when neither event nor code
# is there, and then Invoicing is an invoice: nothing else can tell.
KINDS_OF_EVENT_FAMILY: dict[str, str] = {
    "payment": "collection", "payout": "payout", "invoice": "invoice", "sms": "sms",
    "chat": "chat"}
KINDS_OF_CODE_SERVICE: dict[int, str] = {
    1: "collection", 2: "payout", 3: "invoice", 4: "sms", 5: "chat"}
KINDS_OF_SERVICE: dict[str, frozenset[str]] = {
    "collection": frozenset({"collection"}), "disbursement": frozenset({"payout"}),
    "invoicing": frozenset({"invoice"}), "bulk sms": frozenset({"sms"})}
KINDS_OF_TYPE: dict[str, frozenset[str]] = {
    "PAYOUT": frozenset({"payout"}), "CHARGE": frozenset({"collection", "invoice", "sms"})}

SUCCESS_STATUSES = frozenset({"SUCCESSFUL", "SUCCESS", "PAID", "PARTIAL", "COMPLETED"})
FAILURE_STATUSES = frozenset({"FAILED", "REJECTED", "CANCELLED", "USER_REJECTED", "EXPIRED"})
REFUND_STATUSES = frozenset({"REFUNDED", "REVERSED"})


@dataclass(frozen=True, slots=True)
class KindClaim:
    """A field of a provider record saying which kinds of record it can be."""

    field: str
    value: object
    kinds: frozenset[str]

    @property
    def kinds_text(self) -> str:
        return " or ".join(sorted(self.kinds))

    def __str__(self) -> str:
        return f"its {self.field} {self.value} is of {self.kinds_text}"


@dataclass(frozen=True, slots=True)
class ProviderRecord:
    """What the provider says about one reference."""

    reference: str
    status: str | None
    amount: Decimal | None
    event: str | None
    code: int | None
    transaction_id: str | None
    customer_reference: str | None
    service: str | None
    timestamp: str | None
    type: str | None = None
    # the invoice block as a webhook's is read (``ingest.general_body``): a part payment's
    # or a refund's record says what its invoice is after it, as its webhook would have
    invoice: dict[str, Any] | None = None
    unread_fields: tuple[str, ...] = ()

    @property
    def outcome(self) -> Outcome:
        return record_outcome(self.event, self.code, self.status)

    @property
    def terminal(self) -> bool:
        return self.outcome in TERMINAL

    def not_a(self, subject: str) -> KindClaim | None:
        """The field that says this record is not a ``subject`` (a collection, a payout),
        or None. The reference API answers every kind of record at one address, so an
        invoice's number, an SMS id or a payout's reference asked about as a collection
        comes back as that other record; recovered, its state and amount would land in the
        wrong projection. A field that is absent, or holds a value no rule knows, says
        nothing; the event and the code, when either is there, speak for the record (and
        must agree), otherwise ``service`` and ``type`` do."""
        family = (self.event or "").partition(".")[0].strip().casefold()
        digit = (self.code // 1000 % 10
                 if self.code and EVENT_CODES[0] <= self.code <= EVENT_CODES[1] else 0)
        named = [("event", self.event, KINDS_OF_EVENT_FAMILY.get(family)),
                 ("code", self.code, KINDS_OF_CODE_SERVICE.get(digit))]
        strong: list[tuple[str, object, frozenset[str] | None]] = [
            (field, value, frozenset({kind})) for field, value, kind in named
            if kind is not None]
        claims = strong or [
            ("service", self.service,
             KINDS_OF_SERVICE.get((self.service or "").strip().casefold())),
            ("type", self.type, KINDS_OF_TYPE.get((self.type or "").strip().upper()))]
        for field, value, kinds in claims:
            if kinds is not None and subject not in kinds:
                return KindClaim(field, value, kinds)
        return None

    def as_json(self) -> dict[str, Any]:
        answer: dict[str, Any] = {
            "reference": self.reference, "status": self.status, "amount": self.amount,
            "event": self.event, "code": self.code, "transaction_id": self.transaction_id,
            "customer_reference": self.customer_reference, "service": self.service,
            "type": self.type, "timestamp": self.timestamp, "outcome": self.outcome}
        if self.invoice is not None:  # records without one keep the shape they had
            answer["invoice"] = self.invoice
        return answer


EVENT_CODES = (90000, 99999)  # the spec's "9 S OO (five digits)"


def record_outcome(event: str | None, code: int | None, status: str | None) -> Outcome:
    """The code's band first (``code % 100 >= 50`` is a failure); then the event, read as a
    webhook's is (:func:`ingest.codes.outcome`, so that the same fields never give the two
    paths different answers); then a listed code's own event (91010 is a refund whatever
    word the operator used); only then the status word, which is the operator's verbatim and
    can never be listed in full. Only a five-digit webhook event code (9 S OO) is read: the
    band is theirs, and another code a record carries (an operator's) says nothing here."""
    if code is not None and not EVENT_CODES[0] <= code <= EVENT_CODES[1]:
        code = None
    if code is not None and is_failure_code(code):
        return "failure"
    if event in PAYMENT_EVENTS:
        return webhook_outcome(event, code)
    listed = CODES.get(code) if code is not None else None
    if listed is not None and listed.event in PAYMENT_EVENTS:
        return outcome_of_event(listed.event)
    word = (status or "").strip().upper()
    if word in REFUND_STATUSES:
        return "refunded"
    if word in SUCCESS_STATUSES:
        return "success"
    if word in FAILURE_STATUSES:
        return "failure"
    return "pending"


def _word(data: Mapping[str, Any], path: str) -> str | None:
    """A field read only as a hint (``type``): text, or None whatever else it holds, so a
    provider that puts something else there loses the hint, not every lookup."""
    value = dig(data, path)
    return value if isinstance(value, str) and jsonb_can_hold(value) else None


def dig(data: Mapping[str, Any], path: str) -> Any:
    """The value at a dotted path, or None when any step is missing."""
    value: Any = data
    for step in path.split("."):
        if not isinstance(value, Mapping) or step not in value:
            return None
        value = value[step]
    return value


@dataclass(frozen=True)
class RecordMapping:
    """Dotted paths into ``data`` for each field of :class:`ProviderRecord`."""

    paths: Mapping[str, str]

    @classmethod
    def create(cls, overrides: Mapping[str, str] | None = None) -> RecordMapping:
        unknown = sorted(set(overrides or {}) - set(DEFAULT_PATHS))
        if unknown:
            raise MappingError(f"unknown record field(s) in the mapping: {', '.join(unknown)}")
        return cls({**DEFAULT_PATHS, **(overrides or {})})

    def read(self, data: Mapping[str, Any], reference: str) -> ProviderRecord:
        """Map ``data``; a wrong type is a :class:`MappingError`, a missing field None,
        and a record with none of the fields that say a state a :class:`MappingError` too
        (unknown is not pending)."""
        def text(name: str) -> str | None:
            value = dig(data, self.paths[name])
            if value is None:
                return None
            if isinstance(value, bool) or not isinstance(value, str | int | Decimal):
                raise MappingError(f"{name} has the wrong type")
            if isinstance(value, str) and not jsonb_can_hold(value):
                # kept, it would fail the append of every answer checked beside it, pass
                # after pass: the subject is asked first again each time
                raise MappingError(f"{name} holds a character the ledger cannot keep")
            return str(value)

        amount_raw = dig(data, self.paths["amount"])
        amount: Decimal | None = None
        if amount_raw is not None:
            if isinstance(amount_raw, bool) or not isinstance(amount_raw, int | Decimal | str):
                raise MappingError("amount is not a number")
            if isinstance(amount_raw, str) and not in_plain_digits(amount_raw):
                raise MappingError("amount is not written with the digits 0-9")
            try:
                amount = Decimal(str(amount_raw))
            except InvalidOperation as exc:
                raise MappingError("amount is not a number") from exc
            if not amount.is_finite():
                raise MappingError("amount is not a number")
            if amount < 0:
                # no money is paid negative: refused as a webhook's is (and as this
                # record's own invoice block's), not recovered as a refund of -1000 TZS
                raise MappingError("amount is negative")
            exponent = amount.as_tuple().exponent
            assert isinstance(exponent, int)  # finite
            if not amount:  # zero's exponent tells nothing (0E-20 was refused every pass)
                amount = plain_zero(amount, MAX_AMOUNT_PLACES)
            elif amount.adjusted() > MAX_AMOUNT_EXPONENT or exponent < -MAX_AMOUNT_PLACES:
                # past what a projection's numeric column takes: stored, it would fail the
                # projector's every batch from then on
                raise MappingError("amount is out of range for money")
        code_raw = dig(data, self.paths["code"])
        code_raw = whole_number(code_raw, 10)  # 91055.0 is 91055, as in webhooks
        if code_raw is not None and (isinstance(code_raw, bool)
                                     or not isinstance(code_raw, int)):
            raise MappingError("code is not an integer")
        if code_raw is not None and code_raw not in CODE_RANGE:
            raise MappingError("code is out of range")
        status, event = text("status"), text("event")
        transaction_id = text("transaction_id")
        customer_reference, service = text("customer_reference"), text("service")
        timestamp = text("timestamp")
        answered = text("reference")
        if answered is not None and answered.strip().casefold() != reference.strip().casefold():
            # another payment's record (or a wrong path for the field): nothing of it may be
            # recovered as the state of the one asked about
            raise MappingError(f"the record is about reference {answered[:64]!r}, "
                               f"not {reference[:64]!r}")
        if code_raw is None and not (status or "").strip() and not (event or "").strip():
            # nothing that says a state: read as "pending", such an answer (a mapping that
            # does not fit the provider's ``data``) opened a false ``unresolved`` whose
            # advice is to charge the customer again, and a false mismatch for every
            # payment our webhooks call final
            raise MappingError("the record names no status, event or code: check "
                               "HOOKLEDGER_RECONCILE_RECORD_PATHS against the API's data")
        invoice, unread = _invoice_block(dig(data, self.paths["invoice"]))
        return ProviderRecord(
            reference=answered or reference, status=status, amount=amount,
            event=event, code=code_raw, customer_reference=customer_reference,
            transaction_id=None if transaction_id in (None, "", "-1") else transaction_id,
            service=service, timestamp=timestamp,
            type=_word(data, self.paths["type"]), invoice=invoice, unread_fields=unread)


INVOICE_AMOUNTS = frozenset({"total", "amountPaid", "amountDue"})


def _numeric_text(item: Any) -> Any:
    """A number spelled as text as that number (the record's own ``amount`` is read so);
    anything else as it is, for the webhook's rules to judge."""
    if isinstance(item, str) and in_plain_digits(item):
        try:
            number = Decimal(item.strip())
        except InvalidOperation:
            return item
        if number.is_finite():
            return number
    return item


def _invoice_block(value: Any) -> tuple[dict[str, Any] | None, tuple[str, ...]]:
    """The record's invoice block read by the webhook's rules (invoice number and amounts
    strictly, what only describes leniently, left out and named). A block that cannot be
    read so (an amount spelled as text, which a record's own amount may be) costs the
    block, named in the unread fields, never the record: refused whole, the payment it
    recovers was lost with it. A refund recovered without its block is then flagged on
    its invoice as a blockless one is."""
    if value is None:
        return None, ()
    if isinstance(value, dict):  # amounts spelled as text, as a record's own may be
        value = {key: _numeric_text(item) if key in INVOICE_AMOUNTS else item
                 for key, item in value.items()}
    try:
        block, unread = read_invoice_block(value)
    except BodyError:
        return None, ("invoice",)
    if any(isinstance(text, str) and not jsonb_can_hold(text) for text in block.values()):
        return None, ("invoice",)
    return block, tuple(unread)
