-- Row -1 of leaf_worker records the database instance that answers claims. A database created
-- by the migrations starts it as 'new': the first claim then takes over at once. A row -1 that
-- is missing on a migrated database means leaf_worker lost its rows (DELETE, TRUNCATE, a
-- restore of an empty table) while nodes may still issue: claimants then wait a whole lease.
-- Additive and repeatable (an existing record is kept).
INSERT INTO leaf_worker (worker_id, owner, lease_until, fence_ms) VALUES (-1, 'new', 0, 0)
ON CONFLICT (worker_id) DO NOTHING;
