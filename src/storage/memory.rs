//! An in-process store for tests, benchmarks and the simulation: `leaf_alloc` as the SQL
//! dialects' locked plan moves it (the same code), with a database instance a simulated
//! failover or restore can replace. It forgets everything when dropped, so a restarted server
//! would repeat IDs: it is never selected by a storage URL.

use std::collections::BTreeMap;
use std::sync::Mutex;

use async_trait::async_trait;

use super::locked::LockedRow;
use super::{
    Grant, LeafAlloc, Lease, LeaseKeeper, NewTag, SegmentStore, StoreError, WorkerLeaseStore,
    WorkerRow,
};

#[derive(Default)]
pub struct MemoryStore {
    rows: Mutex<Rows>,
    /// `leaf_worker`, for the database coordinator in tests (the system clock stands in for
    /// the database's).
    workers: Mutex<BTreeMap<i64, HeldRow>>,
    /// The snowflake layout recorded for the worker ids.
    layout: Mutex<Option<String>>,
}

/// The rows of `leaf_alloc` and the database instance that answers (what a row's `writer`
/// records, so an allocation after a failover skips the failover margin).
#[derive(Clone, Debug, Default)]
pub struct MemoryRows {
    rows: BTreeMap<String, LockedRow>,
    instance: u64,
}

type Rows = MemoryRows;

impl MemoryRows {
    /// Each tag's `max_id`, in tag order.
    pub fn max_ids(&self) -> Vec<(String, i64)> {
        self.rows
            .iter()
            .map(|(tag, row)| (tag.clone(), row.alloc.max_id))
            .collect()
    }

    /// The instance's name as rows record it.
    fn instance_name(&self) -> String {
        format!("memory-{}", self.instance)
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

impl MemoryStore {
    pub fn new() -> MemoryStore {
        MemoryStore::default()
    }

    /// Deletes a row, as an operator's `DELETE FROM leaf_alloc` would.
    pub fn delete_row(&self, tag: &str) {
        self.rows().rows.remove(tag);
    }

    /// Every row and the instance, as a backup (or a replica's state) would keep them.
    pub fn snapshot(&self) -> MemoryRows {
        self.rows().clone()
    }

    /// Puts `rows` back: a restore of a backup (`new_instance: false`, the same server) or a
    /// failover to a replica that had them (`true`: another instance answers from now on,
    /// which allocations of rows the old one wrote see).
    pub fn restore(&self, rows: MemoryRows, new_instance: bool) {
        let mut held = self.rows();
        let instance = held.instance + u64::from(new_instance);
        *held = MemoryRows { instance, ..rows };
    }

    fn rows(&self) -> std::sync::MutexGuard<'_, Rows> {
        // A panic while holding this lock cannot leave a row half-written, so poisoning is moot.
        self.rows.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `tag`'s row, for a change under the lock.
    fn row_mut<'a>(rows: &'a mut Rows, tag: &str) -> Result<&'a mut LeafAlloc, StoreError> {
        Ok(&mut Self::locked_mut(rows, tag)?.alloc)
    }

    fn locked_mut<'a>(rows: &'a mut Rows, tag: &str) -> Result<&'a mut LockedRow, StoreError> {
        rows.rows
            .get_mut(tag)
            .ok_or_else(|| StoreError::UnknownTag(tag.to_string()))
    }
}

/// What the dialects' `move_up_sql` does: `max_id` (and `exclusive_max`, so the next range
/// starts exactly there) up to `floor`, a higher value left alone; the `max_id` after.
fn move_up(row: &mut LockedRow, floor: i64) -> i64 {
    if row.alloc.max_id < floor {
        row.exclusive_max = Some(floor);
        row.alloc.max_id = floor;
    }
    row.alloc.max_id
}

#[async_trait]
impl SegmentStore for MemoryStore {
    async fn allocate(&self, tag: &str, grant: Grant) -> Result<LeafAlloc, StoreError> {
        let mut rows = self.rows();
        let current = rows.instance_name();
        let row = rows
            .rows
            .get_mut(tag)
            .ok_or_else(|| StoreError::UnknownTag(tag.to_string()))?;
        // What MariaDB and PostgreSQL do under the row lock; a refusal moves nothing.
        let mut locked = row.clone();
        let alloc = locked.allocate(tag, &grant, &current)?;
        *row = locked;
        Ok(alloc)
    }

