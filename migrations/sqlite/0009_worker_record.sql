-- Row -1 of leaf_worker records the database instance that answers claims. A database created
-- by the migrations starts it as 'new': the first claim then takes over at once. A row -1 that
-- is missing on a migrated database means leaf_worker lost its rows (DELETE, TRUNCATE, a
-- restore of an empty table) while nodes may still issue: claimants then wait a whole lease.
-- Row -3 records the highest worker id ever given a row (fence_ms): a claim that must insert
-- the row of an id at or below it finds a row that was deleted, whose holder may still issue,
-- and waits a whole lease. Additive and repeatable (existing records are kept).
INSERT OR IGNORE INTO leaf_worker (worker_id, owner, lease_until, fence_ms) VALUES (-1, 'new', 0, 0);
INSERT OR IGNORE INTO leaf_worker (worker_id, owner, lease_until, fence_ms)
SELECT -3, 'ids', 0, COALESCE(MAX(worker_id), -1) FROM leaf_worker WHERE worker_id >= 0;
