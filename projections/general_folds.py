"""Pure folds of general (system A) events into payments, payouts, invoices and SMS rows.

Each ``fold_*`` takes the subject's current row (or ``None``) and one ledger event and
returns the new row and any discrepancies found. A row is a plain dict of its table's
columns, bookkeeping included (``winner`` key, ``provenance``, ``event_count``...), so the
SQL layer only loads and stores dicts.
"""

from __future__ import annotations

from datetime import date, datetime
from decimal import Decimal
from typing import Any

from ledger import StoredEvent
from ledger.instants import storable_instant
from ledger.money import amount_text, difference
from projections.folding import (
    OLD_TIEBREAK,
    Discrepancy,
    SortKey,
    decimal_or_none,
    key_from_json,
    key_to_json,
    merge_descriptive,
    sort_key,
    tiebreak,
)

Row = dict[str, Any]

PAYMENT_RANK = {"payment.failed": 1, "payment.confirmed": 2, "payment.refunded": 3}
PAYOUT_RANK = {"payout.approved": 1, "payout.failed": 2, "payout.confirmed": 3}
# A delivery's outcome comes from its code (its failure band, or a listed code's own meaning)
# before its event name (``ingest.codes.outcome``), so the rank and the evidence slot follow
# the outcome: a payment.confirmed carrying 91055 is a failure everywhere, never a success in
# one place and a failure in another.
PAYMENT_RANK_BY_OUTCOME = {"failure": 1, "success": 2, "refunded": 3}
PAYOUT_RANK_BY_OUTCOME = {"pending": 1, "failure": 2, "success": 3}
SLOT_OF_OUTCOME = {"success": "confirmed", "refunded": "refunded", "failure": "failed"}
SUCCESS_SLOTS = ("confirmed", "refunded")
# where ``evidence`` keeps the slots the provider's records (``reconcile.recovered``) took
RECOVERED_SLOTS = "recovered"
SMS_RANK = {"sms.failed": 1, "sms.delivered": 2}
# In one second with the same money received: the invoice's own events outrank a part
# payment that carries the same block, and an update outranks ``invoice.paid`` and
# ``invoice.cancelled``, which fire once, so an update beside one is the re-save after it
# (ranked below them, a paid invoice re-saved with more due in that second showed settled).
# ``invoice.updated`` moved from 2 to 4, not the others down: marks stored before keep
# their meaning, and only a row's same-second ties change, as ``hookledger rebuild`` shows.
INVOICE_RANK = {"invoice.created": 0, "payment.confirmed": 1, "invoice.paid": 3,
                "invoice.cancelled": 3, "invoice.updated": 4}
# An invoice is created once, before anything else happens to it, so an ``invoice.created``
# comes before every other event of its invoice whatever its time (:func:`_block_newer`): a
# repeated callback stamped anew is a second ledger event (``timestamp`` is in the dedupe
# key), and as the latest it reopened a paid invoice. Told by its rank, which every mark
# shape kept (it was always 0), so marks keep their shape and rows folded before read alike.
CREATED_RANK = INVOICE_RANK["invoice.created"]


def _facts(event: StoredEvent) -> dict[str, Any]:
    return dict(event.facts)


def _event_key(event: StoredEvent, rank: int) -> SortKey:
    return sort_key(rank, event.occurred_at, event.dedupe_key, event.position)


# Events the reconciler appends when the provider's record shows a terminal state that no
# webhook told us (a lost delivery). Their facts have the webhook's shape plus the name of
# the provider event they stand for (``event``). They rank like that event but sort BEFORE
# every webhook of the same rank (provider time 0): a webhook always confirms or overrides
# a recovered state, and a recovered state never overrides a webhook of equal or higher rank.
RECOVERED_EVENT = "reconcile.recovered"



def _recovered_at(event: StoredEvent) -> datetime | None:
    text = event.facts.get("occurred_at")
    return datetime.fromisoformat(text) if isinstance(text, str) else None


