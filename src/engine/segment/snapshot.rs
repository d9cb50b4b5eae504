//! A copy of every tag's buffers and counters, for LEAF.TAGS and the monitor page.

use super::{LoadFailure, SegmentEngine, TagBuffer, TagSnapshot};

impl SegmentEngine {
    /// Every known tag's buffers, sorted by tag (a tag never asked for shows empty buffers).
    pub fn snapshot(&self) -> Vec<TagSnapshot> {
        let mut tags: Vec<TagSnapshot> = self
            .tags
            .load()
            .iter()
            .map(|(name, entry)| match entry.loaded() {
                Some(buffer) => snapshot_of(buffer),
                None => {
                    let name = String::from_utf8_lossy(name);
                    let recorded = entry.recorded.as_deref();
                    snapshot_of(&TagBuffer::new(&name, &self.settings, recorded))
                }
            })
            .collect();
        tags.sort_by(|a, b| a.tag.cmp(&b.tag));
        tags
    }

    /// The tags a request has asked for since the node started (or since the tag's rule last
    /// changed), unsorted: the others have served nothing and loaded nothing.
    pub fn used_snapshot(&self) -> Vec<TagSnapshot> {
        self.tags
            .load()
            .values()
            .filter_map(|entry| entry.loaded().map(|buffer| snapshot_of(buffer)))
            .collect()
    }
}

fn snapshot_of(buffer: &TagBuffer) -> TagSnapshot {
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
}
