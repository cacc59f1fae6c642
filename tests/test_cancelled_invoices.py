"""A pass's reading of a cancelled invoice whose row shows money received (pure)."""

from __future__ import annotations

from decimal import Decimal

from hypothesis import given
from hypothesis import strategies as st

from projections.general_folds import cancelled_with_money
from reconcile.cancelled_invoices import Earlier, judge_cancelled


def key(amount: str) -> str:
    return cancelled_with_money("INV-1", Decimal(amount)).dedupe_key


def test_first_found_under_the_projectors_key_for_the_amount() -> None:
    verdict = judge_cancelled("INV-1", Decimal("20000.00"), [], set())
    assert verdict.found is not None and verdict.superseded == ()
    assert verdict.found.dedupe_key == key("20000")
    assert verdict.found.amount_at_risk == Decimal("20000.00")


def test_an_open_finding_at_the_amount_stands_and_supersedes_the_others() -> None:
    earlier = [Earlier("a", Decimal(20000), True, None, 5),
               Earlier("b", Decimal(15000), True, None, 6)]
    verdict = judge_cancelled("INV-1", Decimal("15000.0"), earlier, {key("20000"), key("15000")})
    assert (verdict.found, verdict.superseded) == (None, ("a",))


def test_a_part_refund_moves_the_finding_to_the_amount_held() -> None:
    earlier = [Earlier("a", Decimal(20000), True, None, 5)]
    verdict = judge_cancelled("INV-1", Decimal(15000), earlier, {key("20000")})
    assert verdict.found is not None and verdict.found.amount_at_risk == Decimal(15000)
    assert verdict.superseded == ("a",)


def test_money_paid_again_after_a_refund_is_a_new_finding() -> None:
    """The first finding at 20000 was settled by the refund; the same amount paid again
    has that finding's key, already in the ledger: found under a key of its own."""
    earlier = [Earlier("a", Decimal(20000), False, "reconciler", 9)]
    verdict = judge_cancelled("INV-1", Decimal(20000), earlier, {key("20000")})
    assert verdict.found is not None and verdict.found.dedupe_key != key("20000")
    assert verdict.found.amount_at_risk == Decimal(20000)


@given(accepted=st.integers(1, 10**6), now=st.integers(1, 10**6),
       paid_in_at=st.none() | st.integers(1, 20))
def test_a_person_accepting_an_amount_covers_it_and_less_until_money_is_paid_in_again(
        accepted: int, now: int, paid_in_at: int | None) -> None:
    """Resolved by a person at position 10: an amount within it that came from before
    (or from a refund since: ``paid_in_at`` None) stays accepted; money paid in after it
    (refunded in full, then paid again) is raised whatever the amount."""
    earlier = [Earlier("a", Decimal(accepted), False, "admin", 10),
               Earlier("b", Decimal(10**7), True, None, 3)]
    verdict = judge_cancelled("INV-1", Decimal(now), earlier, {key(str(accepted))},
                              paid_in_at)
    covered = now <= accepted and (paid_in_at is None or paid_in_at < 10)
    assert (verdict.found is None) == covered
    assert verdict.superseded == ("b",)
