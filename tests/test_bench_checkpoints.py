"""The checkpoint figures the ingest benchmark prints beside a saturating load's tail."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from bench.checkpoints import CheckpointActivity, checkpoint, checkpoint_activity, described


def test_a_checkpoint_and_new_wal_are_counted_between_two_readings(db_url: str) -> None:
    before = checkpoint_activity(db_url)
    with psycopg.connect(db_url, autocommit=True) as conn:
        # WAL of its own (a few segments' worth would need more; a switch starts a new one)
        conn.execute("CREATE TABLE filler AS SELECT g, repeat('x', 500) AS pad "
                     "FROM generate_series(1, 20000) AS g")
        conn.execute("UPDATE filler SET pad = pad || 'y'")  # dirty buffers to write out
        conn.execute("SELECT pg_switch_wal()")
        conn.execute("CHECKPOINT")
    during = checkpoint_activity(db_url).since(before)
    assert during.begun >= 1
    assert during.buffers > 0
    assert during.wal_files is not None  # the suite's role may list pg_wal


def test_since_keeps_an_unreadable_file_count_unknown() -> None:
    later = CheckpointActivity(begun=3, buffers=500, wal_files=None)
    assert later.since(CheckpointActivity(1, 100, 7)) == CheckpointActivity(2, 400, None)
    assert CheckpointActivity(3, 500, 9).since(CheckpointActivity(1, 100, 7)).wal_files == 2


def test_a_row_of_rounds_is_described_round_by_round() -> None:
    load = {"checkpoints_begun": 1, "checkpoint_buffers": 2743, "wal_files_added": None,
            "rounds": [{"p99_ms": 36.8, "checkpoint_buffers": 0, "wal_files_added": 13},
                       {"p99_ms": 51.55, "checkpoint_buffers": 2743, "wal_files_added": None}]}
    line = described(load)
    assert line.startswith("checkpoints begun 1, buffers written by checkpoints 2,743, "
                           "WAL files added ?")
    assert line.endswith("36.8 ms / 0 / 13, 51.55 ms / 2,743 / ?")


def test_a_load_can_start_from_a_checkpoint(db_url: str) -> None:
    """The bench checkpoints before each measured load, so that a fill's dirty buffers are
    not written out during whichever round comes next."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE dirtied AS SELECT g FROM generate_series(1, 5000) AS g")
    before = checkpoint_activity(db_url)
    assert checkpoint(db_url) is True
    assert checkpoint_activity(db_url).since(before).begun >= 1


def test_a_role_that_may_not_checkpoint_is_told_apart(db_url: str) -> None:
    role = f"bench_no_checkpoint_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN")
    try:
        try:
            with psycopg.connect(db_url, user=role):
                pass
        except psycopg.OperationalError:
            pytest.skip("the test server asks this new role for a password")
        assert checkpoint(make_conninfo(db_url, user=role)) is False
    finally:
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute(f"DROP ROLE {role}")