def _fold_money(row: Row | None, event: StoredEvent, *, kind: str, rank: int,
                descriptive: dict[str, Any]) -> tuple[Row, list[Discrepancy]]:
    """Payments and payouts: the highest-ranked event decides the state.

    ``evidence`` keeps, per slot (confirmed, refunded, failed), the highest-keyed event of
    that kind, so conflicts are found whatever the arrival order: a failure beside a
    success, or a confirmation whose amount differs from another confirmation's.
    """
    facts = _facts(event)
    recovered = event.event_type == RECOVERED_EVENT
    key = (sort_key(rank, None, event.dedupe_key, event.position) if recovered
           else _event_key(event, rank))
    reference = facts["reference"]
    amount = decimal_or_none(facts.get("amount"))
    candidate: Row = {
        "reference": reference,
        "status": facts.get("status"),
        "outcome": facts["outcome"],
        "code": facts.get("code"),
        "amount": amount,
        "last_event": facts["event"],
        "updated_at": _recovered_at(event) if recovered else event.occurred_at,
        "recovered": recovered,
    }
    state: Row = dict(row) if row is not None else {
        **candidate, "winner": None, "provenance": {}, "evidence": {}, "conflicted": False,
        "event_count": 0, "last_position": 0}
    state.setdefault("recovered", False)
    evidence: dict[str, Any] = dict(state["evidence"])
    found: list[Discrepancy] = []
    slot = SLOT_OF_OUTCOME.get(facts["outcome"])
    mark = [key_to_json(key), event.dedupe_key, None if amount is None else str(amount)]
    if RECOVERED_SLOTS not in evidence and state["recovered"]:
        evidence[RECOVERED_SLOTS] = _recovered_slot_of_old_row(state)
    if slot is not None and recovered:
        # the provider's record counts for the outcome (a late webhook saying otherwise is
        # a conflict), never for the amounts, which it spells its own way
        found = _outcome_conflict(evidence, slot, amount, kind, reference)
        held_recovered: dict[str, list[Any]] = dict(evidence.get(RECOVERED_SLOTS, {}))
        _keep_highest(held_recovered, slot, key, mark)
        evidence[RECOVERED_SLOTS] = held_recovered
    elif slot is not None:
        known_amounts = _confirmed_amounts(evidence)  # before this event takes the slot
        found = _conflicts(evidence, slot, amount, known_amounts, kind, reference)
        _keep_highest(evidence, slot, key, mark)
        if slot == "confirmed" and amount is not None:
            evidence["amounts"] = sorted({*known_amounts, _amount_text(amount)}, key=Decimal)
    if not recovered and facts.get("code_event_conflict"):
        found.append(_code_contradiction(kind, event, facts["outcome"], amount or None))
    if state["winner"] is None or key > key_from_json(state["winner"]):
        state.update(candidate)
        state["winner"] = key_to_json(key)
    current = {name: state.get(name) for name in descriptive}
    values, provenance = merge_descriptive(current, state["provenance"], descriptive, key)
    state.update(values)
    state["provenance"] = provenance
    state["evidence"] = evidence
    state["conflicted"] = state["conflicted"] or bool(found)
    state["event_count"] += 1
    state["last_position"] = max(state["last_position"], event.position)
    return state, found


def _amount_text(amount: Decimal) -> str:
    """One spelling per value, so 700 and 700.00 are the same amount; exactly, so two
    amounts differing in the 29th digit are two (:mod:`ledger.money`)."""
    return amount_text(amount)


def _code_contradiction(subject: str, event: StoredEvent, counts_as: str,
                        at_risk: Decimal | None, *,
                        reference: str | None = None) -> Discrepancy:
    """A delivery whose code contradicts its event name: the code decided, or (a success
    code of another service on a ``*.failed`` event, a listed code of another family) the
    event name did; the detail says which reading counted. Filed under ``reference``, else
    the delivery's (an invoice's row is keyed by its block's number)."""
    facts = event.facts
    return Discrepancy(
        kind="conflicting_events", subject=subject, reference=reference or facts["reference"],
        detail=f"code {facts.get('code')} contradicts event {facts['event']}; it counts as "
               f"{counts_as}",
        amount_at_risk=at_risk, evidence=(event.dedupe_key,))


