"""A connection whose peer vanished is noticed within about a minute, not hours."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from hookledger.database import database, with_dead_peer_detection
from hookledger.migrate import upgrade
from hookledger.settings import load_settings
from tests.relay import TcpRelay


@pytest.fixture
def relay(db_url: str) -> Iterator[TcpRelay]:
    relay = TcpRelay(db_url)
    yield relay
    relay.close()


def test_the_settings_are_added_only_where_the_url_is_silent() -> None:
    added = conninfo_to_dict(with_dead_peer_detection("postgresql://app@db:5432/ledger"))
    assert (added["keepalives"], added["keepalives_idle"], added["keepalives_interval"],
            added["keepalives_count"]) == ("1", "30", "10", "3")
    assert added["tcp_user_timeout"] == "60000"
    assert (added["host"], added["dbname"]) == ("db", "ledger")

    own = "postgresql://app@db/ledger?sslmode=require&keepalives_idle=5&tcp_user_timeout=9000"
    kept = conninfo_to_dict(with_dead_peer_detection(own))
    assert (kept["keepalives_idle"], kept["tcp_user_timeout"], kept["sslmode"]) == (
        "5", "9000", "require")
    assert kept["keepalives_count"] == "3"
    assert with_dead_peer_detection(with_dead_peer_detection(own)) == with_dead_peer_detection(own)


def test_a_configured_databases_connections_probe_a_silent_peer(
        relay: TcpRelay, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Read off the client's own socket: the kernel's defaults probe after 7,200 s."""
    monkeypatch.setenv("HOOKLEDGER_DATABASE_URL", relay.postgresql_url)
    monkeypatch.setenv("HOOKLEDGER_HOME", str(tmp_path))
    with database(load_settings()) as url, psycopg.connect(url) as conn:
        sock = socket.socket(fileno=os.dup(conn.fileno()))
        try:
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 30
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) == 10
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == 3
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 60000
        finally:
            sock.detach()
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_migrations_take_the_url_with_its_settings(relay: TcpRelay, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """SQLAlchemy passes the added parameters through to libpq (a bad one fails here)."""
    monkeypatch.setenv("HOOKLEDGER_DATABASE_URL", relay.postgresql_url)
    monkeypatch.setenv("HOOKLEDGER_HOME", str(tmp_path))
    with database(load_settings()) as url:
        upgrade(url)
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT count(*) FROM hookledger.ledger").fetchone() == (0,)


def test_a_password_with_a_question_mark_keeps_its_database(
        db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """libpq (and SQLAlchemy) read a ``?`` before the host as part of the password, and the
    README asks only ``%`` and ``@`` to be escaped: the added settings begin the URL's
    query, never run on into the database's name (it was ``test&client_encoding=...``, a
    database that does not exist, so every command failed after the upgrade)."""
    scheme, rest = db_url.split("://", 1)
    user, host = rest.split("@", 1)
    url = f"{scheme}://{user.split(':', 1)[0]}:pass?word@{host}"
    given = conninfo_to_dict(url)
    assert given["password"] == "pass?word"  # as libpq reads it, before anything is added
    monkeypatch.setenv("HOOKLEDGER_DATABASE_URL", url)
    monkeypatch.setenv("HOOKLEDGER_HOME", str(tmp_path))
    with database(load_settings()) as configured:
        read = conninfo_to_dict(configured)
        assert (read["password"], read["dbname"], read["keepalives"],
                read["client_encoding"]) == ("pass?word", given["dbname"], "1", "UTF8")
        upgrade(configured)  # SQLAlchemy reads the same URL
        with psycopg.connect(configured) as conn:
            assert conn.execute("SELECT current_database()").fetchone() == (given["dbname"],)
