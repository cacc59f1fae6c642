"""Expectations: what the merchant initiated, so that a webhook that never comes is noticed.

A collection or a payout is reconciled when its webhook does not come; a sent SMS (kind
``sms``, amount 0) is only shown ``pending`` in ``sms_messages`` until its operator report
arrives, and never waited for: some messages never get one.

One implementation for every intake (HTTP, CLI, SQL): validation here, then the documented
SQL function ``hookledger.expect(reference, kind, amount, initiated_at)``, which is
idempotent (the same reference, kind and amount again is not an error) and refuses the
same reference with another kind or amount.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any

import psycopg

from ledger.instants import storable_instant
from ledger.jsonenc import jsonb_can_hold
from ledger.money import in_plain_digits
from reconcile.errors import ExpectationInvalid, ReconcileError
from reconcile.records import MAX_AMOUNT_PLACES

KINDS = ("collection", "payout", "sms")
MAX_REFERENCE = 512
MAX_AMOUNT = Decimal("1e15")

REQUEST_SCHEMA: dict[str, Any] = {
    "type": "object", "required": ["reference", "kind"],
    "additionalProperties": False,
    "properties": {
        "reference": {"type": "string", "minLength": 1, "maxLength": MAX_REFERENCE},
        "kind": {"type": "string", "enum": list(KINDS)},
        "amount": {"oneOf": [{"type": "number", "minimum": 0},
                             {"type": "string", "pattern": r"^[0-9]+(\.[0-9]+)?$"}],
                   "description": "TZS, exact (send a string to avoid float rounding); "
                                  "required and positive for a collection or payout, "
                                  "0 or absent for an sms"},
        "initiated_at": {"type": "string", "format": "date-time",
                         "description": "with a UTC offset; default: now"}},
}
RESPONSE_SCHEMA: dict[str, Any] = {
    "type": "object", "properties": {
        "reference": {"type": "string"}, "kind": {"type": "string"},
        "amount": {"type": "string"}, "initiated_at": {"type": "string"},
        "created": {"type": "boolean"}}}


class ExpectationConflict(ReconcileError):
    """the reference is already expected with another kind or amount"""


@dataclass(frozen=True, slots=True)
class Expectation:
    reference: str
    kind: str
    amount: Decimal
    initiated_at: datetime

    def as_json(self) -> dict[str, Any]:
        return {"reference": self.reference, "kind": self.kind,
                "amount": format(self.amount, "f"), "initiated_at": self.initiated_at.isoformat()}


def parse_amount(value: Any, *, zero: bool = False) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, int | float | Decimal | str):
        raise ExpectationInvalid("amount must be a number")
    if isinstance(value, str) and not in_plain_digits(value):  # "١٢" was kept as 12
        raise ExpectationInvalid("amount must be written with the digits 0-9 (no '_')")
    try:
        amount = Decimal(str(value).strip())
    except InvalidOperation as exc:
        raise ExpectationInvalid("amount must be a number") from exc
    if not amount.is_finite() or amount < 0 or (amount == 0 and not zero) \
            or amount >= MAX_AMOUNT:
        raise ExpectationInvalid("amount must be a positive number of TZS")
    if amount.as_tuple().exponent < -MAX_AMOUNT_PLACES:  # type: ignore[operator]
        # past what numeric holds (16,383 places), the insert failed: a 500, a traceback
        raise ExpectationInvalid(f"amount must have at most {MAX_AMOUNT_PLACES} decimal "
                                 "places")
    return amount


def parse_expectation(data: Any, *, now: datetime) -> Expectation:
    """Validate a JSON object; raise :class:`ExpectationInvalid` naming the field."""
    if not isinstance(data, Mapping):
        raise ExpectationInvalid("the body must be a JSON object")
    unknown = sorted(set(data) - {"reference", "kind", "amount", "initiated_at"})
    if unknown:
        raise ExpectationInvalid(f"unknown field(s): {', '.join(unknown)}")
    reference = data.get("reference")
    if not isinstance(reference, str) or not reference.strip() \
            or len(reference) > MAX_REFERENCE:
        raise ExpectationInvalid(f"reference must be a string of 1 to {MAX_REFERENCE} "
                                 "characters")
    if not jsonb_can_hold(reference):  # the database's text refuses it: a 500, before
        raise ExpectationInvalid("reference must not hold a NUL or half a character")
    kind = data.get("kind")
    if kind not in KINDS:
        raise ExpectationInvalid("kind must be collection, payout or sms")
    if kind == "sms":
        amount = Decimal(0)
        if data.get("amount") is not None and parse_amount(data["amount"], zero=True) != 0:
            raise ExpectationInvalid("an sms carries no amount: give 0 or none")
    elif data.get("amount") is None:
        raise ExpectationInvalid("amount is required")
    else:
        amount = parse_amount(data["amount"])
    raw = data.get("initiated_at")
    initiated_at = now
    if raw is not None:
        if not isinstance(raw, str):
            raise ExpectationInvalid("initiated_at must be an ISO 8601 date-time")
        try:
            initiated_at = datetime.fromisoformat(raw.replace("Z", "+00:00"))
        except ValueError as exc:
            raise ExpectationInvalid("initiated_at must be an ISO 8601 date-time") from exc
        if initiated_at.tzinfo is None:
            raise ExpectationInvalid("initiated_at must carry a UTC offset")
        if not storable_instant(initiated_at):
            raise ExpectationInvalid("initiated_at must be between 1900 and 9997")
    return Expectation(reference, str(kind), amount, initiated_at.astimezone(UTC))


async def register(conn: psycopg.AsyncConnection[Any], expectation: Expectation) -> bool:
    """True when new, False when already registered alike; conflict otherwise."""
    try:
        cur = await conn.execute(
            "SELECT hookledger.expect(%s, %s, %s, %s)",
            (expectation.reference, expectation.kind, expectation.amount,
             expectation.initiated_at))
    except psycopg.errors.UniqueViolation as exc:
        raise ExpectationConflict() from exc
    except psycopg.errors.InvalidParameterValue as exc:
        raise ExpectationInvalid(str(exc.diag.message_primary or "invalid")) from exc
    row = await cur.fetchone()
    return bool(row and row[0])


async def registered(conn: psycopg.AsyncConnection[Any], reference: str) -> Expectation | None:
    """The expectation as stored: a repeat registration keeps the first one's amount and
    ``initiated_at``, so that is what a repeat is answered with, not what it asked."""
    cur = await conn.execute(
        "SELECT reference, kind, amount, initiated_at FROM hookledger_private.expectations "
        "WHERE reference = %s", (reference,))
    row = await cur.fetchone()
    return Expectation(row[0], row[1], row[2], row[3].astimezone(UTC)) if row else None
