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

/// Whether the database has no `leaf_worker` yet (asked before the migrations): a new one,
/// whose row −1 this start then records (no holder ever, so the first claim waits for none).
/// A table that exists without row −1 (it lost its rows, or a start that created it was cut
/// before recording it) makes its claimants wait a lease.
pub(super) async fn lease_table_missing<DB: sqlx::Database>(
    pool: &sqlx::Pool<DB>,
) -> Result<bool, StoreError>
where
    for<'c> &'c sqlx::Pool<DB>: sqlx::Executor<'c, Database = DB>,
    for<'q> <DB as sqlx::Database>::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
{
    match sqlx::query("SELECT 1 FROM leaf_worker WHERE 1 = 0")
        .execute(pool)
        .await
    {
        Ok(_) => Ok(false),
        Err(e) if missing_table(&e) => Ok(true),
        Err(e) => Err(e.into()),
    }
}

/// A table that does not exist: MySQL 1146, PostgreSQL 42P01, SQLite "no such table".
pub(crate) fn missing_table(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(db) => {
            mysql_error_number(e) == Some(1146)
                || db.code().as_deref() == Some("42P01")
                || db.message().contains("no such table")
        }
        _ => false,
    }
}

/// How long a starting node waits for another node's migration before giving up.
const LOCK_WAIT_SECS: i64 = 60;

/// How long the migration lock lasts without a renewal: a node killed while it holds it makes
/// the others wait this long at most.
const LOCK_LEASE_MS: i64 = 10_000;

