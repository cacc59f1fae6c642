-- One rotation of a number at a time, held from before the provider is asked until the new
-- secret is stored (in a transaction of its own, on a connection of its own: ended however
-- the rotation ends). Another key than chat_secrets_lock.sql's, which the store takes on
-- another connection meanwhile. Tried, not waited for: a second rotation is refused.
-- Named in pg_catalog, as chat_secrets_lock.sql's.
SELECT pg_catalog.pg_try_advisory_xact_lock(
    pg_catalog.hashtextextended('hookledger.chat_secrets.rotation:' || %(phone_number_id)s, 0))
