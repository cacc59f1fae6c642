"""The database's collation: the dedupe index is only as sound as the order it compares by."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from click.testing import CliRunner

from hookledger.cli import main
from hookledger.collation import collation_concern, database_collation_concern
from tests.dbutil import create_database, drop_database, unique_name, with_database
from tests.relay import TcpRelay


@pytest.mark.parametrize(("collate", "provider", "locale", "concern"), [
    ("C", None, None, False),                  # PostgreSQL 13 and 14 name no provider
    ("POSIX", None, None, False),
    ("C", "c", None, False),
    ("en_US.UTF-8", "c", None, True),
    ("en_US.UTF-8", None, None, True),
    ("C.UTF-8", "c", None, True),              # still the C library's strcoll
    ("C", "i", "en-US", True),                 # ICU's order, whatever datcollate says
    ("en_US.UTF-8", "b", "C.UTF-8", False),    # builtin: code points, no library
])
def test_only_a_bytewise_collation_is_free_of_concern(
        collate: str, provider: str | None, locale: str | None, concern: bool) -> None:
    found = collation_concern(collate, provider, locale)
    assert (found is not None) is concern
    if found is not None:
        assert repr(locale if provider == "i" else collate) in found
        assert "LOCALE 'C'" in found


def test_an_icu_database_is_named_by_its_icu_locale() -> None:
    found = collation_concern("C", "i", "de-DE")
    assert found is not None and "'de-DE' (ICU's locale)" in found


def _database_with_locale(admin_url: str, name: str) -> str | None:
    """A new database with the first of the locales below the server accepts; None when it
    accepts none of them (a server whose operating system has no such locale)."""
    for locale in ("C.UTF-8", "C.utf8", "en_US.UTF-8", "en_US.utf8"):
        try:
            create_database(admin_url, name, locale=locale)
        except psycopg.Error:
            continue
        return locale
    return None


@pytest.fixture
def locale_db(pg_admin_url: str) -> Iterator[tuple[str, str]]:
    name = unique_name("hookledger_locale")
    locale = _database_with_locale(pg_admin_url, name)
    if locale is None:
        pytest.skip("the test server accepts none of the locale collations tried")
    try:
        yield with_database(pg_admin_url, name), locale
    finally:
        drop_database(pg_admin_url, name)


@pytest.fixture
def c_db(pg_admin_url: str) -> Iterator[str]:
    name = unique_name("hookledger_c")
    url = create_database(pg_admin_url, name, locale="C")
    try:
        yield url
    finally:
        drop_database(pg_admin_url, name)


def _migrate(url: str, home: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("HOOKLEDGER_DATABASE_URL", url)
    monkeypatch.setenv("HOOKLEDGER_HOME", str(home))
    result = CliRunner().invoke(main, ["migrate"])
    assert result.exit_code == 0, result.output
    return result.output


def test_migrate_warns_of_a_locale_collation_and_still_migrates(
        locale_db: tuple[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url, locale = locale_db
    with psycopg.connect(url) as conn:
        assert database_collation_concern(conn) is not None
    output = _migrate(url, tmp_path, monkeypatch)
    assert "database.collation_not_c" in output
    assert repr(locale) in output
    assert "migrations applied" in output
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT count(*) FROM hookledger.ledger").fetchone() == (0,)


def test_migrate_says_nothing_of_a_c_database(
        c_db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with psycopg.connect(c_db) as conn:
        assert database_collation_concern(conn) is None
    output = _migrate(c_db, tmp_path, monkeypatch)
    assert "collation" not in output
    assert "migrations applied" in output


def test_a_migration_that_fails_still_warns_of_the_collation_first(
        locale_db: tuple[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The warnings came after the migrations, so a role that may not create the schemas
    stopped the command without them, though the collation concerned the same database."""
    url, locale = locale_db
    role = unique_name("hookledger_no_create")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN")
    try:
        try:
            psycopg.connect(url, user=role).close()
        except psycopg.OperationalError:
            pytest.skip("the test server asks this new role for a password")
        monkeypatch.setenv("HOOKLEDGER_DATABASE_URL", make_conninfo_url(url, role))
        monkeypatch.setenv("HOOKLEDGER_HOME", str(tmp_path))
        result = CliRunner().invoke(main, ["migrate"])
        assert result.exit_code != 0
        assert "database.collation_not_c" in result.output and repr(locale) in result.output
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"DROP OWNED BY {role}; DROP ROLE {role}")


def make_conninfo_url(url: str, user: str) -> str:
    """``url`` with another user (no password: the test servers trust their roles)."""
    parts = urlsplit(url)
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit((parts.scheme, f"{user}@{host}", parts.path, parts.query,
                       parts.fragment))


def test_a_server_slow_to_take_the_first_session_is_still_migrated(
        db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The settings' check, first since it comes before the migrations, gave the server 10 s
    to take its session whatever the URL said, and a session it could not open ended the
    command: a server that takes longer (one resuming from a pause) was migrated before, and
    the check then skipped; ``migrate`` and ``serve`` failed on it after the upgrade."""
    relay = TcpRelay(db_url, first_answer_after_s=11)
    try:
        monkeypatch.setenv("HOOKLEDGER_DATABASE_URL", relay.postgresql_url)
        monkeypatch.setenv("HOOKLEDGER_HOME", str(tmp_path))
        result = CliRunner().invoke(main, ["migrate"])
    finally:
        relay.close()
    assert result.exit_code == 0, result.output
    assert "migrations applied" in result.output
