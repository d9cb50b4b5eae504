//! Loading a tag's segments: one allocation of a tag at a time, each checked against this
//! node's high-water mark (the rollback guard) and made durable before any ID of it is served.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::step;
use super::{BufferState, LoadFailure, Segment, SegmentEngine, SegmentError, TagBuffer, TagKind};
use crate::storage::{Grant, LeafAlloc, SeenRow, StoreError};

/// Told the outcome of every segment load (the metrics implement it), so the engine need not
/// know how they are exported.
pub trait LoadObserver: Send + Sync + 'static {
    fn load_finished(&self, tag: &str, elapsed: Duration);
}

/// No one is told (tests, tools).
impl LoadObserver for () {
    fn load_finished(&self, _: &str, _: Duration) {}
}

impl SegmentEngine {
    /// A block larger than any segment of the tag: reserved directly in the database.
    pub(super) async fn allocate_block(
        &self,
        buffer: &TagBuffer,
        n: i64,
    ) -> Result<i64, SegmentError> {
        self.stats.request_waits.fetch_add(1, Ordering::Relaxed);
        let interleave = buffer.lock().interleave;
        let Some(span) = interleave.span(n) else {
            return Err(SegmentError::Exhausted(buffer.name.to_string()));
        };
        let started = std::time::Instant::now();
        let deadline = tokio::time::Instant::now() + self.settings.load_timeout;
        let result =
            tokio::time::timeout_at(deadline, self.allocate_guarded(buffer, Some(span))).await;
        let outcome = match result {
            Ok(Ok(guarded)) => guarded,
            Ok(Err(e)) => Err(LoadFailure::from_store(&e)),
            Err(_) => {
                return Err(SegmentError::Unavailable {
                    tag: buffer.name.to_string(),
                    reason: super::timed_out(
                        "no block allocated",
                        self.settings.load_timeout,
                        super::LOAD_TIMEOUT_KEY,
                        deadline,
                    ),
                })
            }
        };
        let mut st = buffer.lock();
        self.book_allocation(buffer, &mut st, started, outcome.as_ref());
        match outcome {
            Ok(alloc) => {
                st.served += n as u64;
                // `span` raw positions, `first..max_id`, hold exactly `n` IDs of the
                // interleave.
                let last = interleave.at_or_below(alloc.max_id - 1);
                st.pass_block(last);
                Ok(last)
            }
            Err(failure) => Err(self.failure_error(&buffer.name, failure)),
        }
    }

    /// Books one finished allocation of `buffer`, whichever path made it (a trend tag's
    /// segment, a block larger than the step, a strict tag's batch), so INFO, `/cache` and the
    /// metrics count them all alike: the engine's and the tag's counters, its duration, and a
    /// log line when the tag starts failing, fails another way or succeeds again.
    pub(super) fn book_allocation(
        &self,
        buffer: &TagBuffer,
        st: &mut BufferState,
        started: std::time::Instant,
        outcome: Result<&LeafAlloc, &LoadFailure>,
    ) {
        self.observer.load_finished(&buffer.name, started.elapsed());
        match outcome {
            Ok(alloc) => {
                self.stats.loads_ok.fetch_add(1, Ordering::Relaxed);
                if st.failure.is_some() {
                    tracing::info!(tag = %buffer.name, "segment loads succeed again");
                }
                st.allocated(alloc.max_id);
                if buffer.kind.strict() {
                    // No segment is installed for a strict tag: LEAF.TAGS shows the row's step.
                    st.step = alloc.step;
                    st.table_step = alloc.step;
                }
            }
            Err(failure) => {
                self.stats.loads_failed.fetch_add(1, Ordering::Relaxed);
                // Logged when the tag starts failing and whenever the kind of failure
                // changes: a failover that first reads as UNAVAILABLE and then as ROLLBACK
                // shows both.
                let kind = std::mem::discriminant(failure);
                if st.failure.as_ref().map(std::mem::discriminant) != Some(kind) {
                    let error = self.failure_error(&buffer.name, failure.clone());
                    tracing::warn!(tag = %buffer.name, %error, "segment load failed; retried when next needed");
                }
                st.failed(failure.clone());
            }
        }
    }

