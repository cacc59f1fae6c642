-- Serialises writers of one number's secrets (bootstrap in several processes, rotation);
-- readers never take it. Named in pg_catalog: a hashtextextended(text, integer) that any
-- role may create in public (PostgreSQL 13 and 14) matched the literal 0 better than
-- PostgreSQL's own, and ran with this session's rights.
SELECT pg_catalog.pg_advisory_xact_lock(
    pg_catalog.hashtextextended('hookledger.chat_secrets:' || %(phone_number_id)s, 0))
