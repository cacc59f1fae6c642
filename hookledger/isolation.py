"""Whether the database's default isolation could fork the hash chain behind a pooler.

The append trigger chains each event to the newest one committed when it takes the append
lock, which only a READ COMMITTED statement sees (:func:`ledger.store.ready_to_append`).
hookledger pins each of its sessions to READ COMMITTED with a session ``SET``, which holds
on a direct connection but not behind a connection pooler in transaction mode (PgBouncer):
there a later transaction runs on another server connection, at the database's or role's
own default. With that default REPEATABLE READ or SERIALIZABLE, two events could chain to
one predecessor and ``hookledger verify`` would call an untouched ledger tampered with.
hookledger cannot tell a pooler from a server, so such a default is warned about.

Likewise durable commits: hookledger raises a default ``synchronous_commit`` of ``off`` for
its appending sessions, which behind such a pooler does not hold either, and a delivery
could then be answered ``200`` before its commit is flushed.
"""

from __future__ import annotations

from typing import Any

import psycopg

SAFE_LEVELS = frozenset({"read committed", "read uncommitted"})  # the latter is the former


def isolation_concern(level: str) -> str | None:
    """Why the default isolation ``level`` (``default_transaction_isolation``) is a risk
    for the hash chain, or None. Pure."""
    if level.strip().lower() in SAFE_LEVELS:
        return None
    return (f"the database's default isolation is {level!r}: hookledger sets READ COMMITTED "
            "for each of its sessions, but a connection pooler in transaction mode does not "
            "keep that, and an append run at this level behind one can chain to an event "
            "that is not the newest (hookledger verify then reports the ledger tampered "
            "with). Behind such a pooler, ALTER DATABASE ... SET "
            "default_transaction_isolation = 'read committed' (or for hookledger's role), or "
            "connect hookledger directly or in session mode")


def database_isolation_concern(conn: psycopg.Connection[Any]) -> str | None:
    """:func:`isolation_concern` for the default ``conn``'s session started with (one of
    hookledger's own, pinned by :func:`ledger.store.ready_to_append`, says nothing)."""
    row = conn.execute("SELECT current_setting('default_transaction_isolation')").fetchone()
    return isolation_concern(str(row[0])) if row else None


def durability_concern(setting: str) -> str | None:
    """Why the default ``synchronous_commit`` is a risk for acknowledged deliveries, or
    None. Pure."""
    if setting.strip().lower() != "off":
        return None
    return ("the database's default synchronous_commit is 'off': hookledger turns it on for "
            "each of its appending sessions, but a connection pooler in transaction mode does "
            "not keep that, and behind one a delivery could be answered 200 before its commit "
            "is flushed (lost in a crash). Behind such a pooler, ALTER DATABASE ... SET "
            "synchronous_commit = on (or for hookledger's role), or connect hookledger "
            "directly or in session mode")


def database_durability_concern(conn: psycopg.Connection[Any]) -> str | None:
    """:func:`durability_concern` for the default ``conn``'s session started with."""
    row = conn.execute("SELECT current_setting('synchronous_commit')").fetchone()
    return durability_concern(str(row[0])) if row else None
