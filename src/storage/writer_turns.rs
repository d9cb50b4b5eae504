//! Turns at a SQLite file's write lock for the processes that share the file: an exclusive
//! flock on a file beside the database, waited for in the kernel, which wakes a waiter at the
//! release.
//!
//! Without it a process that writes back to back starves the other: SQLite's busy handler
//! sleeps up to 100 ms between tries, and the lock, held a tenth of a millisecond and taken
//! again at once, is never free when it looks (a node started beside a busy one on one file
//! served nothing for seconds). A turn is only about fairness: SQLite's own lock still orders
//! the writes, so a turn that cannot be had (no file, no locks, a holder paused) is skipped.

use std::fs::{File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The turns of one database file.
pub(super) struct WriterTurns {
    path: PathBuf,
}

/// This process's turn while held (`None`: went ahead without one).
pub(super) struct Turn(#[allow(dead_code)] Option<File>);

impl WriterTurns {
    /// The turns of the database at `db`, kept in `<db>-writer.lock`.
    pub(super) fn beside(db: &Path) -> WriterTurns {
        let mut name = db.as_os_str().to_owned();
        name.push("-writer.lock");
        WriterTurns {
            path: PathBuf::from(name),
        }
    }

    /// Waits up to `wait` for this process's turn. A file of its own each time (one open file
    /// description per turn): a wait given up keeps no lock another turn of this process would
    /// share, and its late lock is released as it ends.
    pub(super) async fn take(&self, wait: Duration) -> Turn {
        let Ok(file) = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&self.path)
        else {
            return Turn(None);
        };
        match file.try_lock() {
            Ok(()) => return Turn(Some(file)),
            Err(TryLockError::WouldBlock) => {}
            Err(TryLockError::Error(_)) => return Turn(None),
        }
        let waited = tokio::task::spawn_blocking(move || file.lock().ok().map(|()| file));
        match tokio::time::timeout(wait, waited).await {
            Ok(Ok(file)) => Turn(file),
            _ => Turn(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_turn_waits_for_the_holder_and_a_long_wait_goes_ahead() {
        let dir = tempfile::tempdir().unwrap();
        let turns = WriterTurns::beside(&dir.path().join("leafd.db"));
        let held = turns.take(Duration::from_secs(1)).await;
        assert!(held.0.is_some());
        assert!(dir.path().join("leafd.db-writer.lock").exists());
        // Held: a second turn waits it out, then goes ahead without one.
        let started = std::time::Instant::now();
        let second = turns.take(Duration::from_millis(100)).await;
        assert!(second.0.is_none());
        assert!(started.elapsed() >= Duration::from_millis(100));
        // Released: the next turn is had at once, though the given-up wait may still be
        // finishing in its thread (it releases the lock as it ends).
        drop(held);
        let mut third = turns.take(Duration::from_secs(2)).await;
        for _ in 0..20 {
            if third.0.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
            third = turns.take(Duration::from_secs(2)).await;
        }
        assert!(third.0.is_some());
    }
}
