//! The simulated database: `leaf_alloc` in a [`MemoryStore`] (the dialects' own row plan), and
//! each node's connection to it, which delays, cuts and loses what crosses it.
//!
//! Modelled, as MariaDB and PostgreSQL promise: a statement is applied whole under the row
//! lock or not at all; a commit may be applied and its reply lost; a failover answers from a
//! replica that lacks the last K commits (acknowledged or not), as another instance; a restore
//! puts an earlier backup back on the same instance. Stricter than the real ones: no two
//! statements interleave inside one (each is one step of the single-threaded run); weaker: any
//! call may be cut before or after it applied.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use leafd::storage::{
    DbIdentity, Grant, LeafAlloc, LeaseKeeper, MemoryRows, MemoryStore, NewTag, SegmentStore,
    StoreError, WorkerLeaseStore, WorkerRow,
};

use super::leases::LeaseRows;
use super::rng::Rng;
use super::trace::Trace;

/// Commits kept for a failover or restore to go back to.
const HISTORY: usize = 32;

pub struct Database {
    pub store: MemoryStore,
    /// `leaf_worker`.
    leases: Mutex<LeaseRows>,
    /// The instance answering (a failover moves to another).
    instance: AtomicU64,
    /// The database's clock: the simulated time from `epoch_ms` (no node's offset).
    start: tokio::time::Instant,
    epoch_ms: i64,
    /// `leaf_alloc` after each of its last commits, newest last.
    history: Mutex<VecDeque<MemoryRows>>,
    /// `leaf_worker` after each of its last commits, with the database time of each.
    lease_history: Mutex<VecDeque<(i64, LeaseRows)>>,
}

impl Database {
    pub fn new(start: tokio::time::Instant, epoch_ms: u64) -> Arc<Database> {
        Arc::new(Database {
            store: MemoryStore::new(),
            leases: Mutex::new(LeaseRows::created(0)),
            instance: AtomicU64::new(0),
            start,
            epoch_ms: epoch_ms as i64,
            history: Mutex::new(VecDeque::new()),
            lease_history: Mutex::new(VecDeque::new()),
        })
    }

    /// The database's own time, in UNIX ms.
    pub fn now_ms(&self) -> i64 {
        self.epoch_ms + self.start.elapsed().as_millis() as i64
    }

