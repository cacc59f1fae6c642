"""Expectations intake: POST /api/expectations (auth, validation, idempotency), the SQL
function and the view."""

from __future__ import annotations

import httpx
import psycopg
import pytest

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
            b'{"reference": "E-2", "kind": "payout", "amount": 5, "initiated_at": "2026-11-22"}',
            b'{"reference": "E-2", "kind": "payout", "amount": 5, "extra": 1}',
            b'{"reference": "", "kind": "payout", "amount": 5}',
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
