//! The snowflake time fence on local disk: one small JSON file, replaced atomically and fsync'd
//! (file and directory) before the fence it holds may be used.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

/// What the file holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FenceRecord {
    /// No ID this node issued carries a later timestamp (ms since the UNIX epoch).
    pub fence_ms: u64,
    /// The snowflake layout those IDs were issued in (its descriptor); absent in files of
    /// versions that did not record it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layout: Option<String>,
}

/// A fence file at a fixed path.
#[derive(Debug, Clone)]
pub struct FenceFile {
    path: PathBuf,
    /// The layout written beside every fence.
    layout: Option<std::sync::Arc<str>>,
}

/// The path a symbolic link at `path` names (relative to the link's directory), followed
/// while it is one (at most 40 times, as the kernel); `path` itself when it is no link.
pub fn follow_link(path: &std::path::Path) -> PathBuf {
    let mut at = path.to_path_buf();
    for _ in 0..40 {
        match std::fs::read_link(&at) {
            Ok(target) => {
                at = match at.parent() {
                    Some(dir) => dir.join(target),
                    None => target,
                }
            }
            Err(_) => break,
        }
    }
    at
}

/// Temporary files are unique per writer, so two writers never rename each other's file.
static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

impl FenceFile {
    pub fn new(path: impl Into<PathBuf>) -> FenceFile {
        FenceFile {
            path: path.into(),
            layout: None,
        }
    }

    /// The same file, recording `layout` (a descriptor) with every fence it stores.
    pub fn with_layout(mut self, layout: &str) -> FenceFile {
        self.layout = Some(layout.into());
        self
    }

    /// The file of one worker id beside this one (`snowflake-fence.json` →
    /// `snowflake-fence-w7.json`): a fence only matters to the holder of the same worker id,
    /// so processes sharing a state directory never wait for each other's.
    pub fn for_worker(&self, worker_id: u64) -> FenceFile {
        let stem = self
            .path
            .file_stem()
            .map_or_else(|| "fence".into(), |s| s.to_string_lossy().into_owned());
        let name = match self.path.extension() {
            Some(ext) => format!("{stem}-w{worker_id}.{}", ext.to_string_lossy()),
            None => format!("{stem}-w{worker_id}"),
        };
        FenceFile {
            path: self.path.with_file_name(name),
            layout: self.layout.clone(),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn error(&self, e: impl std::fmt::Display) -> String {
        format!("{}: {e}", self.path.display())
    }

    /// The stored fence; `Ok(0)` when there is no file yet.
    pub fn load(&self) -> Result<u64, String> {
        Ok(self.load_record()?.map_or(0, |r| r.fence_ms))
    }

    /// The stored record; `Ok(None)` when there is no file yet.
    pub fn load_record(&self) -> Result<Option<FenceRecord>, String> {
        match std::fs::read(&self.path) {
            Ok(bytes) => serde_json::from_slice::<FenceRecord>(&bytes)
                .map(Some)
                .map_err(|e| self.error(format!("unreadable ({e}); if the node's IDs may have been issued, restore it or wait past the last fence, then delete it"))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(self.error(e)),
        }
    }

    /// Makes `fence_ms` durable: write a temporary file, fsync it, rename it over the file,
    /// fsync the directory. Blocking: call from a blocking thread.
    pub fn store(&self, fence_ms: u64) -> Result<(), String> {
        // Through a symbolic link, the file it names is replaced, not the link: every path
        // that reached the fence still reaches it (and the lock beside it).
        let target = follow_link(&self.path);
        let dir = match target.parent().filter(|d| !d.as_os_str().is_empty()) {
            Some(dir) => dir.to_path_buf(),
            None => PathBuf::from("."),
        };
        std::fs::create_dir_all(&dir).map_err(|e| self.error(e))?;
        let tmp = target.with_extension(format!(
            "tmp.{}.{}",
            std::process::id(),
            TMP_COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let record = FenceRecord {
            fence_ms,
            layout: self.layout.as_deref().map(str::to_string),
        };
        let json = serde_json::to_vec(&record).map_err(|e| self.error(e))?;
        let written = (|| {
            let mut file = std::fs::File::create(&tmp)?;
            file.write_all(&json)?;
            file.sync_all()?;
            std::fs::rename(&tmp, &target)?;
            std::fs::File::open(&dir)?.sync_all()
        })();
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        written.map_err(|e| self.error(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_worker_id_has_its_own_file() {
        let base = FenceFile::new("/var/lib/leafd/snowflake-fence.json");
        assert_eq!(
            base.for_worker(7).path(),
            Path::new("/var/lib/leafd/snowflake-fence-w7.json")
        );
        assert_eq!(
            FenceFile::new("fence").for_worker(0).path(),
            Path::new("fence-w0")
        );
    }

    /// A fence path that is a link, also to a file not written yet, is stored in the file it
    /// names; the link stays a link, and the lock's path is that file's.
    #[test]
    fn a_link_is_followed_to_the_file_it_names() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real-w3.json");
        let link = dir.path().join("link-w3.json");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        assert_eq!(follow_link(&link), real);
        assert_eq!(
            crate::coord::static_id::resolve_file(&link).unwrap(),
            std::fs::canonicalize(dir.path())
                .unwrap()
                .join("real-w3.json")
        );
        FenceFile::new(&link).store(1_764_000_003_000).unwrap();
        assert!(std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(FenceFile::new(&real).load(), Ok(1_764_000_003_000));
    }

    #[test]
    fn stores_loads_and_names_a_corrupt_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = FenceFile::new(dir.path().join("sub/fence.json"));
        assert_eq!(file.load(), Ok(0));
        file.store(1_764_000_003_000).unwrap();
        assert_eq!(file.load(), Ok(1_764_000_003_000));
        file.store(1_764_000_006_000).unwrap();
        assert_eq!(file.load(), Ok(1_764_000_006_000));
        assert_eq!(
            std::fs::read_dir(dir.path().join("sub")).unwrap().count(),
            1
        );
        std::fs::write(file.path(), b"{torn").unwrap();
        let err = file.load().unwrap_err();
        assert!(
            err.contains("fence.json") && err.contains("unreadable"),
            "{err}"
        );
    }
}
