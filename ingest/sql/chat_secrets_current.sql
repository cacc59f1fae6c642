SELECT label, created_at
FROM hookledger_private.chat_secrets
WHERE phone_number_id = %(phone_number_id)s AND retired_at IS NULL
