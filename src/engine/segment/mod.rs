//! Leaf-segment: each tag hands out IDs from an in-memory segment reserved in the database,
//! with the next segment preloaded in the background so requests rarely wait for storage.

mod admin;
mod admit;
mod buffer;
mod entry;
mod gather;
mod load;
pub mod opaque;
pub mod period;
mod rule;
mod settings;
mod snapshot;
pub mod step;
mod strict;
mod table;
mod tags;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub use buffer::{store_reason, BufferState, Interleave, LoadFailure, Segment};
pub use entry::TagBuffer;
use entry::{TagEntry, TagKind};
pub use load::LoadObserver;
pub use opaque::OpaqueCipher;
pub use period::{Calendar, PeriodRule};
pub use rule::{TagRule, MAX_PREFIX_LEN};
pub use settings::{AutoCreate, SegmentSettings};
pub use snapshot::{TagCursor, TagSnapshot, WHOLE_LIST_LIMIT};
use table::TagTable;
pub use tags::{validate_tag_name, MAX_TAG_LEN, MAX_TAG_START};

use crate::clock::Clock;
use crate::storage::{AllocationBatcher, SegmentMarks, SegmentStore, StoreError};

pub use crate::storage::{zone_names_a_place, MAX_ID_DELTA};

/// The setting a request's wait for the database is.
pub(super) const LOAD_TIMEOUT_KEY: &str = "segment.load_timeout_ms";

/// Why a request that waited `timeout` for the database, until `deadline`, got nothing: the
/// database did not answer, or this node had no time to take the answer (a starved CPU, a
/// paused process). Which one is not known, so both are said, and how late this node's own
/// timer fired when it was late enough to tell.
pub(super) fn timed_out(
    what: &str,
    timeout: std::time::Duration,
    named: &str,
    deadline: tokio::time::Instant,
) -> String {
    let late = tokio::time::Instant::now().saturating_duration_since(deadline);
    let busy = if late >= std::time::Duration::from_millis(50) {
        format!(" (its timer fired {} ms late)", late.as_millis())
    } else {
        String::new()
    };
    format!(
        "{what} within {} ms ({named}): the database did not answer in time, or this node was too busy to take the answer{busy}",
        timeout.as_millis()
    )
}

/// Errors a caller of the engine can get; the RESP and HTTP layers map them to replies.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SegmentError {
    #[error("unknown tag '{}'", shown(.0))]
    UnknownTag(String),
    /// Both buffers are used up and no segment could be loaded; `reason` starts with
    /// "database unreachable" only when the database did not answer.
    #[error("segment for '{tag}' exhausted and {reason}")]
    Unavailable { tag: String, reason: String },
    #[error("tag '{0}' has exhausted its ID space")]
    Exhausted(String),
    /// The database handed out a range this node may already have served.
    #[error("tag '{tag}': the database returned IDs from {from}, at or below {mark}, the highest this node already loaded (restored backup or lossy failover?); refused until the table is past that mark (other loads move it; LEAF.TAG SKIP {tag} <n> at once)")]
    Rollback { tag: String, from: i64, mark: i64 },
    /// A period tag's sequence numbers of this period are all handed out.
    #[error("tag '{tag}': period {period} has used all its {last} sequence numbers; the next period starts again at 1")]
    PeriodExhausted { tag: String, period: i64, last: i64 },
    /// A block larger than what is left of the period: refused whole, nothing taken.
    #[error("tag '{tag}': period {period} has {left} sequence numbers left, fewer than the {asked} asked; nothing was taken")]
    PeriodShort {
        tag: String,
        period: i64,
        left: i64,
        asked: i64,
    },
    #[error("tag '{0}' already exists")]
    TagExists(String),
    #[error("{0}")]
    Invalid(String),
    #[error("storage error: {0}")]
    Storage(String),
}

/// A tag name as an error message shows it: a name longer than any tag can be (a client that
/// sent a whole document as a key) is cut, so the reply stays short.
fn shown(tag: &str) -> std::borrow::Cow<'_, str> {
    const SHOWN: usize = 128;
    match tag.char_indices().nth(SHOWN) {
        Some((cut, _)) => format!("{}…", &tag[..cut]).into(),
        None => tag.into(),
    }
}

