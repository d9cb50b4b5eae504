-- Row -3 of leaf_worker records the highest worker id ever given a row (fence_ms): a claim
-- that must insert the row of an id at or below it finds a row that was deleted, whose holder
-- may still issue, and waits a whole lease. Row -1 (the instance record) is not written here:
-- a start that creates the schema records it after the migrations (no holder ever, no wait);
-- a table without it (a wipe, even just before an upgrade) makes its claimants wait a lease.
-- Additive and repeatable (an existing record is kept).
INSERT OR IGNORE INTO leaf_worker (worker_id, owner, lease_until, fence_ms)
SELECT -3, 'ids', 0, COALESCE(MAX(worker_id), -1) FROM leaf_worker WHERE worker_id >= 0;
