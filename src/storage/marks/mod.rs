//! Segment high-water marks: the highest `max_id` this node has loaded per tag, kept durably in
//! its state directory, so a database that went back in time cannot make it hand out IDs twice.

mod journal;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use journal::{raise, Journal};

use super::StoreError;

/// The marks of one node. Each raised mark is appended to `<path>.log` and fdatasynced before
/// [`SegmentMarks::record`] returns; marks raised while a write is under way go out together in
/// the next one (group commit), so a write costs one fdatasync of the new marks only, whatever
/// the number of tags. Once the log is longer than twice the snapshot, the marks are rewritten
/// as a snapshot in two slot files (`<path>.a`, `<path>.b`, written in turn) and the log starts
/// over; a write torn by a crash or a full disk is cut off by the next one.
///
/// Processes that share a state directory (one working directory, one config) share the
/// marks: each write holds an exclusive lock on `<path>.lock` and first reads what the others
/// appended since. A mark is a `max_id` the database handed to some node, so a range at or
/// below any of them is the database gone back, whichever node loaded it.
pub struct SegmentMarks {
    state: Mutex<Marks>,
    /// `<path>.log` (`None`: in memory), and its length after this process's last read or
    /// write of it: another length means another process wrote.
    log: Option<PathBuf>,
    /// The marks' own path (`None`: marks kept in memory only), to open the files again when
    /// the journal was lost ([`SegmentMarks::take_journal`]).
    path: Option<PathBuf>,
    /// Shared with the write under way, which moves it as soon as its bytes are in the log
    /// (before their fdatasync), so another tag's allocation beginning meanwhile does not
    /// wait for that write to read the log.
    known_len: Arc<AtomicU64>,
    /// The files (`None`: marks kept in memory only); one write at a time.
    writer: tokio::sync::Mutex<Option<Journal>>,
    /// The database the marks are of ([`SegmentMarks::scope_to`]).
    scope: std::sync::RwLock<Scope>,
}

/// Which marks apply: those recorded under the database's identity (keys `"<id> <tag>"`; a tag
/// has no space), and, for an identity that inherits them, every other mark of the tag.
#[derive(Default)]
struct Scope {
    /// `"<id> "`; empty for a store without an identity (keys are the tags themselves).
    prefix: String,
    /// Per tag, the highest mark recorded under another identity or before identities were
    /// kept (empty unless the identity inherits them).
    inherited: HashMap<String, i64>,
}

#[derive(Default)]
struct Marks {
    /// This process's marks, and those on disk when it opened them.
    marks: HashMap<String, i64>,
    /// The marks read from the files since (other processes' appends, snapshots they
    /// compacted). Kept apart: another live process's mark may be above a range this one loaded
    /// after it without the database having gone back (their allocations interleave), so only
    /// the marks read before an allocation began may refuse its range.
    read: HashMap<String, i64>,
    /// Marks raised since the last write began, for the next write.
    pending: HashMap<String, i64>,
    /// Numbers the calls to `record`; every call up to `durable` is on disk.
    issued: u64,
    durable: u64,
}

impl SegmentMarks {
    /// Reads the newest complete snapshot of the two slots and the log after it. Nothing yet
    /// is a node that never loaded a segment. Both slots present and neither readable means
    /// the marks are lost, and with them the guard against a database that went back: an
    /// error naming the files and what to do, unless `discard_unreadable` (the operator's
    /// explicit choice) says to start without them. One slot alone that cannot be read is the
    /// first snapshot ever, torn by a crash: the log it was compacted from still holds its marks.
    /// A log with a line that does not parse, a last line no torn write leaves, or a header
    /// naming a snapshot newer than any readable one is damaged and refused the same way (with
    /// `discard_unreadable`, the marks before the damage are kept).
    pub fn open(
        path: impl Into<PathBuf>,
        discard_unreadable: bool,
    ) -> Result<Arc<SegmentMarks>, StoreError> {
        let path = path.into();
        let opened = Journal::open(path.clone()).map_err(StoreError::Unavailable)?;
        let mut lost = opened.damaged.clone();
        if opened.unreadable.len() == 2 {
            lost.extend(opened.unreadable.iter().cloned());
        }
        if !lost.is_empty() {
            let files = lost.join("; ");
            if !discard_unreadable {
                return Err(StoreError::MarksUnreadable(format!(
                    "segment marks unreadable ({files}): this node no longer knows the highest IDs it served. \
                     Restore the files, or move every tag past the database with LEAF.TAG SKIPALL <n> on another node \
                     and delete them, or set storage.discard_unreadable_marks = true to start without them"
                )));
            }
            tracing::warn!(files = %files, "segment marks unreadable; starting without them (storage.discard_unreadable_marks)");
        }
        Ok(Arc::new(SegmentMarks {
            log: Some(opened.journal.log_path()),
            path: Some(path),
            known_len: Arc::new(AtomicU64::new(opened.journal.read_to())),
            state: Mutex::new(Marks {
                marks: opened.marks,
                ..Marks::default()
            }),
            writer: tokio::sync::Mutex::new(Some(opened.journal)),
            scope: Default::default(),
        }))
    }