/// MySQL/MariaDB: sqlx's own lock is `GET_LOCK`, which a Galera cluster does not replicate (a
/// node on each member migrated at once, and a start cut part-way stranded every node), and
/// which MariaDB 10.11 once answered with NULL at once instead of waiting. Here the lock is a
/// row of `leafd_migration_lock` with a lease in database time, taken by one committed statement
/// (on Galera the losers of a simultaneous take fail certification) and renewed while the
/// migrations run on one connection. A database whose schema is current takes no lock.
pub(super) async fn mysql(pool: &MySqlPool, migrator: Migrator) -> Result<(), StoreError> {
    if mysql_schema_current(pool, &migrator).await? {
        return Ok(());
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(LOCK_WAIT_SECS as u64);
    let lock = MigrationLock::take(pool, deadline).await?;
    let result = match pool.acquire().await {
        Ok(mut conn) => mysql_locked(&mut conn, migrator, deadline).await,
        Err(e) => Err(e.into()),
    };
    // The migrations' connection is back in the pool first: with one connection
    // (storage.max_connections = 1) the release needs it.
    lock.release().await;
    result
}

/// The migrations, under the lock.
async fn mysql_locked(
    conn: &mut sqlx::MySqlConnection,
    migrator: Migrator,
    deadline: tokio::time::Instant,
) -> Result<(), StoreError> {
    complete_cut_migrations(conn, &migrator).await?;
    let mut migrator = compatible(migrator);
    migrator.set_locking(false);
    // A node that took the lock after this one's lease ran out (this one paused past it) may
    // migrate at the same time: a duplicate version row, a deadlock or certification failure,
    // or its version row still in progress ("partially applied"). Each is waited out and the
    // run repeated, completing a row left in progress, which then finds the schema current.
    let mut result = migrator.run_direct(&mut *conn).await;
    while let Err(e) = &result {
        if !lost_mysql_race(e) || tokio::time::Instant::now() >= deadline {
            break;
        }
        tracing::debug!(error = %e, "another node migrates at the same time; checking again");
        tokio::time::sleep(Duration::from_millis(100 + fastrand::u64(..200))).await;
        complete_cut_migrations(conn, &migrator).await?;
        result = migrator.run_direct(&mut *conn).await;
    }
    Ok(result?)
}

/// True when every migration this release knows is applied (none in progress).
async fn mysql_schema_current(pool: &MySqlPool, migrator: &Migrator) -> Result<bool, StoreError> {
    let applied: Vec<(i64, bool)> =
        match sqlx::query_as("SELECT version, success FROM _sqlx_migrations")
            .fetch_all(pool)
            .await
        {
            Ok(rows) => rows,
            Err(e) if mysql_error_number(&e) == Some(1146) => return Ok(false),
            Err(e) => return Err(e.into()),
        };
    Ok(applied.iter().all(|(_, success)| *success)
        && migrator
            .iter()
            .all(|m| applied.iter().any(|(version, _)| *version == m.version)))
}

/// The cluster-wide migration lock: row 1 of `leafd_migration_lock`, held by `holder` until
/// `until_ms` (database time), renewed by a task until released.
struct MigrationLock {
    pool: MySqlPool,
    holder: String,
    renewal: tokio::task::JoinHandle<()>,
}

impl MigrationLock {
    async fn take(pool: &MySqlPool, deadline: tokio::time::Instant) -> Result<Self, StoreError> {
        // Additive, outside the migrations: the lock must exist before them.
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS leafd_migration_lock (id INT NOT NULL PRIMARY KEY, holder VARCHAR(64) NOT NULL, until_ms BIGINT NOT NULL) ENGINE = InnoDB",
        )
        .execute(pool)
        .await?;
        let holder = format!("{:016x}", fastrand::u64(..));
        let now = "CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED)";
        let insert = format!(
            "INSERT INTO leafd_migration_lock (id, holder, until_ms) VALUES (1, ?, {now} + ?)"
        );
        let take_over = format!(
            "UPDATE leafd_migration_lock SET holder = ?, until_ms = {now} + ? WHERE id = 1 AND until_ms < {now}"
        );
        loop {
            let taken = match sqlx::query(&insert)
                .bind(&holder)
                .bind(LOCK_LEASE_MS)
                .execute(pool)
                .await
            {
                Ok(_) => true,
                Err(e) if mysql_error_number(&e) == Some(1062) => sqlx::query(&take_over)
                    .bind(&holder)
                    .bind(LOCK_LEASE_MS)
                    .execute(pool)
                    .await
                    .map_or_else(
                        |e| {
                            if lost_lock_race(&e) {
                                Ok(false)
                            } else {
                                Err(e)
                            }
                        },
                        |done| Ok(done.rows_affected() == 1),
                    )?,
                Err(e) if lost_lock_race(&e) => false,
                Err(e) => return Err(e.into()),
            };
            if taken {
                let renewal = tokio::spawn(renew_lock(pool.clone(), holder.clone()));
                return Ok(MigrationLock {
                    pool: pool.clone(),
                    holder,
                    renewal,
                });
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(StoreError::Unavailable(format!(
                    "another node held the schema migration lock (leafd_migration_lock) for {LOCK_WAIT_SECS} s"
                )));
            }
            tokio::time::sleep(Duration::from_millis(100 + fastrand::u64(..200))).await;
        }
    }

    async fn release(self) {
        self.renewal.abort();
        // Runs out by itself anyway if this fails.
        let _ = sqlx::query("DELETE FROM leafd_migration_lock WHERE id = 1 AND holder = ?")
            .bind(&self.holder)
            .execute(&self.pool)
            .await;
    }
}

/// Keeps the lock while the migrations run (a large `leaf_alloc` takes a while to alter).
async fn renew_lock(pool: MySqlPool, holder: String) {
    loop {
        tokio::time::sleep(Duration::from_millis(LOCK_LEASE_MS as u64 / 4)).await;
        let _ = sqlx::query(
            "UPDATE leafd_migration_lock SET until_ms = CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED) + ? WHERE id = 1 AND holder = ?",
        )
        .bind(LOCK_LEASE_MS)
        .bind(&holder)
        .execute(&pool)
        .await;
    }
}

/// A take of the lock that lost to another node's at the same moment: a deadlock or Galera
/// certification failure (1213), a lock wait (1205), a member not ready (1047).
fn lost_lock_race(e: &sqlx::Error) -> bool {
    mysql_error_number(e).is_some_and(|n| matches!(n, 1047 | 1205 | 1213))
}

