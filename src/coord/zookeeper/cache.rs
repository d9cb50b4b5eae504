//! The local worker-id cache: the last worker id, reported time, fence, layout and ZooKeeper
//! session this node had, so it can start while ZooKeeper is unreachable and recognise its session.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::CoordError;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CachedWorker {
    pub cluster: String,
    pub endpoint: String,
    pub worker_id: u64,
    pub last_timestamp_ms: u64,
    /// The ZooKeeper session that held the id: after a restart, its liveness node is this
    /// node's own and is waited for, not mistaken for another node's.
    #[serde(default)]
    pub session_id: Option<i64>,
    /// The fence written with that report. Started from the cache, the node issues no ID past
    /// it: a layout change or an id reuse made meanwhile starts above it, and ZooKeeper, which
    /// would say so, cannot be asked. `None` in caches of releases before it was kept.
    #[serde(default)]
    pub fence_ms: Option<u64>,
    /// The snowflake layout the node issued in (see `zookeeper::layout`).
    #[serde(default)]
    pub layout: Option<String>,
}

fn cache_error(path: &Path, reason: impl ToString) -> CoordError {
    CoordError::Cache {
        path: path.display().to_string(),
        reason: reason.to_string(),
    }
}

/// Reads the cache; `Ok(None)` when the file does not exist.
pub fn load(path: &Path) -> Result<Option<CachedWorker>, CoordError> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| cache_error(path, e)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(cache_error(path, e)),
    }
}

/// Writes the cache atomically (temporary file, then rename), creating its directory.
pub fn store(path: &Path, worker: &CachedWorker) -> Result<(), CoordError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| cache_error(path, e))?;
    }
    let tmp = path.with_extension("tmp");
    let json = serde_json::to_vec(worker).map_err(|e| cache_error(path, e))?;
    std::fs::write(&tmp, json).map_err(|e| cache_error(path, e))?;
    std::fs::rename(&tmp, path).map_err(|e| cache_error(path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_reports_missing_and_corrupt_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/worker.json");
        assert_eq!(load(&path).unwrap(), None);
        let worker = CachedWorker {
            cluster: "c".into(),
            endpoint: "10.0.0.1:6380".into(),
            worker_id: 42,
            last_timestamp_ms: 1_764_000_000_000,
            session_id: Some(0x1234),
            fence_ms: Some(1_764_000_010_000),
            layout: Some("41/10/12@0".into()),
        };
        store(&path, &worker).unwrap();
        assert_eq!(load(&path).unwrap(), Some(worker));
        // A cache of an older release reads with neither fence nor layout.
        std::fs::write(
            &path,
            br#"{"cluster":"c","endpoint":"e","worker_id":1,"last_timestamp_ms":5}"#,
        )
        .unwrap();
        let old = load(&path).unwrap().unwrap();
        assert_eq!((old.fence_ms, old.layout), (None, None));
        std::fs::write(&path, b"{not json").unwrap();
        assert!(load(&path).unwrap_err().to_string().contains("worker.json"));
    }
}
