//! The lease coordinator: worker ids leased from a worker-lease store (`leaf_worker` in the
//! segment database, or etcd), the holder's fence kept with its lease. No ZooKeeper.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use super::renewal::{renew_problem, LeaseRenewal, RETRY_FAILED_RENEWAL};
use super::{CoordError, Coordinator, HeldWorker, LayoutRecord};
use crate::clock::Clock;
use crate::coord::IssueLimit;
use crate::storage::WorkerLeaseStore;

/// What this node remembers between runs: the id it held, to ask for it first.
#[derive(Debug, Serialize, Deserialize)]
struct Previous {
    worker_id: u64,
}

pub struct LeaseCoordinator {
    pub store: Arc<dyn WorkerLeaseStore>,
    /// This node's address; the owner recorded in the row adds a per-process instance id.
    pub endpoint: String,
    pub max_worker_id: u64,
    /// A lease lasts this long in database time; the node stops issuing after half of it
    /// without a successful renewal.
    pub lease_ms: u64,
    pub clock: Arc<dyn Clock>,
    /// Remembers the id held last (in the state directory).
    pub state_file: PathBuf,
    /// The snowflake layout this node issues in; the table records the cluster's.
    pub layout: Arc<dyn LayoutRecord>,
    /// The link to a lease service other than the database (INFO, metrics).
    pub link: Option<Arc<super::LinkStatus>>,
}

impl LeaseCoordinator {
    fn renew_interval(&self) -> Duration {
        Duration::from_millis((self.lease_ms / 5).max(50))
    }

    /// The fence a renewal writes: the node may issue until half the lease after the renewal
    /// that follows this one was due, so an outage shorter than half the lease never stops it.
    fn fence_after_renewal(&self) -> u64 {
        self.clock.now_millis() + self.lease_ms / 2 + self.renew_interval().as_millis() as u64
    }