def _keep_highest(held: dict[str, Any], slot: str, key: SortKey, mark: list[Any]) -> None:
    """Keep in ``held[slot]`` the mark of the highest-keyed event of that slot."""
    current = held.get(slot)
    if current is None or key > key_from_json(current[0]):
        held[slot] = mark


def _recovered_slot_of_old_row(state: Row) -> dict[str, list[Any]]:
    """A row folded before recovered outcomes were kept in ``evidence``, whose state is
    still a recovered one: its winner is that recovered event. (A recovered state a webhook
    has since taken over left no trace in such a row: ``hookledger rebuild`` finds it.)"""
    slot = SLOT_OF_OUTCOME.get(state["outcome"])
    if slot is None or state["winner"] is None:
        return {}
    amount = state.get("amount")
    return {slot: [state["winner"], None, None if amount is None else str(amount)]}


def _outcome_conflict(evidence: dict[str, Any], slot: str, amount: Decimal | None,
                      kind: str, reference: str) -> list[Discrepancy]:
    """A failure beside a success, whether a webhook or the provider's record
    (``reconcile.recovered``) reported either: found once, when the second outcome first
    shows."""
    recovered = evidence.get(RECOVERED_SLOTS, {})
    successes = [held[s] for held in (evidence, recovered) for s in SUCCESS_SLOTS if s in held]
    failed = "failed" in evidence or "failed" in recovered
    # the amount at risk is the success's amount known when the conflict shows; which one
    # that is can depend on arrival order, the finding's identity never does
    if slot == "failed" and successes and not failed:
        return [_conflict(kind, reference, "both a failure and a success were reported",
                          decimal_or_none(successes[0][2]), "outcome:failure",
                          "outcome:success")]
    if slot in SUCCESS_SLOTS and failed and not successes:
        return [_conflict(kind, reference, "both a failure and a success were reported",
                          amount, "outcome:failure", "outcome:success")]
    return []


def _conflicts(evidence: dict[str, Any], slot: str, amount: Decimal | None,
               known_amounts: list[str], kind: str, reference: str) -> list[Discrepancy]:
    """What this webhook contradicts among the events folded before it.

    A finding is named by what conflicts (the outcomes, the two amounts), not by which
    events happened to arrive first, so every arrival order of the same events records the
    same set of discrepancies: one for a failure beside a success, one per pair of
    different confirmed amounts.
    """
    outcome = _outcome_conflict(evidence, slot, amount, kind, reference)
    if outcome:
        return outcome
    if slot == "confirmed" and amount is not None:
        mine = _amount_text(amount)
        found = []
        for seen in known_amounts:
            if seen == mine:
                continue
            low, high = sorted((Decimal(seen), Decimal(mine)))
            low_text, high_text = _amount_text(low), _amount_text(high)
            found.append(_conflict(
                kind, reference, f"confirmations carry different amounts, {low_text} and "
                f"{high_text}", difference(high, low), f"amount:{low_text}",
                f"amount:{high_text}"))
        return found
    return []


def _confirmed_amounts(evidence: dict[str, Any]) -> list[str]:
    """The distinct confirmed amounts seen; a row folded before they were kept has only its
    best confirmation's amount, which is where the list starts."""
    if "amounts" in evidence:
        return list(evidence["amounts"])
    held = evidence.get("confirmed")
    return [] if held is None or held[2] is None else [_amount_text(Decimal(held[2]))]


def _conflict(kind: str, reference: str, detail: str, at_risk: Decimal | None,
              *marks: str) -> Discrepancy:
    return Discrepancy(kind="conflicting_events", subject=kind, reference=reference,
                       detail=f"{detail}; kept the best-supported state",
                       amount_at_risk=at_risk, evidence=tuple(sorted(marks)))


# -- payments (collections) ---------------------------------------------------------------

def _recovered_subject(event: StoredEvent) -> str | None:
    return str(event.facts.get("subject")) if event.event_type == RECOVERED_EVENT else None


def _rank(ranks: dict[str, int], event: StoredEvent) -> int:
    return ranks.get(event.facts["outcome"], 0)


