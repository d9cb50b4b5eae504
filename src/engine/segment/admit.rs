//! Whether a range the database allocated may be served: the row's records (split, order,
//! period rule, opaque key) checked against how this node serves the tag, in one `admit`.

use std::sync::atomic::Ordering;

use super::period::same_rule;
use super::rule::STRICT_MARKER;
use super::{LoadFailure, SegmentEngine, TagBuffer, TagKind};
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
    /// the row records for the tag's kind, recorded now when the row had none (a period's
    /// calendar, strict order, a narrower residue class). The allocation's statement already
    /// refused a row recording another rule; what is refused here is a record another node
    /// wrote between that statement and this node's claim.
    pub(super) async fn admit(
        &self,
        buffer: &TagBuffer,
        alloc: &LeafAlloc,
    ) -> Result<Result<(), LoadFailure>, StoreError> {
        if let Err(refused) = opaque_range_check(buffer, alloc) {
            return Ok(Err(refused));
        }
        let serves = self.serves(buffer);
        let mine = match &buffer.kind {
            TagKind::Period(rule) => Some(rule.record()),
            TagKind::Strict => Some(STRICT_MARKER.to_string()),
            TagKind::Trend { .. } => buffer.lock().interleave.marker(),
        };
        let recorded = alloc.split.as_deref();
        let claimed = match (&buffer.kind, recorded) {
            // Recorded as this node serves it (a period record with its zone and prefix).
            (TagKind::Period(rule), Some(r)) if same_rule(r, &rule.served_marker()) => {
                return Ok(Ok(()))
            }
            (_, r) if r == mine.as_deref() => return Ok(Ok(())),
            // A row without a record, or a split wider than this node's: recorded as this node
            // serves it, unless another node recorded something else first. (Any other record
            // was refused by the allocation's statement; it is never overwritten here.)
            (_, r) if crate::storage::rule_admits(r, None, &serves) => {
                let mine = mine.as_deref();
                super::admin::retry_conflicts(|| self.store.claim_split(&buffer.name, r, mine))
                    .await?
            }
            (_, r) => r.map(str::to_string),
        };
        match crate::storage::refused_rule(
            &buffer.name,
            claimed.as_deref(),
            None,
            &serves,
            alloc.max_id,
        ) {
            None => {
                if recorded.is_some() && claimed != alloc.split {
                    tracing::warn!(
                        tag = %buffer.name,
                        from = recorded.unwrap_or("none"),
                        to = claimed.as_deref().unwrap_or("none"),
                        "the tag's recorded split narrowed to this node's"
                    );
                }
                Ok(Ok(()))
            }
            Some(refused) => {
                // A node that serves the tag by its row's record follows the changed record
                // from the next request on (this allocation is skipped).
                if !buffer.serves_record(claimed.as_deref()) {
                    self.rebuild_tag(&buffer.name, claimed.as_deref());
                }
                let mut st = buffer.lock();
                st.max_id = st.max_id.max(alloc.max_id);
                Ok(Err(LoadFailure::Unavailable(refused.to_string().into())))
            }
        }
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
        // A plain node on a row with an opaque key: refused by the allocation's statement
        // while its range could reach the opaque IDs (`StoreError::PlainBelowOpaque`).
        (None, _) => Ok(()),
    }
}
