"""Test databases: one server per session, a migrated template, a fresh clone per test."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo


def with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))


def create_database(admin_url: str, name: str, template: str | None = None,
                    locale: str | None = None) -> str:
    """A new database, a copy of ``template`` if given; with ``locale``, one of that locale
    made from ``template0`` (the only template a locale other than its own may come from)."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        if locale:
            conn.execute(f"CREATE DATABASE \"{name}\" TEMPLATE template0 LOCALE '{locale}' "
                         "ENCODING 'UTF8'")
        elif template:
            conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
        else:
            conn.execute(f'CREATE DATABASE "{name}"')
    return with_database(admin_url, name)


def drop_database(admin_url: str, name: str) -> None:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def unique_name(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


def refuse_event_type(url: str, event_type: str) -> None:
    """Make the database itself refuse every new ledger row of ``event_type`` (a check
    violation), as it would refuse a row strict reading let through by mistake."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"""
            CREATE FUNCTION hookledger_private.test_refuse() RETURNS trigger
            LANGUAGE plpgsql AS $$
            BEGIN
                RAISE EXCEPTION 'refused for the test' USING ERRCODE = 'check_violation';
            END $$;
            CREATE TRIGGER test_refuse BEFORE INSERT ON hookledger_private.ledger_events
            FOR EACH ROW WHEN (NEW.event_type = '{event_type}')
            EXECUTE FUNCTION hookledger_private.test_refuse();
        """)


@contextlib.contextmanager
def database_read_only(db_url: str) -> Iterator[None]:
    """The service's database turned read-only for every new session (a standby promoted
    elsewhere, a primary set read-only for maintenance), its open sessions cut."""
    name = str(conninfo_to_dict(db_url)["dbname"])
    with psycopg.connect(make_conninfo(db_url, dbname="postgres"), autocommit=True) as conn:
        conn.execute(sql.SQL("ALTER DATABASE {} SET default_transaction_read_only = on")
                     .format(sql.Identifier(name)))
        try:
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                         "WHERE datname = %s", (name,))
            yield
        finally:
            conn.execute(sql.SQL("ALTER DATABASE {} RESET default_transaction_read_only")
                         .format(sql.Identifier(name)))


@contextlib.contextmanager
def tenant_in_public(db_url: str, *definitions: str) -> Iterator[None]:
    """A role that may only create in ``public`` adds ``definitions`` there; each raises
    ``hijacked`` when PostgreSQL picks it."""
    role = f"hl_tenant_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {0} NOLOGIN; GRANT CREATE ON SCHEMA public TO {0}")
                     .format(sql.Identifier(role)))
        conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(role)))
        for definition in definitions:
            conn.execute(definition)
    try:
        yield
    finally:
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP OWNED BY {0}; DROP ROLE {0}").format(
                sql.Identifier(role)))