    /// Marks kept in memory only (tests, benchmarks).
    pub fn in_memory() -> Arc<SegmentMarks> {
        Arc::new(SegmentMarks {
            log: None,
            path: None,
            known_len: Arc::new(AtomicU64::new(0)),
            state: Mutex::new(Marks::default()),
            writer: tokio::sync::Mutex::new(None),
            scope: Default::default(),
        })
    }

    /// Keeps the marks of the database `identity` names from now on (before any allocation):
    /// a new database is served whatever the marks of others say, a restored one is refused by
    /// its own; an identity that inherits (added to an older schema) is refused by every mark
    /// of the tag, whichever database it was recorded for. `None` (a schema without the
    /// identity table: `storage.migrate = false` on an older one, or a restore of a backup from
    /// before it): marks by tag alone, refused by every mark of the tag too.
    pub fn scope_to(&self, identity: Option<&super::DbIdentity>) {
        let mut scope = Scope::default();
        if let Some(identity) = identity {
            scope.prefix = format!("{} ", identity.id);
        }
        if identity.is_none_or(|identity| identity.inherits) {
            let state = self.lock();
            for (key, mark) in &state.marks {
                if !key.starts_with(&scope.prefix) || scope.prefix.is_empty() {
                    let tag = key.split_once(' ').map_or(key.as_str(), |(_, tag)| tag);
                    raise(&mut scope.inherited, tag, *mark);
                }
            }
        }
        *self.scope.write().unwrap_or_else(|p| p.into_inner()) = scope;
    }

    /// The key `tag`'s marks are kept under for this database.
    fn key(&self, tag: &str) -> String {
        let scope = self.scope.read().unwrap_or_else(|p| p.into_inner());
        format!("{}{tag}", scope.prefix)
    }

