//! Segment high-water marks: the highest `max_id` this node has loaded per tag, kept durably in
//! its state directory, so a database that went back in time cannot make it hand out IDs twice.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::StoreError;

/// The marks of one node, kept in two slot files (`<path>.a`, `<path>.b`) written in turn: each
/// write truncates the older slot, writes `{seq, marks}` and fdatasyncs it (one sync, no rename,
/// about a tenth of a millisecond), so the newest slot that parses is always a complete record.
/// A write torn by a crash leaves the other slot, one record older, which nothing was served from.
///
/// Processes that share a state directory (one working directory, one config) share the
/// marks: each write holds an exclusive lock on `<path>.lock`, reads the newest record on disk
/// and writes it merged with its own. A mark is a `max_id` the database handed to some node, so
/// a range at or below any of them is the database gone back, whichever node loaded it.
pub struct SegmentMarks {
    path: Option<PathBuf>,
    state: Mutex<Marks>,
    /// Serialises file writes, so an older map never replaces a newer one.
    writer: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct Marks {
    marks: HashMap<String, i64>,
    /// Sequence number of the last record written (the next goes to the other slot).
    seq: u64,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Record {
    seq: u64,
    marks: HashMap<String, i64>,
}

fn slot(path: &Path, seq: u64) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(if seq.is_multiple_of(2) { ".a" } else { ".b" });
    PathBuf::from(name)
}

impl SegmentMarks {
    /// Reads the newest complete record of the two slots. No slot yet is a node that never
    /// loaded a segment. Both slots present and neither readable means the marks are lost, and
    /// with them the guard against a database that went back: an error naming the files and
    /// what to do, unless `discard_unreadable` (the operator's explicit choice) says to start
    /// without them. One slot alone that cannot be read is the first record ever, torn by a
    /// crash before any ID of its range was served: nothing is lost.
    pub fn open(
        path: impl Into<PathBuf>,
        discard_unreadable: bool,
    ) -> Result<Arc<SegmentMarks>, StoreError> {
        let path = path.into();
        let (newest, unreadable) = read_newest(&path).map_err(StoreError::Unavailable)?;
        if newest.is_none() && unreadable.len() == 2 {
            let files = unreadable.join("; ");
            if !discard_unreadable {
                return Err(StoreError::MarksUnreadable(format!(
                    "segment marks unreadable ({files}): this node no longer knows the highest IDs it served. \
                     Restore the files, or move every tag past the database with LEAF.TAG SKIPALL <n> on another node \
                     and delete them, or set storage.discard_unreadable_marks = true to start without them"
                )));
            }
            tracing::warn!(files = %files, "segment marks unreadable; starting without them (storage.discard_unreadable_marks)");
        }
        let state = newest.map_or_else(Marks::default, |r| Marks {
            marks: r.marks,
            seq: r.seq,
        });
        Ok(Arc::new(SegmentMarks {
            path: Some(path),
            state: Mutex::new(state),
            writer: tokio::sync::Mutex::new(()),
        }))
    }

