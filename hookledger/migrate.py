"""Apply alembic migrations from the installed ``migrations`` package."""

from __future__ import annotations

from pathlib import Path

import click
from alembic import command
from alembic.config import Config
from alembic.util.exc import CommandError

import migrations
from hookledger.database import sqlalchemy_url


def alembic_config(url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(Path(migrations.__file__).parent))
    # '%' must be doubled for configparser interpolation
    config.set_main_option("sqlalchemy.url", sqlalchemy_url(url).replace("%", "%%"))
    return config


class DatabaseNewerThanCode(click.ClickException):
    """The database was migrated by a newer release than this one."""


def upgrade(url: str, revision: str = "head") -> None:
    """Apply migrations up to ``revision``. A database a newer release migrated is refused
    with a message that says so (alembic's own is a traceback about a revision it cannot
    locate), and is left as it is."""
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
