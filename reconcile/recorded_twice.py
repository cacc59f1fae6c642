"""What a pass finds when one payment is in its view twice. Pure.

A lost webhook is recovered under the reference asked about (an expectation's ``CASE-1``),
keeping the provider's own spelling of its record as ``provider_reference`` (``case-1``).
Should the webhook arrive after all, it comes under the provider's spelling, as a row of
its own: the same money is then in ``payments`` (or ``payouts``) twice, and the recovery's
``missing_webhook`` ("fulfil it") never closes, since no webhook arrives under ``CASE-1``.
Nothing but the recovery ties the two rows together, and no rule can merge them safely, so
a person is told once per pair. A recovered row that a webhook of its own has since
confirmed is no longer the provider's record alone, and is not counted twice by this rule.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from projections.folding import Discrepancy
from reconcile.checks import settle

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
    outcome: str | None = None  # the webhook row's
    recovered: bool = False  # the webhook row's state is a recovered one all the same
    both_expected: bool = False  # the merchant registered both spellings
    # the recovery's missing_webhook findings still open: (id, facts)
    open_missing: tuple[tuple[str, Mapping[str, Any]], ...] = ()


def recorded_twice(pair: RecordedTwice) -> Discrepancy:
    """The finding for ``pair``, keyed by both spellings, so it is recorded once."""
    view = VIEW_OF_SUBJECT.get(pair.subject, pair.subject)
    ours, theirs = pair.reference, pair.provider_reference
    if pair.both_expected:  # two payments, or one registered twice: only a person knows
        detail = (f"{pair.subject} {ours} was recovered from the provider's record of "
                  f"{theirs}, which is registered as an expectation of its own and has "
                  f"webhooks of its own: either one {pair.subject} is in {view} twice, or "
                  f"{ours} was recovered from another {pair.subject}'s record; check both "
                  f"with the provider")
    else:
        detail = (f"{pair.subject} {ours} was recovered from the provider's record of "
                  f"{theirs}, and webhooks have since brought {theirs}: the same "
                  f"{pair.subject} is in {view} twice ({ours} and {theirs}); count it and "
                  f"fulfil it once")
    return Discrepancy(KIND, pair.subject, ours, detail, pair.amount,
                       (f"provider_reference:{theirs}",))


def arrived_after_all(pair: RecordedTwice) -> list[tuple[str, str]]:
    """The recovery's open ``missing_webhook`` findings that the webhook row under the
    provider's spelling settles, each with its reason: as a late webhook under the same
    spelling would (it agrees, or a later one moved it on). One it does not settle stays
    open, and so does every one when both spellings are registered (they may be two)."""
    if pair.both_expected:
        return []
    row = {"subject": pair.subject, "outcome": pair.outcome, "recovered": pair.recovered}
    settled = []
    for finding_id, facts in pair.open_missing:
        reason = settle("missing_webhook", facts, row)
        if reason is not None:
            settled.append((finding_id,
                            f"under {pair.provider_reference}: {reason} (see {KIND})"))
    return settled
