"""The declared schema of ingest's own tables: deliveries it refused, chat secrets.

Refused deliveries never reach the ledger; they are kept here for inspection (why was this
refused, what did it look like) with the body cut to a small prefix, so that a flood of
junk cannot fill the disk.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Identity,
    Index,
    LargeBinary,
    Table,
    Text,
    UniqueConstraint,
)
from sqlalchemy.dialects.postgresql import JSONB

from ledger.schema import metadata

rejected_deliveries = Table(
    "rejected_deliveries",
    metadata,
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    Column("received_at", DateTime(timezone=True), nullable=False),
    Column("endpoint", Text, nullable=False),
    Column("reason", Text, nullable=False),
    Column("detail", Text),
    Column("verified", Boolean, nullable=False),
    Column("http_status", BigInteger, nullable=False),
    Column("body_sha256", Text, nullable=False),
    Column("body_size", BigInteger, nullable=False),
    Column("body_prefix", LargeBinary),
    Column("headers", JSONB),
    Column("remote_addr", Text),
)
Index(None, rejected_deliveries.c.received_at)

chat_secrets = Table(
    "chat_secrets",
    metadata,
    # Each connected number's chat webhook secrets: the current one (retired_at NULL) and
    # those rotated out, which still verify for the rotation grace period. ``label`` is a
    # short fingerprint of the secret, safe to log; the secret itself never leaves here.
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    Column("phone_number_id", Text, nullable=False),
    Column("secret", Text, nullable=False),
    Column("label", Text, nullable=False),
    Column("source", Text, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("retired_at", DateTime(timezone=True)),
    UniqueConstraint("phone_number_id", "secret"),
    CheckConstraint("source IN ('bootstrap', 'rotation')", name="source"),
    CheckConstraint("retired_at IS NULL OR retired_at >= created_at",
                    name="retired_after_created"),
)
# at most one current secret per number
Index("ix_chat_secrets_current", chat_secrets.c.phone_number_id, unique=True,
      postgresql_where=chat_secrets.c.retired_at.is_(None))
