"""A kept-but-unreadable delivery is reported once, as ``malformed_delivery``."""

from __future__ import annotations

from projections.malformed import malformed_discrepancy
from tests.projection_events import kept_event, stored


def test_a_malformed_delivery_becomes_one_named_discrepancy() -> None:
    event = stored(kept_event("payout.confirmed", 93000, reference="PO-7", amount="12.50"))
    assert event.event_type == "general.malformed"
    found = malformed_discrepancy(event)
    assert found is not None
    assert (found.kind, found.subject, found.reference) == ("malformed_delivery", "payout",
                                                            "PO-7")
    assert found.amount_at_risk is None and found.evidence == (event.dedupe_key,)
    assert "payout.confirmed" in found.detail and "invalid_field" in found.detail
    assert f"position {event.position}" in found.detail
    # the same delivery read again (a rebuild) is the same finding
    assert malformed_discrepancy(event) == found


def test_well_formed_and_unrecognised_deliveries_are_no_finding() -> None:
    for name in ("payment.confirmed", "something.new"):
        event = stored(kept_event(name, 91000, reference="P-1"))
        assert event.event_type != "general.malformed"
        assert malformed_discrepancy(event) is None
