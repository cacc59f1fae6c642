"""The declared schema of the ledger's tables.

Migrations create these objects; a test compares the migrated database with this
declaration. Constraint and index names are pinned by the naming convention so that
duplicates can be recognised by constraint name, and migrations can name what they alter.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Index,
    LargeBinary,
    MetaData,
    Table,
    Text,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB, UUID

PRIVATE_SCHEMA = "hookledger_private"
"""Tables live here; users query the views in schema ``hookledger``."""

PUBLIC_SCHEMA = "hookledger"

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = MetaData(schema=PRIVATE_SCHEMA, naming_convention=NAMING_CONVENTION)

POSITION_SEQUENCE = "ledger_position_seq"
DEDUPE_CONSTRAINT = "uq_ledger_events_dedupe_key"
NOTIFY_CHANNEL = "hookledger_ledger"
APPEND_LOCK_KEY = 0x686F6F6B6C656467  # "hookledg": serialises appends, see migration 0001

ledger_events = Table(
    "ledger_events",
    metadata,
    # set by the BEFORE INSERT trigger under the append lock, never by the writer
    Column("position", BigInteger, primary_key=True),
    Column("event_id", UUID(as_uuid=True), nullable=False, unique=True,
           server_default=text("gen_random_uuid()")),
    Column("stream", Text, nullable=False),
    Column("event_type", Text, nullable=False),
    Column("source", Text, nullable=False),
    Column("dedupe_key", Text, nullable=False, unique=True),
    Column("endpoint", Text),
    Column("verified_by", Text),
    Column("raw_body", LargeBinary),
    Column("headers", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    # NULL when it is the raw body's jsonb reading, which readers compute (migration 0009)
    Column("payload", JSONB),
    Column("facts", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("occurred_at", DateTime(timezone=True)),
    Column("received_at", DateTime(timezone=True), nullable=False),
    Column("recorded_at", DateTime(timezone=True), nullable=False,
           server_default=text("clock_timestamp()")),
    # set by the same trigger: sha256(previous chain_hash || digest), see migration 0005
    Column("chain_hash", LargeBinary, nullable=False),
    CheckConstraint("CASE WHEN payload IS NOT NULL THEN true "
                    "ELSE convert_from(raw_body, 'UTF8')::jsonb IS NOT NULL END",
                    name="payload_or_raw_body"),
)
Index(None, ledger_events.c.stream, ledger_events.c.position)
Index(None, ledger_events.c.event_type, ledger_events.c.position)

# One row, drawn when the ledger is created (migration 0011): the ledger's own identity,
# kept by a dump and restore, a rename, a failover and a change of address, all of which
# change what the server says about itself. Spool folders are named after it.
ledger_identity = Table(
    "ledger_identity",
    metadata,
    Column("one", Boolean, primary_key=True, server_default=text("true")),
    Column("id", UUID(as_uuid=True), nullable=False, server_default=text("gen_random_uuid()")),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    CheckConstraint("one", name="single_row"),
)
