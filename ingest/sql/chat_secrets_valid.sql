-- The current secret first (it signs nearly everything), then the most recently retired.
SELECT label, secret, retired_at
FROM hookledger_private.chat_secrets
WHERE phone_number_id = %(phone_number_id)s
  AND (retired_at IS NULL OR retired_at > %(since)s)
ORDER BY retired_at IS NOT NULL, retired_at DESC, id DESC
