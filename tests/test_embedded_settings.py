"""The settings the embedded server starts with: its own defaults, then the caller's."""

from __future__ import annotations

import os
from pathlib import Path

import psycopg
import pytest

from hookledger.embedded_postgres import EmbeddedPostgres, memory_bytes, shared_buffers_mb


def settings_for(home: Path, version: str, **given: str) -> dict[str, str]:
    server = EmbeddedPostgres(home, server_settings=given)
    server.data_dir.mkdir(parents=True)
    (server.data_dir / "PG_VERSION").write_text(version + "\n")
    return server.settings()


def test_a_new_wal_segment_is_not_zero_filled_where_the_version_has_the_setting(
        tmp_path: Path) -> None:
    assert settings_for(tmp_path / "16", "16")["wal_init_zero"] == "off"
    assert "wal_init_zero" not in settings_for(tmp_path / "11", "11")  # unknown there
    assert "wal_init_zero" not in settings_for(tmp_path / "9", "9.6")


def test_the_callers_settings_win_over_the_defaults(tmp_path: Path) -> None:
    assert settings_for(tmp_path, "16", wal_init_zero="on", fsync="off",
                        shared_buffers="64MB") == {
        "wal_init_zero": "on", "fsync": "off", "shared_buffers": "64MB"}


def test_shared_buffers_are_an_eighth_of_memory_within_bounds(tmp_path: Path) -> None:
    gib = 2**30
    assert shared_buffers_mb(512 * 2**20) == 128  # never below PostgreSQL's own default
    assert shared_buffers_mb(4 * gib) == 512
    assert shared_buffers_mb(24 * gib) == 2048  # nor above 2 GB
    assert 0 < memory_bytes() <= os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert settings_for(tmp_path, "16")["shared_buffers"] == (
        f"{shared_buffers_mb(memory_bytes())}MB")


def test_the_running_embedded_server_has_them(pg_admin_url: str) -> None:
    if os.environ.get("HOOKLEDGER_TEST_DATABASE_URL"):
        pytest.skip("the suite runs on a configured server, not the embedded one")
    with psycopg.connect(pg_admin_url) as conn:
        shown = {name: conn.execute(f"SHOW {name}").fetchone() for name in
                 ("wal_init_zero", "fsync")}
        (buffers,) = conn.execute("SELECT setting::bigint * 8192 / 2^20 FROM pg_settings "
                                  "WHERE name = 'shared_buffers'").fetchone()  # type: ignore[misc]
    assert buffers == shared_buffers_mb(memory_bytes())
    assert shown == {"wal_init_zero": ("off",), "fsync": ("off",)}  # a default; the suite's