    /// Logs and counts an allocation that moved past a failover (the row was last allocated by
    /// another database instance).
    pub(super) fn note_failover(&self, tag: &str, alloc: &LeafAlloc) {
        let Some(skip) = &alloc.failover else { return };
        if let Some(buffer) = self.loaded_buffer_of(tag) {
            buffer.lock().failover_skips += 1;
        }
        tracing::warn!(
            tag,
            previous_instance = %skip.previous,
            current_instance = %skip.current,
            skipped = skip.margin,
            max_id = alloc.max_id,
            "the database instance changed since this tag's last allocation (failover or restore): skipped segment.failover_margin IDs"
        );
    }

    /// The rollback guard: the range `first..max_id` must start above the highest ID this node
    /// was ever granted (its mark; marks an older release wrote hold its `max_id`, which it
    /// may have served: the same meaning), and above `others`, the marks other processes
    /// sharing the state directory had made durable before the allocation began (each
    /// durable before they served from it); then `max_id - 1` becomes the new mark, on disk.
    async fn guard(
        &self,
        tag: &str,
        alloc: &LeafAlloc,
        others: Option<i64>,
    ) -> Result<(), LoadFailure> {
        let from = alloc.first;
        if let Some(mark) = self.marks.get(tag).max(others) {
            if from <= mark {
                return Err(LoadFailure::Rollback { from, mark });
            }
        }
        self.marks.record(tag, alloc.max_id - 1).await.map_err(|e| {
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
    ) -> Result<Result<LeafAlloc, LoadFailure>, StoreError> {
        let _one_at_a_time = buffer.allocating.lock().await;
        self.allocate_guarded_locked(buffer, step).await
    }

    /// [`SegmentEngine::allocate_guarded`] for a caller that holds `buffer.allocating`.
    pub(super) async fn allocate_guarded_locked(
        &self,
        buffer: &TagBuffer,
        step: Option<i64>,
    ) -> Result<Result<LeafAlloc, LoadFailure>, StoreError> {
        if let Err(refused) = self.claim_opaque_key(buffer).await? {
            return Ok(Err(refused));
        }
        let grant = Grant {
            step,
            failover_margin: self.settings.failover_margin,
            window: buffer.kind.period().map(|rule| rule.window()),
            serves: self.serves(buffer),
            seen: self.seen_row(buffer),
        };
        // Read before the allocation: a mark another live process wrote after it began may be
        // above its range without the database having gone back.
        let others = match self.marks.others_mark(&buffer.name).await {
            Ok(mark) => mark,
            Err(e) => {
                return Ok(Err(LoadFailure::Unavailable(
                    format!("cannot read the high-water marks in the state directory: {e}").into(),
                )))
            }
        };
        let alloc = match self
            .allocate_retrying(&buffer.name, grant, !buffer.kind.strict())
            .await
        {
            // Refused before anything moved: the row records another rule. A node that serves
            // the tag by its row's record follows it from the next request on. LEAF.TAGS shows
            // the table's max_id while the tag is refused: the re-split procedure reads it to
            // choose a start above everything this cluster served.
            Err(refused @ StoreError::RuleMismatch { .. }) => {
                if let StoreError::RuleMismatch {
                    recorded, max_id, ..
                } = &refused
                {
                    if !buffer.serves_record(Some(recorded)) {
                        self.rebuild_tag(&buffer.name, Some(recorded));
                    }
                    let mut st = buffer.lock();
                    st.max_id = st.max_id.max(*max_id);
                }
                return Err(refused);
            }
            other => other?,
        };
        self.note_failover(&buffer.name, &alloc);
        if let Err(refused) = self.admit(buffer, &alloc).await? {
            return Ok(Err(refused));
        }
        Ok(self
            .guard(&buffer.name, &alloc, others)
            .await
            .map(|()| alloc))
    }

    /// How this node serves the tag, which the row's record must admit before it moves.
    pub(super) fn serves(&self, buffer: &TagBuffer) -> crate::storage::Serves {
        use crate::storage::Serves;
        match &buffer.kind {
            TagKind::Period(rule) => Serves::Period(rule.served_marker().into()),
            TagKind::Strict => Serves::Strict,
            TagKind::Trend { opaque } => Serves::Trend {
                split: buffer.lock().interleave.marker().map(Into::into),
                opaque: opaque.is_some(),
            },
        }
    }

    /// A plain strict tag's row as its last allocation on this node found it: while the row
    /// still shows it, the store may allocate in one statement ([`Grant::single_statement`]).
    /// The first allocation after a start reads the whole row.
    fn seen_row(&self, buffer: &TagBuffer) -> Option<SeenRow> {
        if !matches!(buffer.kind, TagKind::Strict) {
            return None;
        }
        let step = buffer.lock().table_step;
        (step > 0).then(|| SeenRow {
            record: super::rule::STRICT_MARKER.into(),
            step,
        })
    }

    /// One allocation, retried for `load_timeout` while the database answers with errors that
    /// pass by themselves (a new primary taking over, a deadlock or Galera certification
    /// conflict, a connection cut): the caller sees them only when they last. `batched`: in a
    /// transaction it may share with other tags' (a trend tag's load; a strict tag's row is
    /// contended by every node, and its lock waits would hold up the other tags).
    async fn allocate_retrying(
        &self,
        tag: &str,
        grant: Grant,
        batched: bool,
    ) -> Result<LeafAlloc, StoreError> {
        let deadline = tokio::time::Instant::now() + self.settings.load_timeout;
        let mut pause = Duration::from_millis(10);
        loop {
            let attempt = if batched {
                self.batcher.allocate(tag, grant.clone()).await
            } else {
                self.store.allocate(tag, grant.clone()).await
            };
            match attempt {
                Err(e) if e.is_transient() && tokio::time::Instant::now() + pause < deadline => {
                    tracing::debug!(tag, error = %e, "allocation failed; retrying");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(200));
                }
                result => return result,
            }
        }
    }

    pub(super) fn spawn_load(self: &Arc<Self>, buffer: Arc<TagBuffer>) {
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
        let near_end = |step| async move {
            match self.allocate_guarded(buffer, step).await {
                // A segment larger than what is left of the ID space: the rest of it, so the
                // tag serves to its last ID (a block asks for its whole size elsewhere, never
                // shortened).
                Err(StoreError::NearEnd { left, .. }) => {
                    self.allocate_guarded(buffer, Some(left)).await
                }
                result => result,
            }
        };
        let deadline = tokio::time::Instant::now() + limit;
        let result = match tokio::time::timeout_at(deadline, near_end(requested_step)).await {
            Ok(result) => result,
            Err(_) => Ok(Err(LoadFailure::Unavailable(
                super::timed_out(
                    "no segment loaded",
                    limit,
                    "a background load's limit: 5 × segment.load_timeout_ms, at least 5 s",
                    deadline,
                )
                .into(),
            ))),
        };
        let outcome = match result {
            Ok(Ok(alloc)) => Ok(alloc),
            Ok(Err(failure)) => Err(failure),
            Err(err) => Err(LoadFailure::from_store(&err)),
        };
        let now = self.clock.now_millis();
        {
            let mut st = buffer.lock();
            self.book_allocation(buffer, &mut st, started, outcome.as_ref());
            match outcome {
                Ok(alloc) => {
                    st.install(Segment::granted(alloc.first, alloc.max_id), alloc.step, now)
                }
                Err(failure) => st.schedule_retry(&failure, now),
            }
            st.loading = false;
        }
        buffer.loaded.notify_waiters();
    }
}
