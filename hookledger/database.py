"""Which database hookledger uses, and URL forms for each driver.

A configured ``HOOKLEDGER_DATABASE_URL`` wins; without one, the embedded server under
``HOOKLEDGER_HOME`` is started (or joined) for the life of the process.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from hookledger.embedded_postgres import EmbeddedPostgres
from hookledger.settings import Settings


def libpq_url(url: str) -> str:
    """The URL as libpq/psycopg want it (no SQLAlchemy driver suffix)."""
    for prefix in ("postgresql+psycopg://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql://" + url[len(prefix):]
    return url


def sqlalchemy_url(url: str) -> str:
    """The URL as SQLAlchemy wants it, pinned to psycopg 3."""
    return "postgresql+psycopg://" + libpq_url(url)[len("postgresql://"):]


@contextmanager
def database(settings: Settings) -> Iterator[str]:
    """Yield the libpq URL to use; an embedded server lives exactly as long as the block."""
    if settings.database_url:
        yield libpq_url(settings.database_url)
        return
    embedded = EmbeddedPostgres(settings.home, os_user_when_root=settings.embedded_os_user)
    url = embedded.start()
    try:
        yield url
    finally:
        embedded.stop()