    /// Who holds the leases, as a sentence names it.
    fn holder(&self) -> &'static str {
        self.store.keeper().holder
    }

    /// Where the leases are, as messages name it.
    fn table(&self) -> &'static str {
        self.store.keeper().place
    }

    fn previous(&self) -> Option<u64> {
        let bytes = std::fs::read(&self.state_file).ok()?;
        serde_json::from_slice::<Previous>(&bytes)
            .ok()
            .map(|p| p.worker_id)
            .filter(|&id| id <= self.max_worker_id)
    }

    fn remember(&self, worker_id: u64) {
        let json = serde_json::to_vec(&Previous { worker_id }).unwrap_or_default();
        if let Some(dir) = self.state_file.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        if let Err(e) = std::fs::write(&self.state_file, json) {
            tracing::warn!(error = %e, file = %self.state_file.display(), "cannot remember the worker id");
        }
    }

    /// The table records the layout its worker ids issue in. Another layout is taken over only
    /// when no node holds a live lease (it would go on issuing IDs of the old layout) and the
    /// new layout's IDs from now on are above all the old one could have issued up to the
    /// latest fence of any worker id.
    async fn adopt_layout(&self) -> Result<(), CoordError> {
        let mine = self.layout.descriptor();
        let mut expected: Option<String> = None;
        // The record moves only from what was read, so nodes racing with different layouts
        // settle on one; a few rounds are enough for that.
        for _ in 0..3 {
            let recorded = self
                .store
                .record_layout(expected.as_deref(), &mine)
                .await
                .map_err(db)?;
            let Some(other) = recorded.filter(|r| *r != mine) else {
                return Ok(());
            };
            let rows = self.store.workers().await.map_err(db)?;
            let live: Vec<i64> = rows
                .iter()
                .filter(|r| r.lease.live())
                .map(|r| r.worker_id)
                .collect();
            if !live.is_empty() {
                return Err(CoordError::LayoutChange(format!(
                    "worker ids {live:?} are leased by nodes issuing IDs of {other}; stop all of them (or wait for their leases to end) before starting a node with {mine}"
                )));
            }
            // A node of the old layout that has just adopted it but not yet claimed its id may
            // issue until its first renewal finds the record changed (then it stops): the old
            // IDs are bounded a lease past now, not by the fences alone.
            let now = self.clock.now_millis();
            let mut fence = 0;
            for row in &rows {
                let id = row.worker_id.max(0) as u64;
                fence = fence.max(
                    inherited_fence(self.table(), id, row.fence_ms)
                        .map_err(CoordError::LayoutChange)?,
                );
            }
            self.layout
                .may_follow(&other, fence.max(now + self.lease_ms), now)
                .map_err(|why| {
                    CoordError::LayoutChange(format!("{why} (recorded in {})", self.table()))
                })?;
            expected = Some(other);
        }
        Err(CoordError::LayoutChange(format!(
            "the layout recorded in {} kept changing (nodes with different layouts starting at once)",
            self.table()
        )))
    }

    /// The ids to try, in order: the previous one, the never-used ones from the lowest (nodes
    /// starting at once race for the lowest; a loser moves on to the next), then expired ones
    /// (longest expired first).
    async fn candidates(&self) -> Result<Vec<u64>, CoordError> {
        let rows = self.store.workers().await.map_err(db)?;
        // A lease with more left than this node's whole lease was taken with a longer one:
        // after the table loses its rows this node would wait too little for that holder.
        if let Some(longer) = rows
            .iter()
            .filter_map(|r| Some((r, r.lease.left_ms()?)))
            .filter(|(_, left)| *left > self.lease_ms as i64)
            .max_by_key(|(_, left)| *left)
        {
            tracing::warn!(
                worker_id = longer.0.worker_id,
                left_ms = longer.1,
                lease_ms = self.lease_ms,
                "another node holds a longer worker-id lease than this node's: every node must run the same lease length, or a claim after the lease table lost its rows may not wait long enough"
            );
        }
        let mut ids: Vec<u64> = self.previous().into_iter().collect();
        let used: std::collections::HashSet<i64> = rows.iter().map(|r| r.worker_id).collect();
        ids.extend((0..=self.max_worker_id).filter(|id| !used.contains(&(*id as i64))));
        let mut expired: Vec<_> = rows
            .iter()
            .filter(|r| !r.lease.live() && r.worker_id as u64 <= self.max_worker_id)
            .collect();
        expired.sort_by_key(|r| std::cmp::Reverse(r.lease.ended_ms_ago()));
        ids.extend(expired.iter().map(|r| r.worker_id as u64));
        ids.dedup();
        Ok(ids)
    }
}

impl LeaseCoordinator {
    /// Every id is leased, but this node held one before it restarted (its state file says
    /// which): that lease is most likely its own, run out within a lease of the crash. Waits
    /// for it (a lease and a renewal interval at most), logged, instead of failing the start.
    async fn wait_for_previous(
        &self,
        owner: &str,
        lease: i64,
    ) -> Result<Option<(u64, u64)>, CoordError> {
        let Some(id) = self.previous() else {
            return Ok(None);
        };
        let wait = Duration::from_millis(self.lease_ms) + self.renew_interval();
        tracing::warn!(
            worker_id = id,
            wait_ms = wait.as_millis() as u64,
            "every worker id is leased; waiting for the one this node held before it restarted"
        );
        let deadline = tokio::time::Instant::now() + wait;
        while tokio::time::Instant::now() < deadline {
            tokio::time::sleep(RETRY_FAILED_RENEWAL).await;
            if let Some(floor) = self
                .store
                .claim(id as i64, owner, lease)
                .await
                .map_err(db)?
            {
                tracing::info!(
                    worker_id = id,
                    "the worker id this node held before is free again"
                );
                return match inherited_fence(self.table(), id, floor) {
                    Ok(floor) => Ok(Some((id, floor))),
                    Err(why) => {
                        let _ = self.store.release(id as i64, owner, floor).await;
                        Err(CoordError::Database(why))
                    }
                };
            }
        }
        Ok(None)
    }
}

fn db(e: crate::storage::StoreError) -> CoordError {
    CoordError::Database(e.to_string())
}

