"""What PostgreSQL itself did while a saturating load ran, to read its tail beside.

Two things the server does under write load stall every commit for tens of milliseconds: a
checkpoint (its writes and final fsyncs share the disk with the WAL's, and after it begins
each first change to a page puts the whole page into the WAL) and a new WAL segment (16 MB
of zeros written and fsynced; a young cluster makes one for every 16 MB of WAL until it has
enough old ones to recycle). On the development machine the p99 at 64 connections ranged
between rounds from 17 to 53 ms for hookledger and from 34 to 81 ms for the bare endpoint;
some high rounds coincided with a checkpoint writing, others with new segments, and not
every round fits either. The table prints both beside each saturating load rather than a
verdict on them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg


@dataclass(frozen=True)
class CheckpointActivity:
    begun: int  # checkpoints started, timed or requested
    buffers: int  # buffers written by checkpoints
    wal_files: int | None  # segment files in pg_wal; None where the role may not list them

    def since(self, earlier: CheckpointActivity) -> CheckpointActivity:
        files = (None if self.wal_files is None or earlier.wal_files is None
                 else self.wal_files - earlier.wal_files)
        return CheckpointActivity(self.begun - earlier.begun, self.buffers - earlier.buffers,
                                  files)


# PostgreSQL 17 moved the checkpointer's counters out of pg_stat_bgwriter
_SINCE_17 = "SELECT num_timed + num_requested, buffers_written FROM pg_stat_checkpointer"
_BEFORE_17 = ("SELECT checkpoints_timed + checkpoints_req, buffers_checkpoint "
              "FROM pg_stat_bgwriter")


def checkpoint_activity(url: str) -> CheckpointActivity:
    """The server's counters so far (cluster-wide, so other databases' loads count too).

    The number of WAL segment files tells new segments apart from recycled ones: a
    recycled segment is an old file renamed, while a new one is 16 MB of zeros written and
    fsynced while commits wait (a young cluster makes many).
    """
    with psycopg.connect(url, autocommit=True) as conn:
        newer = conn.info.server_version >= 170000
        row = conn.execute(_SINCE_17 if newer else _BEFORE_17).fetchone()
        files: int | None
        try:
            counted = conn.execute("SELECT count(*) FROM pg_ls_waldir()").fetchone()
            files = int(counted[0]) if counted else None
        except psycopg.errors.InsufficientPrivilege:  # needs pg_monitor or a superuser
            files = None
    begun, buffers = (int(row[0]), int(row[1])) if row else (0, 0)
    return CheckpointActivity(begun, buffers, files)


def described(load: dict[str, Any]) -> str:
    """One line for a table from a load's JSON figures; a row that stands for rounds shows
    each round's p99 beside the checkpoint buffers written during it."""
    line = (f"checkpoints begun {load['checkpoints_begun']}, buffers written by "
            f"checkpoints {load['checkpoint_buffers']:,}, WAL files added "
            f"{_files(load.get('wal_files_added'))}")
    rounds = load.get("rounds", [])
    if rounds:
        line += "; each round's p99 / checkpoint buffers / WAL files added: " + ", ".join(
            f"{r['p99_ms']} ms / {r.get('checkpoint_buffers', 0):,} / "
            f"{_files(r.get('wal_files_added'))}" for r in rounds)
    return line


def _files(added: int | None) -> str:
    return "?" if added is None else str(added)


def checkpoint(url: str) -> bool:
    """Make the server write out every dirty buffer now, so that the next load starts with
    none of an earlier one's, or of the 5,000,000-event fill's: otherwise the checkpoint
    that writes them lands in whichever rounds follow (both large-ledger rounds of one full
    run ran through one, 7,957 buffers, and none of the empty rounds beside them). False
    where the role may not (``CHECKPOINT`` needs a superuser or, from PostgreSQL 15,
    ``pg_checkpoint``): the load then starts as it finds the server."""
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CHECKPOINT")
    except psycopg.errors.InsufficientPrivilege:
        return False
    return True
