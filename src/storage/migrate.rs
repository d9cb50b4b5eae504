//! Schema migrations that any number of nodes starting at once can run: one node migrates
//! under a lock the database really holds, the others wait for it and find the schema current.

use std::time::Duration;

use sqlx::migrate::{MigrateError, Migrator};
use sqlx::{MySqlPool, SqlitePool};

use super::StoreError;

/// The compatibility rule between releases: every migration is additive (a column added or
/// widened, a table added; never a column dropped, renamed or given another meaning), so a
/// release runs on the schema of the release after it, and an upgrade can be rolled back. A
/// node therefore accepts a database whose applied migrations include versions it does not
/// know (sqlx's `ignore_missing`), and applies the ones it knows that are missing.
pub(super) fn compatible(mut migrator: Migrator) -> Migrator {
    migrator.set_ignore_missing(true);
    migrator
}

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
    let mut migrator = compatible(migrator);
    migrator.set_locking(false);
    // On Galera the lock is held only on the member that granted it: a node on another member
    // migrates at the same time. Its losses are a duplicate version row, a deadlock or
    // certification failure, or the other node's row still marked in progress ("partially
    // applied"): each is waited out and the run repeated, which then finds the schema current.
    let mut result = migrator.run_direct(&mut *conn).await;
    while let Err(e) = &result {
        if !lost_mysql_race(e) || tokio::time::Instant::now() >= deadline {
            break;
        }
        tracing::debug!(error = %e, "another node migrates at the same time; checking again");
        tokio::time::sleep(Duration::from_millis(100 + fastrand::u64(..200))).await;
        result = migrator.run_direct(&mut *conn).await;
    }
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
    let migrator = compatible(migrator);
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

/// An error a concurrent migration by a node on another Galera member causes: a duplicate
/// version row (1062), a deadlock or certification failure (1213), a lock wait (1205), a
/// member not ready (1047), a table or column the other node just made (1050, 1060), or its
/// version row still in progress (dirty). A dirty row that stays past the wait is a migration
/// that really failed half-way, and is reported as sqlx reports it.
fn lost_mysql_race(e: &MigrateError) -> bool {
    match e {
        MigrateError::Dirty(_) => true,
        MigrateError::Execute(sqlx::Error::Database(db))
        | MigrateError::ExecuteMigration(sqlx::Error::Database(db), _) => db
            .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
            .is_some_and(|m| matches!(m.number(), 1047 | 1050 | 1060 | 1062 | 1205 | 1213)),
        _ => false,
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
