//! An in-process store for tests and benchmarks. It forgets everything when dropped, so a
//! restarted server would repeat IDs: it is never selected by a storage URL.

use std::collections::BTreeMap;
use std::sync::Mutex;

use async_trait::async_trait;

use super::{LeafAlloc, SegmentStore, StoreError};

#[derive(Default)]
pub struct MemoryStore {
    rows: Mutex<BTreeMap<String, LeafAlloc>>,
}

impl MemoryStore {
    pub fn new() -> MemoryStore {
        MemoryStore::default()
    }

    fn rows(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, LeafAlloc>> {
        // A panic while holding this lock cannot leave a row half-written, so poisoning is moot.
        self.rows.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[async_trait]
impl SegmentStore for MemoryStore {
    async fn allocate(&self, tag: &str, step: Option<i64>) -> Result<LeafAlloc, StoreError> {
        let mut rows = self.rows();
        let row = rows
            .get_mut(tag)
            .ok_or_else(|| StoreError::UnknownTag(tag.to_string()))?;
        row.max_id = row
            .max_id
            .checked_add(step.unwrap_or(row.step))
            .ok_or_else(|| StoreError::Exhausted(tag.to_string()))?;
        Ok(row.clone())
    }

    async fn list(&self) -> Result<Vec<LeafAlloc>, StoreError> {
        Ok(self.rows().values().cloned().collect())
    }

    async fn create_tag(
        &self,
        tag: &str,
        step: i64,
        max_id: i64,
        description: Option<&str>,
    ) -> Result<(), StoreError> {
        let mut rows = self.rows();
        if rows.contains_key(tag) {
            return Err(StoreError::TagExists(tag.to_string()));
        }
        rows.insert(
            tag.to_string(),
            LeafAlloc {
                tag: tag.to_string(),
                max_id,
                step,
                description: description.map(str::to_string),
            },
        );
        Ok(())
    }

    async fn set_step(&self, tag: &str, step: i64) -> Result<(), StoreError> {
        let mut rows = self.rows();
        let row = rows
            .get_mut(tag)
            .ok_or_else(|| StoreError::UnknownTag(tag.to_string()))?;
        row.step = step;
        Ok(())
    }

    fn backend(&self) -> &'static str {
        "memory"
    }

    async fn close(&self) {}
}
