"""Instants every reader can hold: refused where they enter, so no read of a row fails later.

PostgreSQL stores a ``timestamptz`` in 1 BC, and psycopg cannot read it back: one such
delivery once made every projector batch fail, retried for ever, with every view frozen.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import psycopg
import pytest

from ingest.general_body import MALFORMED_EVENT_TYPE
from ledger.instants import EARLIEST, LATEST, storable_instant
from projections.projector import catch_up, connect
from reconcile.errors import ExpectationInvalid
from reconcile.expectations import parse_expectation
from reconcile.findings import provider_time
from tests.projection_events import EAT, kept_event
from tests.test_projector import append_all


def test_the_range_and_its_ends() -> None:
    assert storable_instant(EARLIEST) and not storable_instant(EARLIEST - timedelta(seconds=1))
    assert storable_instant(LATEST - timedelta(seconds=1)) and not storable_instant(LATEST)
    # past datetime's own range once moved to UTC: refused, not raised
    assert not storable_instant(datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=3))))
    assert not storable_instant(datetime(9999, 12, 31, 23, tzinfo=timezone(-timedelta(hours=5))))
    assert storable_instant(datetime(2026, 11, 25, tzinfo=EAT))


@pytest.mark.parametrize("raw", ["00010101000000", "18991231235959", "99991231235959"])
def test_a_provider_timestamp_outside_the_range_is_a_field_that_cannot_be_read(raw: str) -> None:
    event = kept_event("payment.confirmed", 91000, reference="ODD", amount=5000, timestamp=raw)
    assert event.event_type == MALFORMED_EVENT_TYPE
    assert event.facts["reason"] == "invalid_field" and "timestamp" in event.facts["detail"]
    assert event.occurred_at is None


def test_the_ends_of_the_range_still_read() -> None:
    for raw in ("19000101030000", "99971231235959"):
        event = kept_event("payment.confirmed", 91000, reference="EDGE", timestamp=raw)
        assert event.event_type == "payment.confirmed" and event.occurred_at is not None


def test_a_provider_record_time_outside_the_range_is_no_time() -> None:
    assert provider_time("00010101000000", EAT) is None
    assert provider_time("99991231235959", ZoneInfo("America/New_York")) is None
    assert provider_time("20261122083000", EAT) == datetime(2026, 11, 22, 5, 30, tzinfo=UTC)


def test_a_provider_record_time_in_other_scripts_digits_is_no_time() -> None:
    """As a webhook's is malformed: strptime reads Arabic-Indic digits as a time."""
    assert provider_time("\u0662\u0660\u0662\u0666" + "1122083000", EAT) is None


@pytest.mark.parametrize("raw", ["0001-01-01T00:00:00+14:00", "9999-12-31T23:00:00-05:00",
                                 "1066-10-14T09:00:00+00:00"])
def test_an_expectation_initiated_outside_the_range_is_refused_by_name(raw: str) -> None:
    data = {"reference": "X", "kind": "collection", "amount": "1", "initiated_at": raw}
    with pytest.raises(ExpectationInvalid, match="initiated_at"):
        parse_expectation(data, now=datetime.now(UTC))


@pytest.mark.anyio
async def test_a_delivery_stamped_in_year_one_does_not_stall_the_projector(db_url: str) -> None:
    """Once stored with its time, it failed every batch's read; now it is kept as malformed,
    reported, and the payment after it is projected."""
    await append_all(db_url, [
        kept_event("payment.confirmed", 91000, reference="ODD", amount=5000,
                   timestamp="00010101000000"),
        kept_event("payment.confirmed", 91000, reference="NORMAL", amount=5000)])
    async with await connect(db_url) as conn:
        await asyncio.wait_for(catch_up(conn), 60)
    with psycopg.connect(db_url) as conn:
        assert conn.execute("SELECT reference FROM hookledger.payments").fetchall() == [
            ("NORMAL",)]
        assert conn.execute(
            "SELECT kind, reference FROM hookledger.discrepancies").fetchall() == [
            ("malformed_delivery", "ODD")]

