//! Writes that allocate IDs, lease a worker id or move a fence: each runs in an explicit
//! transaction that this module begins, and commits, checking the commit, before any result is used.

use std::future::Future;

use sqlx::{Database, Pool, Transaction};

use super::StoreError;

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
    let (tx, value) = work(tx).await.map_err(StoreError::into_write_failure)?;
    tx.commit().await.map_err(StoreError::WriteFailed)?;
    Ok(value)
}