/// MySQL/MariaDB commit each DDL statement by itself, so a migration cut part-way (kill -9, a
/// lost connection, a certification failure on Galera) leaves its version row marked in progress
/// (sqlx writes it first) and some of its statements applied; sqlx then refuses every start
/// ("partially applied"). Every statement of leafd's MySQL migrations can be run again: one
/// already applied fails with an error saying so (a table or column that exists, a duplicate
/// row), which is the result wanted. So the node that finds such a row runs the migration's
/// statements again and marks it applied. A row another node is writing right now (on another
/// Galera member) is completed the same way: both runs end in the same schema.
async fn complete_cut_migrations(
    conn: &mut sqlx::MySqlConnection,
    migrator: &Migrator,
) -> Result<(), StoreError> {
    let cut: Vec<(i64,)> =
        match sqlx::query_as("SELECT version FROM _sqlx_migrations WHERE success = FALSE")
            .fetch_all(&mut *conn)
            .await
        {
            Ok(rows) => rows,
            // No migration table yet: a new database.
            Err(e) if mysql_error_number(&e) == Some(1146) => return Ok(()),
            Err(e) => return Err(e.into()),
        };
    for (version,) in cut {
        // A newer release's migration is left for sqlx to report: its statements are unknown.
        let Some(migration) = migrator.iter().find(|m| m.version == version) else {
            continue;
        };
        for statement in statements(&migration.sql) {
            match sqlx::query(&statement).execute(&mut *conn).await {
                Ok(_) => {}
                Err(e) if mysql_error_number(&e).is_some_and(already_applied) => {}
                Err(e) => {
                    // Transient only when the connection failed: a statement that fails for
                    // another reason fails every start the same way.
                    tracing::error!(version, statement = %statement, error = %e, "a migration cut part-way cannot be completed");
                    return Err(StoreError::Migrate(MigrateError::ExecuteMigration(
                        e, version,
                    )));
                }
            }
        }
        sqlx::query("UPDATE _sqlx_migrations SET success = TRUE WHERE version = ?")
            .bind(version)
            .execute(&mut *conn)
            .await?;
        tracing::warn!(
            version,
            "migration {version} had been cut part-way (a node stopped or lost its connection during it); its statements were run again and it is marked applied"
        );
    }
    Ok(())
}

/// The MySQL error number of a database error.
fn mysql_error_number(e: &sqlx::Error) -> Option<u16> {
    match e {
        sqlx::Error::Database(db) => db
            .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
            .map(|m| m.number()),
        _ => None,
    }
}

/// A statement run again fails with these when it was applied: table exists (1050), duplicate
/// column (1060), duplicate key name (1061), duplicate row (1062).
fn already_applied(number: u16) -> bool {
    matches!(number, 1050 | 1060 | 1061 | 1062)
}

/// The statements of a migration file, as a cut migration is run again: `--` comment lines
/// dropped, then split at `;`.
pub fn statements(sql: &str) -> Vec<String> {
    let code: Vec<&str> = sql
        .lines()
        .filter(|line| !line.trim_start().starts_with("--"))
        .collect();
    code.join("\n")
        .split(';')
        .map(str::trim)
        .filter(|statement| !statement.is_empty())
        .map(str::to_string)
        .collect()
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A cut MySQL migration is completed by running its statements again: each must be of a
    /// kind that, once applied, fails only with an error [`already_applied`] accepts (or does
    /// nothing). A new migration with another kind of statement needs its own repair first.
    #[test]
    fn every_mysql_statement_can_be_run_again() {
        let migrator = sqlx::migrate!("./migrations/mysql");
        let mut count = 0;
        for migration in migrator.iter() {
            for statement in statements(&migration.sql) {
                count += 1;
                let upper = statement.to_uppercase();
                let repeatable = upper.starts_with("CREATE TABLE")
                    || upper.starts_with("INSERT ")
                    || (upper.starts_with("ALTER TABLE")
                        && (upper.contains(" ADD COLUMN ") || upper.contains(" MODIFY ")));
                assert!(
                    repeatable,
                    "migration {}: `{statement}` cannot be run again safely",
                    migration.version
                );
            }
        }
        assert_eq!(count, 11, "statements in migrations/mysql");
    }

    #[test]
    fn statements_skip_comments_even_with_semicolons() {
        let sql = "-- a; b\nCREATE TABLE t (x INT);\n-- c\nINSERT INTO t VALUES (1);\n";
        assert_eq!(
            statements(sql),
            ["CREATE TABLE t (x INT)", "INSERT INTO t VALUES (1)"]
        );
    }
}