    fn leases(&self) -> std::sync::MutexGuard<'_, LeaseRows> {
        self.leases.lock().unwrap()
    }

    /// Called after every write of `leaf_alloc` that committed.
    fn committed(&self) {
        let mut history = self.history.lock().unwrap();
        if history.len() == HISTORY {
            history.pop_front();
        }
        history.push_back(self.store.snapshot());
    }

    /// Called after every write of `leaf_worker` that committed.
    fn lease_committed(&self) {
        let mut history = self.lease_history.lock().unwrap();
        if history.len() == HISTORY {
            history.pop_front();
        }
        history.push_back((self.now_ms(), self.leases().clone()));
    }

    /// `leaf_alloc` `k` commits before the newest (`None`: not that many kept).
    pub fn before(&self, k: usize) -> Option<MemoryRows> {
        let history = self.history.lock().unwrap();
        let at = history.len().checked_sub(1 + k)?;
        history.get(at).cloned()
    }

    /// Goes back to `rows`; `new_instance`: a replica answers (a failover), else a restore.
    /// The lost commits leave the history. A failover also loses what `leaf_worker`
    /// committed in the last `lease_lag_ms` (the replica's lag, in time: the renewals and
    /// claims of that long). A restore puts `leaf_alloc` back only: an older `leaf_worker` on
    /// the same instance is what the table cannot tell (docs/concepts/worker-ids.md: stop the
    /// nodes for a lease first).
    pub fn go_back(&self, rows: MemoryRows, k: usize, new_instance: bool, lease_lag_ms: i64) {
        let mut history = self.history.lock().unwrap();
        for _ in 0..k.min(history.len()) {
            history.pop_back();
        }
        self.store.restore(rows, new_instance);
        history.push_back(self.store.snapshot());
        drop(history);
        if new_instance {
            let until = self.now_ms() - lease_lag_ms;
            let mut leases = self.lease_history.lock().unwrap();
            while leases.len() > 1 && leases.back().is_some_and(|(at, _)| *at > until) {
                leases.pop_back();
            }
            if let Some((_, kept)) = leases.back() {
                *self.leases() = kept.clone();
            }
            self.instance.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// `DELETE FROM leaf_worker`: every lease, fence and record gone at once.
    pub fn wipe_leases(&self) {
        *self.leases() = LeaseRows::wiped();
        self.lease_committed();
    }
}

/// One incarnation's connection: dead once its process is killed.
pub struct Link {
    pub dead: AtomicBool,
    pub name: String,
}

/// The fault rates of the connections, in percent of calls.
#[derive(Clone, Copy, Debug)]
pub struct NetFaults {
    /// The call fails before it reached the database.
    pub cut_before: u64,
    /// The call was applied and committed, and its reply is lost.
    pub lost_reply: u64,
    /// Most milliseconds a call takes each way.
    pub max_delay_ms: u64,
    /// The link stalls: the call is held for 0.5–3 s on its way (a lock wait, a stalled
    /// connection), in tenths of a percent of calls.
    pub hold_permille: u64,
}

/// A node's [`SegmentStore`]: the database behind a connection that fails on purpose.
pub struct Connection {
    pub db: Arc<Database>,
    pub link: Arc<Link>,
    pub rng: Arc<Mutex<Rng>>,
    pub faults: NetFaults,
    pub trace: Arc<Trace>,
}

fn gone(what: &str) -> StoreError {
    StoreError::Unavailable(format!("simulated: {what}"))
}

impl Connection {
    async fn transit(&self) -> Result<(), StoreError> {
        let mut ms = self.rng.lock().unwrap().below(self.faults.max_delay_ms + 1);
        if self.rng.lock().unwrap().below(1000) < self.faults.hold_permille {
            ms += 500 + self.rng.lock().unwrap().below(2500);
            self.trace
                .note(format!("{}: a call held {ms} ms", self.link.name));
        }
        if ms > 0 {
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        if self.link.dead.load(Ordering::SeqCst) {
            return Err(gone("the process is dead"));
        }
        Ok(())
    }

    /// A call that reads: delayed each way, possibly cut.
    async fn read<T>(&self, call: impl std::future::Future<Output = T>) -> Result<T, StoreError> {
        self.transit().await?;
        let value = call.await;
        self.transit().await?;
        Ok(value)
    }

    /// A call that writes `leaf_alloc`: cut before it applies, or applied and committed with
    /// its reply lost.
    async fn write<T>(
        &self,
        what: &str,
        call: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        self.write_to(what, call, || self.db.committed()).await
    }

    /// A call that writes `leaf_worker`, as [`Connection::write`].
    async fn write_lease<T>(
        &self,
        what: &str,
        call: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        self.write_to(what, call, || self.db.lease_committed())
            .await
    }

    async fn write_to<T>(
        &self,
        what: &str,
        call: impl std::future::Future<Output = Result<T, StoreError>>,
        committed: impl Fn(),
    ) -> Result<T, StoreError> {
        self.transit().await?;
        if self.rng.lock().unwrap().chance(self.faults.cut_before) {
            self.trace.note(format!(
                "{} {what}: cut before the database",
                self.link.name
            ));
            return Err(gone("connection cut before the statement"));
        }
        let value = call.await;
        if value.is_ok() {
            committed();
        }
        if self.rng.lock().unwrap().chance(self.faults.lost_reply) {
            self.trace
                .note(format!("{} {what}: committed, reply lost", self.link.name));
            return Err(gone("connection cut after the commit"));
        }
        self.transit().await?;
        value
    }
}

#[async_trait]
impl SegmentStore for Connection {
    async fn allocate(&self, tag: &str, grant: Grant) -> Result<LeafAlloc, StoreError> {
        self.write("allocate", self.db.store.allocate(tag, grant))
            .await
    }

    async fn allocate_many(
        &self,
        requests: &[(String, Grant)],
    ) -> Result<Vec<Result<LeafAlloc, StoreError>>, StoreError> {
        self.write("allocate_many", self.db.store.allocate_many(requests))
            .await
    }

    async fn list(&self) -> Result<Vec<LeafAlloc>, StoreError> {
        self.read(self.db.store.list()).await?
    }

    async fn rules(&self) -> Result<Vec<(String, Option<String>)>, StoreError> {
        self.read(self.db.store.rules()).await?
    }

    async fn rules_after(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, Option<String>)>, StoreError> {
        self.read(self.db.store.rules_after(after, limit)).await?
    }

    async fn row(&self, tag: &str) -> Result<Option<LeafAlloc>, StoreError> {
        self.read(self.db.store.row(tag)).await?
    }

    async fn create_tag(&self, new: &NewTag) -> Result<(), StoreError> {
        self.write("create_tag", self.db.store.create_tag(new))
            .await
    }

    async fn claim_split(
        &self,
        tag: &str,
        expected: Option<&str>,
        split: Option<&str>,
    ) -> Result<Option<String>, StoreError> {
        self.write(
            "claim_split",
            self.db.store.claim_split(tag, expected, split),
        )
        .await
    }

    async fn resplit(&self, tag: &str, split: Option<&str>, start: i64) -> Result<i64, StoreError> {
        self.write("resplit", self.db.store.resplit(tag, split, start))
            .await
    }

    async fn raise(&self, tag: &str, floor: i64, marker: &str) -> Result<i64, StoreError> {
        self.write("raise", self.db.store.raise(tag, floor, marker))
            .await
    }

    async fn claim_opaque(
        &self,
        tag: &str,
        marker: &str,
        below: i64,
    ) -> Result<(Option<String>, i64), StoreError> {
        self.write(
            "claim_opaque",
            self.db.store.claim_opaque(tag, marker, below),
        )
        .await
    }

    async fn set_step(&self, tag: &str, step: i64) -> Result<(), StoreError> {
        self.write("set_step", self.db.store.set_step(tag, step))
            .await
    }

    async fn schema_version(&self) -> Option<i64> {
        None
    }

    async fn identity(&self) -> Result<Option<DbIdentity>, StoreError> {
        Ok(None)
    }

    fn backend(&self) -> &'static str {
        "sim"
    }

    async fn close(&self) {}

    fn worker_leases(self: Arc<Self>) -> Option<Arc<dyn WorkerLeaseStore>> {
        None
    }
}

impl Database {
    /// Records the state as a commit (the driver's own writes: tags created, the operator's
    /// skips).
    pub fn committed_now(&self) {
        self.committed();
        self.lease_committed();
    }
}

/// `leaf_worker` through the same connection: every call delayed, cut or its reply lost.
#[async_trait]
impl WorkerLeaseStore for Connection {
    fn keeper(&self) -> LeaseKeeper {
        LeaseKeeper::DATABASE
    }

    async fn instance_changed_within(&self, window_ms: i64) -> Result<bool, StoreError> {
        let db = &self.db;
        self.write_lease("instance_changed_within", async {
            let instance = db.instance.load(Ordering::SeqCst);
            Ok(db
                .leases()
                .instance_changed_within(instance, db.now_ms(), window_ms))
        })
        .await
    }

    async fn claim(
        &self,
        worker_id: i64,
        owner: &str,
        lease_ms: i64,
    ) -> Result<Option<i64>, StoreError> {
        let db = &self.db;
        let claimed = self
            .write_lease("claim", async {
                Ok(db.leases().claim(worker_id, owner, db.now_ms(), lease_ms))
            })
            .await?;
        self.trace.note(format!(
            "{} claims worker id {worker_id} -> {claimed:?}",
            self.link.name
        ));
        Ok(claimed)
    }

    async fn renew(
        &self,
        worker_id: i64,
        owner: &str,
        lease_ms: i64,
        fence_ms: i64,
    ) -> Result<bool, StoreError> {
        let db = &self.db;
        self.write_lease("renew", async {
            db.leases()
                .renew(worker_id, owner, db.now_ms(), lease_ms, fence_ms)
        })
        .await
    }

    async fn release(&self, worker_id: i64, owner: &str, fence_ms: i64) -> Result<(), StoreError> {
        let db = &self.db;
        self.write_lease("release", async {
            db.leases().release(worker_id, owner, fence_ms);
            Ok(())
        })
        .await
    }

    async fn workers(&self) -> Result<Vec<WorkerRow>, StoreError> {
        let db = &self.db;
        self.read(async { db.leases().workers(db.now_ms()) }).await
    }

    async fn record_layout(
        &self,
        expected: Option<&str>,
        layout: &str,
    ) -> Result<Option<String>, StoreError> {
        let db = &self.db;
        self.write_lease("record_layout", async {
            Ok(db.leases().record_layout(expected, layout))
        })
        .await
    }
}
