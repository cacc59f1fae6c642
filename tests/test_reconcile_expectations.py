"""Expectations intake: POST /api/expectations (auth, validation, idempotency), the SQL
function and the view."""

from __future__ import annotations

import dataclasses
import logging
from decimal import Decimal

import httpx
import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reconcile.expectations import ExpectationInvalid, parse_amount
from tests.live import running_service

TOKEN = "admin-token-for-tests"


def test_the_expectations_api_authenticates_validates_and_is_idempotent(db_url: str) -> None:
    with running_service(db_url, admin_token=TOKEN) as base:
        url = f"{base}/api/expectations"
        auth = {"Authorization": f"Bearer {TOKEN}"}
        good = {"reference": "E-1", "kind": "collection", "amount": "1500.50",
                "initiated_at": "2026-11-22T08:00:00+03:00"}
        assert httpx.post(url, json=good).status_code == 401
        assert httpx.post(url, json=good, headers={"Authorization": "Bearer nope"}
                          ).status_code == 401
        first = httpx.post(url, json=good, headers=auth)
        again = httpx.post(url, json=good, headers=auth)
        assert (first.status_code, first.json()["created"]) == (201, True)
        assert (again.status_code, again.json()["created"]) == (200, False)
        assert first.json()["amount"] == "1500.50"
        other = httpx.post(url, json={**good, "amount": 99}, headers=auth)
        assert other.status_code == 409
        bad_bodies = [
            b"not json", b"[]", b'{"kind": "collection", "amount": 1}',
            b'{"reference": "E-2", "kind": "refund", "amount": 1}',
            b'{"reference": "E-2", "kind": "payout", "amount": 0}',
            b'{"reference": "E-2", "kind": "payout", "amount": "ten"}',
            b'{"reference": "E-2", "kind": "payout", "amount": true}',
            # past the places numeric holds: the insert failed, a 500 with a traceback
            b'{"reference": "E-2", "kind": "payout", "amount": "1e-20000"}',
            b'{"reference": "E-2", "kind": "payout", "amount": 1e-20000}',
            b'{"reference": "E-2", "kind": "payout", "amount": 1.5e-20000}',
            b'{"reference": "E-2", "kind": "payout", "amount": 5, "initiated_at": "2026-11-22"}',
            b'{"reference": "E-2", "kind": "payout", "amount": 5, "extra": 1}',
            b'{"reference": "", "kind": "payout", "amount": 5}',
            # text the database cannot hold: a 500 with a traceback, before
            b'{"reference": "E\\u0000-2", "kind": "payout", "amount": 5}',
            b'{"reference": "E\\ud800-2", "kind": "payout", "amount": 5}',
        ]
        for raw in bad_bodies:
            answer = httpx.post(url, content=raw, headers=auth)
            assert answer.status_code == 400, raw
            assert TOKEN not in answer.text
        document = httpx.get(f"{base}/api/openapi.json").json()
        assert "post" in document["paths"]["/api/expectations"]
    with psycopg.connect(db_url) as conn:
        assert conn.execute("SELECT reference, kind, amount::text, resolved FROM "
                            "hookledger.expectations").fetchall() == [
            ("E-1", "collection", "1500.50", False)]


@pytest.mark.parametrize("raw", [
    b"[" * 5000,
    b'{"reference": "R", "kind": "collection", "amount": 1e99999999999999999999}'])
def test_a_body_the_json_reader_cannot_take_is_a_bad_request(db_url: str, raw: bytes) -> None:
    """Nested deeper than the JSON reader goes, a body raised RecursionError, and a number
    past what Decimal holds raised decimal.InvalidOperation: neither is a ValueError, and
    the answer was a 500 with a traceback in the log, not a 400."""
    with running_service(db_url, admin_token=TOKEN) as base:
        answer = httpx.post(f"{base}/api/expectations", content=raw,
                            headers={"Authorization": f"Bearer {TOKEN}"})
    assert answer.status_code == 400 and answer.json()["error"] == "bad_request"


