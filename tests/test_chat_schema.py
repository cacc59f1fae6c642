"""The chat_secrets table: migrated exactly as declared, and removed by its downgrade."""

from __future__ import annotations

import psycopg
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import MetaData, create_engine

import ingest.schema
from hookledger import migrate
from hookledger.database import sqlalchemy_url
from ledger.schema import NAMING_CONVENTION, PRIVATE_SCHEMA


def test_the_migrated_chat_secrets_table_matches_its_declaration(empty_db_url: str) -> None:
    migrate.upgrade(empty_db_url)
    declared = MetaData(schema=PRIVATE_SCHEMA, naming_convention=NAMING_CONVENTION)
    ingest.schema.chat_secrets.to_metadata(declared)
    engine = create_engine(sqlalchemy_url(empty_db_url))
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={
            "include_schemas": True,
            "include_name": lambda name, type_, parent: (
                name == PRIVATE_SCHEMA if type_ == "schema"
                else type_ != "table" or name == "chat_secrets"),
        })
        diff = compare_metadata(context, declared)
    engine.dispose()
    assert diff == []


def test_downgrade_to_0001_drops_chat_secrets(empty_db_url: str) -> None:
    migrate.upgrade(empty_db_url, "0002")
    migrate.downgrade(empty_db_url, "0001")
    with psycopg.connect(empty_db_url) as conn:
        found = conn.execute("SELECT to_regclass('hookledger_private.chat_secrets')").fetchone()
    assert found == (None,)
    migrate.upgrade(empty_db_url, "0002")
