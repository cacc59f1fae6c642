"""The declared schema of reconciliation's own tables (migration 0004 creates them, 0017
``reconcile_schedule``)."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Column,
    DateTime,
    Index,
    Integer,
    Numeric,
    Table,
    Text,
)

from ledger.schema import metadata


def _ts() -> DateTime:
    return DateTime(timezone=True)


expectations = Table(
    "expectations", metadata,
    # what the merchant initiated: a webhook that never comes is noticed through these
    Column("reference", Text, primary_key=True),
    Column("kind", Text, nullable=False),
    Column("amount", Numeric, nullable=False),
    Column("initiated_at", _ts(), nullable=False),
    Column("registered_at", _ts(), nullable=False, server_default="now()"),
    CheckConstraint("kind IN ('collection', 'payout', 'sms')", name="kind"),
    # a sent SMS carries no money (amount 0); a payment always does
    CheckConstraint("CASE WHEN kind = 'sms' THEN amount = 0 ELSE amount > 0 END",
                    name="amount_positive"),
    # instants a Python reader can hold (ledger.instants; migration 0012, NOT VALID there)
    CheckConstraint("initiated_at >= '1900-01-01 00:00+00' AND "
                    "initiated_at < '9998-01-01 00:00+00'", name="initiated_at_storable"),
)

reconcile_subjects = Table(
    "reconcile_subjects", metadata,
    # when each subject was last asked about, so that none is asked more often than needed
    Column("subject", Text, primary_key=True),
    Column("reference", Text, primary_key=True),
    Column("last_checked_at", _ts(), nullable=False),
    Column("checked_position", BigInteger, nullable=False, server_default="0"),
    Column("next_check_at", _ts()),
    Column("last_result", Text, nullable=False),
    Column("checks", Integer, nullable=False, server_default="0"),
    Column("last_pass", Text),
)
Index(None, reconcile_subjects.c.next_check_at)

reconcile_schedule = Table(
    "reconcile_schedule", metadata,
    # when the last scheduled pass began, whichever process ran it: one an interval in all
    Column("job", Text, primary_key=True),
    Column("began_at", _ts(), nullable=False),
)
