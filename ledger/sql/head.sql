SELECT coalesce(max(position), 0) AS head
FROM hookledger_private.ledger_events
