-- Received media messages looked at again (``again``: positions already read, all at or
-- before ``after``, so first in order and never cut off by the limit) and up to ``limit``
-- new ones after ``after``, each with the outcomes recorded so far for its media id (its
-- stream ``chat-media:<id>``, found through the (stream, position) index).
SELECT r.position,
       r.facts->>'media_id' AS media_id,
       r.facts->>'message_id' AS message_id,
       r.facts->>'phone_number_id' AS phone_number_id,
       o.fetched,
       o.failures,
       o.last_failed_at,
       o.refusals
FROM hookledger_private.ledger_events r
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
WHERE r.event_type = 'chat.message.received'
  AND (r.position > %(after)s OR r.position = ANY(%(again)s::bigint[]))
  AND r.facts->>'media_id' IS NOT NULL
  AND r.facts->>'message_type' = ANY(%(kinds)s)
ORDER BY r.position
LIMIT %(limit)s + cardinality(%(again)s::bigint[])