    fn inherited(&self, tag: &str) -> Option<i64> {
        let scope = self.scope.read().unwrap_or_else(|p| p.into_inner());
        scope.inherited.get(tag).copied()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Marks> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The highest `max_id` this node loaded for `tag` from this database (or any, for an
    /// identity that inherits: [`SegmentMarks::scope_to`]).
    pub fn get(&self, tag: &str) -> Option<i64> {
        let own = self.lock().marks.get(&self.key(tag)).copied();
        own.max(self.inherited(tag))
    }

    /// The highest mark of `tag` other processes sharing the directory made durable so far:
    /// asked before an allocation, every range they served before it. When the log did not
    /// change since this process last read or wrote it (no other process: the common case),
    /// one `stat` and no lock.
    pub async fn others_mark(self: &Arc<Self>, tag: &str) -> Result<Option<i64>, String> {
        let Some(log) = &self.log else {
            return Ok(None);
        };
        let len = match std::fs::metadata(log) {
            Ok(meta) => meta.len(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
            Err(e) => return Err(format!("segment marks {}: {e}", log.display())),
        };
        if len != self.known_len.load(Ordering::Acquire) {
            let marks = self.clone();
            // A task of its own, as for a write ([`SegmentMarks::record`]).
            tokio::spawn(async move { marks.catch_up().await })
                .await
                .map_err(|e| format!("segment marks: reading the log failed: {e}"))??;
        }
        Ok(self.lock().read.get(&self.key(tag)).copied())
    }

    /// Reads what other processes appended to the log since this one last looked.
    async fn catch_up(&self) -> Result<(), String> {
        let mut writer = self.writer.lock().await;
        let mut journal = self.take_journal(&mut writer).await?;
        let (journal, read) = tokio::task::spawn_blocking(move || {
            let read = journal.catch_up_locked();
            (journal, read)
        })
        .await
        .map_err(|e| e.to_string())?;
        let read_to = journal.read_to();
        *writer = Some(journal);
        self.merge_read(read?, read_to);
        Ok(())
    }

    /// Keeps the marks other processes wrote, read from the files up to `read_to`, then moves
    /// the log's known length there: in that order, so a reader comparing lengths never skips
    /// marks not yet kept.
    fn merge_read(&self, others: Vec<(String, i64)>, read_to: u64) {
        let mut state = self.lock();
        for (tag, mark) in others {
            raise(&mut state.read, &tag, mark);
        }
        self.known_len.store(read_to, Ordering::Release);
    }

    /// Takes the journal out of `writer` (the caller puts it back). A journal lost to a call
    /// cut short (its runtime shut down mid-write, or a panic) is opened again from the files,
    /// and every mark is first rewritten as a snapshot: the lost write may have carried marks
    /// whose callers count on their being on disk.
    async fn take_journal(&self, writer: &mut Option<Journal>) -> Result<Journal, String> {
        if let Some(journal) = writer.take() {
            return Ok(journal);
        }
        let Some(path) = self.path.clone() else {
            return Err("segment marks: kept in memory, no files to write".into());
        };
        let (marks, issued) = {
            let state = self.lock();
            (state.marks.clone(), state.issued)
        };
        let (journal, on_disk, others) = tokio::task::spawn_blocking(move || {
            let opened = Journal::open(path)?;
            let mut journal = opened.journal;
            let others = journal.compact(marks)?;
            Ok::<_, String>((journal, opened.marks, others))
        })
        .await
        .map_err(|e| e.to_string())??;
        {
            let mut state = self.lock();
            state.durable = state.durable.max(issued);
        }
        // What is on disk includes other processes' marks appended since this one last read
        // the log (and this process's own, no higher than its marks: harmless among them).
        self.merge_read(
            on_disk.into_iter().chain(others).collect(),
            journal.read_to(),
        );
        tracing::warn!("segment marks: a write was cut short; the files were read again and every mark rewritten");
        Ok(journal)
    }

    /// Raises the mark of `tag` to `max_id` and makes it durable before returning. The mark
    /// rises in memory at once, also when the write fails (a full disk); a failed write's
    /// marks go out with the next one.
    pub async fn record(self: &Arc<Self>, tag: &str, max_id: i64) -> Result<(), String> {
        let key = self.key(tag);
        let ticket = {
            let mut state = self.lock();
            raise(&mut state.marks, &key, max_id);
            raise(&mut state.pending, &key, max_id);
            state.issued += 1;
            state.issued
        };
        let marks = self.clone();
        // A task of its own: a caller that goes away (its time limit) must not cut the write
        // short between taking the journal and putting it back, nor before the marks it
        // carried for other callers are booked as durable or put back as pending.
        tokio::spawn(async move { marks.write_through(ticket).await })
            .await
            .map_err(|e| format!("segment marks: the write failed: {e}"))?
    }

    /// [`SegmentMarks::record`] from its ticket on, run to its end.
    async fn write_through(&self, ticket: u64) -> Result<(), String> {
        let mut writer = self.writer.lock().await;
        let (batch, upto) = {
            let mut state = self.lock();
            if state.durable >= ticket {
                // A write that began after this call raised the mark carried it.
                return Ok(());
            }
            (std::mem::take(&mut state.pending), state.issued)
        };
        if self.path.is_none() {
            self.lock().durable = upto;
            return Ok(());
        }
        let mut journal = match self.take_journal(&mut writer).await {
            Ok(journal) => journal,
            Err(e) => {
                self.put_back(batch);
                return Err(e);
            }
        };
        let known_len = self.known_len.clone();
        let (journal, batch, (others, written)) = tokio::task::spawn_blocking(move || {
            let appended = journal.append(&batch, &known_len);
            (journal, batch, appended)
        })
        .await
        .map_err(|e| e.to_string())?;
        let read_to = journal.read_to();
        *writer = Some(journal);
        self.merge_read(others, read_to);
        if let Err(e) = written {
            self.put_back(batch);
            return Err(e);
        }
        let compact = {
            let mut state = self.lock();
            state.durable = state.durable.max(upto);
            let wants = writer.as_ref().is_some_and(Journal::wants_compaction);
            wants.then(|| state.marks.clone())
        };
        if let Some(marks) = compact {
            self.compact(&mut writer, marks).await;
        }
        Ok(())
    }

    /// A failed write's marks, for the next write.
    fn put_back(&self, batch: HashMap<String, i64>) {
        let mut state = self.lock();
        for (tag, mark) in batch {
            raise(&mut state.pending, &tag, mark);
        }
    }

    /// At a clean stop: rewrites the marks as a snapshot if this process appended any, so a
    /// release before the log (which reads the slots only) finds every mark after a rollback.
    /// A journal lost to a write cut short by the stop itself (a connection thread's runtime
    /// ends with its tasks) is opened again, which rewrites them too.
    pub async fn close(&self) {
        if self.path.is_none() {
            return;
        }
        let mut writer = self.writer.lock().await;
        if writer.is_none() {
            match self.take_journal(&mut writer).await {
                Ok(journal) => *writer = Some(journal),
                Err(e) => tracing::warn!(error = %e, "segment marks: not rewritten at stop"),
            }
        } else if writer.as_ref().is_some_and(Journal::appended) {
            let marks = self.lock().marks.clone();
            self.compact(&mut writer, marks).await;
        }
    }

    /// Rewrites the marks as a snapshot and empties the log. A failure (a full disk) only
    /// leaves the log longer: it is tried again after a later write.
    async fn compact(&self, writer: &mut Option<Journal>, marks: HashMap<String, i64>) {
        let Some(mut journal) = writer.take() else {
            return;
        };
        let Ok((journal, compacted)) = tokio::task::spawn_blocking(move || {
            let compacted = journal.compact(marks);
            (journal, compacted)
        })
        .await
        else {
            return;
        };
        let read_to = journal.read_to();
        *writer = Some(journal);
        match compacted {
            Ok(others) => self.merge_read(others, read_to),
            Err(e) => {
                tracing::warn!(error = %e, "segment marks: compaction failed; the log keeps every mark and compaction is tried again later")
            }
        }
    }
}

#[cfg(test)]
impl SegmentMarks {
    /// Compacts once the log passes `bytes` (tests reach compaction with a few marks).
    fn compact_after(self: Arc<Self>, bytes: u64) -> Arc<Self> {
        if let Some(journal) = self.writer.try_lock().expect("unused").as_mut() {
            journal.compact_at_least = bytes;
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::journal::slot;
    use super::*;
    use std::future::Future;

    fn log_of(path: &std::path::Path) -> PathBuf {
        PathBuf::from(format!("{}.log", path.display()))
    }

    /// A compaction keeps another process's mark that this one read before (by `others_mark`,
    /// not in the write that compacts): the log it empties held it.
    #[tokio::test(flavor = "current_thread")]
    async fn a_compaction_keeps_marks_read_before_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("marks.json");
        let first = SegmentMarks::open(&path, false).unwrap();
        let second = SegmentMarks::open(&path, false).unwrap();
        first.record("a", 1).await.unwrap();
        second.record("x", 9).await.unwrap();
        assert_eq!(first.others_mark("x").await.unwrap(), Some(9));
        first.record("a", 2).await.unwrap();
        // A clean stop compacts.
        first.close().await;
        let (newest, _) = journal::read_newest(&path).unwrap();
        assert!(newest.is_some(), "compacted");
        let reopened = SegmentMarks::open(&path, false).unwrap();
        assert_eq!(reopened.get("x"), Some(9));
        assert_eq!(reopened.get("a"), Some(2));
    }

    /// Two writers on one path (two processes sharing a state directory; the lock is per open
    /// file, so two handles in one process exclude each other alike), writing at once and
    /// compacting often: the marks on disk are the highest each tag reached anywhere.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn processes_sharing_a_directory_merge_their_marks() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("marks.json");
        let first = SegmentMarks::open(&path, false).unwrap().compact_after(300);
        let second = SegmentMarks::open(&path, false).unwrap().compact_after(300);
        let write = |marks: Arc<SegmentMarks>, offset: i64| {
            tokio::spawn(async move {
                for i in 1..=200i64 {
                    marks
                        .record(&format!("t{}", i % 7), i * 10 + offset)
                        .await
                        .unwrap();
                }
            })
        };
        let (a, b) = (write(first.clone(), 1), write(second.clone(), 2));
        a.await.unwrap();
        b.await.unwrap();
        let reopened = SegmentMarks::open(&path, false).unwrap();
        for t in 0..7i64 {
            let highest = (1..=200i64).filter(|i| i % 7 == t).max().unwrap() * 10 + 2;
            assert_eq!(reopened.get(&format!("t{t}")), Some(highest), "t{t}");
        }
        let (newest, unreadable) = journal::read_newest(&path).unwrap();
        assert!(unreadable.is_empty(), "{unreadable:?}");
        assert!(newest.is_some_and(|r| r.seq >= 2), "the log was compacted");
        // Each reads the other's marks before an allocation.
        let known = first.get("t0").max(first.others_mark("t0").await.unwrap());
        assert_eq!(known, reopened.get("t0"));
    }

    /// A write whose caller went away while it was under way (the caller's time limit, a
    /// dropped connection) still completes with its bookkeeping: the marks it carried for
    /// another caller are durable, and the next write is not refused.
    #[tokio::test(flavor = "current_thread")]
    async fn a_write_abandoned_by_its_caller_still_completes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("marks.json");
        let marks = SegmentMarks::open(&path, false).unwrap();
        let mut abandoned = Box::pin(marks.record("t", 500));
        let mut carried = Box::pin(marks.record("carried", 70));
        // Both polled until they wait: the first's write under way on a blocking thread, the
        // second's mark raised and waiting for the next write. Then the first is dropped.
        let waiting = std::future::poll_fn(|cx| {
            let first = abandoned.as_mut().poll(cx).is_pending();
            let second = carried.as_mut().poll(cx).is_pending();
            std::task::Poll::Ready(first && second)
        })
        .await;
        assert!(waiting, "a write ended before it could be abandoned");
        drop(abandoned);
        carried.await.unwrap();
        marks.record("u", 9).await.unwrap();
        let reopened = SegmentMarks::open(&path, false).unwrap();
        assert_eq!(reopened.get("t"), Some(500));
        assert_eq!(reopened.get("carried"), Some(70));
        assert_eq!(reopened.get("u"), Some(9));
    }

    /// Starts a write of `tag`'s mark on a runtime of its own and shuts that runtime down while
    /// the write waits for the directory's lock, as a stop ends a connection thread's runtime:
    /// the write task is cut short with the journal taken out.
    fn cut_short(marks: &Arc<SegmentMarks>, path: &std::path::Path, tag: &'static str, mark: i64) {
        let lock = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(format!("{}.lock", path.display()))
            .unwrap();
        lock.lock().unwrap();
        let marks = marks.clone();
        let cut = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap();
            runtime.block_on(async {
                let write = tokio::spawn(async move { marks.record(tag, mark).await });
                for _ in 0..100 {
                    tokio::task::yield_now().await;
                }
                assert!(!write.is_finished(), "the write did not wait for the lock");
            });
            // Waits for the blocking write, which waits for the lock.
            drop(runtime);
        });
        std::thread::sleep(std::time::Duration::from_millis(200));
        lock.unlock().unwrap();
        cut.join().unwrap();
    }

