"""Discrepancy reports: what they say, worked out from discrepancy rows.

:class:`ReportTotals` and :func:`build_report` are pure (rows in, a JSON-ready dict out);
:mod:`reconcile.report_render` only formats that dict (HTML, Markdown, CSV and JSON), so
every format tells the same totals, and :mod:`reconcile.report_files` reads the rows from
the database and writes the files a row at a time. No secret is ever read here.

JSON report schema (``schema_version`` 1; fields may be added, none removed or renamed)::

    {
      "schema_version": 1,
      "generated_at": "ISO 8601 with offset",
      "since": "ISO 8601" | null,            # only discrepancies detected since then
      "currency": "TZS",
      "totals": {"discrepancies": int, "open": int, "resolved": int,
                 "amount_at_risk_open": "decimal string"},
      "by_kind":    [{"kind": str, "open": int, "resolved": int,
                      "amount_at_risk_open": "decimal string"}],      # sorted by kind
      "by_service": [{"service": str, "open": int, "resolved": int,
                      "amount_at_risk_open": "decimal string"}],      # sorted by service
      "aging": [{"bucket": "<1h" | "1h-24h" | "1d-7d" | ">7d", "open": int,
                 "amount_at_risk": "decimal string"}],                # open ones, by age
      "timeline": [{"date": "YYYY-MM-DD", "detected": int, "resolved": int}],  # UTC days
      "open": [{"id": str, "kind": str, "service": str, "subject": str,
                "reference": str, "detail": str,
                "amount_at_risk": "decimal string" | null,
                "detected_at": "ISO 8601", "age_s": int, "action": str}]  # oldest first
    }

Every ``amount_at_risk_open`` and aging amount counts each payment (subject and reference)
once, at the largest amount among its open discrepancies (:func:`at_risk`).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from ingest.codes import CODES
from ledger.money import total

SCHEMA_VERSION = 1
AGING = (("<1h", 3600), ("1h-24h", 86400), ("1d-7d", 7 * 86400), (">7d", None))
ACTIONS = {
    "missing_webhook": "A webhook was lost; the state was recovered from the provider's API. "
                       "Fulfil, credit or release as a normal webhook would have done, then "
                       "check why the receiver missed it (outage, deploy, network).",
    "status_mismatch": "Webhooks and the provider disagree. The provider's record is "
                       "authoritative: check whether goods were released or money moved, "
                       "and ask the provider's support if it stays. Where the detail says "
                       "the record is of another kind, check what the reference was "
                       "registered or delivered as: nothing was recovered.",
    "amount_mismatch": "The amount differs. For a part payment compare with the amount "
                       "requested and collect the rest or refund; otherwise check the order.",
    "unresolved": "Not final after its resolution window. Check its state with the "
                  "provider by reference before doing anything that moves money again.",
    "unknown_at_provider": "The provider does not know this reference: the initiation most "
                           "likely failed. Check it by reference before initiating again.",
    "conflicting_events": "Webhooks contradict each other; check the payment by reference "
                          "and confirm the state kept.",
    "unsettled_paid_invoice": "invoice.paid arrived with money still due: do not treat the "
                              "invoice as settled; collect the outstanding amount.",
    "refunded_invoice_payment": "A payment against this invoice was refunded, and the "
                                "refund did not update the invoice: it still counts the "
                                "money as received. Check the invoice with the provider "
                                "before releasing goods against it; collect again if owed.",
    "cancelled_invoice_paid": "The invoice was cancelled while money received on it is "
                              "still held: refund the customer, or reinstate the invoice if "
                              "it was cancelled by mistake. Closes once the money is "
                              "refunded against it.",
    "recorded_twice": "One payment is in the view twice: recovered under the reference "
                      "you registered, then delivered by webhook under the provider's "
                      "spelling of it. Count it, and fulfil or pay it, once; register "
                      "references as the provider spells them.",
    "unprojectable_event": "A ledger event could not be folded into a projection and was "
                           "left out of it; the event is kept. Report it with its position.",
    "malformed_delivery": "A signed delivery whose fields could not be read is kept in the "
                          "ledger but in no view. Reconciliation asks the provider about its "
                          "payment; check the rest by hand from the raw body at its position.",
}
# advice that depends on the subject: what is safe to do again differs for money coming in
# (a collection) and money going out (a payout, where a second one can pay twice)
SUBJECT_ACTIONS: dict[tuple[str, str], str] = {
    ("unresolved", "collection"):
        "Not final after the {window} resolution window: a collection this old will not "
        "resolve on its own. Tell the customer, and start a new collection if they still "
        "want to pay.",
    ("unresolved", "payout"):
        "Not final after the {window} payout window. Do not start another payout for it: "
        "this one may already be approved and debited, and can still complete, which would "
        "pay twice. Ask the provider's support about it by reference; if it fails, the "
        "provider refunds the wallet itself (payout.failed).",
    ("unknown_at_provider", "collection"):
        "The provider does not know this reference. Where the detail says its webhooks "
        "said success, that payment is unconfirmed (a forged or misdirected webhook, or "
        "another account's): do not fulfil, and hold what was released, until the provider "
        "confirms it. Otherwise the initiation most likely failed: re-initiate if the "
        "customer still wants to pay.",
    ("unknown_at_provider", "payout"):
        "The provider does not know this payout's reference. Where the detail says its "
        "webhooks said success, do not take it as paid: confirm with the provider and the "
        "wallet balance. Otherwise the initiation most likely failed and nothing was "
        "debited: confirm that with the provider (and the wallet balance) before paying out "
        "again, under a new reference.",
}


@dataclass(frozen=True, slots=True)
class Windows:
    """The resolution windows the advice names: ``HOOKLEDGER_RESOLUTION_WINDOW_S`` for a
    collection, ``HOOKLEDGER_RECONCILE_PAYOUT_WINDOW_S`` for a payout (defaults alike)."""

    collection: timedelta = timedelta(seconds=90)
    payout: timedelta = timedelta(hours=24)

    def of(self, subject: str) -> timedelta | None:
        return {"collection": self.collection, "payout": self.payout}.get(subject)


def duration_text(delta: timedelta) -> str:
    """``90 s``, ``2 min``, ``24 h``: the largest unit that states it exactly."""
    seconds = int(delta.total_seconds())
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds // 3600} h"
    if seconds >= 120 and seconds % 60 == 0:
        return f"{seconds // 60} min"
    return f"{seconds} s"


@dataclass(frozen=True, slots=True)
class Row:
    id: str
    kind: str
    service: str
    subject: str
    reference: str
    detail: str
    amount_at_risk: Decimal | None
    status: str
    # None on a row whose resolution was folded before its detection (a replay): resolved,
    # and counted on no day's "detected" until the detection is folded
    detected_at: datetime | None
    resolved_at: datetime | None
    code: int | None = None


def action_for(kind: str, code: int | None, subject: str = "",
               windows: Windows | None = None) -> str:
    """What to do for a discrepancy of ``kind`` about ``subject``, naming its configured
    window, with the spec's retry guidance when a failure code is known."""
    text = SUBJECT_ACTIONS.get((kind, subject)) or ACTIONS.get(
        kind, "Look at the subject's history in hookledger.ledger.")
    window = (windows or Windows()).of(subject)
    if window is not None:
        text = text.replace("{window}", duration_text(window))
    info = CODES.get(code) if code is not None else None
    if info is not None and code is not None and code % 100 >= 50:
        text += f" Code {code}: {info.meaning}; retry: {info.retry}."
    return text


