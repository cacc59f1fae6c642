-- The light read for consumers that fold facts: no raw body, payload or headers (the
-- reader fills those in as absent without asking the server or decoding anything).
SELECT position, event_id, stream, event_type, source, dedupe_key, facts, received_at,
       recorded_at, occurred_at, endpoint, verified_by
FROM hookledger_private.ledger_events
WHERE position > %(after)s
ORDER BY position
LIMIT %(limit)s
