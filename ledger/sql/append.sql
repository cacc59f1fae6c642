-- Append a batch in one statement. Rows are processed in array order, so positions (given
-- by the BEFORE INSERT trigger under the append lock) follow the batch's order. A row whose
-- dedupe key is already in the ledger is skipped and not returned.
INSERT INTO hookledger_private.ledger_events
    (stream, event_type, source, dedupe_key, endpoint, verified_by, raw_body, headers,
     payload, facts, occurred_at, received_at)
SELECT stream, event_type, source, dedupe_key, endpoint, verified_by, raw_body,
       headers::jsonb, payload::jsonb, facts::jsonb, occurred_at, received_at
FROM unnest(
    %(stream)s::text[], %(event_type)s::text[], %(source)s::text[], %(dedupe_key)s::text[],
    %(endpoint)s::text[], %(verified_by)s::text[], %(raw_body)s::bytea[], %(headers)s::text[],
    %(payload)s::text[], %(facts)s::text[], %(occurred_at)s::timestamptz[],
    %(received_at)s::timestamptz[]
) WITH ORDINALITY AS batch(stream, event_type, source, dedupe_key, endpoint, verified_by,
                           raw_body, headers, payload, facts, occurred_at, received_at, ord)
ORDER BY ord
ON CONFLICT ON CONSTRAINT uq_ledger_events_dedupe_key DO NOTHING
RETURNING position, dedupe_key
