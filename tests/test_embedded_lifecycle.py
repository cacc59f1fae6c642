"""The embedded server's life: a start that fails or is interrupted halfway does not leave
a server running that nobody uses."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from hookledger.embedded_postgres import EmbeddedPostgres, EmbeddedPostgresError
from tests.test_serve_process import postgres_running


@pytest.mark.parametrize("interruption", [KeyboardInterrupt, SystemExit,
                                          EmbeddedPostgresError],
                         ids=["ctrl-c", "sigterm", "a failed step"])
def test_a_start_that_stops_after_the_server_came_up_stops_the_server(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        interruption: type[BaseException]) -> None:
    home = tmp_path / "home"
    server = EmbeddedPostgres(home)
    came_up: list[bool] = []

    def interrupted(binaries: object) -> None:
        came_up.append(postgres_running(home))
        raise interruption("interrupted while creating the database")

    monkeypatch.setattr(server, "_ensure_database", interrupted)
    with pytest.raises(interruption):
        server.start()
    assert came_up == [True]  # the interruption came after the server had started
    assert not postgres_running(home)
    assert not list(server.users_dir.iterdir())

    monkeypatch.undo()  # the same home starts normally afterwards
    url = server.start()
    try:
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        server.stop()
    assert not postgres_running(home)


def test_a_repeated_start_that_fails_keeps_the_running_server(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    server = EmbeddedPostgres(home)
    url = server.start()
    try:
        def failing(binaries: object) -> None:
            raise EmbeddedPostgresError("cannot create the database")

        monkeypatch.setattr(server, "_ensure_database", failing)
        with pytest.raises(EmbeddedPostgresError):
            server.start()
        assert postgres_running(home)  # this process still uses it
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        server.stop()
    assert not postgres_running(home)