def payment_keys(event: StoredEvent) -> list[str]:
    if event.event_type in PAYMENT_RANK or _recovered_subject(event) == "collection":
        return [event.facts["reference"]]
    return []


def fold_payment(row: Row | None, event: StoredEvent) -> tuple[Row, list[Discrepancy]]:
    facts = _facts(event)
    customer = facts.get("customer") or {}
    invoice = facts.get("invoice") or {}
    descriptive = {
        "transaction_id": facts.get("transaction_id"),
        "customer_reference": facts.get("customer_reference"),
        "phone_number": customer.get("phone_number"),
        "mno": customer.get("mno"),
        "invoice_no": invoice.get("invoice_no"),
    }
    new, found = _fold_money(row, event, kind="collection",
                             rank=_rank(PAYMENT_RANK_BY_OUTCOME, event), descriptive=descriptive)
    # a refund the invoice fold cannot key (no block, or one without its number, or a
    # recovered one without the provider's time), or whose block gives no amount: the
    # invoice was never told. A recovered
    # refund kept before recoveries carried the record's block (no ``invoice`` in its
    # facts) folds as it did, without. The finding stays open for a person even when a
    # later copy of the refund (its late webhook) carries the block: which refund told the
    # invoice of what cannot be read from flags that outlive the refund they were about
    # (a first part refund with its block, a second without, read as told)
    if (facts.get("outcome") == "refunded" and not _refund_tells_invoice(event)
            and (event.event_type != RECOVERED_EVENT or "invoice" in facts)):
        new["evidence"] = {**new["evidence"], BLOCKLESS_REFUND: True}
    unlinked = _refund_unlinked(new)
    if unlinked is not None and (row is None or _refund_unlinked(row) is None):
        found.append(unlinked)  # the invoice's finding: the payment itself is consistent
    return new, found


# where ``evidence`` notes that a refund said nothing of an invoice
BLOCKLESS_REFUND = "blockless_refund"


def _refund_tells_invoice(event: StoredEvent) -> bool:
    """Whether a refund tells its invoice of the money that went back: a block the invoice
    fold keys (:func:`_payment_block`) that gives the amount paid or due after it. A block
    that only names the invoice (``{"invoiceNo": ...}``) left it paid and settled with no
    finding, where a refund with no block at all was flagged."""
    block = _payment_block(event)
    return block is not None and (block.get("amount_paid") is not None
                                  or block.get("amount_due") is not None)


def _refund_unlinked(row: Row) -> Discrepancy | None:
    """The finding for a payment against an invoice refunded by an event that carried no
    invoice block: the invoice was never told, so it still shows the money as received
    (and may say settled). Named by the payment, so every arrival order finds it once."""
    number = row.get("invoice_no")
    if not number or not (row.get("evidence") or {}).get(BLOCKLESS_REFUND):
        return None
    return Discrepancy(
        kind="refunded_invoice_payment", subject="invoice", reference=number,
        detail=f"payment {row['reference']} against invoice {number} was refunded by an "
               f"event that did not update the invoice; the invoice still counts that "
               f"money as received",
        amount_at_risk=row.get("amount") or None,
        evidence=(f"payment:{row['reference']}",))


# -- payouts ------------------------------------------------------------------------------

def payout_keys(event: StoredEvent) -> list[str]:
    if event.event_type in PAYOUT_RANK or _recovered_subject(event) == "payout":
        return [event.facts["reference"]]
    return []


def fold_payout(row: Row | None, event: StoredEvent) -> tuple[Row, list[Discrepancy]]:
    facts = _facts(event)
    descriptive = {"transaction_id": facts.get("transaction_id"),
                   "customer_reference": facts.get("customer_reference")}
    new, found = _fold_money(row, event, kind="payout", rank=_rank(PAYOUT_RANK_BY_OUTCOME, event),
                             descriptive=descriptive)
    # the provider refunds a failed payout's balance to the wallet by itself
    new["refunded_to_wallet"] = new["outcome"] == "failure"
    return new, found


