"""The database's default isolation: a session SET that a transaction-mode pooler drops
leaves appends at that default, where the hash chain could fork."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner

from hookledger.cli import main
from hookledger.isolation import (
    database_isolation_concern,
    durability_concern,
    isolation_concern,
)
from tests.dbutil import create_database, drop_database, unique_name


@pytest.mark.parametrize(("level", "concern"), [
    ("read committed", False), ("READ COMMITTED", False), ("read uncommitted", False),
    ("repeatable read", True), ("serializable", True),
])
def test_only_read_committed_is_free_of_concern(level: str, concern: bool) -> None:
    assert (isolation_concern(level) is not None) is concern


@pytest.fixture(params=["repeatable read", "read committed"])
def leveled_db(pg_admin_url: str, request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    name = unique_name("hookledger_iso")
    url = create_database(pg_admin_url, name, locale="C")
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        conn.execute(f"ALTER DATABASE \"{name}\" SET default_transaction_isolation = "
                     f"'{request.param}'")
    try:
        yield url, request.param
    finally:
        drop_database(pg_admin_url, name)


def test_migrate_warns_of_a_default_isolation_a_pooler_would_leave_appends_at(
        leveled_db: tuple[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A database whose default is REPEATABLE READ: hookledger's own sessions still run
    READ COMMITTED, but behind a transaction-mode pooler they would not, and nothing said
    so (the README promised correct chaining whatever the default)."""
    url, level = leveled_db
    monkeypatch.setenv("HOOKLEDGER_DATABASE_URL", url)
    monkeypatch.setenv("HOOKLEDGER_HOME", str(tmp_path))
    result = CliRunner().invoke(main, ["migrate"])
    assert result.exit_code == 0, result.output
    assert "migrations applied" in result.output
    warned = "database.isolation_not_read_committed" in result.output
    assert warned is (level != "read committed")
    with psycopg.connect(url) as conn:
        assert (database_isolation_concern(conn) is not None) is warned


@pytest.mark.parametrize(("setting", "concern"), [
    ("off", True), ("OFF", True), ("on", False), ("local", False), ("remote_apply", False)])
def test_only_synchronous_commit_off_is_a_concern(setting: str, concern: bool) -> None:
    assert (durability_concern(setting) is not None) is concern


def test_migrate_warns_of_a_default_that_commits_before_the_flush(
        pg_admin_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """hookledger's appending sessions turn synchronous_commit on, but behind a
    transaction-mode pooler that does not hold, and nothing said so."""
    name = unique_name("hookledger_sync")
    url = create_database(pg_admin_url, name, locale="C")
    try:
        with psycopg.connect(pg_admin_url, autocommit=True) as conn:
            conn.execute(f'ALTER DATABASE "{name}" SET synchronous_commit = off')
        monkeypatch.setenv("HOOKLEDGER_DATABASE_URL", url)
        monkeypatch.setenv("HOOKLEDGER_HOME", str(tmp_path))
        result = CliRunner().invoke(main, ["migrate"])
        assert result.exit_code == 0, result.output
        assert "database.synchronous_commit_off" in result.output
    finally:
        drop_database(pg_admin_url, name)