/// The fence a claim read for `worker_id` (its previous holder issued up to it), checked: a
/// negative one is no time (a row edited by hand, or damaged), so how far that holder issued is
/// not known and the id is refused rather than issued from this node's clock.
pub(super) fn inherited_fence(place: &str, worker_id: u64, fence_ms: i64) -> Result<u64, String> {
    u64::try_from(fence_ms).map_err(|_| {
        format!(
            "{place} records fence_ms {fence_ms} for worker id {worker_id}: not a time, so how far its previous holder issued is not known; set it to a UNIX time in ms at or after that holder's last ID (or now plus the lease)"
        )
    })
}

#[async_trait]
impl Coordinator for LeaseCoordinator {
    fn kind(&self) -> &'static str {
        self.store.keeper().kind
    }

    fn status(&self) -> Option<Arc<dyn super::CoordinatorStatus>> {
        self.link
            .clone()
            .map(|link| link as Arc<dyn super::CoordinatorStatus>)
    }

    async fn acquire(&self, limit: Arc<IssueLimit>) -> Result<Box<dyn HeldWorker>, CoordError> {
        self.adopt_layout().await?;
        let owner = format!("{}#{:016x}", self.endpoint, fastrand::u64(..));
        let lease = self.lease_ms as i64;
        // Within a lease of a failover the table may have lost the last renewals or the very
        // claim of a holder that still issues: it stops by itself within half a lease plus a
        // renewal interval of the failover, so a claimant then waits a whole lease.
        let after_failover = self
            .store
            .instance_changed_within(lease)
            .await
            .map_err(db)?;
        let mut granted = None;
        // A few rounds: every candidate may be taken by other nodes between the read and the
        // claim (nodes starting at once).
        for _ in 0..3 {
            for id in self.candidates().await? {
                if let Some(floor) = self
                    .store
                    .claim(id as i64, &owner, lease)
                    .await
                    .map_err(db)?
                {
                    let floor = match inherited_fence(self.table(), id, floor) {
                        Ok(floor) => floor,
                        Err(why) => {
                            // The claim is given back at once, the fence left as it was read:
                            // the id waits for its fence to be put right, not for this lease.
                            let _ = self.store.release(id as i64, &owner, floor).await;
                            return Err(CoordError::Database(why));
                        }
                    };
                    granted = Some((id, floor));
                    break;
                }
            }
            if granted.is_some() {
                break;
            }
        }
        if granted.is_none() {
            granted = self.wait_for_previous(&owner, lease).await?;
        }
        let Some((worker_id, floor_ms)) = granted else {
            return Err(CoordError::NoFreeWorkerId(format!(
                // A node killed less than a lease ago still holds its id: "live" would mislead.
                "all {} ids of {} are leased (by running nodes, or by stopped ones whose lease has not run out)",
                self.max_worker_id + 1,
                self.table()
            )));
        };
        // Checked again now that the id is claimed: the table may have lost its rows between
        // the first check and the claim, and a claim of a deleted row marks row −1 as changed.
        let after_failover = after_failover
            || self
                .store
                .instance_changed_within(lease)
                .await
                .map_err(db)?;
        let floor_ms = if after_failover {
            let floor = floor_ms.max(self.clock.now_millis() + self.lease_ms);
            tracing::warn!(
                worker_id,
                wait_ms = self.lease_ms,
                "the database instance changed, or leaf_worker lost its rows, within the last lease (a failover, a restore, a wipe): waiting a whole lease before issuing, in case a holder the table no longer shows still issues"
            );
            floor
        } else {
            floor_ms
        };
        // The first fence is in the row before any ID can be issued. The store keeps at least
        // the inherited one: this node issues only past it, but a crash before its clock got
        // there must not leave the next holder a lower fence than the previous holder's.
        let fence = self.fence_after_renewal();
        if !self
            .store
            .renew(worker_id as i64, &owner, lease, fence.max(floor_ms) as i64)
            .await
            .map_err(db)?
        {
            return Err(CoordError::NoFreeWorkerId(format!(
                "worker id {worker_id} was taken by another node while it was being claimed"
            )));
        }
        // The layout again, now that the lease is in the table: a node of another layout that
        // switched the record between this node's check and its claim (this one paused in
        // between) saw no lease of it and bounded this layout's IDs by its own clock then.
        // From here on such a node sees this lease and is refused.
        let mine = self.layout.descriptor();
        match self.store.record_layout(Some(&mine), &mine).await {
            Ok(Some(recorded)) if recorded == mine => {}
            other => {
                // The row keeps the higher of the previous holder's fence and this node's.
                let keep = floor_ms.max(fence) as i64;
                let _ = self.store.release(worker_id as i64, &owner, keep).await;
                return Err(match other {
                    Err(e) => db(e),
                    Ok(recorded) => CoordError::LayoutChange(format!(
                        "the layout recorded in {} changed to {} while this node ({mine}) claimed worker id {worker_id}",
                        self.table(),
                        recorded.as_deref().unwrap_or("nothing")
                    )),
                });
            }
        }
        limit.set_lease(
            fence,
            Some(renew_problem(self.clock.now_millis(), self.holder())),
        );
        self.remember(worker_id);
        tracing::info!(worker_id, owner = %owner, "snowflake worker id leased from the database");
        let stop = CancellationToken::new();
        if let Some(link) = &self.link {
            link.reported(self.clock.now_millis());
        }
        let renewal = LeaseRenewal {
            holder: self.holder(),
            link: self.link.clone(),
            layout: self.layout.descriptor(),
            store: self.store.clone(),
            owner: owner.clone(),
            worker_id,
            lease,
            interval: self.renew_interval(),
            half_lease_ms: self.lease_ms / 2,
            inherited_ms: floor_ms,
            clock: self.clock.clone(),
            limit,
            stop: stop.clone(),
        };
        let task = tokio::spawn(renewal.run());
        Ok(Box::new(LeaseWorker {
            store: self.store.clone(),
            owner,
            worker_id,
            floor_ms,
            lease_ms: self.lease_ms,
            stop,
            task,
        }))
    }
}

