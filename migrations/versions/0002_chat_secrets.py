"""Chat webhook secrets per connected number, with rotation history.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23
"""

from __future__ import annotations

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

UPGRADE = r"""
-- One row per secret a number has had. The current secret has retired_at NULL; a rotated-out
-- secret keeps verifying until retired_at + HOOKLEDGER_ROTATION_GRACE_S (deliveries queued
-- before the rotation were signed with it). label is a short fingerprint of the secret
-- (sha256 prefix), the only thing about a secret that is ever logged.
CREATE TABLE hookledger_private.chat_secrets (
    id               bigint      GENERATED ALWAYS AS IDENTITY,
    phone_number_id  text        NOT NULL,
    secret           text        NOT NULL,
    label            text        NOT NULL,
    source           text        NOT NULL,
    created_at       timestamptz NOT NULL,
    retired_at       timestamptz,
    CONSTRAINT pk_chat_secrets PRIMARY KEY (id),
    CONSTRAINT uq_chat_secrets_phone_number_id_secret UNIQUE (phone_number_id, secret),
    CONSTRAINT ck_chat_secrets_source CHECK (source IN ('bootstrap', 'rotation')),
    CONSTRAINT ck_chat_secrets_retired_after_created
        CHECK (retired_at IS NULL OR retired_at >= created_at)
);
-- At most one current secret per number: a rotation retires the old one in its transaction.
CREATE UNIQUE INDEX ix_chat_secrets_current
    ON hookledger_private.chat_secrets (phone_number_id) WHERE retired_at IS NULL;
"""

DOWNGRADE = r"""
DROP TABLE IF EXISTS hookledger_private.chat_secrets;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
