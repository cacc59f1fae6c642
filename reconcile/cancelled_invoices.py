"""What a pass finds in a cancelled invoice's row that shows money received. Pure.

The projector finds ``cancelled_invoice_paid`` from a cancellation's own block, so that its
findings do not depend on the order events arrive in; money received after the cancellation
(a customer paying with the standing control number) only the row shows. A pass keeps one
open finding per invoice, at the amount the row shows now, under the key the projector
would use for that amount, so it is recorded once whoever finds it first.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from decimal import Decimal

from projections.folding import Discrepancy
from projections.general_folds import cancelled_with_money

PERSON = "admin"  # the source of ``hookledger resolve``'s resolutions


@dataclass(frozen=True, slots=True)
class Earlier:
    """A ``cancelled_invoice_paid`` finding already recorded for the invoice."""

    id: str
    amount: Decimal | None
    open: bool
    resolved_by: str | None
    position: int  # of its latest event: for a resolved one, the resolution's


@dataclass(frozen=True, slots=True)
class InvoiceVerdict:
    found: Discrepancy | None  # to record
    superseded: tuple[str, ...]  # open findings at another amount, to resolve


def judge_cancelled(number: str, received: Decimal, earlier: Sequence[Earlier],
                    recorded: Collection[str], paid_in_at: int | None = None
                    ) -> InvoiceVerdict:
    """What to record for invoice ``number``, cancelled with ``received`` on it.

    * a finding open at that amount stands, and open ones at other amounts (the money
      the invoice held before a part refund or a later payment) are superseded by it;
    * a person who resolved a finding at that amount or more accepted the money held
      (kept as credit, refunded by other means): nothing is raised while the amount is
      within what they accepted and came from before their resolution or from a refund
      since (``paid_in_at``: the position of the payment the amount came from, if it
      did); money paid in after it (the invoice refunded in full, then paid again) is news;
    * otherwise it is found, under the projector's key for the amount, or, when that key
      was recorded and closed since (the money went back and came again), under a key of
      its own, so a second payment after a refund is not lost behind the first.
    ``recorded`` holds which of the projector's keys the ledger has.
    """
    def at_received(e: Earlier) -> bool:
        return e.amount is not None and e.amount == received

    still_open = [e for e in earlier if e.open]
    others = tuple(e.id for e in still_open if not at_received(e))
    if any(at_received(e) for e in still_open):
        return InvoiceVerdict(None, others)
    if any(not e.open and e.resolved_by == PERSON and e.amount is not None
           and e.amount >= received and (paid_in_at is None or paid_in_at < e.position)
           for e in earlier):
        return InvoiceVerdict(None, others)
    found = cancelled_with_money(number, received)
    if found.dedupe_key in recorded:
        found = dataclasses.replace(found, evidence=(*found.evidence, f"again:{len(earlier)}"))
    return InvoiceVerdict(found, others)
