//! A store whose database was unreachable at start: every call fails with "not connected"
//! until the background connector installs the real store, after which calls pass through.

use std::sync::{Arc, Mutex, OnceLock};

use async_trait::async_trait;

use super::{Grant, LeafAlloc, NewTag, SegmentStore, StoreError, WorkerLeaseStore};

pub struct DeferredStore {
    backend: &'static str,
    connected: OnceLock<Arc<dyn SegmentStore>>,
    last_error: Mutex<String>,
}

impl DeferredStore {
    pub fn new(backend: &'static str, first_error: String) -> Arc<DeferredStore> {
        Arc::new(DeferredStore {
            backend,
            connected: OnceLock::new(),
            last_error: Mutex::new(first_error),
        })
    }

    /// Installs the connected store; later calls go to it.
    pub fn connect(&self, store: Arc<dyn SegmentStore>) {
        let _ = self.connected.set(store);
    }

    pub fn is_connected(&self) -> bool {
        self.connected.get().is_some()
    }

    pub fn set_error(&self, error: String) {
        *self.last_error.lock().unwrap_or_else(|p| p.into_inner()) = error;
    }

    fn store(&self) -> Result<&Arc<dyn SegmentStore>, StoreError> {
        self.connected.get().ok_or_else(|| {
            let error = self.last_error.lock().unwrap_or_else(|p| p.into_inner());
            StoreError::Unavailable(format!("database not connected yet: {error}"))
        })
    }
}

#[async_trait]
impl SegmentStore for DeferredStore {
    async fn allocate(&self, tag: &str, grant: Grant) -> Result<LeafAlloc, StoreError> {
        self.store()?.allocate(tag, grant).await
    }

    async fn allocate_many(
        &self,
        requests: &[(String, Grant)],
    ) -> Result<Vec<Result<LeafAlloc, StoreError>>, StoreError> {
        self.store()?.allocate_many(requests).await
    }

    async fn identity(&self) -> Result<Option<super::DbIdentity>, StoreError> {
        self.store()?.identity().await
    }

    async fn list(&self) -> Result<Vec<LeafAlloc>, StoreError> {
        self.store()?.list().await
    }

    async fn rules(&self) -> Result<Vec<(String, Option<String>)>, StoreError> {
        self.store()?.rules().await
    }

    async fn rules_after(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, Option<String>)>, StoreError> {
        self.store()?.rules_after(after, limit).await
    }

    async fn row(&self, tag: &str) -> Result<Option<LeafAlloc>, StoreError> {
        self.store()?.row(tag).await
    }

    async fn create_tag(&self, new: &NewTag) -> Result<(), StoreError> {
        self.store()?.create_tag(new).await
    }

    async fn claim_split(
        &self,
        tag: &str,
        expected: Option<&str>,
        split: Option<&str>,
    ) -> Result<Option<String>, StoreError> {
        self.store()?.claim_split(tag, expected, split).await
    }

    async fn resplit(&self, tag: &str, split: Option<&str>, start: i64) -> Result<i64, StoreError> {
        self.store()?.resplit(tag, split, start).await
    }

    async fn raise(&self, tag: &str, floor: i64, record: &str) -> Result<i64, StoreError> {
        self.store()?.raise(tag, floor, record).await
    }

    async fn claim_opaque(
        &self,
        tag: &str,
        marker: &str,
        below: i64,
    ) -> Result<(Option<String>, i64), StoreError> {
        self.store()?.claim_opaque(tag, marker, below).await
    }

    async fn set_step(&self, tag: &str, step: i64) -> Result<(), StoreError> {
        self.store()?.set_step(tag, step).await
    }

    fn backend(&self) -> &'static str {
        self.backend
    }

    async fn close(&self) {
        if let Some(store) = self.connected.get() {
            store.close().await;
        }
    }

    async fn schema_version(&self) -> Option<i64> {
        self.store().ok()?.schema_version().await
    }

    /// The connected store's lease table (none before the database answered: the snowflake
    /// coordinator is started with it once connected, and LEAF.WORKERS asks each time).
    fn worker_leases(self: Arc<Self>) -> Option<Arc<dyn WorkerLeaseStore>> {
        self.connected.get().cloned()?.worker_leases()
    }
}
