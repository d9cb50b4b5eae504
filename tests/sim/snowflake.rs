//! A node's snowflake side in the simulation: the real lease coordinator (`leaf_worker` in the
//! simulated database, through the node's faulty connection), the real time fence in a file of
//! the node's state directory (a real directory, kept across kills, lost with the disk) and the
//! real engine on the node's clock. A start retries as the app's does until it holds an id.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leafd::clock::Clock;
use leafd::coord::fence::FenceSettings;
use leafd::coord::fence_file::FenceFile;
use leafd::coord::lease::LeaseCoordinator;
use leafd::coord::Worker;
use leafd::engine::snowflake::{Layout, SnowflakeEngine};
use leafd::storage::WorkerLeaseStore;
use tokio::task::JoinHandle;

use super::trace::Trace;

/// 4 worker ids for up to 5 nodes (some wait for an id), sequence bits to spare.
pub fn layout() -> Layout {
    Layout {
        worker_bits: 2,
        sequence_bits: 20,
        ..Layout::default()
    }
}

/// The lease every node runs (`snowflake.database_lease_ms`).
pub const LEASE_MS: u64 = 2000;

/// One incarnation's snowflake side: starting, then serving.
pub struct SnowflakeRun {
    pub engine: Arc<Mutex<Option<Arc<SnowflakeEngine>>>>,
    worker: Arc<Mutex<Option<Worker>>>,
    starting: JoinHandle<()>,
}

impl SnowflakeRun {
    /// Starts acquiring an id in the background: `coord::start` with the lease coordinator,
    /// again a second after each refusal.
    pub fn start(
        store: Arc<dyn WorkerLeaseStore>,
        clock: Arc<dyn Clock>,
        state_dir: PathBuf,
        name: String,
        trace: Arc<Trace>,
    ) -> SnowflakeRun {
        let engine = Arc::new(Mutex::new(None));
        let worker = Arc::new(Mutex::new(None));
        let (engine_slot, worker_slot) = (engine.clone(), worker.clone());
        let starting = tokio::spawn(async move {
            let layout = layout();
            let coordinator = LeaseCoordinator {
                store,
                endpoint: format!("{name}:6380"),
                max_worker_id: layout.max_worker_id(),
                lease_ms: LEASE_MS,
                clock: clock.clone(),
                state_file: state_dir.join("snowflake-worker-db.json"),
                layout: Arc::new(layout),
                link: None,
            };
            let settings = FenceSettings {
                window_ms: 2000,
                max_start_wait_ms: 5000,
            };
            loop {
                let fence = FenceFile::new(state_dir.join("snowflake-fence.json"));
                match leafd::coord::start(&coordinator, &layout, fence, settings, clock.clone())
                    .await
                {
                    Ok(held) => {
                        trace.note(format!(
                            "{name} holds worker id {} from {} ms",
                            held.worker_id,
                            clock.now_millis()
                        ));
                        let engine = SnowflakeEngine::new(
                            layout,
                            held.worker_id,
                            5,
                            clock.clone(),
                            held.limit.clone(),
                            Duration::from_millis(100),
                        )
                        .with_floor(held.floor_ms);
                        *engine_slot.lock().unwrap() = Some(Arc::new(engine));
                        *worker_slot.lock().unwrap() = Some(held);
                        return;
                    }
                    Err(e) => {
                        trace.note(format!("{name} snowflake start refused: {e}"));
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
            }
        });
        SnowflakeRun {
            engine,
            worker,
            starting,
        }
    }

    /// The engine once an id is held.
    pub fn engine(&self) -> Option<Arc<SnowflakeEngine>> {
        self.engine.lock().unwrap().clone()
    }

    /// SIGKILL: the start stops wherever it is, the fence and the lease stop moving.
    pub fn kill(self) {
        self.starting.abort();
        if let Some(worker) = self.worker.lock().unwrap().take() {
            worker.abandon();
        }
    }
}
