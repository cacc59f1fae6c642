"""What a pass finds when one payment is in its view twice. Pure.

A lost webhook is recovered under the reference asked about (an expectation's ``CASE-1``),
keeping the provider's own spelling of its record as ``provider_reference`` (``case-1``).
Should the webhook arrive after all, it comes under the provider's spelling, as a row of
its own: the same money is then in ``payments`` (or ``payouts``) twice, and the recovery's
``missing_webhook`` ("fulfil it") never closes, since no webhook arrives under ``CASE-1``.
Nothing but the recovery ties the two rows together, and no rule can merge them safely, so
a person is told once per pair.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from projections.folding import Discrepancy

KIND = "recorded_twice"
VIEW_OF_SUBJECT = {"collection": "payments", "payout": "payouts"}


@dataclass(frozen=True, slots=True)
class RecordedTwice:
    """A recovered row and the row webhooks brought under the provider's spelling."""

    subject: str  # collection or payout
    reference: str  # as asked about, and recovered under
    provider_reference: str  # as the provider spells it, and webhooks brought it
    amount: Decimal | None  # the webhook row's
    cause_position: int  # the webhook row's latest event
    agrees: bool = False  # the two rows show the same outcome
    open_missing: tuple[str, ...] = ()  # the recovery's missing_webhook, still open


def recorded_twice(pair: RecordedTwice) -> Discrepancy:
    """The finding for ``pair``, keyed by both spellings, so it is recorded once."""
    view = VIEW_OF_SUBJECT.get(pair.subject, pair.subject)
    return Discrepancy(
        KIND, pair.subject, pair.reference,
        f"{pair.subject} {pair.reference} was recovered from the provider's record of "
        f"{pair.provider_reference}, and webhooks have since brought {pair.provider_reference}"
        f": the same {pair.subject} is in {view} twice ({pair.reference} and "
        f"{pair.provider_reference}); count it and fulfil it once",
        pair.amount, (f"provider_reference:{pair.provider_reference}",))


def arrived_after_all(pair: RecordedTwice) -> list[tuple[str, str]]:
    """The recovery's open ``missing_webhook`` findings that the webhook under the
    provider's spelling settles, each with its reason: it arrived, and agrees (as a late
    webhook under the same spelling settles it). One that disagrees stays open."""
    if not pair.agrees:
        return []
    reason = (f"the late webhook arrived as {pair.provider_reference} and agrees "
              f"(see {KIND})")
    return [(i, reason) for i in pair.open_missing]
