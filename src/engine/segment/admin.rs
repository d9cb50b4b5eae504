//! The admin operations on tags (create, ensure, step, skip, re-split, reveal): each writes the
//! row first and then brings this node's map in line with it.

use std::time::Duration;

use super::tags::{validate_tag_name, MAX_TAG_START};
use super::{Interleave, SegmentEngine, SegmentError, TagRule};
use crate::storage::{NewTag, StoreError};

impl SegmentEngine {
    /// What a tag's row records of this node's rule for it, from its creation on: a period's
    /// calendar and digits, strict order, or the data-centre split (`None`: trend order over
    /// the whole ID space). A node configured otherwise is refused by every allocation.
    fn rule_record_of(&self, tag: &str, rule: &TagRule) -> Option<String> {
        rule.record()
            .or_else(|| self.settings.interleave_of(tag).marker())
    }

    /// Creates a tag whose first ID is `start`, by this node's configuration of it.
    pub async fn create_tag(
        &self,
        tag: &str,
        step: i64,
        start: i64,
        description: Option<&str>,
    ) -> Result<(), SegmentError> {
        self.create_ruled_tag(tag, step, start, description, None)
            .await
    }

    /// Creates a tag whose first ID is `start`, with `rule` (`LEAF.TAG CREATE … ORDER strict`,
    /// `… PERIOD daily`) recorded in its row, which every node that does not configure the
    /// tag follows; `None`: this node's configuration of the tag.
    pub async fn create_ruled_tag(
        &self,
        tag: &str,
        step: i64,
        start: i64,
        description: Option<&str>,
        rule: Option<TagRule>,
    ) -> Result<(), SegmentError> {
        validate_tag_name(tag).map_err(SegmentError::Invalid)?;
        self.validate_step(step)?;
        if !(1..=MAX_TAG_START).contains(&start) {
            return Err(SegmentError::Invalid(format!(
                "start must be between 1 and {MAX_TAG_START}"
            )));
        }
        let rule = match rule {
            None => self.settings.configured_rule(tag),
            Some(TagRule::Trend) if !self.settings.follows_row(tag) => {
                self.settings.configured_rule(tag)
            }
            Some(_) if !self.settings.follows_row(tag) => {
                return Err(SegmentError::Invalid(format!(
                    "tag '{tag}' is configured on this node (or this node hands out a split of the ID space): its order and period come from the configuration; create it without ORDER or PERIOD"
                )))
            }
            Some(rule) => rule,
        };
        if matches!(rule, TagRule::Period(_)) && start != 1 {
            return Err(SegmentError::Invalid(
                "a period tag's sequence starts at 1 each period: give no start".into(),
            ));
        }
        let _writer = self.tag_writer.lock().await;
        // Counted and inserted in one transaction behind a database-wide guard: nodes
        // creating tags at once stop at exactly the limit.
        let new = NewTag {
            tag: tag.to_string(),
            step,
            start,
            description: description.map(str::to_string),
            split: self.rule_record_of(tag, &rule),
            max_tags: self.settings.max_tags,
        };
        // Two members of a multi-primary cluster may update the guard at once.
        retry_conflicts(|| self.store.create_tag(&new)).await?;
        self.insert_entry(tag, new.split.as_deref());
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
    /// after a database restore or a lossy failover); returns the new `max_id`. A period tag
    /// (as its row records it) skips `n` numbers of its current period, at most the rest of
    /// it: never into a later period, whose numbers start at 1 as always.
    pub async fn skip(&self, tag: &str, n: i64) -> Result<i64, SegmentError> {
        let row = self.store.row(tag).await?;
        let Some(row) = row else {
            return Err(SegmentError::UnknownTag(tag.to_string()));
        };
        if let Some(reason) = self.period_row_refusal(&row) {
            return Err(SegmentError::Invalid(format!("tag '{tag}': {reason}")));
        }
        self.skip_row(tag, row.split.as_deref(), n).await
    }

    /// Why a period tag's row may not be moved by a skip, as an allocation's raise would refuse
    /// it ([`super::PeriodRule::refuse_row`]): a skip would move it further into an impossible
    /// period, or raise a trend row over IDs it served. The rule is this node's for the tag,
    /// else the one the row records in full.
    fn period_row_refusal(&self, row: &crate::storage::LeafAlloc) -> Option<String> {
        let recorded = row.split.as_deref();
        let rule = self.period_rule_of(&row.tag, recorded)?;
        rule.refuse_row(row.max_id, recorded, self.clock.now_millis())
    }

    /// The period rule this node serves `tag` by, whose row records `recorded`: its own when
    /// configured and the record agrees, else the one the row records in full (as a node that
    /// does not list the tag serves it); `None` for a tag without a period.
    fn period_rule_of(
        &self,
        tag: &str,
        recorded: Option<&str>,
    ) -> Option<std::sync::Arc<super::PeriodRule>> {
        let same = |rule: &super::PeriodRule| {
            recorded.is_none_or(|r| super::period::same_rule(r, &rule.served_marker()))
        };
        match self.settings.period.get(tag).filter(|r| same(r)) {
            Some(rule) => Some(rule.clone()),
            None => Some(std::sync::Arc::new(
                recorded.and_then(super::PeriodRule::from_record)?,
            )),
        }
    }

    /// [`SegmentEngine::skip`] of a tag whose row records `recorded` (its split column).
    async fn skip_row(
        &self,
        tag: &str,
        recorded: Option<&str>,
        n: i64,
    ) -> Result<i64, SegmentError> {
        if n < 1 {
            return Err(SegmentError::Invalid(
                "skip must be a positive number of IDs".into(),
            ));
        }
        let margin = self.settings.failover_margin;
        // The row's rule, else (a row no period node has recorded yet) this node's.
        let configured = self.settings.period.get(tag);
        let rule_marker: Option<std::sync::Arc<str>> = super::period::marker_of_record(recorded)
            .or_else(|| configured.map(|rule| rule.marker()))
            .map(Into::into);
        let window = super::period::window_of_marker(recorded)
            .or_else(|| configured.map(|rule| rule.window()));
        let Some(window) = window else {
            let grant = crate::storage::Grant::step(Some(n), margin);
            let alloc = retry_conflicts(|| self.store.allocate(tag, grant.clone())).await?;
            return Ok(self.skipped(tag, n, alloc));
        };
        // This node's period first, when it serves the tag with a period (its own rule, or the
        // row's record: whether or not a request built the tag's buffers here): the numbers a
        // restore lost are of the period the cluster is in, not of the row's older one. Within
        // PERIOD_AHEAD_MS of that period's end a node whose clock is ahead may already have
        // served the next period's numbers (which the restore lost too): those are skipped
        // as well, and the row is left in the next period, which nodes this close to its start
        // serve already.
        let Some(rule) = self.period_rule_of(tag, recorded) else {
            return self.skip_in_period(tag, rule_marker, window, n).await;
        };
        let now_ms = self.clock.now_millis();
        let now = rule.period_at(now_ms);
        let next = rule.period_at(now_ms.saturating_add(super::period::PERIOD_AHEAD_MS));
        let record = rule.record();
        let mut max_id = 0;
        for period in [now, next].into_iter().take(if next > now { 2 } else { 1 }) {
            let floor = rule.first_position(period);
            max_id = retry_conflicts(|| self.store.raise(tag, floor, &record)).await?;
            // A row already in a later period has none of this one's numbers left to skip.
            if rule.period_of(max_id) == period {
                max_id = self
                    .skip_in_period(tag, rule_marker.clone(), window, n)
                    .await?;
            }
        }
        Ok(max_id)
    }

    /// Skips `n` numbers of the period the row is in (at most the rest of it) under the period
    /// rule `rule` (a marker; `None`: a row no period node has recorded or configured yet is
    /// moved unchecked); the `max_id` after.
    async fn skip_in_period(
        &self,
        tag: &str,
        rule: Option<std::sync::Arc<str>>,
        window: crate::storage::Window,
        n: i64,
    ) -> Result<i64, SegmentError> {
        let margin = self.settings.failover_margin;
        let mut wanted = n;
        for _ in 0..4 {
            let grant = crate::storage::Grant {
                step: Some(wanted),
                failover_margin: margin,
                window: Some(window),
                serves: rule.clone().map_or(
                    crate::storage::Serves::Unchecked,
                    crate::storage::Serves::Period,
                ),
                seen: None,
            };
            match retry_conflicts(|| self.store.allocate(tag, grant.clone())).await {
                Ok(alloc) => return Ok(self.skipped(tag, wanted, alloc)),
                // The period has fewer numbers left: all of them are skipped.
                Err(StoreError::PastEnd { left, max_id, .. }) => {
                    if left == 0 {
                        tracing::warn!(tag, max_id, "skip: the tag's period has no number left");
                        return Ok(max_id);
                    }
                    wanted = left;
                }
                Err(e) => return Err(e.into()),
            }
        }
        Err(SegmentError::Unavailable {
            tag: tag.to_string(),
            reason: "the period's numbers kept changing under the skip; try again".into(),
        })
    }

    /// After an operator's change of the row: this node's next request asks the database.
    fn forget_failure(&self, tag: &str) {
        if let Some(buffer) = self.loaded_buffer_of(tag) {
            buffer.lock().forget_failure();
            buffer
                .period_exhausted
                .store(0, std::sync::atomic::Ordering::Relaxed);
        }
    }

    fn skipped(&self, tag: &str, n: i64, alloc: crate::storage::LeafAlloc) -> i64 {
        self.note_failover(tag, &alloc);
        self.forget_failure(tag);
        tracing::warn!(
            tag,
            skipped = n,
            max_id = alloc.max_id,
            "tag moved forward by an operator"
        );
        alloc.max_id
    }

    /// The operator's re-split of a tag (`LEAF.TAG SPLIT`): records `split` as the tag's class
    /// and moves its `max_id` up to `start`; returns the `max_id` after. Run in every cluster
    /// with a `start` above every cluster's `max_id`, no ID below it is handed out again.
    pub async fn resplit(
        &self,
        tag: &str,
        split: Interleave,
        start: i64,
    ) -> Result<i64, SegmentError> {
        if !(1..=super::MAX_ID_DELTA).contains(&split.delta)
            || !(0..split.delta).contains(&split.remainder)
        {
            return Err(SegmentError::Invalid(format!(
                "split needs a delta between 1 and {} (as segment.id_delta) and 0 <= remainder < delta",
                super::MAX_ID_DELTA
            )));
        }
        if !(1..=MAX_TAG_START).contains(&start) {
            return Err(SegmentError::Invalid(format!(
                "start must be between 1 and {MAX_TAG_START}"
            )));
        }
        let row = self.store.row(tag).await?;
        let Some(row) = row else {
            return Err(SegmentError::UnknownTag(tag.to_string()));
        };
        if let Some(rule) = row.split.as_deref().filter(|r| {
            r.starts_with(super::period::PERIOD_MARKER) || *r == super::rule::STRICT_MARKER
        }) {
            return Err(SegmentError::Invalid(format!(
                "tag '{tag}' records {rule}: a strict or period tag has one order across the cluster and cannot be split between clusters; give each data centre its own tag"
            )));
        }
        let marker = split.marker();
        let max_id = retry_conflicts(|| self.store.resplit(tag, marker.as_deref(), start)).await?;
        self.forget_failure(tag);
        tracing::warn!(
            tag,
            split = split.marker().as_deref().unwrap_or("none"),
            start,
            max_id,
            "tag re-split by an operator"
        );
        Ok(max_id)
    }

    /// [`SegmentEngine::skip`] for every tag in the table; returns each tag's new `max_id`.
    pub async fn skip_all(&self, n: i64) -> Result<Vec<(String, i64)>, SegmentError> {
        let mut moved = Vec::new();
        for row in self.store.list().await? {
            // A row that is no position of its period is left as it is (and out of the reply).
            if let Some(reason) = self.period_row_refusal(&row) {
                tracing::warn!(tag = %row.tag, max_id = row.max_id, "SKIPALL leaves the row: {reason}");
                continue;
            }
            let max_id = self.skip_row(&row.tag, row.split.as_deref(), n).await?;
            moved.push((row.tag.clone(), max_id));
        }
        Ok(moved)
    }

    /// The sequential ID behind an opaque ID of `tag` (the permutation inverted with the key).
    pub fn reveal(&self, tag: &str, id: i64) -> Result<i64, SegmentError> {
        let cipher = self.settings.opaque.get(tag).ok_or_else(|| {
            SegmentError::Invalid(format!("tag '{tag}' does not hand out opaque IDs"))
        })?;
        cipher.decode(id).ok_or_else(|| {
            SegmentError::Invalid(format!(
                "{id} is not an opaque ID of tag '{tag}': they are {} to {}",
                cipher.first_id(),
                cipher.first_id() + cipher.capacity() - 1
            ))
        })
    }

    /// Changes the step stored for a tag; it applies from the tag's next load.
    pub async fn set_step(&self, tag: &str, step: i64) -> Result<(), SegmentError> {
        self.validate_step(step)?;
        retry_conflicts(|| self.store.set_step(tag, step)).await?;
        // A load refused for the row's old step is tried again at once on this node.
        self.forget_failure(tag);
        Ok(())
    }

    pub fn validate_step(&self, step: i64) -> Result<(), SegmentError> {
        if !(1..=self.settings.max_step).contains(&step) {
            return Err(SegmentError::Invalid(format!(
                "step must be between 1 and {}",
                self.settings.max_step
            )));
        }
        Ok(())
    }
}

/// An admin write retried while it loses to a concurrent transaction (a Galera certification
/// failure against an allocation on another member, a deadlock): up to 10 times, briefly.
pub(super) async fn retry_conflicts<T, F, Fut>(mut write: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, StoreError>>,
{
    let mut attempts = 0;
    loop {
        match write().await {
            Err(e) if e.is_conflict() && attempts < 10 => {
                attempts += 1;
                tokio::time::sleep(Duration::from_millis(5 + fastrand::u64(..20))).await;
            }
            result => return result,
        }
    }
}