impl From<StoreError> for SegmentError {
    fn from(err: StoreError) -> SegmentError {
        match err {
            StoreError::UnknownTag(t) => SegmentError::UnknownTag(t),
            StoreError::TagExists(t) => SegmentError::TagExists(t),
            StoreError::Exhausted(t) | StoreError::NearEnd { tag: t, .. } => {
                SegmentError::Exhausted(t)
            }
            limit @ StoreError::TagLimit { .. } => SegmentError::Invalid(limit.to_string()),
            other => SegmentError::Storage(other.to_string()),
        }
    }
}

/// Counters of the engine's activity.
#[derive(Debug, Default)]
pub struct SegmentStats {
    pub loads_ok: AtomicU64,
    pub loads_failed: AtomicU64,
    /// Requests that had to wait for a load because both buffers were empty.
    pub request_waits: AtomicU64,
    /// A strict tag's holder waited for its requesters to come back before allocating, and
    /// enough did (one allocation served them together) …
    pub strict_gathers_paid: AtomicU64,
    /// … or they did not come back within the wait.
    pub strict_gathers_missed: AtomicU64,
}

/// What a request does after looking at its tag's buffers under the lock.
enum Step<'a> {
    Served {
        last: i64,
        preload: bool,
    },
    Block,
    Failed(LoadFailure),
    Wait {
        loaded: tokio::sync::futures::Notified<'a>,
        start_load: bool,
    },
}

/// Batched allocations in flight at once on a server database (SQLite: one): with the
/// database's connections to spare for strict tags, admin commands and worker-id leases.
const ALLOCATION_RUNNERS: usize = 4;

/// The segment engine shared by all connections.
pub struct SegmentEngine {
    store: Arc<dyn SegmentStore>,
    /// The trend tags' loads, several tags to a transaction when they come together.
    batcher: AllocationBatcher,
    /// This node's durable high-water mark per tag (the rollback guard).
    marks: Arc<SegmentMarks>,
    /// Read on every request without a shared lock.
    tags: TagTable,
    /// Serialises refreshes of the tag set and the reads of a missed tag's row.
    tag_writer: tokio::sync::Mutex<()>,
    settings: SegmentSettings,
    clock: Arc<dyn Clock>,
    stats: SegmentStats,
    /// Told how long each load took (the metrics).
    observer: Arc<dyn LoadObserver>,
}

impl SegmentEngine {
    pub fn new(
        store: Arc<dyn SegmentStore>,
        marks: Arc<SegmentMarks>,
        settings: SegmentSettings,
        clock: Arc<dyn Clock>,
        observer: Arc<dyn LoadObserver>,
    ) -> Arc<SegmentEngine> {
        Arc::new(SegmentEngine {
            batcher: AllocationBatcher::new(store.clone(), ALLOCATION_RUNNERS),
            store,
            marks,
            tags: TagTable::default(),
            tag_writer: tokio::sync::Mutex::new(()),
            settings,
            clock,
            stats: SegmentStats::default(),
            observer,
        })
    }

    pub fn store(&self) -> &Arc<dyn SegmentStore> {
        &self.store
    }

    /// `tag`'s buffers, built now if this is its first request; `None` for a tag not in the
    /// map.
    pub(super) fn buffer_of(&self, tag: &str) -> Option<Arc<TagBuffer>> {
        self.tags.read(tag.as_bytes(), |entry| {
            entry.buffer(tag, &self.settings, &self.tags).clone()
        })
    }

    /// `tag`'s buffers if a request already built them.
    pub(super) fn loaded_buffer_of(&self, tag: &str) -> Option<Arc<TagBuffer>> {
        self.tags
            .read(tag.as_bytes(), |entry| entry.loaded().cloned())
            .flatten()
    }

    pub fn marks(&self) -> &Arc<SegmentMarks> {
        &self.marks
    }

    pub fn stats(&self) -> &SegmentStats {
        &self.stats
    }

    pub fn settings(&self) -> &SegmentSettings {
        &self.settings
    }

    /// Number of tags currently known.
    pub fn tag_count(&self) -> usize {
        self.tags.len()
    }

    /// [`SegmentEngine::next_ids`] when the tag's buffers hold the IDs, without waiting and
    /// without building a future; `None` when that would need the tag list or the database.
    /// The tag is given as bytes (the key as the client sent it): tags are ASCII, and the
    /// request path need not prove it is text first.
    pub fn try_next_ids(self: &Arc<Self>, tag: &[u8], n: i64) -> Option<i64> {
        if n < 1 {
            return None;
        }
        self.tags
            .read(tag, |entry| {
                let buffer = entry.loaded()?;
                if n != 1 && buffer.kind.opaque().is_some() {
                    return None;
                }
                buffer.handed_out(self.take_from_buffers(buffer, n)?)
            })
            .flatten()
    }