def test_the_sql_function_registers_refuses_conflicts_and_bad_values(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        assert conn.execute("SELECT hookledger.expect('S-1', 'payout', 250)").fetchone() == (
            True,)
        assert conn.execute("SELECT hookledger.expect('S-1', 'payout', 250.00)").fetchone() == (
            False,)
        with pytest.raises(psycopg.errors.UniqueViolation):
            conn.execute("SELECT hookledger.expect('S-1', 'collection', 250)")
        for args in (("S-2", "refund", 1), ("S-2", "payout", -1), ("", "payout", 1)):
            with pytest.raises(psycopg.errors.InvalidParameterValue):
                conn.execute("SELECT hookledger.expect(%s, %s, %s)", args)
        assert conn.execute("SELECT count(*) FROM hookledger.expectations").fetchone() == (1,)


@pytest.mark.parametrize("initiated_at", ["0001-01-01 00:00+03", "1899-12-31 23:59:59+00",
                                          "9998-01-01 00:00+00", "infinity"])
def test_the_sql_function_refuses_an_instant_no_reader_can_hold(
        db_url: str, initiated_at: str) -> None:
    """The API and the command refused such an ``initiated_at``; the SQL function stored
    it, and every later read of the row in Python (a reconciliation pass) failed."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute("SELECT hookledger.expect('T-1', 'payout', 5, %s::timestamptz)",
                         (initiated_at,))
        assert conn.execute("SELECT hookledger.expect('T-1', 'payout', 5, "
                            "'1900-01-01 00:00+00')").fetchone() == (True,)
        assert conn.execute("SELECT count(*) FROM hookledger.expectations").fetchone() == (1,)


def test_a_registered_sms_is_pending_until_its_report_and_never_reconciled(db_url: str) -> None:
    """sms_messages shows a registered message pending; its operator report replaces it;
    one that never gets a report stays pending and is never a discrepancy."""
    from sandbox.runner import running_sandbox
    from tests.reconcile_helpers import CountingState, deliver, reconcile, rows

    with running_service(db_url, admin_token=TOKEN) as base:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        url = f"{base}/api/expectations"
        for body in ({"reference": "M-1", "kind": "sms"},
                     {"reference": "M-2", "kind": "sms", "amount": 0}):
            assert httpx.post(url, json=body, headers=auth).status_code == 201
        for bad in ({"reference": "M-3", "kind": "sms", "amount": 5},
                    {"reference": "M-3", "kind": "collection"},
                    {"reference": "M-3", "kind": "payout", "amount": 0}):
            assert httpx.post(url, json=bad, headers=auth).status_code == 400, bad
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("SELECT hookledger.expect('M-0', 'sms', 0, now() - interval '1 day')")
        with pytest.raises(psycopg.errors.InvalidParameterValue):
            conn.execute("SELECT hookledger.expect('M-9', 'sms', 1)")
    assert rows(db_url, "SELECT message_id, status, recipient FROM hookledger.sms_messages "
                        "ORDER BY 1") == [("M-0", "pending", None), ("M-1", "pending", None),
                                          ("M-2", "pending", None)]
    deliver(db_url, "sms.delivered", 94000, reference="M-1", amount=0,
            customer_reference="255700000001")
    deliver(db_url, "sms.failed", 94056, reference="M-2", amount=0,
            customer_reference="255700000002")
    assert rows(db_url, "SELECT message_id, status, recipient FROM hookledger.sms_messages "
                        "ORDER BY 1") == [("M-0", "pending", None),
                                          ("M-1", "delivered", "255700000001"),
                                          ("M-2", "failed", "255700000002")]
    assert rows(db_url, "SELECT reference, resolved, outcome FROM hookledger.expectations "
                        "ORDER BY 1") == [("M-0", False, None), ("M-1", True, "success"),
                                          ("M-2", True, "failure")]
    state = CountingState()
    with running_sandbox(state=state) as api:
        result = reconcile(db_url, api.url)
    assert state.asked == {} and result.checked == 0
    assert rows(db_url, "SELECT count(*) FROM hookledger.discrepancies") == [(0,)]


def test_a_repeat_registration_is_answered_with_what_was_kept(db_url: str) -> None:
    """A repeat is accepted (200) and changes nothing, so its answer shows the first
    registration's initiated_at: it once echoed the repeat's own (or the time of the
    repeat, when it gave none), a time that was never stored."""
    with running_service(db_url, admin_token=TOKEN) as base:
        url, auth = f"{base}/api/expectations", {"Authorization": f"Bearer {TOKEN}"}
        first = httpx.post(url, headers=auth, json={
            "reference": "E-9", "kind": "collection", "amount": "1500",
            "initiated_at": "2026-11-22T08:00:00+03:00"})
        assert first.status_code == 201
        for repeat in ({"initiated_at": "2026-11-23T09:00:00+03:00"}, {}):
            again = httpx.post(url, headers=auth, json={
                "reference": "E-9", "kind": "collection", "amount": "1500.00", **repeat})
            assert again.status_code == 200
            assert again.json()["initiated_at"] == "2026-11-22T05:00:00+00:00"
            assert again.json()["amount"] == "1500"
    with psycopg.connect(db_url) as conn:
        assert conn.execute("SELECT initiated_at = '2026-11-22T05:00:00Z' FROM "
                            "hookledger.expectations WHERE reference = 'E-9'").fetchone() == (
            True,)


def test_a_client_gone_mid_body_or_a_body_too_large_is_answered_never_an_error(
        db_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """The admin API read its body whole through Starlette: a caller hanging up mid-body
    was an unhandled ClientDisconnect (500, a traceback in the log), and a body of any
    size was read into memory before the 16 KiB check."""
    import socket
    import time

    with running_service(db_url, admin_token=TOKEN) as base:
        host, port = base.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall(b"POST /api/expectations HTTP/1.1\r\nHost: x\r\n"
                         + f"Authorization: Bearer {TOKEN}\r\n".encode()
                         + b"Content-Length: 500\r\n\r\n" + b'{"reference": "CUT')
            time.sleep(0.3)  # the body has started arriving when the caller goes
        time.sleep(0.5)
        huge = httpx.post(f"{base}/api/expectations", content=b"x" * (64 * 1024),
                          headers={"authorization": f"Bearer {TOKEN}"})
        assert huge.status_code == 413, huge.text
        fine = httpx.post(f"{base}/api/expectations", json={
            "reference": "AFTER-CUT", "kind": "collection", "amount": "10"},
            headers={"authorization": f"Bearer {TOKEN}"})
        assert fine.status_code == 201, fine.text
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], [
        r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


# an amount spelled as a caller may: exact decimals of any scale and exponent, in range and
# out of it, and text that is no number
amounts = st.one_of(
    st.decimals(min_value=Decimal("1e-100"), max_value=Decimal("999999999999999.99"),
                allow_nan=False, allow_infinity=False, places=None),
    st.decimals(allow_nan=True, allow_infinity=True),
    st.integers(-10, 10**16), st.text(max_size=12))


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(reference=st.text(max_size=520), kind=st.sampled_from(["collection", "payout"]),
       amount=amounts)
def test_any_reference_and_amount_is_kept_exactly_or_refused_as_invalid(
        db_url: str, reference: str, kind: str, amount: object) -> None:
    """Whatever a caller sends is refused as invalid, or kept digit for digit (never as a
    float): a repeat of the same amount in another spelling is the same registration, and
    any other amount is a conflict."""
    import asyncio
    from datetime import UTC, datetime

    from reconcile.expectations import (
        ExpectationConflict,
        ExpectationInvalid,
        parse_expectation,
        register,
        registered,
    )

    try:
        expectation = parse_expectation({"reference": reference, "kind": kind,
                                         "amount": amount}, now=datetime.now(UTC))
    except ExpectationInvalid:
        return
    assert expectation.reference == reference
    assert expectation.amount == Decimal(str(amount).strip()) and expectation.amount > 0
    exact = format(expectation.amount, "f")
    respelled = Decimal(exact + ("0" if "." in exact else ".0"))
    other = expectation.amount * 2

    async def go() -> None:
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
            await conn.execute("DELETE FROM hookledger_private.expectations")
            assert await register(conn, expectation) is True
            kept = await registered(conn, reference)
            assert kept is not None and (kept.reference, kept.kind) == (reference, kind)
            assert format(kept.amount, "f") == exact
            assert await register(conn, dataclasses.replace(expectation, amount=respelled)
                                  ) is False
            with pytest.raises(ExpectationConflict):
                await register(conn, dataclasses.replace(expectation, amount=other))

    asyncio.run(go())


@pytest.mark.parametrize("written", ["\u0661\u0662", "\uff11\uff12", "1_000", "12\u00a0"])
def test_an_amount_in_other_digits_or_with_underscores_is_refused(written: str) -> None:
    """Python's Decimal reads them (as 12 and 1000), the SQL function and a person would not."""
    with pytest.raises(ExpectationInvalid, match="digits 0-9"):
        parse_amount(written)


@pytest.mark.parametrize(("written", "amount"), [
    ("12", Decimal("12")), (" 1500.50 ", Decimal("1500.50")), ("1e3", Decimal("1E+3"))])
def test_an_amount_in_ascii_digits_is_read_exactly(written: str, amount: Decimal) -> None:
    assert parse_amount(written) == amount