def _money(value: Decimal) -> str:
    return format(value, "f")


def at_risk(rows: Iterable[Row]) -> Decimal:
    """Money at risk in open discrepancies, each payment (subject and reference) counted
    once, at the largest amount any of them names: one payment can hold a conflict, a
    contradicting code and a mismatch at once, and its money is not at risk three times."""
    largest: dict[tuple[str, str], Decimal] = {}
    for row in rows:
        key = (row.subject, row.reference)
        largest[key] = max(largest.get(key, Decimal(0)), row.amount_at_risk or Decimal(0))
    return total(largest.values())


def aging_bucket(now: datetime, detected_at: datetime) -> str:
    age = (now - detected_at).total_seconds()
    return next(name for name, limit in AGING if limit is None or age < limit)


def is_open(row: Row) -> bool:
    """Open and listed: a row whose resolution was folded before its detection counts as
    resolved until its detection is folded."""
    return row.status == "open" and row.detected_at is not None


class ReportTotals:
    """Everything a report says but its list of open discrepancies, added up a row at a
    time, so that a table of millions of discrepancies is summed in constant memory.

    Rows must come grouped by payment (subject and reference; within one, in a fixed
    order): money at risk counts each payment once, at the largest amount among its open
    discrepancies (:func:`at_risk`), and grouped, only one payment's rows are held."""

    def __init__(self, now: datetime) -> None:
        self.now = now
        self.total = 0
        self.open = 0
        self.counts: dict[str, dict[str, list[int]]] = {"kind": defaultdict(lambda: [0, 0]),
                                                       "service": defaultdict(lambda: [0, 0])}
        self.open_by_age: Counter[str] = Counter()
        self.risk = Decimal(0)
        self.risk_by: dict[str, dict[str, Decimal]] = {
            axis: defaultdict(Decimal) for axis in ("kind", "service", "aging")}
        self.detected: Counter[str] = Counter()
        self.resolved: Counter[str] = Counter()
        self._payment: tuple[str, str] | None = None
        self._payment_open: list[tuple[Row, str]] = []

    def add(self, row: Row) -> None:
        if (row.subject, row.reference) != self._payment:
            self._settle_payment()
            self._payment = (row.subject, row.reference)
        self.total += 1
        if row.detected_at is not None:
            self.detected[_day(row.detected_at)] += 1
        opened = is_open(row)
        for axis, key in (("kind", row.kind), ("service", row.service)):
            self.counts[axis][key][0 if opened else 1] += 1
        if opened:
            self.open += 1
            bucket = aging_bucket(self.now, _detected(row))
            self.open_by_age[bucket] += 1
            self._payment_open.append((row, bucket))
        elif row.resolved_at is not None:
            self.resolved[_day(row.resolved_at)] += 1

    def _settle_payment(self) -> None:
        """The finished payment's money at risk, once in every total it falls in."""
        held, self._payment_open = self._payment_open, []
        if not held:
            return
        if len(held) == 1:  # most payments: its one amount (at least 0) everywhere
            row, bucket = held[0]
            amount = max(Decimal(0), row.amount_at_risk or Decimal(0))
            self.risk = total((self.risk, amount))
            for axis, key in (("kind", row.kind), ("service", row.service), ("aging", bucket)):
                self.risk_by[axis][key] = total((self.risk_by[axis][key], amount))
            return
        self.risk = total((self.risk, at_risk(row for row, _ in held)))
        for axis, key_of in (("kind", lambda r, _: r.kind), ("service", lambda r, _: r.service),
                             ("aging", lambda _, bucket: bucket)):
            for key in {key_of(row, bucket) for row, bucket in held}:
                self.risk_by[axis][key] = total((self.risk_by[axis][key], at_risk(
                    row for row, bucket in held if key_of(row, bucket) == key)))

    def summary(self, since: datetime | None) -> dict[str, Any]:
        """The report without its ``open`` list (which comes last, so that it can follow)."""
        self._settle_payment()
        self._payment = None
        days = sorted(set(self.detected) | set(self.resolved))
        risk = self.risk_by
        return {
            "schema_version": SCHEMA_VERSION, "generated_at": self.now.isoformat(),
            "since": since.isoformat() if since else None, "currency": "TZS",
            "totals": {"discrepancies": self.total, "open": self.open,
                       "resolved": self.total - self.open,
                       "amount_at_risk_open": _money(self.risk)},
            "by_kind": [{"kind": k, "open": v[0], "resolved": v[1],
                         "amount_at_risk_open": _money(risk["kind"][k])}
                        for k, v in sorted(self.counts["kind"].items())],
            "by_service": [{"service": k, "open": v[0], "resolved": v[1],
                            "amount_at_risk_open": _money(risk["service"][k])}
                           for k, v in sorted(self.counts["service"].items())],
            "aging": [{"bucket": name, "open": self.open_by_age[name],
                       "amount_at_risk": _money(risk["aging"][name])} for name, _ in AGING],
            "timeline": [{"date": d, "detected": self.detected[d], "resolved": self.resolved[d]}
                         for d in days],
        }


