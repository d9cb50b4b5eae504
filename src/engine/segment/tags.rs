//! The tag set: tag-name rules and the map re-read from the table (periodically; a miss reads
//! its row).

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{store_reason, SegmentEngine, SegmentError, TagBuffer, TagEntry};
use crate::storage::StoreError;

/// Longest tag name, the width of `leaf_alloc.biz_tag`.
pub const MAX_TAG_LEN: usize = 128;
/// Largest first ID accepted for a tag, leaving room for billions of segments before i64 ends.
pub const MAX_TAG_START: i64 = 1 << 62;

/// A refresh of at least this many tags hands the memory its read freed back to the system.
const RETURN_MEMORY_FROM: usize = 10_000;

/// Rows a sweep of the tag list reads at a time: its memory and the time it holds the tag
/// writer lock stay bounded whatever the number of tags.
pub(super) const SWEEP_PAGE: usize = 10_000;

/// The rows a refresh read and the map it replaced are freed in pieces that glibc keeps for
/// the process; with a million tags that is hundreds of megabytes of RSS nothing uses.
fn return_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free heap pages to the kernel; it takes no pointers.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Checks a tag name: 1–128 bytes of printable ASCII other than space.
pub fn validate_tag_name(tag: &str) -> Result<(), String> {
    if tag.is_empty() || tag.len() > MAX_TAG_LEN {
        return Err(format!("tag must be 1 to {MAX_TAG_LEN} bytes long"));
    }
    if !tag.bytes().all(|b| b.is_ascii_graphic()) {
        return Err("tag may only contain printable ASCII characters without spaces".into());
    }
    Ok(())
}

impl SegmentEngine {
    /// On a miss, reads the tag's row (one indexed read, whatever the number of tags), so a
    /// tag created on another node is usable here at once. Misses are read one at a time, so
    /// a flood of requests for tags that do not exist costs the database one read in flight.
    pub(super) async fn lookup_after_refresh(
        &self,
        tag: &str,
    ) -> Result<Arc<TagBuffer>, SegmentError> {
        validate_tag_name(tag).map_err(|_| SegmentError::UnknownTag(tag.to_string()))?;
        let writer = self.tag_writer.lock().await;
        if let Some(buffer) = self.buffer_of(tag) {
            return Ok(buffer);
        }
        self.read_row_into_map(tag).await?;
        if let Some(buffer) = self.buffer_of(tag) {
            return Ok(buffer);
        }
        drop(writer);
        self.create_on_first_use(tag).await
    }

    /// Reads `tag`'s row and adds the tag to the map if the table has it; the caller holds
    /// `tag_writer`.
    async fn read_row_into_map(&self, tag: &str) -> Result<(), SegmentError> {
        let row = self
            .store
            .row(tag)
            .await
            .map_err(|e| SegmentError::Unavailable {
                tag: tag.to_string(),
                reason: store_reason(&e),
            })?;
        if let Some(row) = row {
            self.insert_entry(tag, row.split.as_deref());
        }
        Ok(())
    }

    /// Adds a tag of the table to the map, unless it is there already.
    pub(super) fn insert_entry(&self, tag: &str, recorded: Option<&str>) {
        self.tags.insert_if_absent(tag, || TagEntry::new(recorded));
    }

    /// `segment.auto_create`: an unknown tag the pattern allows is created (one INSERT, so
    /// nodes racing to create it agree on one row and serve distinct ranges of it), counted by
    /// `segment.max_tags` like any other.
    async fn create_on_first_use(&self, tag: &str) -> Result<Arc<TagBuffer>, SegmentError> {
        let Some(auto) = self
            .settings
            .auto_create
            .as_ref()
            .filter(|auto| (auto.allows)(tag))
        else {
            return Err(SegmentError::UnknownTag(tag.to_string()));
        };
        if self
            .ensure_tag(tag, auto.step, 1, Some("created on first use"))
            .await?
        {
            tracing::info!(
                tag,
                step = auto.step,
                "tag created on first use (segment.auto_create)"
            );
        } else {
            // Another node created it first: read its row.
            let _writer = self.tag_writer.lock().await;
            self.read_row_into_map(tag).await?;
        }
        self.buffer_of(tag)
            .ok_or_else(|| SegmentError::UnknownTag(tag.to_string()))
    }