    async fn allocate_many(
        &self,
        requests: &[(String, Grant)],
    ) -> Result<Vec<Result<LeafAlloc, StoreError>>, StoreError> {
        let mut out = Vec::with_capacity(requests.len());
        for (tag, grant) in requests {
            out.push(self.allocate(tag, grant.clone()).await);
        }
        Ok(out)
    }

    async fn list(&self) -> Result<Vec<LeafAlloc>, StoreError> {
        Ok(self.rows().rows.values().map(|r| r.alloc.clone()).collect())
    }

    async fn rules(&self) -> Result<Vec<(String, Option<String>)>, StoreError> {
        let rows = self.rows();
        Ok(rows
            .rows
            .values()
            .map(|r| (r.alloc.tag.clone(), r.alloc.split.clone()))
            .collect())
    }

    async fn rules_after(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, Option<String>)>, StoreError> {
        use std::ops::Bound;
        let rows = self.rows();
        let from = after.map_or(Bound::Unbounded, Bound::Excluded);
        Ok(rows
            .rows
            .range::<str, _>((from, Bound::Unbounded))
            .take(limit)
            .map(|(_, r)| (r.alloc.tag.clone(), r.alloc.split.clone()))
            .collect())
    }

    async fn row(&self, tag: &str) -> Result<Option<LeafAlloc>, StoreError> {
        Ok(self.rows().rows.get(tag).map(|r| r.alloc.clone()))
    }

    async fn create_tag(&self, new: &NewTag) -> Result<(), StoreError> {
        let mut held = self.rows();
        // The creating instance is recorded, as the dialects do: a failover that loses the
        // tag's first allocations is then seen like any other.
        let writer = Some(held.instance_name());
        let rows = &mut held.rows;
        if rows.len() >= new.max_tags {
            return Err(StoreError::TagLimit {
                count: rows.len() as i64,
                limit: new.max_tags,
            });
        }
        if rows.contains_key(&new.tag) {
            return Err(StoreError::TagExists(new.tag.clone()));
        }
        // Its first range starts at `start`: no allocation served it (`exclusive_max`).
        let alloc = LeafAlloc {
            tag: new.tag.clone(),
            max_id: new.start,
            first: new.start,
            step: new.step,
            description: new.description.clone(),
            failover: None,
            opaque: None,
            split: new.split.clone(),
            update_time: None,
        };
        let row = LockedRow {
            alloc,
            writer,
            exclusive_max: Some(new.start),
        };
        rows.insert(new.tag.clone(), row);
        Ok(())
    }

    async fn claim_split(
        &self,
        tag: &str,
        expected: Option<&str>,
        split: Option<&str>,
    ) -> Result<Option<String>, StoreError> {
        let mut rows = self.rows();
        let row = Self::row_mut(&mut rows, tag)?;
        if row.split.as_deref() == expected {
            row.split = split.map(str::to_string);
        }
        Ok(row.split.clone())
    }

    async fn resplit(&self, tag: &str, split: Option<&str>, start: i64) -> Result<i64, StoreError> {
        let mut rows = self.rows();
        let row = Self::locked_mut(&mut rows, tag)?;
        row.alloc.split = split.map(str::to_string);
        Ok(move_up(row, start))
    }

    async fn raise(&self, tag: &str, floor: i64, record: &str) -> Result<i64, StoreError> {
        let mut rows = self.rows();
        let row = Self::locked_mut(&mut rows, tag)?;
        let serves = super::Serves::Period(super::served_marker(record).into());
        let alloc = &mut row.alloc;
        let (split, opaque) = (alloc.split.as_deref(), alloc.opaque.as_deref());
        if let Some(refused) = super::refused_rule(tag, split, opaque, &serves, alloc.max_id) {
            return Err(refused);
        }
        // As the dialects' statement: the whole rule recorded with the move, on a row that
        // records none or only the calendar and digits.
        if split.is_none_or(|split| split == super::position_marker(record)) {
            alloc.split = Some(record.to_string());
        }
        Ok(move_up(row, floor))
    }