def open_item(row: Row, now: datetime, windows: Windows | None = None) -> dict[str, Any]:
    """One open discrepancy as the report lists it, with what to do about it."""
    detected = _detected(row)
    return {"id": row.id, "kind": row.kind, "service": row.service, "subject": row.subject,
            "reference": row.reference, "detail": row.detail,
            "amount_at_risk": None if row.amount_at_risk is None else _money(row.amount_at_risk),
            "detected_at": detected.isoformat(),
            "age_s": int((now - detected).total_seconds()),
            "action": action_for(row.kind, row.code, row.subject, windows)}


def payment_order(row: Row) -> tuple[str, str, str]:
    """How :class:`ReportTotals` wants rows: by payment, and by id within one."""
    return (row.subject, row.reference, row.id)


def listing_order(row: Row) -> tuple[datetime, str]:
    """The open list's order: oldest first, then by id (compared as code points, as
    PostgreSQL's ``COLLATE "C"`` compares UTF-8)."""
    return (_detected(row), row.id)


def build_report(rows: Iterable[Row], *, now: datetime, since: datetime | None = None,
                 windows: Windows | None = None) -> dict[str, Any]:
    """The whole report from rows in memory; :mod:`reconcile.report_files` writes the same
    from the database a row at a time."""
    ordered = sorted(rows, key=payment_order)
    totals = ReportTotals(now)
    for row in ordered:
        totals.add(row)
    report = totals.summary(since)
    report["open"] = [open_item(row, now, windows)
                      for row in sorted(filter(is_open, ordered), key=listing_order)]
    return report


def _day(moment: datetime) -> str:
    return moment.astimezone(UTC).date().isoformat()


def _detected(row: Row) -> datetime:
    """An open row's detection time (an open row always has one: only a detection opens)."""
    assert row.detected_at is not None
    return row.detected_at
