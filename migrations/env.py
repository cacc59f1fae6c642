"""Alembic environment: one connection, one advisory lock, migrations in one transaction.

The lock makes concurrent ``serve`` processes on one database migrate one at a time: the
second waits, then finds nothing left to do.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, text

from hookledger.schema import PRIVATE_SCHEMA, metadata

MIGRATION_LOCK_KEY = 0x686F6F6B6D696772  # "hookmigr"


def run_migrations_online() -> None:
    config = context.config
    connection = config.attributes.get("connection")
    if connection is None:
        url = config.get_main_option("sqlalchemy.url")
        assert url, "sqlalchemy.url is not set"
        engine = create_engine(url)
        with engine.connect() as connection:
            _run(connection)
        engine.dispose()
    else:
        _run(connection)


def _run(connection) -> None:  # type: ignore[no-untyped-def]
    connection.execute(text("SELECT pg_advisory_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
    try:
        connection.execute(text(f"CREATE SCHEMA IF NOT EXISTS {PRIVATE_SCHEMA}"))
        connection.commit()
        context.configure(
            connection=connection,
            target_metadata=metadata,
            version_table_schema=PRIVATE_SCHEMA,
            transaction_per_migration=False,
        )
        with context.begin_transaction():
            context.run_migrations()
        connection.commit()
    finally:
        # after a failure the transaction is aborted, and the unlock itself failed in it,
        # hiding the real error (a read-only server's, say) behind "transaction aborted"
        connection.rollback()
        connection.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": MIGRATION_LOCK_KEY})
        connection.commit()


if context.is_offline_mode():
    raise SystemExit("offline (SQL script) migrations are not supported")
run_migrations_online()
