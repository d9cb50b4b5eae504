//! Writes that allocate IDs, lease a worker id or move a fence: each runs in a top-level
//! transaction that this module begins and commits, checking the commit, before any result is used.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

use sqlx::pool::PoolOptions;
use sqlx::{Connection, Database, Pool, Transaction, TransactionManager};

use super::StoreError;
use crate::config::StorageConfig;

/// Runs `work` in a transaction on `pool` and returns its value only once the commit has
/// succeeded. A row a statement returned is not proof of anything: on SQLite a full disk fails
/// the commit after `UPDATE … RETURNING` produced its row, and on every dialect the connection
/// can die between the statement and the commit. So `work` gets the transaction and hands it
/// back with its value; this function commits it. Any error of the statements or the commit is
/// a [`StoreError::WriteFailed`] (unless `work` returned a typed error such as an unknown tag),
/// and the transaction is rolled back when dropped: nothing of it may be used.
///
/// `work` should drive every statement to completion (`execute`, `fetch_all`): a statement
/// left half-read can hide its own error.
pub(crate) async fn committed<DB, T, W, Fut>(pool: &Pool<DB>, work: W) -> Result<T, StoreError>
where
    DB: Database,
    W: FnOnce(Transaction<'static, DB>) -> Fut,
    Fut: Future<Output = Result<(Transaction<'static, DB>, T), StoreError>>,
{
    let tx = pool.begin().await?;
    // A savepoint inside a transaction left open on the connection would "commit" into a
    // transaction that never commits (see `pool_options`): only a top-level one counts.
    if DB::TransactionManager::get_transaction_depth(&tx) != 1 {
        return Err(StoreError::Unavailable(
            "a pooled connection was still inside an earlier transaction; it is closed, retry"
                .into(),
        ));
    }
    let (tx, value) = work(tx).await.map_err(|e| noted(e.into_write_failure()))?;
    tx.commit()
        .await
        .map_err(|e| noted(StoreError::WriteFailed(e)))?;
    Ok(value)
}

/// When a statement last found its connection dead, in milliseconds since [`clock_base`] plus
/// one (0: never): for a second after, every pooled connection is pinged before use, so the
/// rest of a pool the database dropped (a restart, a failover) is weeded out at once instead
/// of failing one allocation after another.
static CONNECTION_LOST_AT: AtomicU64 = AtomicU64::new(0);

fn clock_base() -> Instant {
    static BASE: OnceLock<Instant> = OnceLock::new();
    *BASE.get_or_init(Instant::now)
}

/// Returns `error`, noting when it says a connection was lost.
pub(crate) fn noted(error: StoreError) -> StoreError {
    if let StoreError::Database(e) | StoreError::WriteFailed(e) = &error {
        if super::error::connection_lost(e) {
            let now = clock_base().elapsed().as_millis() as u64 + 1;
            CONNECTION_LOST_AT.store(now, Ordering::Relaxed);
        }
    }
    error
}

/// Whether a connection was found dead within [`PING_IDLE_AFTER`].
fn connection_lost_lately() -> bool {
    let at = CONNECTION_LOST_AT.load(Ordering::Relaxed);
    at != 0
        && clock_base().elapsed().as_millis() as u64 + 1 - at < PING_IDLE_AFTER.as_millis() as u64
}

/// Runs `attempt` again, up to five times in all after a short random pause, while it fails on
/// a conflict with a concurrent transaction that a retry resolves (a deadlock of InnoDB gap
/// locks between nodes starting at once, a serialization failure, a unique-key race).
pub(crate) async fn retry_conflicts<T, F, Fut>(mut attempt: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    let mut tries = 0;
    loop {
        tries += 1;
        match attempt().await {
            Err(e) if tries < 5 && e.is_conflict() => {
                tokio::time::sleep(std::time::Duration::from_millis(5 + fastrand::u64(..20))).await;
            }
            result => return result,
        }
    }
}

/// Opens the pool of a server database. A pool that cannot connect retries until its acquire
/// timeout and then says only "pool timed out": one direct attempt then names the cause
/// (connection refused, unknown host, a TLS or password failure).
pub(crate) async fn connect_pool<DB: Database>(
    pool: PoolOptions<DB>,
    options: <DB::Connection as sqlx::Connection>::Options,
) -> Result<sqlx::Pool<DB>, sqlx::Error> {
    match pool.connect_with(options.clone()).await {
        Err(sqlx::Error::PoolTimedOut) => match sqlx::ConnectOptions::connect(&options).await {
            Err(cause) => Err(cause),
            Ok(_) => Err(sqlx::Error::PoolTimedOut),
        },
        result => result,
    }
}

/// Pool settings shared by every dialect. A connection that still counts itself inside a
/// transaction when taken from the pool is closed instead of used. SQLite rolls a transaction
/// back by itself when its COMMIT fails on a full disk; the driver's ROLLBACK then fails too
/// ("no transaction is active") and its transaction depth stays at one, so the connection's next
/// "transaction" would be a savepoint whose release commits nothing, while the connection holds
/// the database's write lock against every other node.
///
/// A connection idle for [`PING_IDLE_AFTER`] or longer is pinged before use (and closed when the
/// ping fails), as sqlx's `test_before_acquire` would ping every one: that ping is a round trip
/// on every allocation, while a connection in steady use was just proven alive (sqlx also pings
/// each one as it comes back to the pool). One that died meanwhile fails its statement, which
/// is transient: the allocation is retried, and for a second every connection is pinged before
/// use ([`noted`]), as every one may have died with it.
pub(crate) fn pool_options<DB: Database>(config: &StorageConfig) -> PoolOptions<DB> {
    PoolOptions::new()
        .max_connections(config.max_connections)
        .acquire_timeout(config.acquire_timeout())
        .test_before_acquire(false)
        .before_acquire(|conn: &mut DB::Connection, meta| {
            Box::pin(async move {
                if conn.is_in_transaction() {
                    return Ok(false);
                }
                if meta.idle_for >= PING_IDLE_AFTER || connection_lost_lately() {
                    return Ok(conn.ping().await.is_ok());
                }
                Ok(true)
            })
        })
}

/// How long a pooled connection may sit idle and still be used without a ping first.
pub(crate) const PING_IDLE_AFTER: std::time::Duration = std::time::Duration::from_secs(1);
