//! An in-process store for tests and benchmarks. It forgets everything when dropped, so a
//! restarted server would repeat IDs: it is never selected by a storage URL.

use std::collections::BTreeMap;
use std::sync::Mutex;

use async_trait::async_trait;

use super::{
    Grant, LeafAlloc, Lease, LeaseKeeper, NewTag, SegmentStore, StoreError, WorkerLeaseStore,
    WorkerRow,
};

#[derive(Default)]
pub struct MemoryStore {
    rows: Mutex<BTreeMap<String, LeafAlloc>>,
    /// `leaf_worker`, for the database coordinator in tests (the system clock stands in for
    /// the database's).
    workers: Mutex<BTreeMap<i64, HeldRow>>,
    /// The snowflake layout recorded for the worker ids.
    layout: Mutex<Option<String>>,
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
    #[cfg(test)]
    pub(crate) fn delete_row(&self, tag: &str) {
        self.rows().remove(tag);
    }

    fn rows(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, LeafAlloc>> {
        // A panic while holding this lock cannot leave a row half-written, so poisoning is moot.
        self.rows.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[async_trait]
impl SegmentStore for MemoryStore {
    async fn allocate(&self, tag: &str, grant: Grant) -> Result<LeafAlloc, StoreError> {
        let mut rows = self.rows();
        let row = rows
            .get_mut(tag)
            .ok_or_else(|| StoreError::UnknownTag(tag.to_string()))?;
        if let Some(refused) = super::refused_rule(
            tag,
            row.split.as_deref(),
            row.opaque.as_deref(),
            &grant.serves,
            row.max_id,
        ) {
            return Err(refused);
        }
        // Every row here is written by leafd alone: each range starts at the last max_id.
        let first = row.max_id;
        let step = grant.step.unwrap_or(row.step);
        super::check_step(tag, step)?;
        let max_id = first
            .checked_add(step)
            .ok_or_else(|| match i64::MAX - first {
                left if left >= 1 => StoreError::NearEnd {
                    tag: tag.to_string(),
                    left,
                },
                _ => StoreError::Exhausted(tag.to_string()),
            })?;
        if let Some(window) = grant.window {
            if max_id > window.end_of(first) {
                return Err(StoreError::PastEnd {
                    tag: tag.to_string(),
                    max_id: first,
                    left: (window.end_of(first) - first).max(0),
                });
            }
        }
        row.max_id = max_id;
        row.first = first;
        Ok(row.clone())
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
        Ok(self.rows().values().cloned().collect())
    }

    async fn rules(&self) -> Result<Vec<(String, Option<String>)>, StoreError> {
        let rows = self.rows();
        Ok(rows
            .values()
            .map(|r| (r.tag.clone(), r.split.clone()))
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
            .range::<str, _>((from, Bound::Unbounded))
            .take(limit)
            .map(|(_, r)| (r.tag.clone(), r.split.clone()))
            .collect())
    }

    async fn row(&self, tag: &str) -> Result<Option<LeafAlloc>, StoreError> {
        Ok(self.rows().get(tag).cloned())
    }

    async fn create_tag(&self, new: &NewTag) -> Result<(), StoreError> {
        let mut rows = self.rows();
        if rows.len() >= new.max_tags {
            return Err(StoreError::TagLimit {
                count: rows.len() as i64,
                limit: new.max_tags,
            });
        }
        if rows.contains_key(&new.tag) {
            return Err(StoreError::TagExists(new.tag.clone()));
        }
        rows.insert(
            new.tag.clone(),
            LeafAlloc {
                tag: new.tag.clone(),
                max_id: new.start,
                first: new.start,
                step: new.step,
                description: new.description.clone(),
                failover: None,
                opaque: None,
                split: new.split.clone(),
                update_time: None,
            },
        );
        Ok(())
    }

    async fn claim_split(
        &self,
        tag: &str,
        expected: Option<&str>,
        split: Option<&str>,
    ) -> Result<Option<String>, StoreError> {
        let mut rows = self.rows();
        let row = rows
            .get_mut(tag)
            .ok_or_else(|| StoreError::UnknownTag(tag.to_string()))?;
        if row.split.as_deref() == expected {
            row.split = split.map(str::to_string);
        }
        Ok(row.split.clone())
    }

    async fn resplit(&self, tag: &str, split: Option<&str>, start: i64) -> Result<i64, StoreError> {
        let mut rows = self.rows();
        let row = rows
            .get_mut(tag)
            .ok_or_else(|| StoreError::UnknownTag(tag.to_string()))?;
        row.split = split.map(str::to_string);
        row.max_id = row.max_id.max(start);
        Ok(row.max_id)
    }

    async fn raise(&self, tag: &str, floor: i64, marker: &str) -> Result<i64, StoreError> {
        let mut rows = self.rows();
        let row = rows
            .get_mut(tag)
            .ok_or_else(|| StoreError::UnknownTag(tag.to_string()))?;
        let serves = super::Serves::Period(marker.into());
        let (split, opaque) = (row.split.as_deref(), row.opaque.as_deref());
        if let Some(refused) = super::refused_rule(tag, split, opaque, &serves, row.max_id) {
            return Err(refused);
        }
        row.max_id = row.max_id.max(floor);
        Ok(row.max_id)
    }

    async fn claim_opaque(
        &self,
        tag: &str,
        marker: &str,
        below: i64,
    ) -> Result<(Option<String>, i64), StoreError> {
        let mut rows = self.rows();
        let row = rows
            .get_mut(tag)
            .ok_or_else(|| StoreError::UnknownTag(tag.to_string()))?;
        super::opaque_claimable(tag, row.split.as_deref())?;
        if row.opaque.is_none() && row.max_id < below {
            row.opaque = Some(marker.to_string());
        }
        Ok((row.opaque.clone(), row.max_id))
    }

    async fn set_step(&self, tag: &str, step: i64) -> Result<(), StoreError> {
        let mut rows = self.rows();
        let row = rows
            .get_mut(tag)
            .ok_or_else(|| StoreError::UnknownTag(tag.to_string()))?;
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
