//! Session limits on every database connection: how long an allocation waits for a row lock,
//! and how long a transaction may sit idle before the database aborts it.
//!
//! Why: a strict tag allocates in the table on every request, so a node paused (SIGSTOP, a
//! VM stall) or cut off while it holds the row lock would stop the tag on every node until it
//! came back. With these limits the database rolls the paused transaction back after
//! [`IDLE_TRANSACTION_SECS`] (its range is never handed out: the holder's COMMIT fails), and
//! the other nodes' allocations, retried on a lock timeout, go on.

use sqlx::postgres::PgConnectOptions;

/// A transaction idle this long (its client sent nothing) is aborted by the database.
pub const IDLE_TRANSACTION_SECS: u64 = 2;
/// An allocation waits this long for a row lock before its statement fails (and is retried).
pub const LOCK_WAIT_SECS: u64 = 2;

/// PostgreSQL: `lock_timeout` and `idle_in_transaction_session_timeout` set in the startup
/// packet (no round trip).
pub(crate) fn postgres(options: PgConnectOptions) -> PgConnectOptions {
    options.options([
        ("lock_timeout", format!("{LOCK_WAIT_SECS}s")),
        (
            "idle_in_transaction_session_timeout",
            format!("{IDLE_TRANSACTION_SECS}s"),
        ),
    ])
}

/// MySQL / MariaDB: `innodb_lock_wait_timeout` on every server; `idle_transaction_timeout`
/// where the server has it (MariaDB 10.3 and later, Galera included). MySQL and TiDB have no
/// such limit: there a paused holder blocks the tag until its connection closes.
///
/// `autocommit` is set on too, whatever the server's default or `init_connect` chose: an
/// allocation made by one statement outside a transaction must commit with it.
pub(crate) async fn mysql(conn: &mut sqlx::MySqlConnection) -> Result<(), sqlx::Error> {
    sqlx::query(&format!(
        "SET SESSION innodb_lock_wait_timeout = {LOCK_WAIT_SECS}, autocommit = 1"
    ))
    .execute(&mut *conn)
    .await?;
    let idle = format!("SET SESSION idle_transaction_timeout = {IDLE_TRANSACTION_SECS}");
    match sqlx::query(&idle).execute(&mut *conn).await {
        // 1193: unknown system variable (MySQL, TiDB).
        Err(sqlx::Error::Database(db))
            if db
                .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
                .is_some_and(|e| e.number() == 1193) =>
        {
            Ok(())
        }
        other => other.map(drop),
    }
}
