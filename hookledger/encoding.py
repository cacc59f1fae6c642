"""Whether the database's encoding can hold every delivery's text.

Deliveries are UTF-8 JSON, and their text (references, dedupe keys, payloads) is stored as
text. In a database of another encoding, a character the encoding has not (a euro sign in
LATIN1) is refused when the event is appended, so that delivery is never kept; the general
webhook system does not retry. ``SQL_ASCII`` checks nothing and names no encoding for its
text: hookledger's sessions say UTF-8 (``hookledger.database.speaking_utf8``), others may
not. The embedded cluster is UTF-8; a database of the user's own is only warned about,
since changing it means a new database.
"""

from __future__ import annotations

from typing import Any

import psycopg

ENCODING_SQL = ("SELECT pg_encoding_to_char(encoding) FROM pg_database "
                "WHERE datname = current_database()")
UTF8_NAMES = frozenset({"UTF8", "UNICODE"})  # PostgreSQL's name and its alias


def encoding_concern(encoding: str) -> str | None:
    """Why a database of ``encoding`` cannot keep every delivery, or None. Pure."""
    if encoding.strip().upper().replace("-", "") in UTF8_NAMES:
        return None
    if encoding.strip().upper() == "SQL_ASCII":
        why = ("it checks no text: hookledger writes UTF-8 into it, but any other "
               "client may store bytes in any encoding beside it, which no view can read "
               "back reliably")
    else:
        why = (f"a delivery with a character {encoding} has not (a euro sign in LATIN1, "
               "any non-Latin script) is refused when appended and never kept")
    return (f"the database's encoding is {encoding!r}, not 'UTF8': {why}. Create the "
            "database with ENCODING 'UTF8' (README, 'Running on your own PostgreSQL') and "
            "copy the data into it (pg_dump)")


def database_encoding_concern(conn: psycopg.Connection[Any]) -> str | None:
    """:func:`encoding_concern` for the database ``conn`` is connected to (its name read
    as bytes too: a SQL_ASCII database's text reaches psycopg so)."""
    row: Any = conn.execute(ENCODING_SQL).fetchone()
    if not row:
        return None
    name = row[0]
    return encoding_concern(name.decode("ascii", "replace") if isinstance(name, bytes)
                            else str(name))
