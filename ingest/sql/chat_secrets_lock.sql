-- Serialises writers of one number's secrets (bootstrap in several processes, rotation);
-- readers never take it.
SELECT pg_advisory_xact_lock(hashtextextended('hookledger.chat_secrets:' || %(phone_number_id)s, 0))