    /// Marks kept in memory only (tests, benchmarks).
    pub fn in_memory() -> Arc<SegmentMarks> {
        Arc::new(SegmentMarks {
            path: None,
            state: Mutex::new(Marks::default()),
            writer: tokio::sync::Mutex::new(()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Marks> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The highest `max_id` this node loaded for `tag`.
    pub fn get(&self, tag: &str) -> Option<i64> {
        self.lock().marks.get(tag).copied()
    }

    /// Raises the mark of `tag` to `max_id` and makes it durable before returning. A write
    /// that fails (a full disk) leaves the slot it tore as the one the next write goes to, so
    /// the other slot, holding the newest complete record, is never the one overwritten next.
    pub async fn record(&self, tag: &str, max_id: i64) -> Result<(), String> {
        let _writing = self.writer.lock().await;
        let record = {
            let mut state = self.lock();
            let mark = state.marks.entry(tag.to_string()).or_insert(max_id);
            *mark = (*mark).max(max_id);
            Record {
                seq: state.seq + 1,
                marks: state.marks.clone(),
            }
        };
        let Some(path) = self.path.clone() else {
            self.lock().seq = record.seq;
            return Ok(());
        };
        let written = tokio::task::spawn_blocking(move || write_shared(&path, record))
            .await
            .map_err(|e| e.to_string())??;
        let mut state = self.lock();
        state.seq = written.seq;
        for (tag, mark) in written.marks {
            let known = state.marks.entry(tag).or_insert(mark);
            *known = (*known).max(mark);
        }
        Ok(())
    }
}

/// The newest complete record of the two slots, and the slots that could not be parsed.
fn read_newest(path: &Path) -> Result<(Option<Record>, Vec<String>), String> {
    let mut newest: Option<Record> = None;
    let mut unreadable = Vec::new();
    for seq in [0, 1] {
        let file = slot(path, seq);
        match std::fs::read(&file) {
            // A torn or empty slot is the older one: the other holds the last record.
            Ok(bytes) => match serde_json::from_slice::<Record>(&bytes) {
                Ok(record) => {
                    if newest.as_ref().is_none_or(|n| record.seq > n.seq) {
                        newest = Some(record)
                    }
                }
                Err(e) => unreadable.push(format!("{}: {e}", file.display())),
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("segment marks file {}: {e}", file.display())),
        }
    }
    Ok((newest, unreadable))
}

/// Writes `ours` merged with the newest record on disk, under the directory's marks lock, as
/// the record after that one; returns what was written.
fn write_shared(path: &Path, ours: Record) -> Result<Record, String> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    let mut lock_name = path.as_os_str().to_owned();
    lock_name.push(".lock");
    let lock_path = PathBuf::from(lock_name);
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| format!("{}: {e}", lock_path.display()))?;
    // Released when `lock` is dropped (and by the kernel if the process dies).
    lock.lock()
        .map_err(|e| format!("{}: {e}", lock_path.display()))?;
    let (on_disk, _) = read_newest(path)?;
    let mut record = ours;
    if let Some(disk) = on_disk {
        record.seq = record.seq.max(disk.seq + 1);
        for (tag, mark) in disk.marks {
            let known = record.marks.entry(tag).or_insert(mark);
            *known = (*known).max(mark);
        }
    }
    write_slot(path, &record)?;
    Ok(record)
}

fn write_slot(path: &Path, record: &Record) -> Result<(), String> {
    let file = slot(path, record.seq);
    let fail = |e: &dyn std::fmt::Display| format!("{}: {e}", file.display());
    let json = serde_json::to_vec(record).map_err(|e| fail(&e))?;
    let created = !file.exists();
    if created {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| fail(&e))?;
        }
    }
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&file)
        .map_err(|e| fail(&e))?;
    out.write_all(&json).map_err(|e| fail(&e))?;
    out.sync_data().map_err(|e| fail(&e))?;
    if created {
        // A new file's directory entry must be durable too (once per slot).
        let dir = match path.parent().filter(|d| !d.as_os_str().is_empty()) {
            Some(dir) => dir.to_path_buf(),
            None => PathBuf::from("."),
        };
        std::fs::File::open(&dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| fail(&e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two writers on one path (two processes sharing a state directory; the lock is per open
    /// file, so two handles in one process exclude each other alike), writing at once: every
    /// record stays readable, and the marks on disk are the highest each tag reached anywhere.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn processes_sharing_a_directory_merge_their_marks() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("marks.json");
        let first = SegmentMarks::open(&path, false).unwrap();
        let second = SegmentMarks::open(&path, false).unwrap();
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
        let (newest, unreadable) = read_newest(&path).unwrap();
        assert!(unreadable.is_empty(), "{unreadable:?}");
        let reopened = SegmentMarks::open(&path, false).unwrap();
        for t in 0..7i64 {
            let highest = (1..=200i64).filter(|i| i % 7 == t).max().unwrap() * 10 + 2;
            assert_eq!(reopened.get(&format!("t{t}")), Some(highest), "t{t}");
        }
        assert!(
            newest.unwrap().seq >= 400,
            "every write came after the one on disk"
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn marks_only_rise_and_survive_a_reopen_and_a_torn_slot() {
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
        // A crash tore the newest slot (seq 3, ".b"): the other slot, one record older, is used.
        std::fs::write(slot(&path, 3), b"{\"seq\":3,\"marks\":{\"ord").unwrap();
        let reopened = SegmentMarks::open(&path, false).unwrap();
        assert_eq!(
            (reopened.get("order"), reopened.get("pay")),
            (Some(500), None)
        );
        reopened.record("pay", 9).await.unwrap();
        let again = SegmentMarks::open(&path, false).unwrap();
        assert_eq!((again.get("order"), again.get("pay")), (Some(500), Some(9)));
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
        assert_eq!(discarded.get("order"), None);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_lone_torn_first_slot_is_no_loss() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("segment-marks.json");
        std::fs::write(slot(&path, 1), b"{\"seq\":1,\"mar").unwrap();
        let marks = SegmentMarks::open(&path, false).unwrap();
        assert_eq!(marks.get("order"), None);
    }

    /// Writes that fail (a full disk, here a directory in the slot's place) keep going to the
    /// slot they tore: the slot with the newest complete record is never truncated.
    #[tokio::test(flavor = "current_thread")]
    async fn failed_writes_never_overwrite_the_last_good_slot() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("segment-marks.json");
        let marks = SegmentMarks::open(&path, false).unwrap();
        marks.record("order", 100).await.unwrap(); // seq 1: slot .b
        std::fs::create_dir(slot(&path, 2)).unwrap(); // slot .a cannot be written
        assert!(marks.record("order", 200).await.is_err());
        assert!(marks.record("order", 300).await.is_err());
        assert_eq!(
            marks.get("order"),
            Some(300),
            "the mark still rises in memory"
        );
        let kept: Record = serde_json::from_slice(&std::fs::read(slot(&path, 1)).unwrap()).unwrap();
        assert_eq!(
            kept.marks["order"], 100,
            "slot .b kept the last good record"
        );
        std::fs::remove_dir(slot(&path, 2)).unwrap();
        marks.record("order", 400).await.unwrap();
        let on_disk = SegmentMarks::open(&path, false).unwrap();
        assert_eq!(on_disk.get("order"), Some(400));
    }
}