    /// Re-reads the tag list: new rows become tags, removed rows stop being served.
    pub async fn refresh_tags(&self) -> Result<usize, StoreError> {
        let _writer = self.tag_writer.lock().await;
        self.refresh_locked().await
    }

    /// Rebuilds the tag map from the table; the caller holds `tag_writer`.
    async fn refresh_locked(&self) -> Result<usize, StoreError> {
        let rows = self.store.rules().await?;
        self.tags.replace_all(rows.iter().map(|(tag, recorded)| {
            let entry = self
                .tags
                .get(tag.as_bytes())
                .filter(|entry| entry.serves_record(recorded.as_deref()))
                .unwrap_or_else(|| TagEntry::new(recorded.as_deref()));
            (tag.as_str(), entry)
        }));
        let count = self.tags.len();
        drop(rows);
        if count >= RETURN_MEMORY_FROM {
            return_freed_memory();
        }
        Ok(count)
    }

    /// Re-reads the tag list page by page ([`SWEEP_PAGE`] rows at a time): new rows become
    /// tags, a changed record rebuilds its tag, and once every page is read, the tags whose
    /// rows are gone stop being served. Returns the number of tags after.
    pub async fn sweep_tags(&self) -> Result<usize, StoreError> {
        let sweep = self.tags.begin_sweep();
        let mut after: Option<String> = None;
        loop {
            let page = self.store.rules_after(after.as_deref(), SWEEP_PAGE).await?;
            let _writer = self.tag_writer.lock().await;
            let mut changed = Vec::new();
            for (tag, recorded) in &page {
                match self.tags.get(tag.as_bytes()) {
                    Some(entry) if entry.serves_record(recorded.as_deref()) => {
                        self.tags.mark(&entry, sweep)
                    }
                    _ => changed.push((tag.as_str(), TagEntry::new(recorded.as_deref()))),
                }
            }
            self.tags.insert_many(changed);
            if page.len() < SWEEP_PAGE {
                break;
            }
            let next = page.into_iter().next_back().map(|(tag, _)| tag);
            // A store whose order the cursor does not follow would hand the same page back
            // for ever: the sweep ends there, removing nothing.
            if next == after {
                return Err(StoreError::Unavailable(format!(
                    "the tag list did not move past '{}': the sweep stopped and removed nothing",
                    next.unwrap_or_default()
                )));
            }
            after = next;
        }
        let _writer = self.tag_writer.lock().await;
        let removed = self.tags.remove_unswept(sweep);
        if removed > 0 {
            tracing::info!(removed, "tags whose rows are gone are no longer served");
        }
        Ok(self.tags.len())
    }

    /// Builds `tag`'s buffer anew from its row's record `recorded` (a node that does not
    /// configure the tag follows a changed rule); requests in flight finish on the old one.
    pub(super) fn rebuild_tag(&self, tag: &str, recorded: Option<&str>) {
        let entry = TagEntry::built(
            Arc::new(TagBuffer::new(tag, &self.settings, recorded)),
            recorded,
        );
        tracing::info!(
            tag,
            rule = recorded.unwrap_or("none"),
            "the tag's row records another rule: this node follows it"
        );
        self.tags.insert(tag, entry.clone());
        self.tags.note_used(&entry);
    }

    pub(super) fn forget_tag(&self, tag: &str) {
        self.tags.remove(tag);
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
                        if let Err(e) = engine.sweep_tags().await {
                            tracing::warn!(error = %e, "tag refresh failed; keeping the known tags");
                        }
                    }
                }
            }
        })
    }
}
