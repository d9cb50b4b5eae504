//! Snowflake worker ids and the time fence: one [`Coordinator`] trait, implemented by the static
//! id, ZooKeeper and the lease coordinator (leases in the database or etcd), and [`start`], which makes any of them
//! safe across restarts.

pub mod etcd;
pub mod fence;
pub mod fence_file;
pub mod identity;
pub mod lease;
mod limit;
mod renewal;
pub mod static_id;
pub mod zookeeper;

pub use limit::IssueLimit;

use std::sync::Arc;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use crate::clock::Clock;
use fence::{FenceKeeper, FenceSettings};
use fence_file::FenceFile;

/// The snowflake layout as the coordinators record it beside fences and leases: they store its
/// descriptor and ask it whether following a recorded layout is safe, knowing nothing of IDs.
pub trait LayoutRecord: Send + Sync {
    fn descriptor(&self) -> String;
    /// The layout's epoch (UNIX ms): the clock must be past it.
    fn epoch_ms(&self) -> u64;
    /// The last millisecond the layout can encode: the clock must not be past it.
    fn last_ms(&self) -> u64;
    /// The highest worker id the layout can encode: a wider one would issue another's IDs.
    fn max_worker_id(&self) -> u64;
    /// `Ok` when every ID this layout issues from `now_ms` on is above every ID the layout
    /// `previous` (a descriptor) could have issued, by any worker, up to `fence_ms`; else why.
    fn may_follow(&self, previous: &str, fence_ms: u64, now_ms: u64) -> Result<(), String>;
}

