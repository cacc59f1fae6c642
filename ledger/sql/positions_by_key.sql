SELECT dedupe_key, position
FROM hookledger_private.ledger_events
WHERE dedupe_key = ANY(%(keys)s::text[])
