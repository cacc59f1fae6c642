-- Keep the newest %(keep)s refused deliveries (ids only grow; a gap only keeps fewer).
DELETE FROM hookledger_private.rejected_deliveries
WHERE id <= (SELECT max(id) FROM hookledger_private.rejected_deliveries) - %(keep)s