struct LeaseWorker {
    store: Arc<dyn WorkerLeaseStore>,
    owner: String,
    worker_id: u64,
    floor_ms: u64,
    lease_ms: u64,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

#[async_trait]
impl HeldWorker for LeaseWorker {
    fn worker_id(&self) -> u64 {
        self.worker_id
    }

    fn floor_ms(&self) -> u64 {
        self.floor_ms
    }

    fn floor_wait_ms(&self) -> u64 {
        self.lease_ms
    }

    fn abandon(&self) {
        self.task.abort();
    }

    async fn close(self: Box<Self>, last_issued_ms: Option<u64>) {
        self.stop.cancel();
        let _ = self.task.await;
        // Freed at once for the next holder, who starts past what this node issued.
        // Never below the floor this node inherited: the next holder's clock may be behind it.
        let fence = last_issued_ms
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as u64 + self.lease_ms)
            })
            .max(self.floor_ms);
        if let Err(e) = self
            .store
            .release(self.worker_id as i64, &self.owner, fence as i64)
            .await
        {
            tracing::warn!(error = %e, "could not release the worker-id lease; it expires by itself");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::SystemClock;
    use crate::storage::{LeaseKeeper, MemoryStore, StoreError, WorkerRow};

    /// A table where another node of layout `to` wins the race for the record just as this node
    /// claims its id (this node paused between its layout check and its claim).
    struct SwitchedOnClaim {
        inner: Arc<MemoryStore>,
        to: String,
    }

    #[async_trait]
    impl WorkerLeaseStore for SwitchedOnClaim {
        fn keeper(&self) -> LeaseKeeper {
            LeaseKeeper::DATABASE
        }
        async fn instance_changed_within(&self, window: i64) -> Result<bool, StoreError> {
            self.inner.instance_changed_within(window).await
        }
        async fn claim(&self, id: i64, owner: &str, lease: i64) -> Result<Option<i64>, StoreError> {
            let current = self.inner.record_layout(Some(&self.to), &self.to).await?;
            self.inner
                .record_layout(current.as_deref(), &self.to)
                .await?;
            self.inner.claim(id, owner, lease).await
        }
        async fn renew(
            &self,
            id: i64,
            owner: &str,
            lease: i64,
            fence: i64,
        ) -> Result<bool, StoreError> {
            self.inner.renew(id, owner, lease, fence).await
        }
        async fn release(&self, id: i64, owner: &str, fence: i64) -> Result<(), StoreError> {
            self.inner.release(id, owner, fence).await
        }
        async fn workers(&self) -> Result<Vec<WorkerRow>, StoreError> {
            self.inner.workers().await
        }
        async fn record_layout(
            &self,
            expected: Option<&str>,
            layout: &str,
        ) -> Result<Option<String>, StoreError> {
            self.inner.record_layout(expected, layout).await
        }
    }

    struct Fixed(&'static str);

    impl LayoutRecord for Fixed {
        fn descriptor(&self) -> String {
            self.0.to_string()
        }
        fn epoch_ms(&self) -> u64 {
            0
        }
        fn last_ms(&self) -> u64 {
            u64::MAX
        }
        fn max_worker_id(&self) -> u64 {
            3
        }
        fn may_follow(&self, _: &str, _: u64, _: u64) -> Result<(), String> {
            Ok(())
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_record_changed_between_the_check_and_the_claim_refuses_the_claim() {
        let inner = Arc::new(MemoryStore::new());
        let store = Arc::new(SwitchedOnClaim {
            inner: inner.clone(),
            to: "the other layout".into(),
        });
        let dir = tempfile::tempdir().unwrap();
        let coordinator = LeaseCoordinator {
            store,
            endpoint: "127.0.0.1:6380".into(),
            max_worker_id: 3,
            lease_ms: 2000,
            clock: Arc::new(SystemClock),
            state_file: dir.path().join("worker.json"),
            layout: Arc::new(Fixed("this layout")),
            link: None,
        };
        let err = match coordinator.acquire(Arc::new(IssueLimit::new())).await {
            Err(e) => e.to_string(),
            Ok(_) => panic!("claimed under another layout's record"),
        };
        assert!(
            err.contains("changed to the other layout while this node"),
            "{err}"
        );
        // The lease it took is given back at once.
        let rows = inner.workers().await.unwrap();
        assert!(rows.iter().all(|r| !r.lease.live()), "{rows:?}");
    }

    fn coordinator(store: Arc<MemoryStore>, dir: &std::path::Path) -> LeaseCoordinator {
        LeaseCoordinator {
            store,
            endpoint: "127.0.0.1:6380".into(),
            max_worker_id: 0,
            lease_ms: 2000,
            clock: Arc::new(SystemClock),
            state_file: dir.join("worker.json"),
            layout: Arc::new(Fixed("this layout")),
            link: None,
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_negative_fence_in_the_row_refuses_the_worker_id() {
        let store = Arc::new(MemoryStore::new());
        // A previous holder's row, its fence edited by hand to a value that is no time.
        assert_eq!(store.claim(0, "old", 1).await.unwrap(), Some(0));
        store.release(0, "old", -5).await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let err = match coordinator(store.clone(), dir.path())
            .acquire(Arc::new(IssueLimit::new()))
            .await
        {
            Err(e) => e.to_string(),
            Ok(_) => panic!("issued after a fence of -5"),
        };
        assert!(
            err.contains("leaf_worker records fence_ms -5 for worker id 0: not a time"),
            "{err}"
        );
        // Nothing remembered: a restart does not ask for that id as its own.
        assert!(!dir.path().join("worker.json").exists());
        // The claim is given back, the fence left as it was read.
        let rows = store.workers().await.unwrap();
        assert!(
            rows.iter().all(|r| !r.lease.live() && r.fence_ms == -5),
            "{rows:?}"
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_negative_fence_in_any_row_refuses_a_layout_change() {
        let store = Arc::new(MemoryStore::new());
        store.record_layout(None, "the old layout").await.unwrap();
        assert_eq!(store.claim(7, "old", 1).await.unwrap(), Some(0));
        store.release(7, "old", -1).await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let err = match coordinator(store.clone(), dir.path())
            .acquire(Arc::new(IssueLimit::new()))
            .await
        {
            Err(e) => e.to_string(),
            Ok(_) => panic!("changed the layout past a fence of -1"),
        };
        assert!(
            err.contains(
                "snowflake layout change refused: leaf_worker records fence_ms -1 for worker id 7"
            ),
            "{err}"
        );
        assert_eq!(
            store
                .record_layout(Some("x"), "x")
                .await
                .unwrap()
                .as_deref(),
            Some("the old layout")
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_worker_id_wider_than_the_layout_is_refused_before_its_fence_file() {
        let dir = tempfile::tempdir().unwrap();
        let coordinator = crate::coord::static_id::StaticCoordinator {
            worker_id: 4,
            lock_paths: Vec::new(),
        };
        let fence = dir.path().join("fence.json");
        let err = match crate::coord::start(
            &coordinator,
            &Fixed("this layout"),
            crate::coord::fence_file::FenceFile::new(&fence),
            crate::coord::fence::FenceSettings {
                window_ms: 1000,
                max_start_wait_ms: 0,
            },
            Arc::new(SystemClock),
        )
        .await
        {
            Err(e) => e.to_string(),
            Ok(_) => panic!("started with worker id 4 in a layout of 0 to 3"),
        };
        assert_eq!(
            err,
            "the static coordinator gave worker id 4, and the snowflake layout has worker ids 0 to 3 only (its IDs would carry worker id 0); refusing to start"
        );
        let written: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert!(written.is_empty(), "{written:?}");
    }

    /// A store whose renewals replace the fence, as etcd's do, recording each one written.
    struct ReplacingRenewals {
        inner: Arc<MemoryStore>,
        written: std::sync::Mutex<Vec<i64>>,
    }

    #[async_trait]
    impl WorkerLeaseStore for ReplacingRenewals {
        fn keeper(&self) -> LeaseKeeper {
            LeaseKeeper::DATABASE
        }
        async fn instance_changed_within(&self, window: i64) -> Result<bool, StoreError> {
            self.inner.instance_changed_within(window).await
        }
        async fn claim(&self, id: i64, owner: &str, lease: i64) -> Result<Option<i64>, StoreError> {
            self.inner.claim(id, owner, lease).await
        }
        async fn renew(
            &self,
            id: i64,
            owner: &str,
            lease: i64,
            fence: i64,
        ) -> Result<bool, StoreError> {
            self.written.lock().unwrap().push(fence);
            self.inner.renew(id, owner, lease, fence).await
        }
        async fn release(&self, id: i64, owner: &str, fence: i64) -> Result<(), StoreError> {
            self.inner.release(id, owner, fence).await
        }
        async fn workers(&self) -> Result<Vec<WorkerRow>, StoreError> {
            self.inner.workers().await
        }
        async fn record_layout(
            &self,
            expected: Option<&str>,
            layout: &str,
        ) -> Result<Option<String>, StoreError> {
            self.inner.record_layout(expected, layout).await
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn renewals_never_write_less_than_the_fence_the_previous_holder_left() {
        let inner = Arc::new(MemoryStore::new());
        // The previous holder's clock was a minute ahead: its fence is a minute past this clock.
        let inherited = SystemClock.now_millis() as i64 + 60_000;
        assert_eq!(inner.claim(0, "old", 1).await.unwrap(), Some(0));
        inner.release(0, "old", inherited).await.unwrap();
        let store = Arc::new(ReplacingRenewals {
            inner,
            written: Default::default(),
        });
        let dir = tempfile::tempdir().unwrap();
        let mut coordinator = coordinator(Arc::new(MemoryStore::new()), dir.path());
        coordinator.store = store.clone();
        coordinator.lease_ms = 500;
        let limit = Arc::new(IssueLimit::new());
        let held = coordinator.acquire(limit.clone()).await.unwrap();
        assert_eq!(held.floor_ms(), inherited as u64);
        // This node's own lease bounds what it issues; what it writes keeps the inherited fence.
        assert!(limit.fence_ms() < inherited as u64);
        tokio::time::sleep(Duration::from_millis(400)).await;
        let written = store.written.lock().unwrap().clone();
        assert!(written.len() >= 2, "{written:?}");
        assert!(
            written.iter().all(|&f| f >= inherited),
            "{written:?} below {inherited}"
        );
        held.close(None).await;
    }
}
