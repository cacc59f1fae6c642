"""Projection tables for the general system, their checkpoints, and the contract views.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22
"""

from __future__ import annotations

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

UPGRADE = r"""
CREATE TABLE hookledger_private.projection_checkpoints (
    name        text        NOT NULL,
    position    bigint      NOT NULL DEFAULT 0,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT pk_projection_checkpoints PRIMARY KEY (name)
);
INSERT INTO hookledger_private.projection_checkpoints (name)
VALUES ('payments'), ('payouts'), ('invoices'), ('sms_messages'), ('chat_messages'),
       ('chat_threads');

CREATE TABLE hookledger_private.payments (
    reference          text        NOT NULL,
    status             text,
    outcome            text        NOT NULL,
    code               integer,
    amount             numeric,
    last_event         text        NOT NULL,
    updated_at         timestamptz,
    transaction_id     text,
    customer_reference text,
    phone_number       text,
    mno                text,
    invoice_no         text,
    winner             jsonb       NOT NULL,
    provenance         jsonb       NOT NULL,
    evidence           jsonb       NOT NULL,
    conflicted         boolean     NOT NULL,
    event_count        integer     NOT NULL,
    last_position      bigint      NOT NULL,
    CONSTRAINT pk_payments PRIMARY KEY (reference)
);

CREATE TABLE hookledger_private.payouts (
    reference          text        NOT NULL,
    status             text,
    outcome            text        NOT NULL,
    code               integer,
    amount             numeric,
    last_event         text        NOT NULL,
    updated_at         timestamptz,
    transaction_id     text,
    customer_reference text,
    refunded_to_wallet boolean     NOT NULL,
    winner             jsonb       NOT NULL,
    provenance         jsonb       NOT NULL,
    evidence           jsonb       NOT NULL,
    conflicted         boolean     NOT NULL,
    event_count        integer     NOT NULL,
    last_position      bigint      NOT NULL,
    CONSTRAINT pk_payouts PRIMARY KEY (reference)
);

CREATE TABLE hookledger_private.invoices (
    invoice_no         text        NOT NULL,
    status             text        NOT NULL,
    total              numeric,
    amount_paid        numeric,
    amount_due         numeric,
    currency           text,
    due_date           date,
    paid_date          timestamptz,
    payment_reference  text,
    settled            boolean     NOT NULL,
    cancelled          boolean     NOT NULL,
    paid_event         boolean     NOT NULL,
    block_key          jsonb,
    provenance         jsonb       NOT NULL,
    conflicted         boolean     NOT NULL,
    event_count        integer     NOT NULL,
    last_position      bigint      NOT NULL,
    updated_at         timestamptz,
    last_event         text,
    CONSTRAINT pk_invoices PRIMARY KEY (invoice_no)
);

CREATE TABLE hookledger_private.sms_messages (
    message_id         text        NOT NULL,
    recipient          text,
    status             text        NOT NULL,
    code               integer,
    updated_at         timestamptz,
    winner             jsonb       NOT NULL,
    provenance         jsonb       NOT NULL,
    statuses           jsonb       NOT NULL,
    conflicted         boolean     NOT NULL,
    event_count        integer     NOT NULL,
    last_position      bigint      NOT NULL,
    CONSTRAINT pk_sms_messages PRIMARY KEY (message_id)
);

CREATE TABLE hookledger_private.chat_messages (
    message_id         text        NOT NULL,
    phone_number_id    text,
    contact_wa_id      text,
    direction          text,
    type               text,
    body               text,
    media_id           text,
    status             text        NOT NULL,
    code               integer,
    error_code         text,
    error_title        text,
    updated_at         timestamptz,
    received_at        timestamptz,
    sent_at            timestamptz,
    delivered_at       timestamptz,
    read_at            timestamptz,
    failed_at          timestamptz,
    winner             jsonb       NOT NULL,
    provenance         jsonb       NOT NULL,
    event_count        integer     NOT NULL,
    last_position      bigint      NOT NULL,
    CONSTRAINT pk_chat_messages PRIMARY KEY (message_id)
);

CREATE TABLE hookledger_private.chat_threads (
    thread_key         text        NOT NULL,
    phone_number_id    text        NOT NULL,
    contact_wa_id      text        NOT NULL,
    profile_name       text,
    last_inbound_at    timestamptz,
    window_expires_at  timestamptz,
    last_message_id    text,
    provenance         jsonb       NOT NULL,
    event_count        integer     NOT NULL,
    last_position      bigint      NOT NULL,
    CONSTRAINT pk_chat_threads PRIMARY KEY (thread_key)
);

CREATE VIEW hookledger.payments AS
SELECT reference, status, outcome, code, amount, transaction_id, customer_reference,
       phone_number, mno, last_event, updated_at,
       invoice_no, conflicted, event_count, last_position
FROM hookledger_private.payments;

CREATE VIEW hookledger.payouts AS
SELECT reference, status, outcome, code, amount, refunded_to_wallet, updated_at,
       last_event, transaction_id, customer_reference, conflicted, event_count, last_position
FROM hookledger_private.payouts;

CREATE VIEW hookledger.invoices AS
SELECT invoice_no, status, total, amount_paid, amount_due, currency, due_date, paid_date,
       payment_reference, settled,
       updated_at, last_event, conflicted, event_count, last_position
FROM hookledger_private.invoices;

CREATE VIEW hookledger.sms_messages AS
SELECT message_id, recipient, status, code, updated_at,
       conflicted, event_count, last_position
FROM hookledger_private.sms_messages;

-- window_open is computed against the current time when the view is read
CREATE VIEW hookledger.chat_threads AS
SELECT phone_number_id, contact_wa_id, profile_name, last_inbound_at, window_expires_at,
       (window_expires_at IS NOT NULL AND window_expires_at > now()) AS window_open,
       last_message_id, event_count
FROM hookledger_private.chat_threads;

CREATE VIEW hookledger.chat_messages AS
SELECT message_id, phone_number_id, contact_wa_id, direction, type, body, media_id, status,
       code, error_code, error_title, updated_at,
       received_at, sent_at, delivered_at, read_at, failed_at, event_count, last_position
FROM hookledger_private.chat_messages;
"""

DOWNGRADE = r"""
DROP VIEW IF EXISTS hookledger.chat_messages;
DROP VIEW IF EXISTS hookledger.chat_threads;
DROP TABLE IF EXISTS hookledger_private.chat_messages;
DROP TABLE IF EXISTS hookledger_private.chat_threads;
DROP VIEW IF EXISTS hookledger.sms_messages;
DROP VIEW IF EXISTS hookledger.invoices;
DROP VIEW IF EXISTS hookledger.payouts;
DROP VIEW IF EXISTS hookledger.payments;
DROP TABLE IF EXISTS hookledger_private.sms_messages;
DROP TABLE IF EXISTS hookledger_private.invoices;
DROP TABLE IF EXISTS hookledger_private.payouts;
DROP TABLE IF EXISTS hookledger_private.payments;
DROP TABLE IF EXISTS hookledger_private.projection_checkpoints;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
