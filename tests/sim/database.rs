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
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use leafd::storage::{
    DbIdentity, Grant, LeafAlloc, MemoryRows, MemoryStore, NewTag, SegmentStore, StoreError,
    WorkerLeaseStore,
};

use super::rng::Rng;
use super::trace::Trace;

/// Commits kept for a failover or restore to go back to.
const HISTORY: usize = 32;

pub struct Database {
    pub store: MemoryStore,
    /// The state after each of the last commits, newest last.
    history: Mutex<VecDeque<MemoryRows>>,
}

impl Database {
    pub fn new() -> Arc<Database> {
        Arc::new(Database {
            store: MemoryStore::new(),
            history: Mutex::new(VecDeque::new()),
        })
    }

    /// Called after every write that committed.
    fn committed(&self) {
        let mut history = self.history.lock().unwrap();
        if history.len() == HISTORY {
            history.pop_front();
        }
        history.push_back(self.store.snapshot());
    }

    /// The state `k` commits before the newest (`None`: not that many kept).
    pub fn before(&self, k: usize) -> Option<MemoryRows> {
        let history = self.history.lock().unwrap();
        let at = history.len().checked_sub(1 + k)?;
        history.get(at).cloned()
    }

    /// Goes back to `rows`; `new_instance`: a replica answers (a failover), else a restore.
    /// The lost commits leave the history.
    pub fn go_back(&self, rows: MemoryRows, k: usize, new_instance: bool) {
        let mut history = self.history.lock().unwrap();
        for _ in 0..k.min(history.len()) {
            history.pop_back();
        }
        self.store.restore(rows, new_instance);
        history.push_back(self.store.snapshot());
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
        let ms = self.rng.lock().unwrap().below(self.faults.max_delay_ms + 1);
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

    /// A call that writes: cut before it applies, or applied and committed with its reply lost.
    async fn write<T>(
        &self,
        what: &str,
        call: impl std::future::Future<Output = Result<T, StoreError>>,
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
            self.db.committed();
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
    }
}
