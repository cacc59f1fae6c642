-- Appends are serialised and become visible in position order (migration 0001), so reading
-- "after the last position seen" can never pass over an event that commits later.
-- A delivery's payload is stored once, as its raw bytes (migration 0009).
SELECT position, event_id, stream, event_type, source, dedupe_key,
       coalesce(payload, convert_from(raw_body, 'UTF8')::jsonb) AS payload, facts,
       received_at, recorded_at, occurred_at, raw_body, headers, endpoint, verified_by
FROM hookledger_private.ledger_events
WHERE position > %(after)s
ORDER BY position
LIMIT %(limit)s
