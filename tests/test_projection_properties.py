"""Any arrival order, any duplication: the same final projections as the canonical order."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ingest.general_body import read_invoice_block
from ledger import NewEvent, StoredEvent
from ledger.jsonenc import dumps
from projections.registry import PROJECTIONS, Row
from reconcile.findings import recovered_event
from reconcile.records import ProviderRecord
from tests.projection_events import EAT, new_event, restamped, stored

# columns a user sees; positions differ with arrival order by nature
HIDDEN = {"winner", "provenance", "evidence", "block_key", "last_position", "statuses"}


def ts(minute: int) -> str:
    return f"202611220{8 + minute // 60}{minute % 60:02d}00"


# minutes a repeated invoice.created may be stamped at: the invoice's other events are at
# 10-12 (part payments and updates), 30 (paid or cancelled) and 40 (re-saved)
RESTAMPED_AT = [1, 10, 15, 30, 50]


def recovered(event: str, code: int, status: str, reference: str, amount: int,
              timestamp: str | None, invoice: dict[str, Any] | None) -> NewEvent:
    """The reconciler's recovery of a lost webhook from the provider's record, with the
    record's invoice block (as the API spells it), as the ledger keeps its facts."""
    record = ProviderRecord(reference=reference, status=status, amount=Decimal(amount),
                            event=event, code=code, transaction_id=None,
                            customer_reference=None, service=None, timestamp=timestamp,
                            invoice=None if invoice is None else read_invoice_block(invoice)[0])
    new = recovered_event("collection", record, "pass-1", datetime.now(UTC), EAT)
    return dataclasses.replace(new, facts=orjson.loads(dumps(new.facts)))


@st.composite
def scenario(draw: st.DrawFn) -> list[NewEvent]:
    """A consistent story per subject (timestamps increase within a subject)."""
    events: list[NewEvent] = []
    for i in range(draw(st.integers(0, 2))):
        # several confirmations of one collection, amounts drawn from a small set so that
        # equal amounts (700 and 700.0) and different ones both occur; some with a code that
        # contradicts the event; some in the same second (the provider's resolution)
        for n, amount in enumerate(draw(st.lists(st.sampled_from([700, 700.0, 900, 1100]),
                                                 min_size=1, max_size=4))):
            events.append(new_event("payment.confirmed",
                                    draw(st.sampled_from([91000, 91001, 91055])),
                                    reference=f"R{i}", amount=amount,
                                    timestamp=ts(draw(st.sampled_from([0, n]))),
                                    transaction_id=f"TX-{n}"))
    for i in range(draw(st.integers(1, 4))):
        ref, kind = f"P{i}", draw(st.sampled_from(["paid", "refunded", "failed", "conflict"]))
        if kind in ("paid", "refunded", "conflict"):
            events.append(new_event("payment.confirmed", 91000, reference=ref,
                                    amount=draw(st.integers(1, 10**6)), timestamp=ts(1)))
        if kind == "refunded":
            events.append(new_event("payment.refunded", 91010, reference=ref, timestamp=ts(5),
                                    transaction_id=None))
        if kind in ("failed", "conflict"):
            events.append(new_event("payment.failed", draw(st.sampled_from([91051, 91099])),
                                    reference=ref, amount=0, transaction_id="-1",
                                    timestamp=ts(9)))
    for i in range(draw(st.integers(0, 3))):
        ref = f"O{i}"
        events.append(new_event("payout.approved", 92002, reference=ref, timestamp=ts(1),
                                service="Disbursement"))
        end = draw(st.sampled_from(["payout.confirmed", "payout.failed", None]))
        if end:
            events.append(new_event(end, 92000 if end == "payout.confirmed" else 92053,
                                    reference=ref, service="Disbursement", timestamp=ts(2),
                                    amount=1000 if end == "payout.confirmed" else 0))
    for i in range(draw(st.integers(0, 2))):
        number, total = f"INV{i}", 900
        base = {"invoiceNo": number, "total": total, "currency": "TZS",
                "dueDate": "2026-12-31", "paymentReference": "99123"}

        def block(base: dict[str, Any] = base, **amounts: Any) -> dict[str, Any] | None:
            """An invoice block that may leave fields out, or be missing altogether."""
            if draw(st.integers(0, 9)) == 0:
                return None
            full = {**base, **amounts}
            gone = draw(st.sets(st.sampled_from(["amountPaid", "amountDue", "total",
                                                 "dueDate", "paymentReference"])))
            return {k: v for k, v in full.items() if k not in gone}

        created = new_event("invoice.created", 93000, reference=number, amount=total,
                            timestamp=ts(0), invoice=block(amountPaid=0, amountDue=total))
        events.append(created)
        # the same creation sent again (a repeated callback), stamped at any later time,
        # before the invoice's other events, between them or after all of them
        events.extend(restamped(created, ts(minute))
                      for minute in draw(st.lists(st.sampled_from(RESTAMPED_AT), max_size=2)))
        paid = 0
        for step in range(draw(st.integers(0, 3))):
            paid += 100
            part = {**base, "amountPaid": paid, "amountDue": total - paid}
            # its webhook, the provider's record of it (the webhook lost), or both
            told = draw(st.sampled_from(["webhook", "recovered", "both"]))
            if told != "recovered":
                events.append(new_event("payment.confirmed", 91001,
                                        reference=f"{number}-p{step}", amount=100,
                                        timestamp=ts(10 + step), invoice=part))
            if told != "webhook":
                events.append(recovered("payment.confirmed", 91001, "PARTIAL",
                                        f"{number}-p{step}", 100, ts(10 + step), part))
            events.append(new_event("invoice.updated", 93001, reference=number, amount=total,
                                    timestamp=ts(10 + step),
                                    invoice=block(amountPaid=paid, amountDue=total - paid)))
        if paid:  # the first part payment refunded: by webhook, record, or both, each
            # with the invoice's block or without (a record may lack its time too)
            back = {**base, "amountPaid": paid - 100, "amountDue": total - paid + 100}
            # (one recovery at most: a record's state is recovered once, under one key)
            ways = [draw(st.sampled_from([None, "webhook", "webhook, no block"])),
                    draw(st.sampled_from([None, "recovered", "recovered, no block",
                                          "recovered, no time"]))]
            for way in filter(None, ways):
                carried = None if "no block" in way else back
                if way.startswith("webhook"):
                    events.append(new_event("payment.refunded", 91010,
                                            reference=f"{number}-p0", amount=100,
                                            status="REVERSED", timestamp=ts(20),
                                            invoice=carried))
                else:
                    events.append(recovered("payment.refunded", 91010, "REVERSED",
                                            f"{number}-p0", 100,
                                            None if "no time" in way else ts(20), carried))
        if draw(st.booleans()):  # a confirmation whose code says it failed: no money moved
            events.append(new_event("payment.confirmed", 91055, reference=f"{number}-x",
                                    amount=total, timestamp=ts(20),
                                    invoice={**base, "amountPaid": total, "amountDue": 0}))
        end = draw(st.sampled_from(["paid", "paid, then raised", "cancelled", None]))
        if end and end.startswith("paid"):
            events.append(new_event("invoice.paid", 93002, reference=number, amount=total,
                                    timestamp=ts(30), invoice=block(amountPaid=total,
                                                                    amountDue=0)))
        if end == "paid, then raised":  # re-saved with a larger total: owed again
            events.append(new_event("invoice.updated", 93001, reference=number, amount=1500,
                                    timestamp=ts(40), invoice=block(
                                        total=1500, amountPaid=total, amountDue=1500 - total,
                                        dueDate="2027-01-31", paymentReference="99777")))
        elif end == "cancelled":
            events.append(new_event("invoice.cancelled", 93003, reference=number,
                                    amount=total, timestamp=ts(30),
                                    invoice=block(amountPaid=paid, amountDue=total - paid)))
    for i in range(draw(st.integers(0, 2))):
        for name in draw(st.lists(st.sampled_from(["sms.delivered", "sms.failed"]),
                                  min_size=1, max_size=2, unique=True)):
            events.append(new_event(name, 94000 if name == "sms.delivered" else 94050,
                                    reference=f"M{i}", amount=0, customer_reference="2557"))
    return events