    async fn claim_opaque(
        &self,
        tag: &str,
        marker: &str,
        below: i64,
    ) -> Result<(Option<String>, i64), StoreError> {
        let mut rows = self.rows();
        let row = Self::row_mut(&mut rows, tag)?;
        super::opaque_claimable(tag, row.split.as_deref())?;
        if row.opaque.is_none() && row.max_id < below {
            row.opaque = Some(marker.to_string());
        }
        Ok((row.opaque.clone(), row.max_id))
    }

    async fn set_step(&self, tag: &str, step: i64) -> Result<(), StoreError> {
        let mut rows = self.rows();
        let row = Self::row_mut(&mut rows, tag)?;
        row.step = step;
        Ok(())
    }

    fn worker_leases(self: std::sync::Arc<Self>) -> Option<std::sync::Arc<dyn WorkerLeaseStore>> {
        Some(self)
    }

    async fn schema_version(&self) -> Option<i64> {
        None
    }

    async fn identity(&self) -> Result<Option<super::DbIdentity>, StoreError> {
        Ok(None)
    }

    fn backend(&self) -> &'static str {
        "memory"
    }

    async fn close(&self) {}
}

/// A worker id's lease in memory: its holder, the end (UNIX ms) and the fence.
#[derive(Debug, Default)]
struct HeldRow {
    owner: String,
    lease_until: i64,
    fence_ms: i64,
}

#[async_trait]
impl WorkerLeaseStore for MemoryStore {
    fn keeper(&self) -> LeaseKeeper {
        LeaseKeeper::DATABASE
    }

    /// One process's memory is never replaced under it.
    async fn instance_changed_within(&self, _window_ms: i64) -> Result<bool, StoreError> {
        Ok(false)
    }

    async fn claim(
        &self,
        worker_id: i64,
        owner: &str,
        lease_ms: i64,
    ) -> Result<Option<i64>, StoreError> {
        let mut workers = self.workers.lock().unwrap_or_else(|p| p.into_inner());
        let now = now_ms();
        let row = workers.entry(worker_id).or_default();
        if row.lease_until >= now {
            return Ok(None);
        }
        row.owner = owner.to_string();
        row.lease_until = now + lease_ms;
        Ok(Some(row.fence_ms))
    }

    async fn renew(
        &self,
        worker_id: i64,
        owner: &str,
        lease_ms: i64,
        fence_ms: i64,
    ) -> Result<bool, StoreError> {
        let mut workers = self.workers.lock().unwrap_or_else(|p| p.into_inner());
        match workers.get_mut(&worker_id) {
            Some(row) if row.owner == owner => {
                row.lease_until = now_ms() + lease_ms;
                row.fence_ms = row.fence_ms.max(fence_ms);
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn release(&self, worker_id: i64, owner: &str, fence_ms: i64) -> Result<(), StoreError> {
        let mut workers = self.workers.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(row) = workers.get_mut(&worker_id).filter(|r| r.owner == owner) {
            row.lease_until = 0;
            row.fence_ms = fence_ms;
        }
        Ok(())
    }

    async fn workers(&self) -> Result<Vec<WorkerRow>, StoreError> {
        let now = now_ms();
        let workers = self.workers.lock().unwrap_or_else(|p| p.into_inner());
        Ok(workers
            .iter()
            .map(|(&worker_id, row)| WorkerRow {
                worker_id,
                owner: row.owner.clone(),
                lease: Lease::Timed(row.lease_until - now),
                fence_ms: row.fence_ms,
            })
            .collect())
    }

    async fn record_layout(
        &self,
        expected: Option<&str>,
        layout: &str,
    ) -> Result<Option<String>, StoreError> {
        let mut recorded = self.layout.lock().unwrap_or_else(|p| p.into_inner());
        if recorded.as_deref() == expected && expected != Some(layout) {
            *recorded = Some(layout.to_string());
        }
        Ok(recorded.clone())
    }
}