    /// A write cut short by its runtime's shutdown loses the journal: the next write opens the
    /// files again and rewrites every mark (the cut write's too), and so does a clean stop, whose
    /// snapshot then holds every mark (an older release reads only the snapshot).
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_write_cut_short_by_its_runtime_is_rewritten() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("marks.json");
        let marks = SegmentMarks::open(&path, false).unwrap();
        marks.record("a", 1).await.unwrap();
        cut_short(&marks, &path, "t", 500);
        marks.record("u", 9).await.unwrap();
        cut_short(&marks, &path, "v", 70);
        marks.close().await;
        let (snapshot, _) = journal::read_newest(&path).unwrap();
        let snapshot = snapshot.expect("a snapshot written at close").marks;
        for (tag, mark) in [("a", 1), ("t", 500), ("u", 9), ("v", 70)] {
            assert_eq!(snapshot.get(tag), Some(&mark), "{tag}");
        }
        let reopened = SegmentMarks::open(&path, false).unwrap();
        assert_eq!(reopened.get("v"), Some(70));
    }

    /// What another process appended is read before this one's next allocation, and kept
    /// apart from this process's own marks.
    #[tokio::test(flavor = "current_thread")]
    async fn a_write_reads_the_marks_another_process_appended() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("marks.json");
        let first = SegmentMarks::open(&path, false).unwrap();
        let second = SegmentMarks::open(&path, false).unwrap();
        assert_eq!(second.others_mark("t").await.unwrap(), None);
        first.record("t", 600).await.unwrap();
        assert_eq!(second.others_mark("t").await.unwrap(), Some(600));
        assert_eq!(second.get("t"), None, "its own marks only");
        second.record("t", 100).await.unwrap();
        assert_eq!(second.get("t"), Some(100));
        let own = first.others_mark("t").await.unwrap();
        assert_eq!(own, Some(100), "the other's mark, not its own read back");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn marks_only_rise_and_survive_a_reopen_and_a_torn_log_tail() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("marks.json");
        let marks = SegmentMarks::open(&path, false).unwrap();
        assert_eq!(marks.get("order"), None);
        marks.record("order", 500).await.unwrap();
        marks.record("order", 300).await.unwrap();
        marks.record("pay", 7).await.unwrap();
        let reopened = SegmentMarks::open(&path, false).unwrap();
        assert_eq!(
            (reopened.get("order"), reopened.get("pay")),
            (Some(500), Some(7))
        );
        // A crash tore the last append: its line has no newline and is not a mark.
        let mut log = std::fs::read(log_of(&path)).unwrap();
        log.extend_from_slice(b"[\"pay\",90");
        std::fs::write(log_of(&path), &log).unwrap();
        let reopened = SegmentMarks::open(&path, false).unwrap();
        assert_eq!(
            (reopened.get("order"), reopened.get("pay")),
            (Some(500), Some(7))
        );
        // The next append replaces the torn line, so the marks after it are read.
        reopened.record("pay", 9).await.unwrap();
        reopened.record("order", 501).await.unwrap();
        let again = SegmentMarks::open(&path, false).unwrap();
        assert_eq!((again.get("order"), again.get("pay")), (Some(501), Some(9)));
    }

    /// A compaction writes every mark as a snapshot and starts the log over; a snapshot torn by
    /// a crash leaves the slot before it and the log, which together hold every mark.
    #[tokio::test(flavor = "current_thread")]
    async fn compaction_keeps_every_mark_and_a_torn_snapshot_loses_none() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("marks.json");
        let marks = SegmentMarks::open(&path, false)
            .unwrap()
            .compact_after(2000);
        for i in 0..500i64 {
            marks.record(&format!("tag{}", i % 50), i).await.unwrap();
        }
        let (newest, _) = journal::read_newest(&path).unwrap();
        let newest = newest.expect("compacted");
        assert!(std::fs::metadata(log_of(&path)).unwrap().len() < 4000);
        let reopened = SegmentMarks::open(&path, false).unwrap();
        for t in 0..50i64 {
            assert_eq!(reopened.get(&format!("tag{t}")), Some(450 + t), "tag{t}");
        }
        // A crash tore the newest snapshot, so it never emptied the log that held its marks:
        // tear it, and put those marks back in the log.
        let before = std::fs::read(slot(&path, newest.seq)).unwrap();
        std::fs::write(slot(&path, newest.seq), &before[..before.len() / 2]).unwrap();
        // The log still follows the snapshot before (its header is rewritten after the slot).
        let log = std::fs::read(log_of(&path)).unwrap();
        let first_line = log.iter().position(|&b| b == b'\n').unwrap() + 1;
        let mut log = [
            format!("{{\"after\":{}}}\n", newest.seq - 1).as_bytes(),
            &log[first_line..],
        ]
        .concat();
        for (tag, mark) in &newest.marks {
            log.extend_from_slice(format!("[\"{tag}\",{mark}]\n").as_bytes());
        }
        // The lock file's record of the log is written after the log's header, so the crash
        // left the one from before the compaction too.
        let tail = format!("{{\"after\":{},\"len\":{}}}", newest.seq - 1, log.len());
        std::fs::write(log_of(&path), log).unwrap();
        std::fs::write(lock_of(&path), tail).unwrap();
        let reopened = SegmentMarks::open(&path, false).unwrap();
        for t in 0..50i64 {
            assert_eq!(reopened.get(&format!("tag{t}")), Some(450 + t), "tag{t}");
        }
    }

    fn lock_of(path: &std::path::Path) -> PathBuf {
        PathBuf::from(format!("{}.lock", path.display()))
    }

    /// A log that lost whole lines (cut at a line's end, emptied, cut to its header, deleted)
    /// is no crash's work: the lock file records its synced length, and such a log is refused
    /// like a damaged one, so a database restored below the lost marks is not served again.
    #[tokio::test(flavor = "current_thread")]
    async fn a_log_that_lost_whole_lines_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("segment-marks.json");
        let marks = SegmentMarks::open(&path, false).unwrap();
        marks.record("order", 500).await.unwrap();
        let first = std::fs::read(log_of(&path)).unwrap();
        marks.record("order", 1200).await.unwrap();
        drop(marks);
        let full = std::fs::read(log_of(&path)).unwrap();
        assert!(full.len() > first.len());
        let refused = |why: &str| {
            let text = SegmentMarks::open(&path, false)
                .err()
                .unwrap_or_else(|| panic!("{why}: accepted"))
                .to_string();
            assert!(text.contains("segment-marks.json"), "{why}: {text}");
            assert!(
                text.contains("storage.discard_unreadable_marks"),
                "{why}: {text}"
            );
            text
        };
        std::fs::write(log_of(&path), &first).unwrap();
        let text = refused("cut after its first line");
        assert!(
            text.contains(&format!("ends at byte {}", first.len())),
            "{text}"
        );
        std::fs::write(log_of(&path), b"").unwrap();
        refused("emptied");
        std::fs::remove_file(log_of(&path)).unwrap();
        assert!(refused("deleted").contains("it is gone"));
        // The operator's choice keeps what is left.
        std::fs::write(log_of(&path), &first).unwrap();
        let kept = SegmentMarks::open(&path, true).unwrap();
        assert_eq!(kept.get("order"), Some(500));
        drop(kept);
        // A crash's torn tail after the last synced line is still no damage.
        let mut torn = full.clone();
        torn.extend_from_slice(b"[\"order\",17");
        std::fs::write(log_of(&path), &torn).unwrap();
        assert_eq!(
            SegmentMarks::open(&path, false).unwrap().get("order"),
            Some(1200)
        );
        // A damaged record is refused; none at all (a directory an older release wrote) is
        // read as before.
        std::fs::write(log_of(&path), &full).unwrap();
        std::fs::write(lock_of(&path), b"{\"after\":").unwrap();
        refused("a damaged length record");
        std::fs::write(lock_of(&path), b"").unwrap();
        assert_eq!(
            SegmentMarks::open(&path, false).unwrap().get("order"),
            Some(1200)
        );

        // After a compaction the log is its header: marks after it, cut back to the header,
        // are refused; a log from before the compaction is too.
        let marks = SegmentMarks::open(&path, false).unwrap().compact_after(0);
        marks.record("order", 1300).await.unwrap();
        marks.record("order", 1400).await.unwrap();
        drop(marks);
        let (newest, _) = journal::read_newest(&path).unwrap();
        let seq = newest.expect("compacted").seq;
        let header = format!("{{\"after\":{seq}}}\n");
        let log = std::fs::read(log_of(&path)).unwrap();
        assert!(log.starts_with(header.as_bytes()) && log.len() > header.len());
        std::fs::write(log_of(&path), &header).unwrap();
        refused("cut to its header");
        std::fs::write(log_of(&path), &full).unwrap();
        assert!(refused("an older log").contains("last followed snapshot"));
    }

    /// A compaction that crashed after its snapshot and the log's emptying, before the log's
    /// header and the lock file's record, lost nothing (every mark is in the snapshot): no
    /// refusal (helper-3's false refusal).
    #[tokio::test(flavor = "current_thread")]
    async fn a_compaction_cut_before_the_logs_header_is_no_damage() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("segment-marks.json");
        let marks = SegmentMarks::open(&path, false).unwrap();
        marks.record("order", 500).await.unwrap();
        marks.record("order", 600).await.unwrap();
        drop(marks);
        assert!(std::fs::read(lock_of(&path))
            .unwrap()
            .starts_with(b"{\"after\":0,"));
        std::fs::write(slot(&path, 1), br#"{"seq":1,"marks":{"order":600}}"#).unwrap();
        std::fs::write(log_of(&path), b"").unwrap();
        let opened = SegmentMarks::open(&path, false).expect("no mark lost");
        assert_eq!(opened.get("order"), Some(600));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn unreadable_marks_refuse_to_open_unless_discarded() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("segment-marks.json");
        let marks = SegmentMarks::open(&path, false).unwrap();
        marks.record("order", 500).await.unwrap();
        marks.record("order", 600).await.unwrap();
        std::fs::write(slot(&path, 0), b"garbage").unwrap();
        std::fs::write(slot(&path, 1), b"").unwrap();
        let refused = SegmentMarks::open(&path, false).err().expect("refused");
        let text = refused.to_string();
        assert!(text.contains("segment-marks.json.a"), "{text}");
        assert!(text.contains("segment-marks.json.b"), "{text}");
        assert!(text.contains("LEAF.TAG SKIPALL"), "{text}");
        assert!(text.contains("storage.discard_unreadable_marks"), "{text}");
        let discarded = SegmentMarks::open(&path, true).unwrap();
        assert_eq!(
            discarded.get("order"),
            Some(600),
            "the log's marks are still read"
        );
    }

    /// A log damaged from its first byte, or with a complete line that does not parse, or
    /// whose header names a lost snapshot, is refused like unreadable slots: it is no torn
    /// write, and reading it as "no marks" would serve what the node already served.
    #[tokio::test(flavor = "current_thread")]
    async fn a_damaged_log_is_refused_unless_discarded() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("segment-marks.json");
        let marks = SegmentMarks::open(&path, false).unwrap();
        marks.record("order", 500).await.unwrap();
        drop(marks);
        let good = std::fs::read(log_of(&path)).unwrap();
        let damaged: [&[u8]; 8] = [
            b"garbage",
            b"[\"t\",12x]\n",
            b"\n",
            b"{\"after\":0}\n{\"after\":0}\n",
            b"[\"t\",12]garbage",
            b"[\"t\" 12",
            b"\xff\xfe",
            b"{\"seq\":",
        ];
        for bytes in damaged {
            std::fs::write(log_of(&path), bytes).unwrap();
            let text = SegmentMarks::open(&path, false)
                .err()
                .unwrap_or_else(|| panic!("{:?} accepted", String::from_utf8_lossy(bytes)))
                .to_string();
            assert!(text.contains("segment-marks.json.log"), "{text}");
            assert!(text.contains("storage.discard_unreadable_marks"), "{text}");
        }
        // A good line, then a damaged one: refused; with the operator's choice, the good one
        // is kept.
        let mut log = good.clone();
        log.extend_from_slice(b"[\"order\",9x]\n[\"pay\",5]\n");
        std::fs::write(log_of(&path), &log).unwrap();
        assert!(SegmentMarks::open(&path, false).is_err());
        let discarded = SegmentMarks::open(&path, true).unwrap();
        assert_eq!(
            (discarded.get("order"), discarded.get("pay")),
            (Some(500), None)
        );
        // Torn writes stay what they were: a prefix of a line, or zeros a crash left.
        let torn: [&[u8]; 6] = [
            b"",
            b"[",
            b"[\"or",
            b"[\"order\",60",
            b"[\"order\",600]",
            b"[\"order\"\0\0\0\0",
        ];
        for tail in torn {
            let mut log = good.clone();
            log.extend_from_slice(tail);
            std::fs::write(log_of(&path), &log).unwrap();
            let opened = SegmentMarks::open(&path, false)
                .unwrap_or_else(|e| panic!("{:?}: {e}", String::from_utf8_lossy(tail)));
            assert_eq!(opened.get("order"), Some(500));
        }
        // Zeros from the first byte: the first line had been written and synced.
        std::fs::write(log_of(&path), b"\0\0\0\0").unwrap();
        assert!(SegmentMarks::open(&path, false).is_err());
        // A header naming a snapshot no slot holds: the newest snapshot was lost.
        std::fs::write(log_of(&path), b"{\"after\":3}\n").unwrap();
        let text = SegmentMarks::open(&path, false).err().unwrap().to_string();
        assert!(text.contains("follows snapshot 3"), "{text}");
    }

    /// Marks are kept per database: a new one (an identity made with its schema) is not
    /// refused by another's marks, a restored one is by its own, and one whose identity was
    /// added to an older schema by every mark the node holds.
    #[tokio::test(flavor = "current_thread")]
    async fn marks_belong_to_the_database_they_came_from() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("segment-marks.json");
        let id = |id: &str, inherits| crate::storage::DbIdentity {
            id: id.into(),
            inherits,
        };
        let marks = SegmentMarks::open(&path, false).unwrap();
        marks.record("order", 100).await.unwrap(); // before identities were kept
        marks.scope_to(Some(&id("a1", false)));
        marks.record("order", 3000).await.unwrap();
        marks.record("pay", 7).await.unwrap();
        assert_eq!(marks.get("order"), Some(3000));
        drop(marks);
        let reopened = SegmentMarks::open(&path, false).unwrap();
        reopened.scope_to(Some(&id("b2", false)));
        assert_eq!((reopened.get("order"), reopened.get("pay")), (None, None));
        reopened.record("order", 50).await.unwrap();
        reopened.scope_to(Some(&id("a1", false)));
        assert_eq!(
            (reopened.get("order"), reopened.get("pay")),
            (Some(3000), Some(7))
        );
        let again = SegmentMarks::open(&path, false).unwrap();
        again.scope_to(Some(&id("c3", true)));
        assert_eq!(
            (again.get("order"), again.get("pay")),
            (Some(3000), Some(7))
        );
        // A database without an identity: every mark of the tag (a restore of a backup from
        // before identities, on a node that does not migrate).
        again.scope_to(None);
        assert_eq!(
            (again.get("order"), again.get("pay")),
            (Some(3000), Some(7))
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_lone_torn_first_slot_is_no_loss() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("segment-marks.json");
        std::fs::write(slot(&path, 1), b"{\"seq\":1,\"mar").unwrap();
        let marks = SegmentMarks::open(&path, false).unwrap();
        assert_eq!(marks.get("order"), None);
    }

    /// Writes that fail (a full disk; here a directory in the log's place) return the error,
    /// the mark still rises in memory, and the next write that succeeds carries every mark the
    /// failed ones did not write.
    #[tokio::test(flavor = "current_thread")]
    async fn failed_writes_are_carried_by_the_next_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("segment-marks.json");
        let marks = SegmentMarks::open(&path, false).unwrap();
        std::fs::create_dir(log_of(&path)).unwrap();
        assert!(marks.record("order", 200).await.is_err());
        assert!(marks.record("pay", 300).await.is_err());
        assert_eq!(marks.get("order"), Some(200), "the mark rises in memory");
        std::fs::remove_dir(log_of(&path)).unwrap();
        marks.record("refund", 1).await.unwrap();
        let on_disk = SegmentMarks::open(&path, false).unwrap();
        assert_eq!(
            (
                on_disk.get("order"),
                on_disk.get("pay"),
                on_disk.get("refund")
            ),
            (Some(200), Some(300), Some(1))
        );
    }
}