# -- SMS ----------------------------------------------------------------------------------

def sms_keys(event: StoredEvent) -> list[str]:
    return [event.facts["reference"]] if event.event_type in SMS_RANK else []


def fold_sms(row: Row | None, event: StoredEvent) -> tuple[Row, list[Discrepancy]]:
    facts = _facts(event)
    # the code decides over the event name, as for payments
    status = "delivered" if facts.get("outcome") == "success" else "failed"
    rank = SMS_RANK[f"sms.{status}"]
    key = _event_key(event, rank)
    candidate = {"message_id": facts["reference"], "status": status, "code": facts.get("code"),
                 "updated_at": event.occurred_at}
    descriptive = {"recipient": facts.get("customer_reference")}
    found: list[Discrepancy] = []
    if facts.get("code_event_conflict"):
        found.append(_code_contradiction("sms", event, status, None))
    if row is None:
        values, provenance = merge_descriptive({}, {}, descriptive, key)
        return {**candidate, **values, "winner": key_to_json(key), "provenance": provenance,
                "statuses": [status], "conflicted": bool(found), "event_count": 1,
                "last_position": event.position}, found
    statuses = sorted(set(row["statuses"]) | {status})
    if len(statuses) == 2 and len(row["statuses"]) == 1:  # delivered and failed, first time
        found.append(Discrepancy(
            kind="conflicting_events", subject="sms", reference=facts["reference"],
            detail="both delivered and failed were reported; kept delivered",
            amount_at_risk=None, evidence=("status:delivered", "status:failed")))
    values, provenance = merge_descriptive({"recipient": row.get("recipient")}, row["provenance"],
                                           descriptive, key)
    base = candidate if key > key_from_json(row["winner"]) else {k: row[k] for k in candidate}
    return {**base, **values, "winner": key_to_json(max(key, key_from_json(row["winner"]))),
            "provenance": provenance, "statuses": statuses,
            "conflicted": row["conflicted"] or bool(found),
            "event_count": row["event_count"] + 1,
            "last_position": max(row["last_position"], event.position)}, found


# -- invoices -----------------------------------------------------------------------------

def invoice_keys(event: StoredEvent) -> list[str]:
    if event.event_type.startswith("invoice."):
        invoice = event.facts.get("invoice")
        number = (invoice or {}).get("invoice_no") or event.facts["reference"]
        return [number]
    block = _payment_block(event)
    return [block["invoice_no"]] if block is not None else []


def _payment_block(event: StoredEvent) -> dict[str, Any] | None:
    """The invoice block of a part payment against an invoice, or of its refund, delivered
    or recovered from the provider's record: money moved, and the block is the invoice
    after it; else None. The code decides here as everywhere, so a payment.confirmed
    carrying 91055 moved no money and never touches the invoice. A recovered one counts
    only with the provider's time, without which it has no place among its invoice's
    events (its refund is then flagged as one without a block)."""
    if event.event_type not in PAYMENT_RANK and not (
            _recovered_subject(event) == "collection" and _recovered_at(event) is not None):
        return None
    block = event.facts.get("invoice")
    if (isinstance(block, dict) and block.get("invoice_no")
            and event.facts.get("outcome") in ("success", "refunded")):
        return block
    return None


def _parse_date(text: str | None) -> date | None:
    if not text:
        return None
    try:
        return date.fromisoformat(text)
    except ValueError:
        return None


def _parse_instant(text: str | None) -> datetime | None:
    """An ISO 8601 instant with its offset, or None: also one outside what every reader of
    the projections can hold (a ``0001-01-01T00:00:00+14:00`` is in year 0 in UTC)."""
    if not text:
        return None
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None and storable_instant(parsed) else None


def invoice_status(*, cancelled: bool, amount_paid: Decimal | None,
                   amount_due: Decimal | None) -> str:
    if cancelled:
        return "cancelled"
    if amount_due is not None and amount_due == 0:
        return "paid"
    if amount_paid is not None and amount_paid > 0:
        return "partially_paid"
    return "open"


