"""The rolling re-check of final payments: its per-pass allowance, and the slow re-asking of
successful collections that a lost payment.refunded would otherwise hide for ever."""

from __future__ import annotations

from tests.reconcile_helpers import CountingState, body, deliver, expect, reconcile, rows


def confirmed(db_url: str, state: CountingState, reference: str, amount: int = 10) -> None:
    """A collection confirmed by webhook, the provider's record agreeing."""
    state.record_general(body("payment.confirmed", 91000, reference=reference, amount=amount))
    deliver(db_url, "payment.confirmed", 91000, reference=reference, amount=amount)


def test_the_recheck_allowance_holds_for_the_whole_pass_not_for_each_chunk(
        db_url: str) -> None:
    """Six fresh confirmations, two re-checks a pass, chunks of two: a pass asks about two,
    and the next pass about the next two."""
    from sandbox.runner import running_sandbox

    state = CountingState()
    for i in range(6):
        confirmed(db_url, state, f"RC-{i}")
    with running_sandbox(state=state) as api:
        first = reconcile(db_url, api.url, recheck_limit=2, chunk_size=2)
        assert (first.checked, sum(state.asked.values())) == (2, 2)
        second = reconcile(db_url, api.url, recheck_limit=2, chunk_size=2)
    assert (second.checked, sum(state.asked.values())) == (2, 4)
    assert max(state.asked.values()) == 1
    assert rows(db_url, "SELECT count(*) FROM hookledger_private.reconcile_subjects") == [(4,)]


def test_subjects_due_anyway_do_not_use_up_the_recheck_allowance(db_url: str) -> None:
    """An overdue expectation is asked about whatever the allowance; the allowance (two) is
    for re-checks only, counted across chunks of one."""
    from sandbox.runner import running_sandbox

    state = CountingState()
    state.record_general(body("payment.confirmed", 91000, reference="EX-1", amount=30))
    expect(db_url, "EX-1", "collection", 30)
    for i in range(4):
        confirmed(db_url, state, f"RC-{i}")
    with running_sandbox(state=state) as api:
        result = reconcile(db_url, api.url, recheck_limit=2, chunk_size=1)
    assert result.checked == 3 and result.recovered == ["EX-1"]
    assert state.asked["EX-1"] == 1 and sum(state.asked.values()) == 3
