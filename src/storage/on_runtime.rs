//! A store whose every call runs on one runtime, the application's, whichever thread asks.
//! A database socket belongs to the event loop that opened it; connection threads must not own one.

use std::future::Future;
use std::sync::Arc;

use async_trait::async_trait;
use tokio::runtime::Handle;

use super::{
    Grant, LeafAlloc, LeaseKeeper, NewTag, SegmentStore, StoreError, WorkerLeaseStore, WorkerRow,
};

/// Runs the calls of `inner` as tasks on `runtime`. Without it, a pooled connection opened
/// during a command on a connection thread would be registered with that thread's event loop:
/// it would be served only when that thread is idle, and die with it at shutdown.
pub struct OnRuntime<S: ?Sized> {
    inner: Arc<S>,
    runtime: Handle,
}

impl<S: ?Sized + Send + Sync + 'static> OnRuntime<S> {
    pub fn new(inner: Arc<S>, runtime: Handle) -> OnRuntime<S> {
        OnRuntime { inner, runtime }
    }

    /// `call(inner)` as a task on the runtime. Dropping the returned future (a caller's time
    /// limit) does not cancel the call, as a statement sent to the database may still apply;
    /// its result is dropped instead. Callers treat either the same way: IDs may be skipped,
    /// never repeated.
    async fn run<T, F, Fut>(&self, call: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(Arc<S>) -> Fut,
        Fut: Future<Output = Result<T, StoreError>> + Send + 'static,
    {
        match self.runtime.spawn(call(self.inner.clone())).await {
            Ok(result) => result,
            Err(e) => Err(StoreError::Unavailable(format!(
                "storage call did not finish: {e}"
            ))),
        }
    }
}

#[async_trait]
impl SegmentStore for OnRuntime<dyn SegmentStore> {
    async fn allocate(&self, tag: &str, grant: Grant) -> Result<LeafAlloc, StoreError> {
        let tag = tag.to_string();
        self.run(|s| async move { s.allocate(&tag, grant).await })
            .await
    }

    async fn allocate_many(
        &self,
        requests: &[(String, Grant)],
    ) -> Result<Vec<Result<LeafAlloc, StoreError>>, StoreError> {
        let requests = requests.to_vec();
        self.run(|s| async move { s.allocate_many(&requests).await })
            .await
    }

    async fn list(&self) -> Result<Vec<LeafAlloc>, StoreError> {
        self.run(|s| async move { s.list().await }).await
    }

    async fn rules(&self) -> Result<Vec<(String, Option<String>)>, StoreError> {
        self.run(|s| async move { s.rules().await }).await
    }

    async fn rules_after(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, Option<String>)>, StoreError> {
        let after = after.map(str::to_string);
        self.run(|s| async move { s.rules_after(after.as_deref(), limit).await })
            .await
    }

    async fn row(&self, tag: &str) -> Result<Option<LeafAlloc>, StoreError> {
        let tag = tag.to_string();
        self.run(|s| async move { s.row(&tag).await }).await
    }

    async fn create_tag(&self, new: &NewTag) -> Result<(), StoreError> {
        let new = new.clone();
        self.run(|s| async move { s.create_tag(&new).await }).await
    }

    async fn claim_split(
        &self,
        tag: &str,
        expected: Option<&str>,
        split: Option<&str>,
    ) -> Result<Option<String>, StoreError> {
        let (tag, expected, split) = (
            tag.to_string(),
            expected.map(str::to_string),
            split.map(str::to_string),
        );
        self.run(|s| async move {
            s.claim_split(&tag, expected.as_deref(), split.as_deref())
                .await
        })
        .await
    }

    async fn resplit(&self, tag: &str, split: Option<&str>, start: i64) -> Result<i64, StoreError> {
        let (tag, split) = (tag.to_string(), split.map(str::to_string));
        self.run(|s| async move { s.resplit(&tag, split.as_deref(), start).await })
            .await
    }

    async fn raise(&self, tag: &str, floor: i64, record: &str) -> Result<i64, StoreError> {
        let (tag, record) = (tag.to_string(), record.to_string());
        self.run(|s| async move { s.raise(&tag, floor, &record).await })
            .await
    }

    async fn claim_opaque(
        &self,
        tag: &str,
        marker: &str,
        below: i64,
    ) -> Result<(Option<String>, i64), StoreError> {
        let (tag, marker) = (tag.to_string(), marker.to_string());
        self.run(|s| async move { s.claim_opaque(&tag, &marker, below).await })
            .await
    }

    async fn set_step(&self, tag: &str, step: i64) -> Result<(), StoreError> {
        let tag = tag.to_string();
        self.run(|s| async move { s.set_step(&tag, step).await })
            .await
    }

    fn backend(&self) -> &'static str {
        self.inner.backend()
    }

    async fn identity(&self) -> Result<Option<super::DbIdentity>, StoreError> {
        self.run(|s| async move { s.identity().await }).await
    }

    async fn schema_version(&self) -> Option<i64> {
        self.run(|s| async move { Ok(s.schema_version().await) })
            .await
            .ok()
            .flatten()
    }

    async fn close(&self) {
        let _ = self
            .run(|s| async move {
                s.close().await;
                Ok(())
            })
            .await;
    }

    fn worker_leases(self: Arc<Self>) -> Option<Arc<dyn WorkerLeaseStore>> {
        let leases = self.inner.clone().worker_leases()?;
        Some(Arc::new(OnRuntime::new(leases, self.runtime.clone())))
    }
}

#[async_trait]
impl WorkerLeaseStore for OnRuntime<dyn WorkerLeaseStore> {
    fn keeper(&self) -> LeaseKeeper {
        self.inner.keeper()
    }

    async fn instance_changed_within(&self, window_ms: i64) -> Result<bool, StoreError> {
        self.run(|s| async move { s.instance_changed_within(window_ms).await })
            .await
    }

    async fn claim(
        &self,
        worker_id: i64,
        owner: &str,
        lease_ms: i64,
    ) -> Result<Option<i64>, StoreError> {
        let owner = owner.to_string();
        self.run(|s| async move { s.claim(worker_id, &owner, lease_ms).await })
            .await
    }

    async fn renew(
        &self,
        worker_id: i64,
        owner: &str,
        lease_ms: i64,
        fence_ms: i64,
    ) -> Result<bool, StoreError> {
        let owner = owner.to_string();
        self.run(|s| async move { s.renew(worker_id, &owner, lease_ms, fence_ms).await })
            .await
    }

    async fn release(&self, worker_id: i64, owner: &str, fence_ms: i64) -> Result<(), StoreError> {
        let owner = owner.to_string();
        self.run(|s| async move { s.release(worker_id, &owner, fence_ms).await })
            .await
    }

    async fn workers(&self) -> Result<Vec<WorkerRow>, StoreError> {
        self.run(|s| async move { s.workers().await }).await
    }

    async fn record_layout(
        &self,
        expected: Option<&str>,
        layout: &str,
    ) -> Result<Option<String>, StoreError> {
        let (expected, layout) = (expected.map(str::to_string), layout.to_string());
        self.run(|s| async move { s.record_layout(expected.as_deref(), &layout).await })
            .await
    }
}
