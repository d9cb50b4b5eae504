//! The simulated `leaf_worker`: worker-id leases in the database's time, kept with its commits
//! (a failover or a restore takes them back too), row for row as `storage/workers.rs` writes
//! them on every dialect: row −1 the instance last seen and since when, row −3 the highest id
//! ever given a row, row −2 the layout.

use std::collections::BTreeMap;

use leafd::storage::{Lease, StoreError, WorkerRow};

#[derive(Clone, Debug)]
struct Row {
    owner: String,
    lease_until: i64,
    fence_ms: i64,
}

#[derive(Clone, Debug)]
pub struct LeaseRows {
    rows: BTreeMap<i64, Row>,
    /// Row −1: the instance that answered last, and the database time it was first seen.
    seen: Option<(u64, i64)>,
    /// Row −3.
    highest: Option<i64>,
    /// Row −2.
    layout: Option<String>,
}

impl LeaseRows {
    /// A schema just created on `instance`: first seen at 0, no id given a row yet.
    pub fn created(instance: u64) -> LeaseRows {
        LeaseRows {
            rows: BTreeMap::new(),
            seen: Some((instance, 0)),
            highest: Some(-1),
            layout: None,
        }
    }

    /// The table wiped (every row deleted, the schema kept).
    pub fn wiped() -> LeaseRows {
        LeaseRows {
            rows: BTreeMap::new(),
            seen: None,
            highest: None,
            layout: None,
        }
    }

    fn highest_of_rows(&self) -> i64 {
        self.rows.keys().copied().max().unwrap_or(-1)
    }

    pub fn instance_changed_within(&mut self, instance: u64, now: i64, window_ms: i64) -> bool {
        match self.seen {
            None => {
                self.seen = Some((instance, now));
                if self.highest.is_none() {
                    self.highest = Some(self.highest_of_rows());
                }
                true
            }
            Some((seen, since)) if seen == instance => now - since < window_ms,
            Some(_) => {
                self.seen = Some((instance, now));
                true
            }
        }
    }

    pub fn claim(&mut self, worker_id: i64, owner: &str, now: i64, lease_ms: i64) -> Option<i64> {
        match self.rows.get_mut(&worker_id) {
            None => {
                self.rows.insert(
                    worker_id,
                    Row {
                        owner: owner.to_string(),
                        lease_until: now + lease_ms,
                        fence_ms: 0,
                    },
                );
                match self.highest {
                    // An id at or below the highest ever given a row: its row was deleted, and
                    // its holder may still issue. Marked as changed now.
                    Some(highest) if highest >= worker_id => {
                        if let Some((_, since)) = self.seen.as_mut() {
                            *since = now;
                        }
                    }
                    Some(_) => self.highest = Some(worker_id),
                    None => {
                        if let Some((_, since)) = self.seen.as_mut() {
                            *since = now;
                        }
                        self.highest = Some(self.highest_of_rows().max(worker_id));
                    }
                }
                Some(0)
            }
            Some(row) if row.lease_until < now => {
                row.owner = owner.to_string();
                row.lease_until = now + lease_ms;
                Some(row.fence_ms)
            }
            Some(_) => None,
        }
    }

    pub fn renew(
        &mut self,
        worker_id: i64,
        owner: &str,
        now: i64,
        lease_ms: i64,
        fence_ms: i64,
    ) -> Result<bool, StoreError> {
        match self.rows.get_mut(&worker_id) {
            Some(row) if row.owner == owner => {
                row.lease_until = now + lease_ms;
                row.fence_ms = row.fence_ms.max(fence_ms);
                Ok(true)
            }
            Some(row) if row.lease_until >= now => Ok(false),
            Some(_) => Err(StoreError::WentBack(format!(
                "leaf_worker shows worker id {worker_id} as another holder's, expired (simulated)"
            ))),
            None => Err(StoreError::WentBack(format!(
                "leaf_worker has no row for worker id {worker_id} (simulated)"
            ))),
        }
    }

    pub fn release(&mut self, worker_id: i64, owner: &str, fence_ms: i64) {
        if let Some(row) = self.rows.get_mut(&worker_id).filter(|r| r.owner == owner) {
            row.lease_until = 0;
            row.fence_ms = fence_ms;
        }
    }

    pub fn workers(&self, now: i64) -> Vec<WorkerRow> {
        self.rows
            .iter()
            .map(|(&worker_id, row)| WorkerRow {
                worker_id,
                owner: row.owner.clone(),
                lease: Lease::Timed(row.lease_until - now),
                fence_ms: row.fence_ms,
            })
            .collect()
    }

    pub fn record_layout(&mut self, expected: Option<&str>, layout: &str) -> Option<String> {
        if self.layout.as_deref() == expected && expected != Some(layout) {
            self.layout = Some(layout.to_string());
        }
        self.layout.clone()
    }
}
