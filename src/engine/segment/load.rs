//! Loading a tag's segments: one allocation of a tag at a time, each checked against this
//! node's high-water mark (the rollback guard) and made durable before any ID of it is served.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::period::same_rule;
use super::step;
use super::{
    BufferState, Interleave, LoadFailure, Segment, SegmentEngine, SegmentError, TagBuffer, TagKind,
};
use crate::storage::{Grant, LeafAlloc, SeenRow, StoreError};

/// What a strict tag's row records (in its `split` column, which a strict tag does not
/// otherwise use): a node serving the tag in trend order is refused.
pub const STRICT_MARKER: &str = "order:strict";

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
        let result = tokio::time::timeout(
            self.settings.load_timeout,
            self.allocate_guarded(buffer, Some(span)),
        )
        .await;
        let outcome = match result {
            Ok(Ok(guarded)) => guarded,
            Ok(Err(e)) => Err(LoadFailure::from_store(&e)),
            Err(_) => {
                return Err(SegmentError::Unavailable {
                    tag: buffer.name.to_string(),
                    reason: "database unreachable: it did not answer in time".into(),
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
        if let Some(cipher) = buffer.kind.opaque() {
            if !buffer.opaque_claimed.load(Ordering::Acquire) {
                let (marker, max_id) = self
                    .store
                    .claim_opaque(&buffer.name, cipher.marker(), cipher.first_id())
                    .await?;
                if let Err(refused) = opaque_claim_result(cipher, marker.as_deref(), max_id) {
                    return Ok(Err(refused));
                }
                buffer.opaque_claimed.store(true, Ordering::Release);
            }
        }
        let grant = Grant {
            step,
            failover_margin: self.settings.failover_margin,
            window: buffer.kind.period().map(|rule| rule.window()),
            period_rule: buffer.kind.period().map(|rule| rule.marker().into()),
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
            // Refused before anything moved: the row records another period rule. A node
            // that serves the tag by its row's record follows it from the next request on.
            Err(StoreError::RuleMismatch {
                tag,
                recorded,
                mine,
            }) => {
                if !buffer.serves_record(Some(&recorded)) {
                    self.rebuild_tag(&buffer.name, Some(&recorded));
                }
                return Err(StoreError::RuleMismatch {
                    tag,
                    recorded,
                    mine,
                });
            }
            other => other?,
        };
        self.note_failover(&buffer.name, &alloc);
        if let Err(refused) = opaque_range_check(buffer, &alloc) {
            return Ok(Err(refused));
        }
        let interleave = buffer.lock().interleave;
        let checked = match &buffer.kind {
            TagKind::Period(rule) => {
                let (marker, record) = (rule.marker(), rule.record());
                self.rule_check(&buffer.name, &marker, &record, &alloc)
                    .await?
            }
            TagKind::Strict => {
                self.rule_check(&buffer.name, STRICT_MARKER, STRICT_MARKER, &alloc)
                    .await?
            }
            TagKind::Trend { opaque } => {
                self.split_check(&buffer.name, interleave, opaque.is_some(), &alloc)
                    .await?
            }
        };
        if let Err(refused) = checked {
            // A node that serves the tag by its row's record follows a changed record from
            // the next request on (this allocation is skipped: it was made under the old one).
            if !buffer.serves_record(alloc.split.as_deref()) {
                self.rebuild_tag(&buffer.name, alloc.split.as_deref());
            }
            // LEAF.TAGS shows the table's max_id even while the tag is refused: the re-split
            // procedure reads it to choose a start above everything this cluster served.
            let mut st = buffer.lock();
            st.max_id = st.max_id.max(alloc.max_id);
            return Ok(Err(refused));
        }
        Ok(self
            .guard(&buffer.name, &alloc, others)
            .await
            .map(|()| alloc))
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
            record: STRICT_MARKER.into(),
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

    /// Whether this node's residue class may serve a range of the row: the class the row
    /// recorded (read in the allocation's transaction), or one inside it, which then becomes
    /// the record (a narrowed split; a node still on the wider class is refused from then on).
    /// Any other class could reach IDs another cluster served. `opaque`: this node hands out
    /// the tag's IDs through the permutation (which only trend order serves).
    async fn split_check(
        &self,
        tag: &str,
        mine: Interleave,
        opaque: bool,
        alloc: &LeafAlloc,
    ) -> Result<Result<(), LoadFailure>, StoreError> {
        let marker = mine.marker();
        if alloc.split == marker {
            return Ok(Ok(()));
        }
        let recorded = alloc.split.as_deref();
        if let Some(rule) = recorded.filter(|r| r.starts_with(super::period::PERIOD_MARKER)) {
            return Ok(Err(LoadFailure::Unavailable(
                format!(
                    "IDs refused: tag '{tag}' hands out period IDs ({rule}) and this node has no period configured for it; its positions are not IDs"
                )
                .into(),
            )));
        }
        if recorded == Some(STRICT_MARKER) {
            // An opaque tag cannot be configured strict: the way out is the record.
            let remedy = if opaque {
                format!("opaque IDs are served in trend order only: once no node serves the tag strict, clear the record (UPDATE leaf_alloc SET split = NULL WHERE biz_tag = '{tag}'), or give the strict use a tag of its own")
            } else {
                "configure order = \"strict\" for the tag on this node".to_string()
            };
            return Ok(Err(LoadFailure::Unavailable(
                format!(
                    "IDs refused: tag '{tag}' records strict order ({STRICT_MARKER}) and this node serves it in trend order, whose buffered IDs would come back out of order; {remedy}"
                )
                .into(),
            )));
        }
        let refused = |recorded: Option<&str>| {
            let recorded = match recorded {
                Some(split) => format!("id_delta:id_remainder {split}"),
                None => "the whole ID space (no split)".into(),
            };
            LoadFailure::Unavailable(
                format!(
                    "IDs refused: the tag's split is recorded as {recorded} and this node's {}:{} is not inside it, so it could repeat IDs another cluster served; once every node runs the new split, run LEAF.TAG SPLIT {tag} {} {} <start> in every cluster, with <start> above every cluster's max_id (this cluster's is {})",
                    mine.delta, mine.remainder, mine.delta, mine.remainder, alloc.max_id
                )
                .into(),
            )
        };
        match Interleave::from_marker(recorded) {
            Ok(outer) if mine.within(outer) => {}
            _ => return Ok(Err(refused(recorded))),
        }
        let now = self
            .store
            .claim_split(tag, recorded, marker.as_deref())
            .await?;
        if now == marker {
            tracing::warn!(
                tag,
                from = recorded.unwrap_or("none"),
                to = marker.as_deref().unwrap_or("none"),
                "the tag's recorded split narrowed to this node's"
            );
            Ok(Ok(()))
        } else {
            Ok(Err(refused(now.as_deref())))
        }
    }

    /// Whether this node's rule for a strict or period tag (`marker`: `order:strict`, or the
    /// period's calendar and digits) is the one the tag's row records (read in the
    /// allocation's transaction), recording it when the row has none. Under another calendar
    /// or digit count the row's positions are other IDs, some already served; a trend node
    /// would serve buffered IDs out of order: so a node with another rule hands out nothing
    /// (its allocation is skipped).
    async fn rule_check(
        &self,
        tag: &str,
        marker: &str,
        record: &str,
        alloc: &LeafAlloc,
    ) -> Result<Result<(), LoadFailure>, StoreError> {
        let recorded = match alloc.split.as_deref() {
            Some(recorded) if same_rule(recorded, marker) => return Ok(Ok(())),
            Some(recorded) => Some(recorded.to_string()),
            None => {
                super::tags::retry_conflicts(|| self.store.claim_split(tag, None, Some(record)))
                    .await?
            }
        };
        if recorded.as_deref().is_some_and(|r| same_rule(r, marker)) {
            return Ok(Ok(()));
        }
        let recorded = recorded.unwrap_or_else(|| "none".into());
        let kind = if recorded.starts_with(super::period::PERIOD_MARKER) {
            "the period rule"
        } else if recorded.starts_with("order:") {
            "the order rule"
        } else {
            "the split"
        };
        Ok(Err(LoadFailure::Unavailable(
            format!(
                "IDs refused: tag '{tag}' records {kind} {recorded} and this node's is {marker}; a node with another rule would repeat or misorder IDs; configure the tag as its row records it, or use a new tag"
            )
            .into(),
        )))
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
        buffer
            .loaded
            .send_modify(|generation| *generation = generation.wrapping_add(1));
    }
}

/// Whether the database's record lets this node serve the tag's opaque IDs under its key: the
/// claim records the key's marker unless the tag has served plain IDs reaching the opaque
/// range (`max_id` at or past the smallest opaque ID) or IDs under another key.
fn opaque_claim_result(
    cipher: &super::OpaqueCipher,
    stored: Option<&str>,
    max_id: i64,
) -> Result<(), LoadFailure> {
    match stored {
        Some(marker) if marker == cipher.marker() => Ok(()),
        Some(marker) => Err(LoadFailure::Unavailable(
            format!(
                "opaque IDs refused: the tag served opaque IDs under another key or digit count (recorded {marker}, configured {}); a changed key would repeat IDs",
                cipher.marker()
            )
            .into(),
        )),
        None => Err(LoadFailure::Unavailable(
            format!(
                "opaque IDs refused: the tag's max_id is {max_id}, at or past its first opaque ID ({}), so plain IDs there may have been handed out; use a new tag, or more digits",
                cipher.first_id()
            )
            .into(),
        )),
    }
}

/// An allocated range may be served: an opaque tag's row carries this key's marker; a plain
/// tag that once served opaque IDs serves only plain IDs above all of them.
fn opaque_range_check(buffer: &TagBuffer, alloc: &LeafAlloc) -> Result<(), LoadFailure> {
    let from = alloc.first;
    match (buffer.kind.opaque(), alloc.opaque.as_deref()) {
        // Past the last position with an opaque ID: no further range is worth loading.
        (Some(cipher), _) if from >= cipher.capacity() => Err(LoadFailure::Exhausted),
        (Some(cipher), stored) => opaque_claim_result(cipher, stored, alloc.max_id),
        (None, Some(marker)) => {
            let digits = super::opaque::marker_digits(marker).unwrap_or(super::opaque::MAX_DIGITS);
            let past_opaque = 10i64.pow(digits);
            if from >= past_opaque {
                return Ok(());
            }
            Err(LoadFailure::Unavailable(
                format!(
                    "plain IDs refused: the tag served opaque IDs of {digits} digits ({marker}), and plain IDs below {past_opaque} could repeat them; configure it opaque again, or LEAF.TAG SKIP it past {past_opaque}"
                )
                .into(),
            ))
        }
        (None, None) => Ok(()),
    }
}
