-- Received media messages looked at again (``again``: positions already read) and up to
-- ``limit`` new ones after ``after``, each with the outcomes recorded so far for its media
-- id (its stream ``chat-media:<id>``, found through the (stream, position) index).
-- Two branches, not one ``position > after OR position = ANY(again)``: with the OR the
-- scan of new rows no longer starts at ``after`` in the primary key, and every poll (with
-- a prepared, generic plan) read the ledger from its first position.
SELECT r.position,
       r.facts->>'media_id' AS media_id,
       r.facts->>'message_id' AS message_id,
       r.facts->>'phone_number_id' AS phone_number_id,
       o.fetched,
       o.failures,
       o.last_failed_at,
       o.refusals
FROM (
    (SELECT position, facts
     FROM hookledger_private.ledger_events
     WHERE position = ANY(%(again)s::bigint[]))  -- rows read before: media messages
    UNION ALL
    (SELECT position, facts
     FROM hookledger_private.ledger_events
     WHERE event_type = 'chat.message.received'
       AND position > %(after)s
       AND facts->>'media_id' IS NOT NULL
       AND facts->>'message_type' = ANY(%(kinds)s)
     ORDER BY position
     LIMIT %(limit)s)
) r
CROSS JOIN LATERAL (
    SELECT coalesce(bool_or(e.event_type = 'chat.media.fetched'), false) AS fetched,
           count(*) FILTER (WHERE e.event_type = 'chat.media.failed') AS failures,
           max(e.received_at) FILTER (WHERE e.event_type = 'chat.media.failed')
               AS last_failed_at,
           -- what counts toward giving up: not an API that gave no usable answer (older
           -- events, written before the flag, count as they always did)
           count(*) FILTER (WHERE e.event_type = 'chat.media.failed'
                              AND NOT coalesce((e.facts->>'retryable')::boolean, false))
               AS refusals
    FROM hookledger_private.ledger_events e
    WHERE e.stream = 'chat-media:' || (r.facts->>'media_id')
) o
ORDER BY r.position
