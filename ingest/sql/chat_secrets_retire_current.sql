-- GREATEST: another process's clock may be a little behind the one that created the row.
UPDATE hookledger_private.chat_secrets
SET retired_at = GREATEST(%(now)s, created_at)
WHERE phone_number_id = %(phone_number_id)s AND retired_at IS NULL
RETURNING label
