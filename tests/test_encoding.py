"""The database's encoding: a delivery is kept only if the database can hold its text."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner

from hookledger import migrate
from hookledger.cli import main
from hookledger.database import database
from hookledger.encoding import database_encoding_concern, encoding_concern
from hookledger.settings import load_settings
from ledger.store import append_in
from tests.dbutil import create_database, drop_database, unique_name, with_database
from tests.projection_events import new_event


@pytest.mark.parametrize(("encoding", "concern"), [
    ("UTF8", False),
    ("utf8", False),
    ("UTF-8", False),
    ("LATIN1", True),
    ("WIN1252", True),
    ("SQL_ASCII", True),
])
def test_only_utf8_is_free_of_concern(encoding: str, concern: bool) -> None:
    found = encoding_concern(encoding)
    assert (found is not None) is concern
    if found is not None:
        assert repr(encoding) in found and "ENCODING 'UTF8'" in found


def _database_with_encoding(admin_url: str, name: str, encoding: str) -> str:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE \"{name}\" TEMPLATE template0 LOCALE 'C' "
                     f"ENCODING '{encoding}'")
    return with_database(admin_url, name)


@pytest.fixture(params=["LATIN1", "SQL_ASCII"])
def encoded_db(request: pytest.FixtureRequest, pg_admin_url: str) -> Iterator[tuple[str, str]]:
    name = unique_name("hookledger_encoding")
    url = _database_with_encoding(pg_admin_url, name, request.param)
    try:
        yield url, request.param
    finally:
        drop_database(pg_admin_url, name)


def test_a_database_not_in_utf8_is_a_concern_naming_its_encoding(
        encoded_db: tuple[str, str]) -> None:
    """SQL_ASCII included, whose text reaches psycopg as bytes, not str."""
    url, encoding = encoded_db
    with psycopg.connect(url) as conn:
        found = database_encoding_concern(conn)
    assert found is not None and repr(encoding) in found


def test_a_latin1_database_cannot_hold_every_delivery(
        pg_admin_url: str, latin1_db: str) -> None:
    """What the warning is for: an event with a character LATIN1 has not is refused by the
    database, so such a delivery is never kept."""
    async def append(reference: str) -> None:
        async with await psycopg.AsyncConnection.connect(latin1_db, autocommit=True) as conn:
            async with conn.transaction():
                await append_in(conn, [new_event("payment.confirmed", 91000,
                                                 reference=reference, amount=1000)])

    migrate.upgrade(latin1_db)
    asyncio.run(append("R-é"))  # one LATIN1 has
    with pytest.raises(psycopg.errors.UntranslatableCharacter):
        asyncio.run(append("R-€"))


@pytest.fixture
def latin1_db(pg_admin_url: str) -> Iterator[str]:
    name = unique_name("hookledger_latin1")
    try:
        yield _database_with_encoding(pg_admin_url, name, "LATIN1")
    finally:
        drop_database(pg_admin_url, name)


def _migrated(url: str, home: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """What ``hookledger migrate`` against ``url`` said, once it succeeded."""
    monkeypatch.setenv("HOOKLEDGER_DATABASE_URL", url)
    monkeypatch.setenv("HOOKLEDGER_HOME", str(home))
    result = CliRunner().invoke(main, ["migrate"])
    assert result.exit_code == 0, result.output
    assert "migrations applied" in result.output
    return result.output


def test_migrate_warns_once_of_a_latin1_database_and_still_migrates(
        latin1_db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    output = _migrated(latin1_db, tmp_path, monkeypatch)
    assert output.count("database.encoding_not_utf8") == 1 and "'LATIN1'" in output


def test_migrate_says_nothing_of_a_utf8_database(
        pg_admin_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    name = unique_name("hookledger_utf8")
    url = create_database(pg_admin_url, name, locale="C")  # ENCODING 'UTF8'
    try:
        with psycopg.connect(url) as conn:
            assert database_encoding_concern(conn) is None
        assert "encoding" not in _migrated(url, tmp_path, monkeypatch)
    finally:
        drop_database(pg_admin_url, name)


def test_a_sql_ascii_database_is_migrated_warned_of_and_read_as_text(
        pg_admin_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """hookledger's sessions say UTF-8 where the database names no encoding: its text came
    back as bytes, and every command stopped with a TypeError before any warning."""
    name = unique_name("hookledger_ascii")
    url = _database_with_encoding(pg_admin_url, name, "SQL_ASCII")
    try:
        output = _migrated(url, tmp_path, monkeypatch)
        assert output.count("database.encoding_not_utf8") == 1 and "'SQL_ASCII'" in output
        with database(load_settings()) as speaking, psycopg.connect(speaking) as conn:
            assert conn.execute("SELECT 'f\u00fcnf \u20ac'::text").fetchone() == (
                "f\u00fcnf \u20ac",)
    finally:
        drop_database(pg_admin_url, name)
