"""The declared schema of the projection tables (migration 0003 creates them)."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Date,
    DateTime,
    Index,
    Integer,
    Numeric,
    Table,
    Text,
)
from sqlalchemy.dialects.postgresql import JSONB

from ledger.schema import metadata


def _ts() -> DateTime:
    return DateTime(timezone=True)


projection_checkpoints = Table(
    "projection_checkpoints", metadata,
    Column("name", Text, primary_key=True),
    Column("position", BigInteger, nullable=False, server_default="0"),
    Column("updated_at", _ts(), nullable=False, server_default="now()"),
)


def _money_table(name: str, *extra: Column) -> Table:
    return Table(
        name, metadata,
        Column("reference", Text, primary_key=True),
        Column("status", Text),
        Column("outcome", Text, nullable=False),
        Column("code", Integer),
        Column("amount", Numeric),
        Column("last_event", Text, nullable=False),
        Column("updated_at", _ts()),
        Column("transaction_id", Text),
        Column("customer_reference", Text),
        *extra,
        Column("winner", JSONB, nullable=False),
        Column("provenance", JSONB, nullable=False),
        Column("evidence", JSONB, nullable=False),
        Column("conflicted", Boolean, nullable=False),
        Column("event_count", Integer, nullable=False),
        Column("last_position", BigInteger, nullable=False),
    )


payments = _money_table("payments", Column("phone_number", Text), Column("mno", Text),
                        Column("invoice_no", Text))
payouts = _money_table("payouts", Column("refunded_to_wallet", Boolean, nullable=False))

invoices = Table(
    "invoices", metadata,
    Column("invoice_no", Text, primary_key=True),
    Column("status", Text, nullable=False),
    Column("total", Numeric),
    Column("amount_paid", Numeric),
    Column("amount_due", Numeric),
    Column("currency", Text),
    Column("due_date", Date),
    Column("paid_date", _ts()),
    Column("payment_reference", Text),
    Column("settled", Boolean, nullable=False),
    Column("cancelled", Boolean, nullable=False),
    Column("paid_event", Boolean, nullable=False),
    Column("block_key", JSONB),
    Column("provenance", JSONB, nullable=False),
    Column("conflicted", Boolean, nullable=False),
    Column("event_count", Integer, nullable=False),
    Column("last_position", BigInteger, nullable=False),
    Column("updated_at", _ts()),
    Column("last_event", Text),
)

sms_messages = Table(
    "sms_messages", metadata,
    Column("message_id", Text, primary_key=True),
    Column("recipient", Text),
    Column("status", Text, nullable=False),
    Column("code", Integer),
    Column("updated_at", _ts()),
    Column("winner", JSONB, nullable=False),
    Column("provenance", JSONB, nullable=False),
    Column("statuses", JSONB, nullable=False),
    Column("conflicted", Boolean, nullable=False),
    Column("event_count", Integer, nullable=False),
    Column("last_position", BigInteger, nullable=False),
)

chat_messages = Table(
    "chat_messages", metadata,
    Column("message_id", Text, primary_key=True),
    Column("phone_number_id", Text),
    Column("contact_wa_id", Text),
    Column("direction", Text),
    Column("type", Text),
    Column("body", Text),
    Column("media_id", Text),
    Column("status", Text, nullable=False),
    Column("code", Integer),
    Column("error_code", Text),
    Column("error_title", Text),
    Column("updated_at", _ts()),
    Column("received_at", _ts()),
    Column("sent_at", _ts()),
    Column("delivered_at", _ts()),
    Column("read_at", _ts()),
    Column("failed_at", _ts()),
    Column("winner", JSONB, nullable=False),
    Column("provenance", JSONB, nullable=False),
    Column("event_count", Integer, nullable=False),
    Column("last_position", BigInteger, nullable=False),
)

chat_threads = Table(
    "chat_threads", metadata,
    Column("thread_key", Text, primary_key=True),
    Column("phone_number_id", Text, nullable=False),
    Column("contact_wa_id", Text, nullable=False),
    Column("profile_name", Text),
    Column("last_inbound_at", _ts()),
    Column("window_expires_at", _ts()),
    Column("last_message_id", Text),
    Column("provenance", JSONB, nullable=False),
    Column("event_count", Integer, nullable=False),
    Column("last_position", BigInteger, nullable=False),
)

payments.append_column(Column("recovered", Boolean, nullable=False, server_default="false"))
payouts.append_column(Column("recovered", Boolean, nullable=False, server_default="false"))

discrepancies = Table(
    "discrepancies", metadata,
    Column("id", Text, primary_key=True),
    Column("kind", Text, nullable=False),
    Column("subject", Text, nullable=False),
    Column("service", Text, nullable=False),
    Column("reference", Text, nullable=False),
    Column("detail", Text, nullable=False),
    Column("amount_at_risk", Numeric),
    Column("status", Text, nullable=False),
    Column("detected_at", _ts()),
    Column("resolved_at", _ts()),
    Column("resolution", Text),
    Column("detected_by", Text),
    Column("facts", JSONB, nullable=False),
    Column("event_count", Integer, nullable=False),
    Column("last_position", BigInteger, nullable=False),
    Column("resolved_by", Text),  # who: admin (a person) or reconciler; migration 0013
)
Index(None, discrepancies.c.status, discrepancies.c.kind)
Index(None, discrepancies.c.subject, discrepancies.c.reference)
