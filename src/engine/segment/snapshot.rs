//! A copy of every tag's buffers and counters, for LEAF.TAGS and the monitor page.

use super::{LoadFailure, Segment, SegmentEngine, TagBuffer, TagEntry};

impl SegmentEngine {
    /// Every known tag's buffers, sorted by tag (a tag never asked for shows empty buffers).
    pub fn snapshot(&self) -> Vec<TagSnapshot> {
        let mut tags: Vec<TagSnapshot> = self
            .tags
            .shards()
            .iter()
            .flat_map(|shard| shard.iter())
            .map(|(name, entry)| self.entry_snapshot(name, entry))
            .collect();
        tags.sort_by(|a, b| a.tag.cmp(&b.tag));
        tags
    }

    /// A tag's snapshot; one never asked for shows the empty buffers its rule gives it.
    fn entry_snapshot(&self, name: &[u8], entry: &TagEntry) -> TagSnapshot {
        match entry.loaded() {
            Some(buffer) => snapshot_of(buffer),
            None => {
                let name = String::from_utf8_lossy(name);
                let recorded = entry.recorded.as_deref();
                snapshot_of(&TagBuffer::new(&name, &self.settings, recorded))
            }
        }
    }

    /// Up to `count` tags named after `after`'s tag, sorted bytewise, and the cursor of the
    /// next page (`0`: none). The names come from the table's sorted index, so the work stays
    /// bounded by `count`, not by the number of tags.
    pub fn snapshot_page(&self, after: &TagCursor, count: usize) -> (Vec<TagSnapshot>, String) {
        let (names, more) = self.tags.names_after(&after.0, count);
        // A name removed since the index was read is skipped.
        let page: Vec<TagSnapshot> = names
            .iter()
            .filter_map(|name| {
                self.tags
                    .read(name, |entry| self.entry_snapshot(name, entry))
            })
            .collect();
        let next = match (more, names.last()) {
            (true, Some(last)) => TagCursor(last.to_vec()).render(),
            _ => "0".to_string(),
        };
        (page, next)
    }

    /// The tags a request has asked for since the node started (or since the tag's rule last
    /// changed), unsorted: the others have served nothing and loaded nothing.
    pub fn used_snapshot(&self) -> Vec<TagSnapshot> {
        self.tags
            .used_buffers()
            .iter()
            .map(|buffer| snapshot_of(buffer))
            .collect()
    }
}

/// A listing of every tag (`LEAF.TAGS`, `/cache`) goes only up to this many; a page holds at
/// most this many too.
pub const WHOLE_LIST_LIMIT: usize = 10_000;

/// Where a page of tags starts: after the tag it names (`0`: the first page). Rendered as the
/// tag's bytes in hex, so no tag name can look like the end.
pub struct TagCursor(pub Vec<u8>);

impl TagCursor {
    pub fn parse(text: &[u8]) -> Option<TagCursor> {
        if text == b"0" {
            return Some(TagCursor(Vec::new()));
        }
        let hex = std::str::from_utf8(text.strip_prefix(b"t")?).ok()?;
        if hex.is_empty() || hex.len() % 2 != 0 {
            return None;
        }
        (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).ok())
            .collect::<Option<Vec<u8>>>()
            .map(TagCursor)
    }

    pub fn render(&self) -> String {
        let mut out = String::with_capacity(1 + 2 * self.0.len());
        out.push('t');
        for b in &self.0 {
            out.push_str(&format!("{b:02x}"));
        }
        out
    }
}

fn snapshot_of(buffer: &TagBuffer) -> TagSnapshot {
    let st = buffer.lock();
    TagSnapshot {
        tag: buffer.name.to_string(),
        order: if buffer.kind.strict() {
            "strict"
        } else {
            "trend"
        },
        split: st.interleave.marker(),
        opaque: buffer.kind.opaque().map(|c| c.marker().to_string()),
        period: buffer.kind.period().map(|rule| rule.describe()),
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

/// A copy of one tag's state for LEAF.TAGS and the monitor page.
#[derive(Debug, Clone)]
pub struct TagSnapshot {
    pub tag: String,
    /// `"strict"` (`order = "strict"`) or `"trend"`.
    pub order: &'static str,
    /// This node's data-centre split of the tag (`delta:remainder`), `None` for the whole space:
    /// clusters on separate databases compare it by hand (each table knows only its own).
    pub split: Option<String>,
    /// The fingerprint of an opaque tag's key and digits (`d10:…`), the same in every cluster.
    pub opaque: Option<String>,
    /// A period tag's rule (`daily Asia/Shanghai 6`).
    pub period: Option<String>,
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
    pub failover_skips: u64,
}