# what an invoice row takes from its events, each field from the latest event that carries
# it; ``last_event`` (with ``updated_at``) from the latest event of all
INVOICE_FIELDS = ("amount_paid", "amount_due", "total", "currency", "due_date", "paid_date",
                  "payment_reference", "last_event")


# A payment the provider's record told of (``reconcile.recovered``) takes its place among
# its invoice's events by the record's time, like its webhook, so it moves the invoice
# exactly when it is the latest word and never overrides a later event. Its rank is below a
# delivered payment's, so the webhook itself, should it come late in the same second with
# the same money, is the word kept (a webhook confirms or overrides a recovered state). A
# fraction, so the ranks stored marks hold keep their meaning.
RECOVERED_INVOICE_RANK = 0.5


def _provider_time(event: StoredEvent) -> datetime | None:
    """When the provider says the event happened: a recovered event's is its record's."""
    return _recovered_at(event) if event.event_type == RECOVERED_EVENT else event.occurred_at


def _invoice_order(event: StoredEvent, paid: Decimal | None) -> list[Any]:
    """An invoice event's place among its invoice's: an ``invoice.created`` before every
    other event (:data:`CREATED_RANK`; compared by :func:`_block_newer`), then by the
    provider's time, then a refund after everything else in its second (it can only follow
    the payment it refunds, and by money received it sorted first, leaving a refunded
    invoice paid), then by money received (which only a refund takes back: among refunds,
    the one leaving the least is the later), then rank, then dedupe key, then position."""
    recovered = event.event_type == RECOVERED_EVENT
    refund = int((event.event_type in PAYMENT_RANK or recovered)
                 and event.facts.get("outcome") == "refunded")
    received = paid if paid is not None else Decimal(-1)
    when = _provider_time(event)
    rank = (RECOVERED_INVOICE_RANK if recovered
            else INVOICE_RANK.get(event.event_type, INVOICE_RANK["payment.confirmed"]))
    return [when.timestamp() if when else 0.0, refund,
            str(received.copy_negate() if refund else received), rank,  # exact
            tiebreak(event.dedupe_key), event.position]


def _current_mark(mark: list[Any]) -> list[Any] | None:
    """A mark in the current shape (time, refund, money received, rank, dedupe key,
    position). Rows folded before kept marks without the refund (taken as none) and, before
    that, without the dedupe key (ranking below every tie); None for a rank-first mark of
    an older shape still, which any event may replace (as ``hookledger rebuild`` would)."""
    if len(mark) == 6 and isinstance(mark[2], str):
        return list(mark)
    if len(mark) in (4, 5) and isinstance(mark[1], str):
        keyed = mark if len(mark) == 5 else [*mark[:3], OLD_TIEBREAK, mark[3]]
        return [keyed[0], 0, *keyed[1:]]
    return None


def amount_source(mark: Any) -> tuple[int, bool] | None:
    """Where an invoice row's ``amount_paid`` came from, by its mark: the event's position,
    and whether that event was a payment bringing money in (not a refund, not one of the
    invoice's own events; a mark of an older shape, which does not tell a refund, never
    is); None for no mark of a known shape."""
    current = _current_mark(mark) if isinstance(mark, list) else None
    if current is None:
        return None
    paid_in = (len(mark) == 6 and current[1] == 0
               and current[3] in (INVOICE_RANK["payment.confirmed"], RECOVERED_INVOICE_RANK))
    return int(current[-1]), paid_in


def _invoice_values(event: StoredEvent, block: dict[str, Any]) -> dict[str, Any]:
    """What this event says about its invoice; None where it says nothing."""
    total = None
    if event.event_type.startswith("invoice."):  # a part payment's block is not the
        total = decimal_or_none(block.get("total"))  # invoice's word on its total
        if total is None:
            total = decimal_or_none(event.facts.get("amount"))  # invoice events: the TOTAL
    return {
        "amount_paid": decimal_or_none(block.get("amount_paid")),
        "amount_due": decimal_or_none(block.get("amount_due")),
        "total": total,
        "currency": block.get("currency"),
        "due_date": _parse_date(block.get("due_date")),
        "paid_date": _parse_instant(block.get("paid_date")),
        "payment_reference": block.get("payment_reference"),
        "last_event": event.facts["event"],
    }