/// Why a worker id could not be obtained; every one of these stops the start.
#[derive(Debug, thiserror::Error)]
pub enum CoordError {
    #[error("clock is {gap_ms} ms behind {what} (the clock went back across a restart, or the worker id's previous holder used it until then); refusing to start, as the gap is over the {max_wait_ms} ms snowflake.max_start_wait_ms allows")]
    ClockBehindFence {
        gap_ms: u64,
        what: String,
        max_wait_ms: u64,
    },
    #[error("clock differs from the average of the other live nodes by {skew} ms (limit {max} ms); refusing to start")]
    ClockSkew { skew: i64, max: u64 },
    #[error("no free worker id: {0}")]
    NoFreeWorkerId(String),
    #[error("the {kind} coordinator gave worker id {worker_id}, and the snowflake layout has worker ids 0 to {max} only (its IDs would carry worker id {masked}); refusing to start")]
    WorkerIdTooWide {
        kind: &'static str,
        worker_id: u64,
        max: u64,
        masked: u64,
    },
    #[error("ZooKeeper unreachable ({0}) and no usable worker-id cache")]
    Unreachable(String),
    #[error("ZooKeeper: {0}")]
    Zookeeper(#[from] zookeeper_client::Error),
    #[error("worker-id cache {path}: {reason}")]
    Cache { path: String, reason: String },
    #[error("time fence file {0}")]
    Fence(String),
    #[error("snowflake.epoch_ms {epoch_ms} is {ahead_ms} ms in the future; IDs would be negative")]
    EpochInFuture { epoch_ms: u64, ahead_ms: u64 },
    #[error("node identity: {0}")]
    Identity(String),
    #[error("worker-id lease table: {0}")]
    Database(String),
    #[error("the snowflake layout ends at {last_ms} ms (UNIX time), before now: choose a later epoch_ms, more timestamp_bits or a longer time_unit_ms")]
    LayoutEnded { last_ms: u64 },
    #[error("snowflake layout change refused: {0}")]
    LayoutChange(String),
}

/// A worker id a coordinator granted, kept by the coordinator's own task until closed.
#[async_trait]
pub trait HeldWorker: Send + Sync {
    fn worker_id(&self) -> u64;
    /// The time the id's previous holders recorded: no ID may be issued until the clock is
    /// past it (0: nothing recorded).
    fn floor_ms(&self) -> u64;
    /// How far ahead of its clock a holder may have recorded that floor (beyond the usual
    /// start wait, a restart may wait this much longer for it).
    fn floor_wait_ms(&self) -> u64;
    /// Releases the id (stops reports, removes liveness records). `last_issued_ms`: the
    /// timestamp of the last ID issued, once issuing has stopped for good.
    async fn close(self: Box<Self>, last_issued_ms: Option<u64>);
    /// Stops every background task at once and writes nothing more (a process killed with
    /// SIGKILL, as the simulation's kills are): the id stays held until its lease runs out.
    fn abandon(&self) {}
}

/// What a coordinator with a link to a service tells operators (INFO, `/metrics`).
pub trait CoordinatorStatus: Send + Sync {
    /// The coordinator's name: INFO shows `<kind>_connected` and `<kind>_last_report_age_ms`.
    fn kind(&self) -> &'static str;
    /// Whether the link to the service is up now.
    fn connected(&self) -> bool;
    /// Clock time (UNIX ms) of the last report the service accepted.
    fn last_report_ms(&self) -> u64;
}

/// The link of a lease coordinator to its service (etcd): whether the last request was
/// answered, and when a renewal last succeeded.
#[derive(Debug)]
pub struct LinkStatus {
    kind: &'static str,
    connected: std::sync::atomic::AtomicBool,
    last_report_ms: std::sync::atomic::AtomicU64,
}

impl LinkStatus {
    pub fn new(kind: &'static str) -> LinkStatus {
        LinkStatus {
            kind,
            connected: Default::default(),
            last_report_ms: Default::default(),
        }
    }
    pub fn set_connected(&self, up: bool) {
        self.connected
            .store(up, std::sync::atomic::Ordering::Relaxed);
    }
    /// A renewal succeeded at `now_ms`.
    pub fn reported(&self, now_ms: u64) {
        self.last_report_ms
            .store(now_ms, std::sync::atomic::Ordering::Relaxed);
    }
}

impl CoordinatorStatus for LinkStatus {
    fn kind(&self) -> &'static str {
        self.kind
    }
    fn connected(&self) -> bool {
        self.connected.load(std::sync::atomic::Ordering::Relaxed)
    }
    fn last_report_ms(&self) -> u64 {
        self.last_report_ms
            .load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// Where worker ids come from. An implementation sets the lease part of the limit it is given
/// (how long the id is surely this node's) and keeps it up to date; [`start`] adds the fence.
#[async_trait]
pub trait Coordinator: Send + Sync {
    /// `static`, `zookeeper`, …: for logs, INFO and `check-config`.
    fn kind(&self) -> &'static str;
    /// The state of its link to a service, for INFO and metrics; `None` without one.
    fn status(&self) -> Option<Arc<dyn CoordinatorStatus>> {
        None
    }
    async fn acquire(&self, limit: Arc<IssueLimit>) -> Result<Box<dyn HeldWorker>, CoordError>;
}

/// A worker id in use, with the limit its engine obeys.
pub struct Worker {
    pub worker_id: u64,
    pub kind: &'static str,
    pub limit: Arc<IssueLimit>,
    /// The clock when every start check had passed (past every fence, the layout accepted):
    /// no ID may carry an earlier time, even if the clock steps back before the first one.
    pub floor_ms: u64,
    held: Box<dyn HeldWorker>,
    pub fence_file: FenceFile,
    stop: CancellationToken,
    fence_task: tokio::task::JoinHandle<()>,
}

impl Worker {
    /// SIGKILL: the fence stops moving and the id is not released (see
    /// [`HeldWorker::abandon`]); what is on disk and in the store stays as it was.
    pub fn abandon(self) {
        self.fence_task.abort();
        self.held.abandon();
    }

    /// Stops extending the fence and releases the id. `last_issued_ms`, the timestamp of the
    /// last ID issued once issuing has stopped for good, becomes the durable fence, so a clean
    /// restart waits only if the clock is behind what was really issued.
    pub async fn close(self, last_issued_ms: Option<u64>) {
        self.stop.cancel();
        let _ = self.fence_task.await;
        if let Some(last) = last_issued_ms.filter(|&last| last < self.limit.fence_ms()) {
            let file = self.fence_file.clone();
            let stored = tokio::task::spawn_blocking(move || file.store(last)).await;
            if let Ok(Err(e)) = stored {
                tracing::warn!(error = %e, "could not lower the time fence at shutdown; the next start may wait for it");
            }
        }
        self.held.close(last_issued_ms).await;
    }
}

/// Obtains a worker id from `coordinator`, then opens the time fence in the worker id's own file
/// beside `fence_file` ([`FenceFile::for_worker`]): waits until the clock is past every fence
/// this node and the id's previous holders recorded (or refuses), makes the first fence durable,
/// and keeps extending it in the background. `fence_file` itself, written by leafd before
/// fences were kept per worker id, still holds the start back once.
///
/// The worker id's file also records the layout: a start with another layout is refused unless
/// its IDs from now on are above all the old layout could have issued up to that fence.
pub async fn start(
    coordinator: &dyn Coordinator,
    layout: &dyn LayoutRecord,
    fence_file: FenceFile,
    settings: FenceSettings,
    clock: Arc<dyn Clock>,
) -> Result<Worker, CoordError> {
    let epoch_ms = layout.epoch_ms();
    let now = clock.now_millis();
    if now <= epoch_ms {
        return Err(CoordError::EpochInFuture {
            epoch_ms,
            ahead_ms: epoch_ms - now,
        });
    }
    if now > layout.last_ms() {
        return Err(CoordError::LayoutEnded {
            last_ms: layout.last_ms(),
        });
    }
    let limit = Arc::new(IssueLimit::new());
    let held = coordinator.acquire(limit.clone()).await?;
    // Every coordinator bounds its ids by the layout; one read from a store or a file that
    // passed that bound anyway is refused here, before its fence file is touched.
    let max = layout.max_worker_id();
    if held.worker_id() > max {
        let worker_id = held.worker_id();
        held.close(None).await;
        return Err(CoordError::WorkerIdTooWide {
            kind: coordinator.kind(),
            worker_id,
            max,
            masked: worker_id & max,
        });
    }
    let shared_fence = match fence_file.load() {
        Ok(fence) => fence,
        Err(e) => {
            held.close(None).await;
            return Err(CoordError::Fence(e));
        }
    };
    let fence_file = fence_file
        .for_worker(held.worker_id())
        .with_layout(&layout.descriptor());
    let previous = match fence_file.load_record() {
        Ok(record) => record,
        Err(e) => {
            held.close(None).await;
            return Err(CoordError::Fence(e));
        }
    };
    if let Some((recorded, fence)) = previous.and_then(|r| Some((r.layout?, r.fence_ms))) {
        if let Err(why) = layout.may_follow(&recorded, fence, clock.now_millis()) {
            held.close(None).await;
            return Err(CoordError::LayoutChange(format!(
                "{why} (recorded in {})",
                fence_file.path().display()
            )));
        }
    }
    let keeper = FenceKeeper::new(fence_file.clone(), settings, clock.clone(), limit.clone());
    let floor = held.floor_ms().max(shared_fence);
    if let Err(e) = keeper.open(floor, held.floor_wait_ms()).await {
        held.close(None).await;
        return Err(e);
    }
    let floor_ms = clock.now_millis();
    let stop = CancellationToken::new();
    let fence_task = keeper.spawn(stop.clone());
    Ok(Worker {
        worker_id: held.worker_id(),
        kind: coordinator.kind(),
        limit,
        floor_ms,
        held,
        fence_file,
        stop,
        fence_task,
    })
}
