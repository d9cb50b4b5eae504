//! Snowflake worker ids: a fixed id from the configuration, or Leaf-snowflake's ZooKeeper
//! registration with a local cache file, clock checks and safe reuse of dead nodes' ids.

pub mod cache;
pub mod zookeeper;

/// Why a worker id could not be obtained; every one of these stops the start.
#[derive(Debug, thiserror::Error)]
pub enum CoordError {
    #[error("clock is {0} ms behind this node's last reported time (the clock went back across a restart); refusing to start until it has caught up")]
    ClockBehindLastReport(u64),
    #[error("clock differs from the average of the other live nodes by {skew} ms (limit {max} ms); refusing to start")]
    ClockSkew { skew: i64, max: u64 },
    #[error("no free worker id: {0}")]
    NoFreeWorkerId(String),
    #[error("ZooKeeper unreachable ({0}) and no usable worker-id cache")]
    Unreachable(String),
    #[error("ZooKeeper: {0}")]
    Zookeeper(#[from] zookeeper_client::Error),
    #[error("worker-id cache {path}: {reason}")]
    Cache { path: String, reason: String },
}
