"""The declared schema of ingest's own table: deliveries it refused.

Refused deliveries never reach the ledger; they are kept here for inspection (why was this
refused, what did it look like) with the body cut to a small prefix, so that a flood of
junk cannot fill the disk.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Identity,
    Index,
    LargeBinary,
    Table,
    Text,
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
