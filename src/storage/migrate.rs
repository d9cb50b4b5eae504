//! Schema migrations that any number of nodes starting at once can run: one node migrates
//! under a lock the database really holds, the others wait for it and find the schema current.

use std::time::Duration;

use sqlx::migrate::{MigrateError, Migrator};
use sqlx::{MySqlPool, SqlitePool};

use super::StoreError;

/// How long a starting node waits for another node's migration before giving up.
const LOCK_WAIT_SECS: i64 = 60;

/// MySQL/MariaDB: sqlx's own lock is `GET_LOCK(…, -1)` with its result unchecked, and MariaDB
/// 10.11 answered a second session's call with NULL at once instead of waiting, so two nodes
/// migrated together (duplicate key, "partially applied"). Here the lock is taken with a
/// timeout, its result checked, and the migrations run on the connection that holds it.
pub(super) async fn mysql(pool: &MySqlPool, migrator: Migrator) -> Result<(), StoreError> {
    let mut conn = pool.acquire().await?;
    let name = "leafd_schema_migration";
    let deadline = tokio::time::Instant::now() + Duration::from_secs(LOCK_WAIT_SECS as u64);
    loop {
        let held: Option<i64> = sqlx::query_scalar("SELECT GET_LOCK(?, ?)")
            .bind(name)
            .bind(LOCK_WAIT_SECS)
            .fetch_one(&mut *conn)
            .await?;
        if held == Some(1) {
            break;
        }
        // 0: timed out; NULL: an error inside GET_LOCK (seen returning at once on MariaDB).
        if tokio::time::Instant::now() >= deadline {
            return Err(StoreError::Unavailable(format!(
                "another node held the schema migration lock ({name}) for {LOCK_WAIT_SECS} s"
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut migrator = migrator;
    migrator.set_locking(false);
    let result = migrator.run_direct(&mut *conn).await;
    // Released with the session anyway if this fails.
    let _ = sqlx::query("SELECT RELEASE_LOCK(?)")
        .bind(name)
        .fetch_all(&mut *conn)
        .await;
    Ok(result?)
}

/// SQLite has no lock to take, but each migration is one transaction: a node that loses the
/// race to another process on the same file has its transaction rolled back (a unique clash
/// on the version, a busy snapshot) and, run again, finds the migration applied.
pub(super) async fn sqlite(pool: &SqlitePool, migrator: Migrator) -> Result<(), StoreError> {
    let mut attempts = 0;
    loop {
        match migrator.run(pool).await {
            Ok(()) => return Ok(()),
            Err(e) if attempts < 20 && lost_race(&e) => {
                attempts += 1;
                tracing::debug!(error = %e, "another process migrated at the same time; checking again");
                tokio::time::sleep(Duration::from_millis(20 + fastrand::u64(..80))).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// An error a concurrent migration of the same file causes (not a broken migration).
fn lost_race(e: &MigrateError) -> bool {
    match e {
        MigrateError::Execute(sqlx::Error::Database(db))
        | MigrateError::ExecuteMigration(sqlx::Error::Database(db), _) => {
            let message = db.message();
            db.is_unique_violation()
                || message.contains("locked")
                || message.contains("busy")
                || message.contains("already exists")
                || message.contains("duplicate column")
        }
        _ => false,
    }
}
