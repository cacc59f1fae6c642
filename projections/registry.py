"""The projections, each a table and a pure fold, applied together by the projector."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ledger import StoredEvent
from projections import chat_folds as c
from projections import discrepancy_folds as d
from projections import general_folds as g
from projections.folding import Discrepancy

Row = g.Row
Fold = Callable[[Row | None, StoredEvent], tuple[Row, list[Discrepancy]]]


@dataclass(frozen=True)
class Projection:
    """One projection table: which subjects an event touches, and how it changes them."""

    table: str
    key_column: str
    keys: Callable[[StoredEvent], list[str]]
    fold: Fold
    columns: tuple[str, ...]
    json_columns: frozenset[str]


MONEY_COLUMNS = ("reference", "status", "outcome", "code", "amount", "last_event",
                 "updated_at", "transaction_id", "customer_reference", "recovered")
BOOKKEEPING = ("winner", "provenance", "evidence", "conflicted", "event_count",
               "last_position")

PROJECTIONS: tuple[Projection, ...] = (
    Projection("payments", "reference", g.payment_keys, g.fold_payment,
               (*MONEY_COLUMNS, "phone_number", "mno", "invoice_no", *BOOKKEEPING),
               frozenset({"winner", "provenance", "evidence"})),
    Projection("payouts", "reference", g.payout_keys, g.fold_payout,
               (*MONEY_COLUMNS, "refunded_to_wallet", *BOOKKEEPING),
               frozenset({"winner", "provenance", "evidence"})),
    Projection("invoices", "invoice_no", g.invoice_keys, g.fold_invoice,
               ("invoice_no", "status", "total", "amount_paid", "amount_due", "currency",
                "due_date", "paid_date", "payment_reference", "settled", "cancelled",
                "paid_event", "block_key", "provenance", "conflicted", "event_count",
                "last_position", "updated_at", "last_event"),
               frozenset({"block_key", "provenance"})),
    Projection("sms_messages", "message_id", g.sms_keys, g.fold_sms,
               ("message_id", "recipient", "status", "code", "updated_at", "winner",
                "provenance", "statuses", "conflicted", "event_count", "last_position"),
               frozenset({"winner", "provenance", "statuses"})),
    Projection("chat_messages", "message_id", c.message_keys, c.fold_message,
               ("message_id", "phone_number_id", "contact_wa_id", "direction", "type", "body",
                "media_id", "status", "code", "error_code", "error_title", "updated_at",
                "received_at", "sent_at", "delivered_at", "read_at", "failed_at", "winner",
                "provenance", "event_count", "last_position"),
               frozenset({"winner", "provenance"})),
    Projection("chat_threads", "thread_key", c.thread_keys, c.fold_thread,
               ("thread_key", "phone_number_id", "contact_wa_id", "profile_name",
                "last_inbound_at", "window_expires_at", "last_message_id", "provenance",
                "event_count", "last_position"),
               frozenset({"provenance"})),
    Projection("discrepancies", "id", d.discrepancy_keys, d.fold_discrepancy,
               ("id", "kind", "subject", "service", "reference", "detail", "amount_at_risk",
                "status", "detected_at", "resolved_at", "resolution", "detected_by", "facts",
                "event_count", "last_position", "resolved_by"),
               frozenset({"facts"})),
)
