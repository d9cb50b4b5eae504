//! A copy of every tag's buffers and counters, for LEAF.TAGS and the monitor page.

use super::{LoadFailure, SegmentEngine, TagSnapshot};

impl SegmentEngine {
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
                    order: if buffer.strict { "strict" } else { "trend" },
                    split: st.interleave.marker(),
                    opaque: buffer.opaque.as_ref().map(|c| c.marker().to_string()),
                    period: buffer.period.as_ref().map(|rule| rule.describe()),
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
                    failover_skips: st.failover_skips,
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
}