def as_ledger(deliveries: list[NewEvent]) -> list[StoredEvent]:
    """What the ledger keeps of a delivery stream: first copy of each key, in arrival order."""
    seen: set[str] = set()
    kept = []
    for delivery in deliveries:
        if delivery.dedupe_key not in seen:
            seen.add(delivery.dedupe_key)
            kept.append(stored(delivery, position=len(kept) + 1))
    return kept


def project(events: list[StoredEvent]) -> dict[str, Any]:
    """The rows a user sees, and the discrepancies found, by identity and wording (the
    projector appends each once, keyed on its identity, so the set is what the ledger gets;
    the amount at risk is the one known at detection and may depend on the order)."""
    tables: dict[str, Any] = {}
    found: set[tuple[str, str]] = set()
    for projection in PROJECTIONS:
        rows: dict[str, Row] = {}
        for event in events:
            for key in projection.keys(event):
                rows[key], new = projection.fold(rows.get(key), event)
                found.update((d.dedupe_key, d.detail) for d in new)
        tables[projection.table] = {
            k: {c: v for c, v in row.items() if c not in HIDDEN} for k, row in rows.items()}
    tables["discrepancies found"] = found
    return tables


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(data=st.data(), story=scenario())
def test_any_order_and_duplication_gives_the_canonical_projection(
        data: st.DataObject, story: list[NewEvent]) -> None:
    canonical = project(as_ledger(story))
    copies = data.draw(st.lists(st.sampled_from(story), max_size=len(story) * 2))
    arrived = data.draw(st.permutations(story + copies))
    assert project(as_ledger(arrived)) == canonical


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(data=st.data(), story=scenario())
def test_a_repeated_invoice_created_changes_no_invoice_whatever_its_time(
        data: st.DataObject, story: list[NewEvent]) -> None:
    """An invoice is created once, first: a copy of its ``invoice.created`` stamped later
    (another ledger event) counts as earlier than its other events, so every row, every
    other projection and every finding stay as they were. Only the count of events moves,
    and the time of an invoice known by nothing but its creation (the later creation is
    the later, as before)."""
    creations = [e for e in story if e.event_type == "invoice.created"]
    copies = [restamped(e, ts(data.draw(st.sampled_from(RESTAMPED_AT), label="stamped at")))
              for e in data.draw(st.lists(st.sampled_from(creations), max_size=4))
              ] if creations else []
    before = project(as_ledger(story))
    after = project(as_ledger(data.draw(st.permutations(story + copies))))
    # every event gives last_event: still invoice.created, nothing else reached the invoice
    created_only = {number for number, row in before["invoices"].items()
                    if row["last_event"] == "invoice.created"}

    def shown(tables: dict[str, Any]) -> dict[str, Any]:
        invoices = {number: {c: v for c, v in row.items() if c != "event_count"
                             and (c != "updated_at" or number not in created_only)}
                    for number, row in tables["invoices"].items()}
        return {**tables, "invoices": invoices}

    assert shown(after) == shown(before)