def _marks_of(state: Row) -> dict[str, Any]:
    """The row's per-field marks. A row folded before each field kept its own took its
    amounts and ``last_event`` from the block under ``block_key``: that is their mark, set
    here before ``block_key`` moves on (read later, it would be a newer block's, one that
    may not give the field, and an older event that does would be refused)."""
    marks = dict(state["provenance"])
    if state.get("block_key"):
        for name in ("amount_paid", "amount_due", "last_event"):
            if name not in marks and state.get(name) is not None:
                marks[name] = list(state["block_key"])
    return marks


def _held_mark(marks: dict[str, Any], name: str) -> list[Any] | None:
    """The order of the event a field's value came from; None when any event may replace
    it: none yet, or a rank-first mark of the shape rows kept before (the next event
    giving the field replaces it, as ``hookledger rebuild`` would)."""
    held = marks.get(name)
    return None if held is None else _current_mark(held)


CANCELLED_WORDS = frozenset({"CANCELLED", "CANCELED"})


def _resaved_cancelled(event: StoredEvent) -> bool:
    """An ``invoice.updated`` whose status word says the invoice is cancelled: the re-save
    of a cancelled invoice, the only word of it left when ``invoice.cancelled`` (fired
    once, never sent again) was lost. The word is the invoice's status, which the spec
    names; no amount could say it instead."""
    if event.event_type != "invoice.updated":
        return False
    word = event.facts.get("status")
    return isinstance(word, str) and word.strip().upper() in CANCELLED_WORDS


def cancelled_with_money(number: str, received: Decimal) -> Discrepancy:
    """The finding that invoice ``number`` is cancelled with ``received`` on it: one per
    amount (its key names the amount in one spelling), whoever finds it, the projector
    from a cancellation's block or the reconcile pass from the invoice's row."""
    spelled = _amount_text(received)
    return Discrepancy(
        kind="cancelled_invoice_paid", subject="invoice", reference=number,
        detail=f"invoice {number} is cancelled with {spelled} received: refund the "
               f"customer or reinstate the invoice",
        amount_at_risk=received, evidence=(f"received:{spelled}",))


