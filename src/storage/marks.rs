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
    /// Reads the newest complete record of the two slots (none yet is fine; a slot that exists
    /// but cannot be read is an error that names it).
    pub fn open(path: impl Into<PathBuf>) -> Result<Arc<SegmentMarks>, StoreError> {
        let path = path.into();
        let mut newest: Option<Record> = None;
        for seq in [0, 1] {
            let file = slot(&path, seq);
            match std::fs::read(&file) {
                // A torn or empty slot is the older one: the other holds the last record.
                Ok(bytes) => match serde_json::from_slice::<Record>(&bytes) {
                    Ok(record) if newest.as_ref().is_none_or(|n| record.seq > n.seq) => {
                        newest = Some(record)
                    }
                    _ => {}
                },
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(StoreError::Unavailable(format!(
                        "segment marks file {}: {e}",
                        file.display()
                    )))
                }
            }
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

    /// Raises the mark of `tag` to `max_id` and makes it durable before returning.
    pub async fn record(&self, tag: &str, max_id: i64) -> Result<(), String> {
        let _writing = self.writer.lock().await;
        let record = {
            let mut state = self.lock();
            let mark = state.marks.entry(tag.to_string()).or_insert(max_id);
            *mark = (*mark).max(max_id);
            state.seq += 1;
            Record {
                seq: state.seq,
                marks: state.marks.clone(),
            }
        };
        let Some(path) = self.path.clone() else {
            return Ok(());
        };
        tokio::task::spawn_blocking(move || write_slot(&path, &record))
            .await
            .map_err(|e| e.to_string())?
    }
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

    #[tokio::test(flavor = "current_thread")]
    async fn marks_only_rise_and_survive_a_reopen_and_a_torn_slot() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("marks.json");
        let marks = SegmentMarks::open(&path).unwrap();
        assert_eq!(marks.get("order"), None);
        marks.record("order", 500).await.unwrap();
        marks.record("order", 300).await.unwrap();
        marks.record("pay", 7).await.unwrap();
        let reopened = SegmentMarks::open(&path).unwrap();
        assert_eq!(
            (reopened.get("order"), reopened.get("pay")),
            (Some(500), Some(7))
        );
        // A crash tore the newest slot (seq 3, ".b"): the other slot, one record older, is used.
        std::fs::write(slot(&path, 3), b"{\"seq\":3,\"marks\":{\"ord").unwrap();
        let reopened = SegmentMarks::open(&path).unwrap();
        assert_eq!(
            (reopened.get("order"), reopened.get("pay")),
            (Some(500), None)
        );
        reopened.record("pay", 9).await.unwrap();
        let again = SegmentMarks::open(&path).unwrap();
        assert_eq!((again.get("order"), again.get("pay")), (Some(500), Some(9)));
    }
}
