-- Appends are serialised and become visible in position order (migration 0001), so reading
-- "after the last position seen" can never pass over an event that commits later.
SELECT position, event_id, stream, event_type, source, dedupe_key, payload, facts,
       received_at, recorded_at, occurred_at, raw_body, headers, endpoint, verified_by
FROM hookledger_private.ledger_events
WHERE position > %(after)s
ORDER BY position
LIMIT %(limit)s
