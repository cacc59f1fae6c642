"""Which database hookledger uses, and URL forms for each driver.

A configured ``HOOKLEDGER_DATABASE_URL`` wins; without one, the embedded server under
``HOOKLEDGER_HOME`` is started (or joined) for the life of the process.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import unquote

from hookledger.embedded_postgres import EmbeddedPostgres
from hookledger.settings import Settings


def libpq_url(url: str) -> str:
    """The URL as libpq/psycopg want it (no SQLAlchemy driver suffix)."""
    for prefix in ("postgresql+psycopg://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql://" + url[len(prefix):]
    return url


def without_password(message: str, url: str | None) -> str:
    """``message`` with every piece of ``url``'s password masked. libpq ends the password
    at its first ``@``, so an unescaped one (``app:Tr0ub4dor@horse@db``) makes the rest of
    it the host, which libpq's own message then names ("failed to resolve host
    'horse@db'"). The password is taken as users mean it: up to the URL's last ``@``."""
    if not url or "://" not in url:
        return message
    rest = url.split("://", 1)[1]
    userinfo = rest.rsplit("@", 1)[0] if "@" in rest else ""
    password = userinfo.split(":", 1)[1] if ":" in userinfo else ""
    pieces = {piece for form in (password, unquote(password))
              for piece in (form, *form.split("@")) if len(piece) >= 3}
    for piece in sorted(pieces, key=len, reverse=True):
        message = message.replace(piece, "***")
    return message


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
