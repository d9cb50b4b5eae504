//! Leaf-segment: each tag hands out IDs from an in-memory segment reserved in the database,
//! with the next segment preloaded in the background so requests rarely wait for storage.

mod buffer;
pub mod step;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

pub use buffer::{store_reason, BufferState, LoadFailure, Segment};

use crate::config::{validate_tag_name, SegmentConfig, MAX_TAG_START};
use crate::engine::clock::Clock;
use crate::metrics::Metrics;
use crate::storage::{LeafAlloc, SegmentMarks, SegmentStore, StoreError};

/// Tuning of the engine, taken from [`SegmentConfig`].
#[derive(Debug, Clone)]
pub struct SegmentSettings {
    pub adaptive_step: bool,
    pub max_step: i64,
    /// Longest a request waits for a load when both buffers are empty.
    pub load_timeout: Duration,
    /// Most tags the table may hold; creating one more is refused.
    pub max_tags: usize,
}

impl From<&SegmentConfig> for SegmentSettings {
    fn from(c: &SegmentConfig) -> Self {
        SegmentSettings {
            adaptive_step: c.adaptive_step,
            max_step: c.max_step,
            load_timeout: Duration::from_millis(c.load_timeout_ms),
            max_tags: c.max_tags,
        }
    }
}

/// Errors a caller of the engine can get; the RESP and HTTP layers map them to replies.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SegmentError {
    #[error("unknown tag '{0}'")]
    UnknownTag(String),
    /// Both buffers are used up and no segment could be loaded; `reason` starts with
    /// "database unreachable" only when the database did not answer.
    #[error("segment for '{tag}' exhausted and {reason}")]
    Unavailable { tag: String, reason: String },
    #[error("tag '{0}' has exhausted its ID space")]
    Exhausted(String),
    /// The database handed out a range this node may already have served.
    #[error("tag '{tag}': the database returned IDs from {from}, at or below {mark}, the highest this node already loaded (restored backup or lossy failover?); refusing until an operator moves the tag forward (LEAF.TAG SKIP {tag} <n>)")]
    Rollback { tag: String, from: i64, mark: i64 },
    #[error("tag '{0}' already exists")]
    TagExists(String),
    #[error("{0}")]
    Invalid(String),
    #[error("storage error: {0}")]
    Storage(String),
}

impl From<StoreError> for SegmentError {
    fn from(err: StoreError) -> SegmentError {
        match err {
            StoreError::UnknownTag(t) => SegmentError::UnknownTag(t),
            StoreError::TagExists(t) => SegmentError::TagExists(t),
            StoreError::Exhausted(t) => SegmentError::Exhausted(t),
            other => SegmentError::Storage(other.to_string()),
        }
    }
}

/// A tag's double buffer and the signal that a load finished.
pub struct TagBuffer {
    name: Arc<str>,
    state: Mutex<BufferState>,
    /// Bumped after every finished load, so waiting requests re-check the buffers.
    loaded: watch::Sender<u64>,
    /// One allocation of this tag at a time on this node (a background load or an INCRBY
    /// block), each checked against the high-water mark before the next is sent: responses of
    /// concurrent allocations could otherwise arrive out of order and look like a rollback,
    /// and a real rollback between two in-flight allocations could go unseen.
    allocating: tokio::sync::Mutex<()>,
}