    /// A pipeline of `n` INCRs of `tag` served as one block of `n` consecutive IDs, the last
    /// returned, when the tag is strict: one allocation instead of `n` in a row. `None` for any
    /// other tag (and for one not yet known): the caller serves each INCR on its own. Period
    /// tags are not batched: a block that reached the period's last number would be refused
    /// whole, where INCRs one by one get every number left and then the error.
    pub async fn next_strict_block(
        self: &Arc<Self>,
        tag: &[u8],
        n: i64,
    ) -> Option<Result<i64, SegmentError>> {
        let buffer = self
            .tags
            .read(tag, |entry| {
                let buffer = entry.loaded()?;
                let plain_strict = matches!(buffer.kind, TagKind::Strict);
                (plain_strict && n >= 1).then(|| buffer.clone())
            })
            .flatten()?;
        Some(self.next_strict(&buffer, n).await)
    }

    /// The next ID of a period tag in its string form (`ORD20261204000123`); a tag without a
    /// period is refused before any ID is taken.
    pub async fn next_code(self: &Arc<Self>, tag: &str) -> Result<String, SegmentError> {
        let buffer = match self.buffer_of(tag) {
            Some(buffer) => buffer,
            None => self.lookup_after_refresh(tag).await?,
        };
        let Some(rule) = buffer.kind.period().cloned() else {
            return Err(SegmentError::Invalid(format!(
                "tag '{}' has no period: LEAF.CODE serves the tags configured with one (INCR serves every tag)",
                shown(tag)
            )));
        };
        let id = self.next_strict(&buffer, 1).await?;
        Ok(rule.code(id))
    }

    /// Hands out `n` contiguous IDs of `tag` and returns the last one (the caller owns
    /// `last - n + 1 ..= last`). Waits for storage only when both buffers are used up.
    pub async fn next_ids(self: &Arc<Self>, tag: &str, n: i64) -> Result<i64, SegmentError> {
        if n < 1 {
            return Err(SegmentError::Invalid("count must be positive".into()));
        }
        // Fast path: the tag map is read without cloning anything, and the clock is not read.
        let found = self.tags.read(tag.as_bytes(), |entry| {
            let buffer = entry.buffer(tag, &self.settings, &self.tags);
            match buffer.kind.opaque() {
                None => self.take_from_buffers(buffer, n).ok_or(buffer),
                Some(_) => Err(buffer),
            }
            .map_err(Arc::clone)
        });
        let buffer = match found {
            Some(Ok(last)) => return Ok(last),
            Some(Err(buffer)) => buffer,
            None => self.lookup_after_refresh(tag).await?,
        };
        if let Some(refused) = buffer.refuses_count(n) {
            return Err(refused);
        }
        if buffer.kind.strict() {
            return self.next_strict(&buffer, n).await;
        }
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
                } else if st.last_load_ms.is_some()
                    && st
                        .interleave
                        .span(n)
                        .is_none_or(|span| span > st.step.max(st.table_step))
                {
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
                    // Made under the lock, so the end of the load cannot be missed (a
                    // `Notified` sees every `notify_waiters` from its creation on).
                    Step::Wait {
                        loaded: buffer.loaded.notified(),
                        start_load,
                    }
                }
            };
            let loaded = match step {
                Step::Served { last, preload } => {
                    if preload {
                        self.spawn_load(buffer.clone());
                    }
                    return buffer.hand_out(last);
                }
                // A block reserved straight in the table is handed out like a buffered ID: an
                // opaque tag whose delta exceeds its step gets here for single IDs, and its
                // sequential position must not go out as it is (it repeated opaque IDs).
                Step::Block => return buffer.hand_out(self.allocate_block(&buffer, n).await?),
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
            if tokio::time::timeout_at(deadline, loaded).await.is_err() {
                return Err(SegmentError::Unavailable {
                    tag: tag.to_string(),
                    reason: timed_out(
                        "no segment loaded",
                        self.settings.load_timeout,
                        LOAD_TIMEOUT_KEY,
                        deadline,
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
}

#[cfg(test)]
mod tests;
