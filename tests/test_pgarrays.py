"""Packed arrays reach PostgreSQL as the arrays psycopg's own lists would have been."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from uuid import UUID

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledger import pgarrays

pgarrays.register()

# text PostgreSQL can hold: no NUL, no lone surrogates
texts = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"))
offsets = st.integers(-14 * 60, 14 * 60).map(lambda m: timezone(timedelta(minutes=m)))
aware = st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30),
                     timezones=offsets)
lists = settings(max_examples=60, deadline=None,
                 suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def conn(pg_admin_url: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    with psycopg.connect(pg_admin_url, autocommit=True) as connection:
        connection.execute("SET TIME ZONE 'UTC'")
        yield connection


def round_trip(conn: psycopg.Connection[tuple[object, ...]], packed: bytes, sql_type: str
               ) -> list[object]:
    row = conn.execute(f"SELECT %b::{sql_type}[], pg_typeof(%b) = '{sql_type}[]'::regtype",
                       [packed, packed]).fetchone()
    assert row is not None and row[1] is True  # sent under the array's own type
    return list(row[0])  # type: ignore[call-overload]


@lists
@given(st.lists(st.none() | texts, max_size=20))
def test_text_arrays(conn: psycopg.Connection[tuple[object, ...]],
                     values: list[str | None]) -> None:
    assert round_trip(conn, pgarrays.text_array(values), "text") == values


@lists
@given(st.lists(st.none() | st.binary(max_size=300), max_size=20))
def test_bytea_arrays(conn: psycopg.Connection[tuple[object, ...]],
                      values: list[bytes | None]) -> None:
    assert round_trip(conn, pgarrays.bytea_array(values), "bytea") == values


@lists
@given(st.lists(st.none() | aware, max_size=20))
def test_timestamptz_arrays_keep_the_instant(conn: psycopg.Connection[tuple[object, ...]],
                                             values: list[datetime | None]) -> None:
    back = round_trip(conn, pgarrays.timestamptz_array(values), "timestamptz")
    assert back == values  # aware datetimes compare as instants
    assert all(b is None or b.tzinfo is not None for b in back)


@lists
@given(st.lists(st.uuids(), max_size=20))
def test_uuid_arrays(conn: psycopg.Connection[tuple[object, ...]], values: list[UUID]) -> None:
    assert round_trip(conn, pgarrays.uuid_array([v.bytes for v in values]), "uuid") == values


def test_a_uuid_of_the_wrong_length_is_refused() -> None:
    with pytest.raises(ValueError, match="16 bytes"):
        pgarrays.uuid_array([b"\x00" * 15])


def test_a_naive_time_is_refused_rather_than_guessed() -> None:
    with pytest.raises(ValueError, match="naive"):
        pgarrays.timestamptz_array([datetime(2026, 1, 1, 12, 0)])


def test_an_empty_batch_is_an_empty_array(conn: psycopg.Connection[tuple[object, ...]]
                                          ) -> None:
    assert round_trip(conn, pgarrays.text_array([]), "text") == []
    assert pgarrays.timestamptz_array([datetime(2000, 1, 1, tzinfo=UTC)]).endswith(
        b"\x00" * 8)  # PostgreSQL's own epoch is instant zero
