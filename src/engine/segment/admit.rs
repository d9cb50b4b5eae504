//! Whether a range the database allocated may be served: the row's records (split, order,
//! period rule, opaque key) checked against how this node serves the tag, in one `admit`.

use std::sync::atomic::Ordering;

use super::period::same_rule;
use super::rule::STRICT_MARKER;
use super::{Interleave, LoadFailure, SegmentEngine, TagBuffer, TagKind};
use crate::storage::{LeafAlloc, StoreError};

impl SegmentEngine {
    /// Before an opaque tag's first allocation on this node: records its key's marker in the
    /// row unless the row shows the key cannot be used (see [`opaque_claim_result`]).
    pub(super) async fn claim_opaque_key(
        &self,
        buffer: &TagBuffer,
    ) -> Result<Result<(), LoadFailure>, StoreError> {
        let Some(cipher) = buffer.kind.opaque() else {
            return Ok(Ok(()));
        };
        if buffer.opaque_claimed.load(Ordering::Acquire) {
            return Ok(Ok(()));
        }
        let (marker, max_id) = self
            .store
            .claim_opaque(&buffer.name, cipher.marker(), cipher.first_id())
            .await?;
        if let Err(refused) = opaque_claim_result(cipher, marker.as_deref(), max_id) {
            return Ok(Err(refused));
        }
        buffer.opaque_claimed.store(true, Ordering::Release);
        Ok(Ok(()))
    }

    /// Whether the range `alloc` may be served by this node: its opaque range, then the rule
    /// the row records for the tag's kind (a period's calendar, strict order, a residue class).
    /// A refusal by the record makes a node that serves the tag by its row's record follow it.
    pub(super) async fn admit(
        &self,
        buffer: &TagBuffer,
        alloc: &LeafAlloc,
    ) -> Result<Result<(), LoadFailure>, StoreError> {
        if let Err(refused) = opaque_range_check(buffer, alloc) {
            return Ok(Err(refused));
        }
        let interleave = buffer.lock().interleave;
        let checked = match &buffer.kind {
            TagKind::Period(rule) => {
                let (marker, record) = (rule.marker(), rule.record());
                self.rule_check(&buffer.name, &marker, &record, alloc)
                    .await?
            }
            TagKind::Strict => {
                self.rule_check(&buffer.name, STRICT_MARKER, STRICT_MARKER, alloc)
                    .await?
            }
            TagKind::Trend { opaque } => {
                self.split_check(&buffer.name, interleave, opaque.is_some(), alloc)
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
        Ok(Ok(()))
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
                super::admin::retry_conflicts(|| self.store.claim_split(tag, None, Some(record)))
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
