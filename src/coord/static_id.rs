//! The static coordinator: the worker id is a number in the configuration, assigned by hand;
//! only the local time fence protects it (distinct ids per node are the operator's job).

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;

use super::{CoordError, Coordinator, HeldWorker};
use crate::coord::IssueLimit;

pub struct StaticCoordinator {
    pub worker_id: u64,
    /// Each held (an exclusive file lock) while this process issues with the id: the one
    /// beside the fence file and the one in the state directory, so a second process given
    /// the same id and either the same fence file or the same state directory (one config
    /// started twice, two nodes on one directory) is refused instead of issuing the same IDs.
    pub lock_paths: Vec<PathBuf>,
}

/// The id and the open lock files; the locks end with the process or the worker.
struct StaticWorker(u64, #[allow(dead_code)] Vec<std::fs::File>);

#[async_trait]
impl HeldWorker for StaticWorker {
    fn worker_id(&self) -> u64 {
        self.0
    }

    fn floor_ms(&self) -> u64 {
        0
    }

    fn floor_wait_ms(&self) -> u64 {
        0
    }

    async fn close(self: Box<Self>, _last_issued_ms: Option<u64>) {}
}

/// The path of the file `path` reaches, whatever path reached it: its directory's symlinks
/// resolved, and the file's own when it is one, so that processes given one fence file by
/// different paths take one lock beside it. A file with more than one hard link is refused: a
/// fence is replaced by a rename, so the other names would keep an older fence while both
/// processes issued with one worker id.
pub fn resolve_file(path: &std::path::Path) -> Result<PathBuf, CoordError> {
    let failed = |e: std::io::Error| CoordError::Fence(format!("{}: {e}", path.display()));
    let dir = match path.parent().filter(|d| !d.as_os_str().is_empty()) {
        Some(dir) => dir,
        None => std::path::Path::new("."),
    };
    std::fs::create_dir_all(dir).map_err(failed)?;
    let name = path
        .file_name()
        .ok_or_else(|| CoordError::Fence(format!("{}: not a file name", path.display())))?;
    // The file a link names (also before that file exists), in its directory's real path.
    let named =
        super::fence_file::follow_link(&std::fs::canonicalize(dir).map_err(failed)?.join(name));
    let real_dir = match named.parent() {
        Some(dir) => std::fs::canonicalize(dir).map_err(failed)?,
        None => PathBuf::from("."),
    };
    let file = real_dir.join(named.file_name().unwrap_or(name));
    if let Ok(meta) = std::fs::metadata(&file) {
        use std::os::unix::fs::MetadataExt;
        if meta.nlink() > 1 {
            return Err(CoordError::Fence(format!(
                "{} has {} hard links: another path reaches this fence file, and a second process with the same worker id could issue the same IDs through it; remove the other links (find / -samefile {})",
                file.display(),
                meta.nlink(),
                file.display()
            )));
        }
    }
    Ok(file)
}

impl StaticCoordinator {
    fn lock_all(&self) -> Result<Vec<std::fs::File>, CoordError> {
        self.lock_paths.iter().map(|path| self.lock(path)).collect()
    }

    fn lock(&self, path: &std::path::Path) -> Result<std::fs::File, CoordError> {
        let failed = |e: std::io::Error| CoordError::Fence(format!("{}: {e}", path.display()));
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(failed)?;
        }
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .map_err(failed)?;
        match file.try_lock() {
            Ok(()) => Ok(file),
            Err(std::fs::TryLockError::WouldBlock) => Err(CoordError::NoFreeWorkerId(format!(
                "worker id {} is in use by another process with the same fence file or state directory ({} is locked): give each node its own snowflake.worker_id and state directory",
                self.worker_id,
                path.display()
            ))),
            Err(std::fs::TryLockError::Error(e)) => Err(failed(e)),
        }
    }
}

#[async_trait]
impl Coordinator for StaticCoordinator {
    fn kind(&self) -> &'static str {
        "static"
    }

    async fn acquire(&self, _limit: Arc<IssueLimit>) -> Result<Box<dyn HeldWorker>, CoordError> {
        Ok(Box::new(StaticWorker(self.worker_id, self.lock_all()?)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_second_holder_of_one_fence_file_is_refused_until_the_first_stops() {
        let dir = tempfile::tempdir().unwrap();
        let coordinator = StaticCoordinator {
            worker_id: 3,
            lock_paths: vec![
                dir.path().join("snowflake-fence-w3.json.lock"),
                dir.path().join("snowflake-w3.lock"),
            ],
        };
        let limit = Arc::new(IssueLimit::new());
        let first = coordinator.acquire(limit.clone()).await.unwrap();
        let refused = coordinator.acquire(limit.clone()).await.err().unwrap();
        assert_eq!(
            refused.to_string(),
            format!(
                "no free worker id: worker id 3 is in use by another process with the same fence file or state directory ({} is locked): give each node its own snowflake.worker_id and state directory",
                dir.path().join("snowflake-fence-w3.json.lock").display()
            )
        );
        first.close(None).await;
        coordinator.acquire(limit).await.unwrap();
    }
}