def fold_invoice(row: Row | None, event: StoredEvent) -> tuple[Row, list[Discrepancy]]:
    """Each field from the latest event that gives it; settled exactly when amount_due is 0.

    "Latest" is :func:`_invoice_order`, per field, so the row depends on the set of events
    and not on the order they arrived in, even when a block leaves a field out: an invoice
    re-saved after ``invoice.paid`` with a larger total shows the new total beside the new
    amount due, and its new due date and control number. ``amount`` on invoice events is
    the TOTAL and stands in for a block without one; it is never money received.
    """
    facts = event.facts
    block = facts.get("invoice") or {}
    number = invoice_keys(event)[0]
    values = _invoice_values(event, block)
    order = _invoice_order(event, values["amount_paid"])
    found: list[Discrepancy] = []
    state = dict(row) if row is not None else {
        "invoice_no": number, "total": None, "amount_paid": None, "amount_due": None,
        "currency": None, "due_date": None, "paid_date": None, "payment_reference": None,
        "cancelled": False, "paid_event": False, "block_key": None, "provenance": {},
        "event_count": 0, "last_position": 0, "updated_at": None, "last_event": None,
        "conflicted": False}
    marks = _marks_of(state)
    for name in INVOICE_FIELDS:
        value = values[name]
        if value is None:
            continue
        held = _held_mark(marks, name)
        if held is None or _block_newer(order, held):
            state[name] = value
            marks[name] = order
            if name == "amount_due":  # as reported (its spelling too): the row may show
                marks[DUE_AS_REPORTED] = format(value, "f")  # it unknown (below)
            if name == "last_event":
                state["updated_at"] = _provider_time(event)
    if block and (state["block_key"] is None or _block_newer(order, state["block_key"])):
        state["block_key"] = order  # the latest block's order (kept for older readers)
    state["provenance"] = marks
    cancelled_now = event.event_type == "invoice.cancelled" or _resaved_cancelled(event)
    if cancelled_now:
        state["cancelled"] = True
    if event.event_type == "invoice.paid":
        state["paid_event"] = True
        due = values["amount_due"]
        if due is None or due != 0:
            found.append(Discrepancy(
                kind="unsettled_paid_invoice", subject="invoice", reference=number,
                detail="invoice.paid arrived "
                       + ("without amountDue" if due is None
                          else f"with amountDue {format(due, 'f')}")  # never 1E-7
                       + "; not settled",
                amount_at_risk=due, evidence=(event.dedupe_key,)))
            state["conflicted"] = True
    if event.event_type.startswith("invoice.") and facts.get("code_event_conflict"):
        # the invoice is read from its block whatever the code says (a refund's code on
        # invoice.paid, a failure's): the code's other word is for a person, as a
        # payment's or an SMS's is, not only a flag in the event's facts
        found.append(_code_contradiction("invoice", event, facts["event"],
                                         values["amount_paid"] or None, reference=number))
        state["conflicted"] = True
    # its own name: ``held`` above is a field's mark, this is money
    if cancelled_now and (received := values["amount_paid"]) is not None and received > 0:
        # the event's own word (cancelled, with this much received), not the row's, so the
        # findings are the same whatever order the events arrive in; money received after
        # the cancellation is the row's word, which the reconcile pass reads
        found.append(cancelled_with_money(number, received))
    state["amount_due"] = _amount_due_now(state, marks)
    state["settled"] = state["amount_due"] is not None and state["amount_due"] == 0
    state["status"] = invoice_status(cancelled=state["cancelled"],
                                     amount_paid=state["amount_paid"],
                                     amount_due=state["amount_due"])
    state["event_count"] += 1
    state["last_position"] = max(state["last_position"], event.position)
    return state, found


# the amount due as last reported, kept beside the marks: the row shows it unknown while
# it is outdated (:func:`_amount_due_now`), and a later word on the amounts may make it
# current again
DUE_AS_REPORTED = "amount_due_reported"


def _amount_due_now(state: Row, marks: dict[str, Any]) -> Decimal | None:
    """The amount due as last reported, or None (unknown) when it is outdated: a later
    event gave a total or an amount paid that the reported due does not fit (total less
    paid). An invoice paid in full (due 0) and re-saved with a larger total by a block that
    leaves ``amountDue`` out still showed due 0 and settled, with money owed. The due and
    the amounts of one event are the provider's word together (a write-off may leave
    nothing due with less paid than the total): only a due older than them is doubted."""
    reported = marks.get(DUE_AS_REPORTED)
    if not isinstance(reported, str) and state["amount_due"] is not None:
        # a row folded before the reported due was kept apart shows the reported one: kept
        # now, before it may be shown unknown, so that a later event can bring it back
        marks[DUE_AS_REPORTED] = reported = format(state["amount_due"], "f")
    due = Decimal(reported) if isinstance(reported, str) else None
    total, paid = state["total"], state["amount_paid"]
    due_mark = _held_mark(marks, "amount_due")
    if due is None or total is None or paid is None or due_mark is None \
            or difference(total, paid) == due:  # exactly: 28 digits rounded it onto due
        return due
    for name in ("total", "amount_paid"):
        mark = _held_mark(marks, name)
        if mark is not None and _block_newer(mark, due_mark):
            return None
    return due


def _block_newer(candidate: list[Any], held: list[Any]) -> bool:
    """Whether the event of order ``candidate`` comes after the one ``held`` marks, which
    may be of a shape rows kept before (:func:`_current_mark`)."""
    current = _current_mark(held)
    if current is None:
        return True

    def comparable(mark: list[Any]) -> tuple[Any, ...]:
        # not created first: an invoice.created never outranks another event of its
        # invoice, whatever its time; among invoice.created the rest of the order decides
        return (mark[3] != CREATED_RANK, mark[0], mark[1], Decimal(mark[2]), *mark[3:])

    return comparable(candidate) > comparable(current)


