//! Allocations of different tags that arrive together share one transaction and one commit,
//! so a node meeting many cold tags at once pays the database's durable commit once per batch.

use std::sync::{Arc, Mutex};

use tokio::sync::{oneshot, Semaphore};

use super::{Grant, LeafAlloc, SegmentStore, StoreError};

/// Most allocations one transaction carries: enough to share a commit among a burst of cold
/// tags, few enough that the row locks it holds are released within milliseconds.
const MAX_BATCH: usize = 32;

/// Batches the allocations given to it. At most `runners` batches run at once; a request that
/// finds every runner busy waits in the queue, and the next runner free takes it with every
/// other request waiting then.
pub struct AllocationBatcher {
    store: Arc<dyn SegmentStore>,
    queue: Arc<Mutex<Vec<Waiting>>>,
    runners: Arc<Semaphore>,
}

struct Waiting {
    tag: String,
    grant: Grant,
    reply: oneshot::Sender<Result<LeafAlloc, StoreError>>,
}

impl AllocationBatcher {
    /// SQLite has one writer, so one runner; a server database `runners` at once.
    pub fn new(store: Arc<dyn SegmentStore>, runners: usize) -> AllocationBatcher {
        let runners = if store.backend() == "sqlite" {
            1
        } else {
            runners.max(1)
        };
        AllocationBatcher {
            store,
            queue: Arc::new(Mutex::new(Vec::new())),
            runners: Arc::new(Semaphore::new(runners)),
        }
    }

    fn queue(&self) -> std::sync::MutexGuard<'_, Vec<Waiting>> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// [`SegmentStore::allocate`], in a transaction it may share with other tags' allocations.
    pub async fn allocate(&self, tag: &str, grant: Grant) -> Result<LeafAlloc, StoreError> {
        let (reply, mut result) = oneshot::channel();
        self.queue().push(Waiting {
            tag: tag.to_string(),
            grant,
            reply,
        });
        loop {
            tokio::select! {
                biased;
                done = &mut result => return answered(done),
                permit = self.runners.clone().acquire_owned() => {
                    let permit = permit.expect("the semaphore is never closed");
                    let batch: Vec<Waiting> = {
                        let mut queue = self.queue();
                        let n = queue.len().min(MAX_BATCH);
                        queue.drain(..n).collect()
                    };
                    if batch.is_empty() {
                        // Another runner took this request: its answer is on the way.
                        drop(permit);
                        return answered(result.await);
                    }
                    // Run apart from this request, which its caller may drop (a client gone):
                    // the batch's other requests still get their answers.
                    let store = self.store.clone();
                    let _ = tokio::spawn(async move {
                        run(store, batch).await;
                        drop(permit);
                    })
                    .await;
                }
            }
        }
    }
}

fn answered(
    done: Result<Result<LeafAlloc, StoreError>, oneshot::error::RecvError>,
) -> Result<LeafAlloc, StoreError> {
    done.unwrap_or_else(|_| Err(StoreError::Unavailable("the allocation was not run".into())))
}

/// Runs one batch. Rows are locked in one order on every node, the order of the requests
/// given to the store (tags compared with ASCII letters lowered, so the tags MySQL takes for
/// one row come together, then bytewise), so two batches never wait for each other in a
/// circle. A store locks them in that order whether row by row or in one statement: nodes that
/// lock in two orders nearly stop under contention (each waits for the other's locks until a
/// lock timeout).
/// A batch whose transaction failed took nothing: each of its requests is then made alone, so
/// each gets its own error (a lock timeout on one row does not fail the others).
async fn run(store: Arc<dyn SegmentStore>, mut batch: Vec<Waiting>) {
    if batch.len() == 1 {
        let one = batch.pop().expect("one request");
        let _ = one.reply.send(store.allocate(&one.tag, one.grant).await);
        return;
    }
    batch.sort_by_cached_key(|w| (w.tag.to_ascii_lowercase(), w.tag.clone()));
    let requests: Vec<(String, Grant)> = batch
        .iter()
        .map(|w| (w.tag.clone(), w.grant.clone()))
        .collect();
    match store.allocate_many(&requests).await {
        Ok(results) if results.len() == batch.len() => {
            for (waiting, result) in batch.into_iter().zip(results) {
                let _ = waiting.reply.send(result);
            }
        }
        outcome => {
            if let Err(e) = outcome {
                tracing::debug!(error = %e, allocations = batch.len(), "batched allocation failed; each is made alone");
            }
            for waiting in batch {
                let result = store.allocate(&waiting.tag, waiting.grant).await;
                let _ = waiting.reply.send(result);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::memory::MemoryStore;
    use crate::storage::NewTag;

    /// Many tags allocated at once from many tasks: each gets the ranges it would alone,
    /// every range distinct, and an unknown tag its own error.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn batched_allocations_answer_each_request_as_alone() {
        let store: Arc<dyn SegmentStore> = Arc::new(MemoryStore::default());
        for t in 0..20 {
            store
                .create_tag(&NewTag {
                    tag: format!("t{t}"),
                    step: 10,
                    start: 1,
                    description: None,
                    split: None,
                    max_tags: 100,
                })
                .await
                .unwrap();
        }
        let batcher = Arc::new(AllocationBatcher::new(store.clone(), 2));
        let mut tasks = Vec::new();
        for i in 0..200 {
            let batcher = batcher.clone();
            tasks.push(tokio::spawn(async move {
                let tag = format!("t{}", i % 20);
                (
                    tag.clone(),
                    batcher.allocate(&tag, Grant::step(None, 0)).await,
                )
            }));
        }
        let unknown = batcher.allocate("nope", Grant::step(None, 0)).await;
        assert!(matches!(unknown, Err(StoreError::UnknownTag(t)) if t == "nope"));
        let mut ranges = std::collections::HashSet::new();
        for task in tasks {
            let (tag, alloc) = task.await.unwrap();
            let alloc = alloc.unwrap();
            assert_eq!(alloc.tag, tag);
            assert_eq!(alloc.max_id - alloc.first, 10, "{alloc:?}");
            assert!(
                ranges.insert((tag, alloc.max_id)),
                "a range handed out twice"
            );
        }
        for t in 0..20 {
            let row = store.row(&format!("t{t}")).await.unwrap().unwrap();
            assert_eq!(row.max_id, 1 + 10 * 10, "t{t}: ten allocations of 10");
        }
    }
}
