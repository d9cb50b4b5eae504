//! The snowflake side of the wiring: the layout from `[snowflake]`, the configured worker-id
//! coordinator, the time fence and the engine built on them.

use std::sync::Arc;
use std::time::Duration;

use super::AppError;
use crate::clock::Clock;
use crate::config::{Config, CoordinatorKind, SnowflakeConfig};
use crate::coord::fence::FenceSettings;
use crate::coord::fence_file::FenceFile;
use crate::coord::static_id::StaticCoordinator;
use crate::coord::zookeeper::ZkCoordinator;
use crate::coord::{self, CoordError, Coordinator, Worker};
use crate::engine::snowflake::{Layout, SnowflakeEngine};

/// The snowflake layout the `[snowflake]` section describes.
pub fn snowflake_layout(sf: &SnowflakeConfig) -> Layout {
    Layout {
        epoch_ms: sf.epoch_ms,
        timestamp_bits: sf.timestamp_bits,
        worker_bits: sf.worker_id_bits,
        sequence_bits: sf.sequence_bits,
        unit_ms: sf.time_unit_ms,
    }
}

/// The snowflake engine and what keeps its worker id.
#[derive(Default)]
pub(super) struct StartedSnowflake {
    pub engine: Option<Arc<SnowflakeEngine>>,
    pub worker: Option<Worker>,
    /// The coordinator's link status, for INFO and metrics.
    pub coordinator: Option<Arc<dyn coord::CoordinatorStatus>>,
}

/// Obtains the worker id from the configured coordinator, opens the time fence and builds
/// the snowflake engine.
pub(super) async fn start_snowflake(
    config: &Config,
    leases: Option<Arc<dyn crate::storage::WorkerLeaseStore>>,
    clock: Arc<dyn Clock>,
) -> Result<StartedSnowflake, AppError> {
    let sf = &config.snowflake;
    if !sf.enabled {
        return Ok(StartedSnowflake::default());
    }
    let layout = snowflake_layout(sf);
    // A configured fence path that is a symbolic link (dangling until the first fence) stands
    // for the file it names: the worker's file and its lock are derived from that.
    let fence_base = crate::coord::fence_file::follow_link(&sf.fence_path(&config.storage));
    let coordinator: Box<dyn Coordinator> = match sf.coordinator {
        CoordinatorKind::Static => {
            let fence = FenceFile::new(&fence_base).for_worker(sf.worker_id);
            // Beside the file itself, whatever path the configuration gives to it.
            let fence = crate::coord::static_id::resolve_file(fence.path())?;
            let mut beside_fence = fence.as_os_str().to_owned();
            beside_fence.push(".lock");
            let in_state_dir = config
                .storage
                .state_dir()
                .join(format!("snowflake-w{}.lock", sf.worker_id));
            Box::new(StaticCoordinator {
                worker_id: sf.worker_id,
                lock_paths: vec![std::path::PathBuf::from(beside_fence), in_state_dir],
            })
        }
        CoordinatorKind::Zookeeper => {
            let endpoint =
                coord::identity::endpoint(sf.zookeeper.advertise.as_deref(), config.resp_bind())?;
            let mut cfg = sf.zookeeper.clone();
            if cfg.cache_file.is_empty() {
                cfg.cache_file = config
                    .storage
                    .state_dir()
                    .join("snowflake-worker.json")
                    .display()
                    .to_string();
            }
            let zk = ZkCoordinator {
                cfg,
                endpoint,
                max_worker_id: layout.max_worker_id(),
                clock: clock.clone(),
                shared: Arc::default(),
                layout: Arc::new(layout),
            };
            Box::new(zk)
        }
        CoordinatorKind::Database => {
            let store = leases.ok_or_else(|| {
                CoordError::Database(format!(
                    "the database {} is not reachable at start (or has no leaf_worker table); the database coordinator needs it",
                    config.storage.redacted_url()
                ))
            })?;
            lease_coordinator(
                config,
                layout,
                &clock,
                store,
                sf.database_lease_ms,
                "snowflake-worker-db.json",
                None,
            )
        }
        CoordinatorKind::Etcd => {
            let leases = coord::etcd::EtcdLeases::new(&sf.etcd)
                .map_err(|e| CoordError::Database(e.to_string()))?;
            let link = leases.status.clone();
            lease_coordinator(
                config,
                layout,
                &clock,
                Arc::new(leases),
                sf.etcd.lease_ms,
                "snowflake-worker-etcd.json",
                Some(link),
            )
        }
    };
    let settings = FenceSettings {
        window_ms: sf.fence_window_ms,
        max_start_wait_ms: sf.max_start_wait_ms,
    };
    let fence_file = FenceFile::new(fence_base);
    let worker = coord::start(
        coordinator.as_ref(),
        &layout,
        fence_file,
        settings,
        clock.clone(),
    )
    .await?;
    tracing::info!(
        coordinator = worker.kind,
        worker_id = worker.worker_id,
        fence_file = %worker.fence_file.path().display(),
        "snowflake worker id held; time fence open"
    );
    let engine = SnowflakeEngine::new(
        layout,
        worker.worker_id,
        sf.max_backward_ms,
        clock,
        worker.limit.clone(),
        Duration::from_millis(sf.fence_wait_ms),
    )
    .with_floor(worker.floor_ms);
    Ok(StartedSnowflake {
        engine: Some(Arc::new(engine)),
        worker: Some(worker),
        coordinator: coordinator.status(),
    })
}

/// The lease coordinator over `store` (the database's table or etcd), remembering the id it
/// held last in `state_name` in the state directory.
fn lease_coordinator(
    config: &Config,
    layout: Layout,
    clock: &Arc<dyn Clock>,
    store: Arc<dyn crate::storage::WorkerLeaseStore>,
    lease_ms: u64,
    state_name: &str,
    link: Option<Arc<coord::LinkStatus>>,
) -> Box<dyn Coordinator> {
    let endpoint = coord::identity::endpoint(None, config.resp_bind())
        .unwrap_or_else(|_| config.resp_bind().to_string());
    Box::new(coord::lease::LeaseCoordinator {
        store,
        endpoint,
        max_worker_id: layout.max_worker_id(),
        lease_ms,
        clock: clock.clone(),
        state_file: config.storage.state_dir().join(state_name),
        layout: Arc::new(layout),
        link,
    })
}
