-- The light read for consumers that fold facts: no raw body, payload or headers.
SELECT position, event_id, stream, event_type, source, dedupe_key, NULL::jsonb AS payload,
       facts, received_at, recorded_at, occurred_at, NULL::bytea AS raw_body,
       '{}'::jsonb AS headers, endpoint, verified_by
FROM hookledger_private.ledger_events
WHERE position > %(after)s
ORDER BY position
LIMIT %(limit)s
