//! Segment high-water marks: the highest `max_id` this node has loaded per tag, kept durably in
//! its state directory, so a database that went back in time cannot make it hand out IDs twice.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::StoreError;

/// The marks of one node: a JSON map `tag -> max_id`, replaced atomically and fsync'd on every
/// change (one write per segment load, in the background load task).
pub struct SegmentMarks {
    path: Option<PathBuf>,
    marks: Mutex<HashMap<String, i64>>,
    /// Serialises file writes, so an older map never replaces a newer one.
    writer: tokio::sync::Mutex<()>,
}

impl SegmentMarks {
    /// Reads the marks file (none yet is fine; an unreadable one is an error that names it).
    pub fn open(path: impl Into<PathBuf>) -> Result<Arc<SegmentMarks>, StoreError> {
        let path = path.into();
        let marks = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
                StoreError::Unavailable(format!(
                    "segment marks file {} is unreadable ({e}); restore it, or delete it to start without the rollback guard",
                    path.display()
                ))
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => HashMap::new(),
            Err(e) => {
                return Err(StoreError::Unavailable(format!(
                    "segment marks file {}: {e}",
                    path.display()
                )))
            }
        };
        Ok(Arc::new(SegmentMarks {
            path: Some(path),
            marks: Mutex::new(marks),
            writer: tokio::sync::Mutex::new(()),
        }))
    }

    /// Marks kept in memory only (tests, benchmarks).
    pub fn in_memory() -> Arc<SegmentMarks> {
        Arc::new(SegmentMarks {
            path: None,
            marks: Mutex::new(HashMap::new()),
            writer: tokio::sync::Mutex::new(()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, i64>> {
        self.marks.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The highest `max_id` this node loaded for `tag`.
    pub fn get(&self, tag: &str) -> Option<i64> {
        self.lock().get(tag).copied()
    }

    /// Raises the mark of `tag` to `max_id` and makes it durable before returning.
    pub async fn record(&self, tag: &str, max_id: i64) -> Result<(), String> {
        let _writing = self.writer.lock().await;
        let snapshot = {
            let mut marks = self.lock();
            let mark = marks.entry(tag.to_string()).or_insert(max_id);
            *mark = (*mark).max(max_id);
            marks.clone()
        };
        let Some(path) = self.path.clone() else {
            return Ok(());
        };
        tokio::task::spawn_blocking(move || write_atomically(&path, &snapshot))
            .await
            .map_err(|e| e.to_string())?
    }
}

fn write_atomically(path: &Path, marks: &HashMap<String, i64>) -> Result<(), String> {
    let fail = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    let dir = match path.parent().filter(|d| !d.as_os_str().is_empty()) {
        Some(dir) => dir.to_path_buf(),
        None => PathBuf::from("."),
    };
    std::fs::create_dir_all(&dir).map_err(|e| fail(&e))?;
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let unique = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = path.with_extension(format!("tmp.{}.{unique}", std::process::id()));
    let json = serde_json::to_vec(marks).map_err(|e| fail(&e))?;
    let written = (|| {
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(&json)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)?;
        std::fs::File::open(&dir)?.sync_all()
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written.map_err(|e| fail(&e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn marks_only_rise_and_survive_a_reopen() {
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
        std::fs::write(&path, b"{oops").unwrap();
        let err = SegmentMarks::open(&path).err().unwrap().to_string();
        assert!(
            err.contains("marks.json") && err.contains("unreadable"),
            "{err}"
        );
    }
}
