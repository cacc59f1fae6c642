-- Append a batch in one statement. Rows are processed in array order, so positions (given
-- by the BEFORE INSERT trigger under the append lock) follow the batch's order. A row whose
-- dedupe key is already in the ledger is skipped and not returned. Event ids come from the
-- writer (ledger/store.py says why).
INSERT INTO hookledger_private.ledger_events
    (event_id, stream, event_type, source, dedupe_key, endpoint, verified_by, raw_body,
     headers, payload, facts, occurred_at, received_at)
SELECT event_id, stream, event_type, source, dedupe_key, endpoint, verified_by, raw_body,
       headers::jsonb, payload::jsonb, facts::jsonb, occurred_at, received_at
FROM unnest(
    %(event_id)b::uuid[], %(stream)b::text[], %(event_type)b::text[], %(source)b::text[],
    %(dedupe_key)b::text[], %(endpoint)b::text[], %(verified_by)b::text[],
    %(raw_body)b::bytea[], %(headers)b::text[], %(payload)b::text[], %(facts)b::text[],
    %(occurred_at)b::timestamptz[], %(received_at)b::timestamptz[]
) WITH ORDINALITY AS batch(event_id, stream, event_type, source, dedupe_key, endpoint,
                           verified_by, raw_body, headers, payload, facts, occurred_at,
                           received_at, ord)
ORDER BY ord
ON CONFLICT ON CONSTRAINT uq_ledger_events_dedupe_key DO NOTHING
RETURNING position, dedupe_key
