-- Snowflake worker ids leased from the segment database (snowflake.coordinator = "database"):
-- one row per worker id; lease_until and fence_ms are UNIX milliseconds, lease_until in the
-- database's own time, fence_ms in the holder's clock (its next holder starts past it).
CREATE TABLE IF NOT EXISTS leaf_worker (
    worker_id   BIGINT     NOT NULL PRIMARY KEY,
    owner       VARCHAR(255) NOT NULL,
    lease_until BIGINT     NOT NULL,
    fence_ms    BIGINT     NOT NULL DEFAULT 0
);
