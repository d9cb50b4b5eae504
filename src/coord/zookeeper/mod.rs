//! Leaf-snowflake's ZooKeeper coordinator. Tree under `{root}/{cluster}`:
//! `forever/{ip}:{port}-{id}` (persistent: last report and fence) and `alive/{id}` (ephemeral:
//! the lock that makes a worker id one session's at a time).

mod cache;
mod layout;
mod registry;
mod supervisor;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use self::registry::Registry;
use super::{CoordError, Coordinator, HeldWorker, LayoutRecord};
use crate::clock::Clock;
use crate::config::ZookeeperConfig;
use crate::coord::IssueLimit;

/// Connection state for INFO and metrics.
#[derive(Debug, Default)]
pub struct ZkShared {
    connected: AtomicBool,
    last_report_ms: AtomicU64,
}

impl super::CoordinatorStatus for ZkShared {
    fn kind(&self) -> &'static str {
        "zookeeper"
    }

    fn connected(&self) -> bool {
        self.connected.load(Ordering::Relaxed)
    }

    /// Clock time of the last successful time report (or of the start from the cache).
    fn last_report_ms(&self) -> u64 {
        self.last_report_ms.load(Ordering::Relaxed)
    }
}

/// A worker id held through ZooKeeper, kept by a background task until closed.
pub struct ZkWorker {
    pub worker_id: u64,
    pub shared: Arc<ZkShared>,
    /// The lease this registration maintains: the fence last written into ZooKeeper.
    pub limit: Arc<IssueLimit>,
    /// The fence the id's previous holder left in ZooKeeper.
    pub floor_ms: u64,
    lease_ms: u64,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl ZkWorker {
    /// Stops reporting and removes the liveness node (the persistent node keeps the id).
    pub async fn close(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}

#[async_trait]
impl HeldWorker for ZkWorker {
    fn worker_id(&self) -> u64 {
        self.worker_id
    }

    fn floor_ms(&self) -> u64 {
        self.floor_ms
    }

    fn floor_wait_ms(&self) -> u64 {
        self.lease_ms
    }

    async fn close(self: Box<Self>, _last_issued_ms: Option<u64>) {
        ZkWorker::close(*self).await
    }
}

/// The coordinator as the application uses it.
pub struct ZkCoordinator {
    pub cfg: ZookeeperConfig,
    pub endpoint: String,
    pub max_worker_id: u64,
    pub clock: Arc<dyn Clock>,
    /// Filled by `acquire`, for INFO and metrics.
    pub shared: Arc<ZkShared>,
    /// The snowflake layout this node issues in; ZooKeeper records the cluster's.
    pub layout: Arc<dyn LayoutRecord>,
}

#[async_trait]
impl Coordinator for ZkCoordinator {
    fn kind(&self) -> &'static str {
        "zookeeper"
    }

    fn status(&self) -> Option<Arc<dyn super::CoordinatorStatus>> {
        Some(self.shared.clone())
    }

    async fn acquire(&self, limit: Arc<IssueLimit>) -> Result<Box<dyn HeldWorker>, CoordError> {
        let worker = acquire_into(
            &self.cfg,
            &self.endpoint,
            self.max_worker_id,
            self.layout.as_ref(),
            self.clock.clone(),
            limit,
            self.shared.clone(),
        )
        .await?;
        Ok(Box::new(worker))
    }
}

/// Obtains this node's worker id from ZooKeeper (or, if ZooKeeper is unreachable, from the
/// local cache) and starts the task that reports the time and the fence.
pub async fn acquire(
    cfg: &ZookeeperConfig,
    endpoint: &str,
    max_worker_id: u64,
    layout: &dyn LayoutRecord,
    clock: Arc<dyn Clock>,
) -> Result<ZkWorker, CoordError> {
    let limit = Arc::new(IssueLimit::unbounded());
    acquire_into(
        cfg,
        endpoint,
        max_worker_id,
        layout,
        clock,
        limit,
        Arc::default(),
    )
    .await
}

/// The fence a start from the cache may issue up to, or why it may not start. While ZooKeeper
/// cannot be asked, another layout may have taken the cluster over, or another node this worker
/// id (reuse); both start above every fence recorded, so IDs below this node's last fence are
/// the only ones it can be sure of. A cache without a fence or of another layout proves nothing.
fn cache_start(
    registry: &Registry,
    cached: &cache::CachedWorker,
    unreachable: &zookeeper_client::Error,
) -> Result<u64, CoordError> {
    let refuse = |why: String| {
        CoordError::Unreachable(format!(
            "{unreachable}; the worker-id cache {} {why}: start once with ZooKeeper answering",
            registry.cfg.cache_file
        ))
    };
    match (&cached.layout, cached.fence_ms) {
        (Some(layout), Some(fence)) if *layout == registry.layout => Ok(fence),
        (Some(layout), Some(_)) => Err(refuse(format!(
            "was written in layout {layout} and this node issues {}; a layout changes only with ZooKeeper answering",
            registry.layout
        ))),
        _ => Err(refuse(
            "was written by an older release (no fence or layout in it)".into(),
        )),
    }
}

async fn acquire_into(
    cfg: &ZookeeperConfig,
    endpoint: &str,
    max_worker_id: u64,
    layout: &dyn LayoutRecord,
    clock: Arc<dyn Clock>,
    limit: Arc<IssueLimit>,
    shared: Arc<ZkShared>,
) -> Result<ZkWorker, CoordError> {
    let base = format!("{}/{}", cfg.root, cfg.cluster);
    let registry = Arc::new(Registry {
        cfg: cfg.clone(),
        endpoint: endpoint.to_string(),
        max_worker_id,
        clock: clock.clone(),
        forever: format!("{base}/forever"),
        alive: format!("{base}/alive"),
        layout: layout.descriptor(),
    });
    let cached = registry.read_cache()?;
    let previous_session = cached.as_ref().and_then(|c| c.session_id);
    let now = clock.now_millis();
    // The first lease: after a report it runs to the fence written; started from the cache, one
    // lease from now but never past the fence the cache holds (see `cache_start`).
    let (client, registered, lease) = match registry.connect().await {
        Ok(client) => {
            layout::adopt(&registry, &client, layout).await?;
            let registered = registry.register(&client, previous_session).await?;
            // Again once this node is alive: a node of another layout that took the record
            // over in between (this one paused) saw no live node; from now on it would.
            let now_recorded = layout::recorded(&registry, &client).await?;
            if now_recorded.as_deref() != Some(registry.layout.as_str()) {
                return Err(CoordError::LayoutChange(format!(
                    "the layout recorded in {} changed to {} while this node ({}) registered",
                    registry.layout_path(),
                    now_recorded.as_deref().unwrap_or("nothing"),
                    registry.layout
                )));
            }
            registry.check_skew(&client, &registered).await?;
            shared.connected.store(true, Ordering::Relaxed);
            tracing::info!(worker_id = registered.id, node = %registry.forever_path(&registered.child), "snowflake worker id from ZooKeeper");
            let lease = (now + cfg.lease_ms, supervisor::lease_problem(now));
            (Some(client), registered, lease)
        }
        Err(e) => {
            let cached = cached.ok_or_else(|| CoordError::Unreachable(e.to_string()))?;
            let fence = cache_start(&registry, &cached, &e)?;
            tracing::warn!(worker_id = cached.worker_id, fence_ms = fence, error = %e, "ZooKeeper unreachable; using the cached worker id up to the fence of its last report, reconnecting in the background");
            let lease = (
                fence.min(now + cfg.lease_ms),
                format!(
                    "started from the worker-id cache while ZooKeeper is unreachable: no ID past the fence of the last report ({fence} ms, UNIX time), which another node may start above"
                ),
            );
            let registered = registry::Registered {
                id: cached.worker_id,
                child: registry.own_child(cached.worker_id),
                floor_ms: cached.last_timestamp_ms,
            };
            (None, registered, lease)
        }
    };
    limit.set_lease(lease.0, Some(lease.1));
    shared.last_report_ms.store(now, Ordering::Relaxed);
    let stop = CancellationToken::new();
    let worker_id = registered.id;
    let floor_ms = registered.floor_ms;
    let task = tokio::spawn(supervisor::supervise(
        registry,
        shared.clone(),
        limit.clone(),
        client,
        registered,
        stop.clone(),
    ));
    Ok(ZkWorker {
        worker_id,
        shared,
        limit,
        floor_ms,
        lease_ms: cfg.lease_ms,
        stop,
        task,
    })
}