impl TagBuffer {
    fn new(name: &str) -> TagBuffer {
        TagBuffer {
            name: name.into(),
            state: Mutex::new(BufferState::default()),
            loaded: watch::Sender::new(0),
            allocating: tokio::sync::Mutex::new(()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, BufferState> {
        // Nothing between lock and unlock can panic half-way through a change of state.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A copy of one tag's state for LEAF.TAGS and the monitor page.
#[derive(Debug, Clone)]
pub struct TagSnapshot {
    pub tag: String,
    /// The step of the last load (the adaptive step).
    pub step: i64,
    /// The step stored in the table.
    pub table_step: i64,
    /// The table's `max_id` as of this node's last load.
    pub max_id: i64,
    pub current: Option<Segment>,
    pub next: Option<Segment>,
    pub loading: bool,
    pub last_error: Option<String>,
    /// IDs this node handed out of the tag.
    pub served: u64,
    pub loads_ok: u64,
    pub loads_failed: u64,
    pub rollbacks: u64,
}

/// Counters of the engine's activity.
#[derive(Debug, Default)]
pub struct SegmentStats {
    pub loads_ok: AtomicU64,
    pub loads_failed: AtomicU64,
    /// Requests that had to wait for a load because both buffers were empty.
    pub request_waits: AtomicU64,
}

/// What a request does after looking at its tag's buffers under the lock.
enum Step {
    Served {
        last: i64,
        preload: bool,
    },
    Block,
    Failed(LoadFailure),
    Wait {
        loaded: watch::Receiver<u64>,
        start_load: bool,
    },
}

/// Tags are created only by admins and configuration, so the hash needs no defence against
/// chosen collisions beyond foldhash's per-process seed; SipHash cost more than the rest of
/// an INCR's lookup.
type TagMap = HashMap<Box<[u8]>, Arc<TagBuffer>, foldhash::fast::RandomState>;

/// A miss on an unknown tag re-reads the tag list at most this often, so a flood of requests
/// for tags that do not exist costs the database at most a few reads a second.
const MISS_REFRESH_INTERVAL_MS: u64 = 200;

/// The segment engine shared by all connections.
pub struct SegmentEngine {
    store: Arc<dyn SegmentStore>,
    /// This node's durable high-water mark per tag (the rollback guard).
    marks: Arc<SegmentMarks>,
    /// Read on every request without a shared lock; replaced whole when the tag set changes.
    tags: ArcSwap<TagMap>,
    /// Serialises changes of the tag set; holds the clock time of the last refresh that a
    /// miss triggered (periodic refreshes do not count, so a miss right after one still looks).
    tag_writer: tokio::sync::Mutex<Option<u64>>,
    settings: SegmentSettings,
    clock: Arc<dyn Clock>,
    stats: SegmentStats,
    metrics: Arc<Metrics>,
}

impl SegmentEngine {
    pub fn new(
        store: Arc<dyn SegmentStore>,
        marks: Arc<SegmentMarks>,
        settings: SegmentSettings,
        clock: Arc<dyn Clock>,
        metrics: Arc<Metrics>,
    ) -> Arc<SegmentEngine> {
        Arc::new(SegmentEngine {
            store,
            marks,
            tags: ArcSwap::from_pointee(TagMap::default()),
            tag_writer: tokio::sync::Mutex::new(None),
            settings,
            clock,
            stats: SegmentStats::default(),
            metrics,
        })
    }

    pub fn store(&self) -> &Arc<dyn SegmentStore> {
        &self.store
    }

    pub fn stats(&self) -> &SegmentStats {
        &self.stats
    }

    pub fn settings(&self) -> &SegmentSettings {
        &self.settings
    }

    /// Number of tags currently known.
    pub fn tag_count(&self) -> usize {
        self.tags.load().len()
    }

    /// [`SegmentEngine::next_ids`] when the tag's buffers hold the IDs, without waiting and
    /// without building a future; `None` when that would need the tag list or the database.
    /// The tag is given as bytes (the key as the client sent it): tags are ASCII, and the
    /// request path need not prove it is text first.
    pub fn try_next_ids(self: &Arc<Self>, tag: &[u8], n: i64) -> Option<i64> {
        if n < 1 {
            return None;
        }
        let tags = self.tags.load();
        self.take_from_buffers(tags.get(tag)?, n)
    }

    /// Hands out `n` contiguous IDs of `tag` and returns the last one (the caller owns
    /// `last - n + 1 ..= last`). Waits for storage only when both buffers are used up.
    pub async fn next_ids(self: &Arc<Self>, tag: &str, n: i64) -> Result<i64, SegmentError> {
        if n < 1 {
            return Err(SegmentError::Invalid("count must be positive".into()));
        }
        // Fast path: the tag map is read without cloning anything, and the clock is not read.
        let found = {
            let tags = self.tags.load();
            match tags.get(tag.as_bytes()) {
                Some(buffer) => match self.take_from_buffers(buffer, n) {
                    Some(last) => return Ok(last),
                    None => Some(buffer.clone()),
                },
                None => None,
            }
        };
        let buffer = match found {
            Some(buffer) => buffer,
            None => self.lookup_after_refresh(tag).await?,
        };
        let deadline = tokio::time::Instant::now() + self.settings.load_timeout;
        let mut waited = false;
        loop {
            let step = {
                let mut st = buffer.lock();
                let now = self.clock.now_millis();
                if let Some(last) = st.take(n) {
                    let preload = st.wants_preload(|| now);
                    if preload {
                        st.loading = true;
                    }
                    Step::Served { last, preload }
                } else if st.last_load_ms.is_some() && n > st.step.max(st.table_step) {
                    Step::Block
                } else if let Some(failure) = st
                    .failure
                    .as_ref()
                    .filter(|_| waited || now < st.retry_at_ms)
                {
                    Step::Failed(failure.clone())
                } else {
                    let start_load = !st.loading;
                    st.loading = true;
                    // Subscribed under the lock, so the end of the load cannot be missed.
                    Step::Wait {
                        loaded: buffer.loaded.subscribe(),
                        start_load,
                    }
                }
            };
            let mut loaded = match step {
                Step::Served { last, preload } => {
                    if preload {
                        self.spawn_load(buffer.clone());
                    }
                    return Ok(last);
                }
                Step::Block => return self.allocate_block(&buffer, n).await,
                Step::Failed(failure) => return Err(self.failure_error(tag, failure)),
                Step::Wait { loaded, start_load } => {
                    if start_load {
                        self.spawn_load(buffer.clone());
                    }
                    loaded
                }
            };
            waited = true;
            self.stats.request_waits.fetch_add(1, Ordering::Relaxed);
            if tokio::time::timeout_at(deadline, loaded.changed())
                .await
                .is_err()
            {
                return Err(SegmentError::Unavailable {
                    tag: tag.to_string(),
                    reason: format!(
                        "database unreachable: no segment loaded within {} ms",
                        self.settings.load_timeout.as_millis()
                    ),
                });
            }
        }
    }

    /// Takes `n` IDs if the buffers have them, starting a preload when one is due.
    fn take_from_buffers(self: &Arc<Self>, buffer: &Arc<TagBuffer>, n: i64) -> Option<i64> {
        let mut st = buffer.lock();
        let last = st.take(n)?;
        let preload = st.wants_preload(|| self.clock.now_millis());
        if preload {
            st.loading = true;
        }
        drop(st);
        if preload {
            self.spawn_load(buffer.clone());
        }
        Some(last)
    }

    fn failure_error(&self, tag: &str, failure: LoadFailure) -> SegmentError {
        match failure {
            LoadFailure::UnknownTag => {
                self.forget_tag(tag);
                SegmentError::UnknownTag(tag.to_string())
            }
            LoadFailure::Exhausted => SegmentError::Exhausted(tag.to_string()),
            LoadFailure::Rollback { from, mark } => SegmentError::Rollback {
                tag: tag.to_string(),
                from,
                mark,
            },
            LoadFailure::Unavailable(reason) => SegmentError::Unavailable {
                tag: tag.to_string(),
                reason: reason.to_string(),
            },
        }
    }

    /// A block larger than any segment of the tag: reserved directly in the database.
    async fn allocate_block(&self, buffer: &TagBuffer, n: i64) -> Result<i64, SegmentError> {
        self.stats.request_waits.fetch_add(1, Ordering::Relaxed);
        let result = tokio::time::timeout(
            self.settings.load_timeout,
            self.allocate_guarded(buffer, Some(n)),
        )
        .await;
        match result {
            Ok(Ok((alloc, guarded))) => match guarded {
                Ok(()) => {
                    let mut st = buffer.lock();
                    st.served += n as u64;
                    st.pass_block(alloc.max_id);
                    Ok(alloc.max_id)
                }
                Err(failure) => {
                    if matches!(failure, LoadFailure::Rollback { .. }) {
                        buffer.lock().rollbacks += 1;
                    }
                    Err(self.failure_error(&buffer.name, failure))
                }
            },
            Ok(Err(StoreError::UnknownTag(t))) => {
                self.forget_tag(&t);
                Err(SegmentError::UnknownTag(t))
            }
            Ok(Err(StoreError::Exhausted(t))) => Err(SegmentError::Exhausted(t)),
            Ok(Err(e)) => Err(SegmentError::Unavailable {
                tag: buffer.name.to_string(),
                reason: store_reason(&e),
            }),
            Err(_) => Err(SegmentError::Unavailable {
                tag: buffer.name.to_string(),
                reason: "database unreachable: it did not answer in time".into(),
            }),
        }
    }

    /// The rollback guard: the range `(max_id - step, max_id]` must start at or above the
    /// highest `max_id` this node loaded before; then `max_id` becomes the new mark, on disk.
    async fn guard(&self, tag: &str, max_id: i64, step: i64) -> Result<(), LoadFailure> {
        let from = max_id - step + 1;
        if let Some(mark) = self.marks.get(tag) {
            if from <= mark {
                return Err(LoadFailure::Rollback { from, mark });
            }
        }
        self.marks.record(tag, max_id).await.map_err(|e| {
            LoadFailure::Unavailable(
                format!("cannot record the high-water mark in the state directory: {e}").into(),
            )
        })
    }

    /// Allocates a range of `buffer`'s tag and runs the rollback guard on it, one allocation
    /// of the tag at a time. `step` is the range's size (`None`: the row's step).
    async fn allocate_guarded(
        &self,
        buffer: &TagBuffer,
        step: Option<i64>,
    ) -> Result<(LeafAlloc, Result<(), LoadFailure>), StoreError> {
        let _one_at_a_time = buffer.allocating.lock().await;
        let alloc = self.store.allocate(&buffer.name, step).await?;
        let guarded = self
            .guard(&buffer.name, alloc.max_id, step.unwrap_or(alloc.step))
            .await;
        Ok((alloc, guarded))
    }

    fn spawn_load(self: &Arc<Self>, buffer: Arc<TagBuffer>) {
        let engine = self.clone();
        tokio::spawn(async move { engine.load(&buffer).await });
    }

    /// Reserves the next segment of a tag and installs it; exactly one runs per tag at a time
    /// (the caller set `loading`).
    async fn load(&self, buffer: &TagBuffer) {
        let requested_step = {
            let st = buffer.lock();
            match st.last_load_ms {
                Some(last) if self.settings.adaptive_step => Some(step::next_step(
                    st.step,
                    st.table_step,
                    self.settings.max_step,
                    self.clock.now_millis().saturating_sub(last),
                )),
                _ => None,
            }
        };
        // Background loads may outlast a request's patience, but never hang for ever.
        let limit = (self.settings.load_timeout * 5).max(Duration::from_secs(5));
        let started = std::time::Instant::now();
        // The range is checked against this node's high-water mark, and the new mark made
        // durable, before a single ID of it is handed out.
        let result = match tokio::time::timeout(
            limit,
            self.allocate_guarded(buffer, requested_step),
        )
        .await
        {
            Ok(result) => result,
            Err(_) => Err(StoreError::Unavailable(
                "database did not answer in time".into(),
            )),
        };
        self.metrics.segment_load(&buffer.name, started.elapsed());
        let outcome = match result {
            Ok((alloc, Ok(()))) => Ok((alloc.clone(), requested_step.unwrap_or(alloc.step))),
            Ok((_, Err(failure))) => Err(failure),
            Err(err) => Err(LoadFailure::from_store(&err)),
        };
        let now = self.clock.now_millis();
        {
            let mut st = buffer.lock();
            match outcome {
                Ok((alloc, step)) => {
                    self.stats.loads_ok.fetch_add(1, Ordering::Relaxed);
                    if st.failure.is_some() {
                        tracing::info!(tag = %buffer.name, "segment loads succeed again");
                    }
                    st.install(Segment::granted(alloc.max_id, step), alloc.step, now);
                }
                Err(failure) => {
                    self.stats.loads_failed.fetch_add(1, Ordering::Relaxed);
                    if matches!(failure, LoadFailure::Rollback { .. }) {
                        st.rollbacks += 1;
                    }
                    if st.failure.is_none() {
                        let error = self.failure_error(&buffer.name, failure.clone());
                        tracing::warn!(tag = %buffer.name, %error, "segment load failed; retrying with back-off");
                    }
                    st.record_failure(failure, now);
                }
            }
            st.loading = false;
        }
        buffer
            .loaded
            .send_modify(|generation| *generation = generation.wrapping_add(1));
    }

    /// On a miss, re-reads the tag list (at most once a second) so a tag created on another
    /// node is usable here before the periodic refresh.
    async fn lookup_after_refresh(&self, tag: &str) -> Result<Arc<TagBuffer>, SegmentError> {
        validate_tag_name(tag).map_err(|_| SegmentError::UnknownTag(tag.to_string()))?;
        let mut last_refresh = self.tag_writer.lock().await;
        if let Some(buffer) = self.tags.load().get(tag.as_bytes()) {
            return Ok(buffer.clone());
        }
        let now = self.clock.now_millis();
        if last_refresh.is_none_or(|t| now.saturating_sub(t) >= MISS_REFRESH_INTERVAL_MS) {
            self.refresh_locked()
                .await
                .map_err(|e| SegmentError::Unavailable {
                    tag: tag.to_string(),
                    reason: store_reason(&e),
                })?;
            *last_refresh = Some(now);
        }
        self.tags
            .load()
            .get(tag.as_bytes())
            .cloned()
            .ok_or_else(|| SegmentError::UnknownTag(tag.to_string()))
    }

    /// Re-reads the tag list: new rows become tags, removed rows stop being served.
    pub async fn refresh_tags(&self) -> Result<usize, StoreError> {
        let _writer = self.tag_writer.lock().await;
        self.refresh_locked().await
    }

    /// Rebuilds the tag map from the table; the caller holds `tag_writer`.
    async fn refresh_locked(&self) -> Result<usize, StoreError> {
        let rows = self.store.list().await?;
        let old = self.tags.load();
        let map: TagMap = rows
            .iter()
            .map(|row| {
                let buffer = old
                    .get(row.tag.as_bytes())
                    .cloned()
                    .unwrap_or_else(|| Arc::new(TagBuffer::new(&row.tag)));
                (Box::from(row.tag.as_bytes()), buffer)
            })
            .collect();
        let count = map.len();
        self.tags.store(Arc::new(map));
        Ok(count)
    }

    fn forget_tag(&self, tag: &str) {
        self.tags.rcu(|map| {
            let mut map = TagMap::clone(map);
            map.remove(tag.as_bytes());
            map
        });
    }

    /// Creates a tag whose first ID is `start`.
    pub async fn create_tag(
        &self,
        tag: &str,
        step: i64,
        start: i64,
        description: Option<&str>,
    ) -> Result<(), SegmentError> {
        validate_tag_name(tag).map_err(SegmentError::Invalid)?;
        self.validate_step(step)?;
        if !(1..=MAX_TAG_START).contains(&start) {
            return Err(SegmentError::Invalid(format!(
                "start must be between 1 and {MAX_TAG_START}"
            )));
        }
        let _writer = self.tag_writer.lock().await;
        // Counted in the table, not in this node's map: other nodes create tags too.
        let existing = self.store.list().await?.len();
        if existing >= self.settings.max_tags {
            return Err(SegmentError::Invalid(format!(
                "tag limit reached: the table has {existing} tags (segment.max_tags = {})",
                self.settings.max_tags
            )));
        }
        self.store
            .create_tag(tag, step, start - 1, description)
            .await?;
        self.tags.rcu(|map| {
            let mut map = TagMap::clone(map);
            map.entry(Box::from(tag.as_bytes()))
                .or_insert_with(|| Arc::new(TagBuffer::new(tag)));
            map
        });
        Ok(())
    }

    /// Creates a tag unless it exists (config seeds).
    pub async fn ensure_tag(
        &self,
        tag: &str,
        step: i64,
        start: i64,
        description: Option<&str>,
    ) -> Result<bool, SegmentError> {
        match self.create_tag(tag, step, start, description).await {
            Ok(()) => Ok(true),
            Err(SegmentError::TagExists(_)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Moves a tag's `max_id` forward by `n` without handing out the skipped IDs (the runbook
    /// after a database restore or a lossy failover); returns the new `max_id`.
    pub async fn skip(&self, tag: &str, n: i64) -> Result<i64, SegmentError> {
        if n < 1 {
            return Err(SegmentError::Invalid(
                "skip must be a positive number of IDs".into(),
            ));
        }
        let alloc = self.store.allocate(tag, Some(n)).await?;
        tracing::warn!(
            tag,
            skipped = n,
            max_id = alloc.max_id,
            "tag moved forward by an operator"
        );
        Ok(alloc.max_id)
    }

    /// [`SegmentEngine::skip`] for every tag in the table; returns each tag's new `max_id`.
    pub async fn skip_all(&self, n: i64) -> Result<Vec<(String, i64)>, SegmentError> {
        let mut moved = Vec::new();
        for row in self.store.list().await? {
            moved.push((row.tag.clone(), self.skip(&row.tag, n).await?));
        }
        Ok(moved)
    }

    /// Changes the step stored for a tag; it applies from the tag's next load.
    pub async fn set_step(&self, tag: &str, step: i64) -> Result<(), SegmentError> {
        self.validate_step(step)?;
        Ok(self.store.set_step(tag, step).await?)
    }

    fn validate_step(&self, step: i64) -> Result<(), SegmentError> {
        if !(1..=self.settings.max_step).contains(&step) {
            return Err(SegmentError::Invalid(format!(
                "step must be between 1 and {}",
                self.settings.max_step
            )));
        }
        Ok(())
    }

    /// Every known tag's buffers, sorted by tag.
    pub fn snapshot(&self) -> Vec<TagSnapshot> {
        let mut tags: Vec<TagSnapshot> = self
            .tags
            .load()
            .values()
            .map(|buffer| {
                let st = buffer.lock();
                TagSnapshot {
                    tag: buffer.name.to_string(),
                    step: st.step,
                    table_step: st.table_step,
                    max_id: st.max_id,
                    current: st.current,
                    next: st.next,
                    loading: st.loading,
                    served: st.served,
                    loads_ok: st.loads_ok,
                    loads_failed: st.loads_failed,
                    rollbacks: st.rollbacks,
                    last_error: st.failure.as_ref().map(|f| match f {
                        LoadFailure::UnknownTag => "unknown tag".to_string(),
                        LoadFailure::Exhausted => "ID space exhausted".to_string(),
                        LoadFailure::Rollback { from, mark } => {
                            format!("rollback: database returned IDs from {from}, below {mark}")
                        }
                        LoadFailure::Unavailable(reason) => reason.to_string(),
                    }),
                }
            })
            .collect();
        tags.sort_by(|a, b| a.tag.cmp(&b.tag));
        tags
    }

    /// Re-reads the tag list every `interval` until `shutdown` is cancelled.
    pub fn spawn_refresher(
        self: &Arc<Self>,
        interval: Duration,
        shutdown: CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        let engine = self.clone();
        tokio::spawn(async move {
            // The first tick is one interval from now: the tag list was just loaded, and an
            // immediate first tick would still wait for the timer's next millisecond.
            let mut ticker =
                tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = ticker.tick() => {
                        if let Err(e) = engine.refresh_tags().await {
                            tracing::warn!(error = %e, "tag refresh failed; keeping the known tags");
                        }
                    }
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::clock::ManualClock;
    use crate::storage::MemoryStore;

    const MINUTE: u64 = 60 * 1000;

    fn engine(max_step: i64, clock: Arc<ManualClock>) -> Arc<SegmentEngine> {
        let settings = SegmentSettings {
            adaptive_step: true,
            max_step,
            load_timeout: Duration::from_secs(1),
            max_tags: 1000,
        };
        SegmentEngine::new(
            Arc::new(MemoryStore::new()),
            crate::storage::SegmentMarks::in_memory(),
            settings,
            clock,
            Arc::new(Metrics::disabled()),
        )
    }

    /// Takes IDs until the tag's current step changed from `before`, and returns the new step.
    async fn drain_until_step_changes(engine: &Arc<SegmentEngine>, before: i64) -> i64 {
        for _ in 0..10_000 {
            engine.next_ids("t", 1).await.unwrap();
            tokio::task::yield_now().await;
            let step = engine.snapshot()[0].step;
            if step != before {
                return step;
            }
        }
        panic!("step stayed at {before}");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn adaptive_step_follows_the_clock() {
        let clock = Arc::new(ManualClock::new(1_000_000_000));
        let engine = engine(400, clock.clone());
        engine.create_tag("t", 100, 1, None).await.unwrap();
        assert_eq!(engine.next_ids("t", 1).await.unwrap(), 1);
        assert_eq!(
            engine.snapshot()[0].step,
            100,
            "first load uses the table step"
        );

        // Segments used up within 15 minutes: the step doubles, up to the cap of 400.
        clock.advance(MINUTE);
        assert_eq!(drain_until_step_changes(&engine, 100).await, 200);
        clock.advance(MINUTE);
        assert_eq!(drain_until_step_changes(&engine, 200).await, 400);

        // A segment that lasted over 30 minutes: the step halves, never below the table's 100.
        clock.advance(31 * MINUTE);
        assert_eq!(drain_until_step_changes(&engine, 400).await, 200);
        clock.advance(31 * MINUTE);
        assert_eq!(drain_until_step_changes(&engine, 200).await, 100);

        // Between 15 and 30 minutes the step stays; drain two whole segments to see two loads.
        clock.advance(20 * MINUTE);
        let loads_before = engine.stats().loads_ok.load(Ordering::SeqCst);
        while engine.stats().loads_ok.load(Ordering::SeqCst) < loads_before + 1 {
            engine.next_ids("t", 1).await.unwrap();
            tokio::task::yield_now().await;
        }
        assert_eq!(engine.snapshot()[0].step, 100);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn segments_never_overlap_under_adaptive_steps() {
        let clock = Arc::new(ManualClock::new(0));
        let engine = engine(1_000_000, clock);
        engine.create_tag("t", 10, 1, None).await.unwrap();
        let mut last = 0;
        for i in 0..20_000 {
            let id = engine.next_ids("t", 1 + (i % 3)).await.unwrap();
            assert!(id > last, "{id} after {last}");
            last = id;
        }
    }

    /// A store whose allocations of the table step answer late, after committing: a background
    /// load finishes after an INCRBY block sent later.
    struct LateAnswers(MemoryStore);

    #[async_trait::async_trait]
    impl SegmentStore for LateAnswers {
        async fn allocate(&self, tag: &str, step: Option<i64>) -> Result<LeafAlloc, StoreError> {
            let alloc = self.0.allocate(tag, step).await;
            if step.is_none() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            alloc
        }
        async fn list(&self) -> Result<Vec<LeafAlloc>, StoreError> {
            self.0.list().await
        }
        async fn create_tag(
            &self,
            tag: &str,
            step: i64,
            max_id: i64,
            description: Option<&str>,
        ) -> Result<(), StoreError> {
            self.0.create_tag(tag, step, max_id, description).await
        }
        async fn set_step(&self, tag: &str, step: i64) -> Result<(), StoreError> {
            self.0.set_step(tag, step).await
        }
        fn backend(&self) -> &'static str {
            "late"
        }
        async fn close(&self) {}
    }

    /// Out-of-order answers of one node's own allocations are not a rollback: allocations of
    /// a tag go one at a time, each checked before the next is sent.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_block_reserved_during_a_slow_load_is_not_taken_for_a_rollback() {
        let settings = SegmentSettings {
            adaptive_step: false,
            max_step: 1000,
            load_timeout: Duration::from_secs(2),
            max_tags: 10,
        };
        let engine = SegmentEngine::new(
            Arc::new(LateAnswers(MemoryStore::new())),
            crate::storage::SegmentMarks::in_memory(),
            settings,
            Arc::new(ManualClock::new(0)),
            Arc::new(Metrics::disabled()),
        );
        engine.create_tag("t", 10, 1, None).await.unwrap();
        assert_eq!(engine.next_ids("t", 1).await.unwrap(), 1);
        // The second ID starts the preload of (10, 20], which answers 50 ms late...
        assert_eq!(engine.next_ids("t", 1).await.unwrap(), 2);
        tokio::time::sleep(Duration::from_millis(5)).await;
        // ...while a block larger than the step is reserved directly.
        let block_end = engine.next_ids("t", 500).await.unwrap();
        assert_eq!(block_end, 520, "the block follows the preloaded segment");
        // IDs keep increasing: the rest of 1..=20 is skipped, the next segment is (520, 530].
        assert_eq!(engine.next_ids("t", 1).await.unwrap(), 521);
        assert_eq!(engine.next_ids("t", 1).await.unwrap(), 522);
    }

    /// The newcomer's case: INCR, an INCRBY larger than the step, INCR again, on one node.
    #[tokio::test(flavor = "current_thread")]
    async fn ids_increase_across_a_block_larger_than_the_step() {
        // The step stays 500 (the cap), so every INCRBY 600 is a block from the database.
        let engine = engine(500, Arc::new(ManualClock::new(0)));
        engine.create_tag("t", 500, 1, None).await.unwrap();
        let mut last = 0;
        for i in 0..3000 {
            let n = match i % 100 {
                7 => 600,
                50 => 50,
                _ => 1,
            };
            let id = engine.next_ids("t", n).await.unwrap();
            assert!(
                id - n + 1 > last,
                "block {}..={id} after {last}",
                id - n + 1
            );
            last = id;
        }
        assert_eq!(engine.next_ids("t", 1).await.unwrap(), last + 1);
    }
}
