"""Whether the database's default collation suits the ledger's keys.

Dedupe keys, streams and references are compared for equality only, and the unique index on
``dedupe_key`` is what keeps a repeated delivery from being appended twice. Under a locale
collation every comparison in that index follows the locale's library (slower appends), and
a library upgrade that changes the locale's order can leave the index inconsistent, after
which a repeated delivery may be appended again. The embedded cluster is created with ``C``;
a database of the user's own is only warned about, since changing it means a new database.
"""

from __future__ import annotations

from typing import Any

import psycopg

# ``datlocprovider`` (PostgreSQL 15) and the ICU or builtin locale's column (``daticulocale``
# in 15-16, ``datlocale`` from 17) read through jsonb, so that 13 and 14, which lack them,
# answer NULL rather than an error
COLLATION_SQL = """
SELECT datcollate,
       to_jsonb(d) ->> 'datlocprovider',
       coalesce(to_jsonb(d) ->> 'datlocale', to_jsonb(d) ->> 'daticulocale')
FROM pg_database d WHERE datname = current_database()
"""

BYTEWISE_LIBC = frozenset({"C", "POSIX"})
PROVIDERS = {"c": "the C library's", "i": "ICU's"}


def collation_concern(collate: str, provider: str | None, locale: str | None) -> str | None:
    """Why a database's default collation puts the dedupe index at risk, or None.

    ``provider`` is ``datlocprovider`` (None before PostgreSQL 15: the C library); ``locale``
    the ICU or builtin locale's name, where the provider is not the C library. The builtin
    provider (PostgreSQL 17) orders by code point with no library behind it: never a concern.
    """
    if provider == "b":
        return None
    if provider in (None, "c") and collate in BYTEWISE_LIBC:
        return None
    name = locale if provider == "i" and locale else collate
    library = PROVIDERS.get(provider or "c", f"provider {provider!r}")
    return (f"the database's default collation is {name!r} ({library} locale), not 'C': "
            "every dedupe-key comparison follows that locale, and an upgrade that changes "
            "its order can leave the unique index on dedupe_key inconsistent, so that a "
            "repeated delivery is appended twice. Create the database with LOCALE 'C' "
            "(README, 'Running on your own PostgreSQL'); after such an upgrade, REINDEX the "
            "database before serving")


def database_collation_concern(conn: psycopg.Connection[Any]) -> str | None:
    """:func:`collation_concern` for the database ``conn`` is connected to."""
    row: Any = conn.execute(COLLATION_SQL).fetchone()
    return collation_concern(str(row[0]), row[1], row[2]) if row else None
