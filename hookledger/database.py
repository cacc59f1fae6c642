"""Which database hookledger uses, and URL forms for each driver.

A configured ``HOOKLEDGER_DATABASE_URL`` wins; without one, the embedded server under
``HOOKLEDGER_HOME`` is started (or joined) for the life of the process.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, suppress
from urllib.parse import unquote, urlencode

import psycopg
from psycopg.conninfo import conninfo_to_dict

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


# libpq's own names; probes after 30 s of silence, 10 s apart, 3 unanswered end it
DEAD_PEER_SETTINGS = {"keepalives": "1", "keepalives_idle": "30",
                      "keepalives_interval": "10", "keepalives_count": "3"}
UNACKNOWLEDGED_MS = "60000"  # libpq's tcp_user_timeout (libpq 12 or newer)


def with_dead_peer_detection(url: str) -> str:
    """``url`` with TCP keepalives and a bound on unacknowledged data, each only where the
    URL does not set it already (ignored on a Unix socket).

    Without them a connection whose peer vanished (a failover, a NAT or firewall dropping
    the flow, a blip that loses the FIN) looked alive to the client for as long as the
    kernel's defaults allow: about two hours idle, and some fifteen minutes with a
    statement unacknowledged. A projector with no standby sat that long waiting for a
    batch's answer and projected nothing, and a reconciliation pass or a command hung as
    long. With them its client sees the connection fail within about a minute and opens
    a new one; the server ends the session it left behind (``projections.live``).
    """
    wanted = dict(DEAD_PEER_SETTINGS)
    if psycopg.pq.version() >= 120000:
        wanted["tcp_user_timeout"] = UNACKNOWLEDGED_MS
    return _with_defaults(url, wanted)


def speaking_utf8(url: str) -> str:
    """``url`` with ``client_encoding=UTF8`` unless it sets an encoding of its own.

    hookledger's text is UTF-8 (deliveries are UTF-8 JSON). A session's encoding is the
    database's by default: in a ``SQL_ASCII`` database that names none, so psycopg read
    every text value as bytes and the first command stopped with a traceback; in another
    encoding, the server converts from UTF-8 and refuses only what that encoding cannot
    hold (``hookledger.encoding`` warns of both)."""
    return _with_defaults(url, {"client_encoding": "UTF8"})


def _with_defaults(url: str, defaults: dict[str, str]) -> str:
    """``url`` with each of libpq's ``defaults`` it does not set itself, as query
    parameters (a user's own choice in the URL always wins).

    Joined with ``&`` only when libpq then reads them as parameters beside the URL's own:
    a ``?`` may stand unescaped in the password (libpq and SQLAlchemy read everything to
    the ``@`` as the user's), and taken for the start of a query it ran the parameters on
    into the database's name. A URL neither reads as meant is left as it is."""
    given = conninfo_to_dict(url)
    missing = {name: value for name, value in defaults.items() if name not in given}
    if not missing:
        return url
    for joiner in ("&", "?"):
        candidate = url + joiner + urlencode(missing)
        with suppress(psycopg.ProgrammingError):
            if conninfo_to_dict(candidate) == {**given, **missing}:
                return candidate
    return url


def sqlalchemy_url(url: str) -> str:
    """The URL as SQLAlchemy wants it, pinned to psycopg 3."""
    return "postgresql+psycopg://" + libpq_url(url)[len("postgresql://"):]


@contextmanager
def database(settings: Settings) -> Iterator[str]:
    """Yield the libpq URL to use; an embedded server lives exactly as long as the block."""
    if settings.database_url:
        yield with_dead_peer_detection(speaking_utf8(libpq_url(settings.database_url)))
        return
    embedded = EmbeddedPostgres(settings.home, os_user_when_root=settings.embedded_os_user)
    url = embedded.start()
    try:
        yield url
    finally:
        embedded.stop()
