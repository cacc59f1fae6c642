"""Apply alembic migrations from the installed ``migrations`` package."""

from __future__ import annotations

from pathlib import Path

import click
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util.exc import CommandError
from sqlalchemy import create_engine
from sqlalchemy.pool import NullPool

import migrations
from hookledger.database import sqlalchemy_url
from ledger.schema import PRIVATE_SCHEMA


def alembic_config(url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(Path(migrations.__file__).parent))
    # '%' must be doubled for configparser interpolation
    config.set_main_option("sqlalchemy.url", sqlalchemy_url(url).replace("%", "%%"))
    return config


class DatabaseNewerThanCode(click.ClickException):
    """The database was migrated by a newer release than this one."""


class NotMigrated(Exception):
    """The database is not at this release's revision, and the command only reads."""


def _current_revision(url: str) -> str | None:
    """The database's revision (None before any migration), read without writing."""
    engine = create_engine(sqlalchemy_url(url), poolclass=NullPool)
    try:
        with engine.connect() as connection:
            current = MigrationContext.configure(
                connection, opts={"version_table_schema": PRIVATE_SCHEMA}
            ).get_current_revision()
    finally:
        engine.dispose()
    return current


def require_head(url: str) -> None:
    """Refuse, rather than migrate, a database not at this release's revision: for the
    commands that only read (``verify``, ``rebuild --verify``), which ran the migrations
    first and so failed with a traceback on a standby or for a read-only role (exit 1, the
    code of a tampered ledger), and changed a database they promise to leave alone."""
    scripts = ScriptDirectory.from_config(alembic_config(url))
    head, current = scripts.get_current_head(), _current_revision(url)
    if current == head:
        return
    if current is not None:
        try:
            scripts.get_revision(current)
        except CommandError:
            raise NotMigrated(
                f"the database was migrated by a newer hookledger (to {current}); this "
                f"release does not know its tables: run that release or a newer one"
            ) from None
    raise NotMigrated(
        f"the database is at migration {current or 'none'}, not this release's {head}: run "
        f"`hookledger migrate` (as a role that may) first; this command changes nothing")


def upgrade(url: str, revision: str = "head") -> None:
    """Apply migrations up to ``revision``. A database a newer release migrated is refused
    with a message that says so (alembic's own is a traceback about a revision it cannot
    locate), and is left as it is. A database already at this release's head is only read:
    alembic's run begins with writes (``CREATE SCHEMA IF NOT EXISTS``), so ``report`` and
    every other command stopped with a traceback on a replica or for a read-only session,
    though nothing was there to migrate."""
    if revision == "head":
        current = _current_revision(url)
        scripts = ScriptDirectory.from_config(alembic_config(url))
        if current is not None and current == scripts.get_current_head():
            return
    try:
        command.upgrade(alembic_config(url), revision)
    except CommandError as exc:
        if "Can't locate revision" not in str(exc):
            raise
        raise DatabaseNewerThanCode(
            f"the database was migrated by a newer hookledger ({exc}); this release does "
            f"not know its tables. Run that release or a newer one; nothing was changed"
        ) from None


def downgrade(url: str, revision: str) -> None:
    command.downgrade(alembic_config(url), revision)
