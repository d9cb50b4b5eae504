//! `leaf_worker` for every SQL dialect: the same statements, differing only in placeholders and
//! in how the database tells its own time in UNIX milliseconds ([`Dialect`]).
//!
//! Row −1 is not a worker id: its owner is the instance that answered the last claim and its
//! `lease_until` the database time at which that instance was first seen. A start that creates
//! the schema records the instance it reached as first seen at 0 (no holder ever: no wait, yet
//! a failover before the first claims replicated is still seen); when it is missing later,
//! `leaf_worker` lost its rows while holders may still issue, and it is written again as first
//! seen now. Row −2 records the snowflake layout; row −3 the highest worker id ever given a row.

use async_trait::async_trait;
use sqlx::{ColumnIndex, Decode, Encode, Executor, IntoArguments, Pool, Row, Type};

use super::committed::{committed, retry_conflicts};
use super::common::RowsAffected;
use super::dialect::Dialect;
use super::{unique_violation, Lease, LeaseKeeper, StoreError, WorkerLeaseStore, WorkerRow};

/// The worker-id lease table of a dialect's database, over the store's pool.
pub(crate) struct LeaseTable<DB: Dialect> {
    pool: Pool<DB>,
}

/// Row −3 recorded again from the rows there are, unless it exists. (The aggregate is a derived
/// table: an aggregate alone gives its one row even when a WHERE beside it is false.)
const IDS_RECORD: &str = "INSERT INTO leaf_worker (worker_id, owner, lease_until, fence_ms) SELECT -3, 'ids', 0, highest FROM (SELECT COALESCE(MAX(worker_id), -1) AS highest FROM leaf_worker WHERE worker_id >= 0) AS ids WHERE NOT EXISTS (SELECT 1 FROM leaf_worker WHERE worker_id = -3)";

impl<DB> LeaseTable<DB>
where
    DB: Dialect,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
{
    pub(crate) fn new(pool: Pool<DB>) -> LeaseTable<DB> {
        LeaseTable { pool }
    }

    /// Row −1 for a database this start created the schema of: the instance reached, first
    /// seen at 0 (kept if another node's claim wrote it first).
    pub(crate) async fn record_new_lease_table(&self) -> Result<(), StoreError> {
        let insert = format!(
            "INSERT INTO leaf_worker (worker_id, owner, lease_until, fence_ms) VALUES (-1, {}, 0, 0)",
            DB::placeholder(1)
        );
        let mut conn = self.pool.acquire().await?;
        let current = format!("instance {}", DB::instance(&mut conn).await?);
        match sqlx::query(&insert)
            .bind(current.as_str())
            .execute(&mut *conn)
            .await
        {
            Err(e) if !unique_violation(&e) => Err(e.into()),
            _ => Ok(()),
        }
    }
}

#[async_trait]
impl<DB> WorkerLeaseStore for LeaseTable<DB>
where
    DB: Dialect,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    usize: ColumnIndex<DB::Row>,
    for<'r> String: Decode<'r, DB> + Type<DB>,
    for<'r> i64: Decode<'r, DB> + Type<DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB>,
    DB::QueryResult: RowsAffected,
{
    fn keeper(&self) -> LeaseKeeper {
        LeaseKeeper::DATABASE
    }

    async fn instance_changed_within(&self, window_ms: i64) -> Result<bool, StoreError> {
        let p = DB::placeholder;
        // A write first takes the lock (the row's, or SQLite's whole-file write lock, which a
        // transaction that read first could not take while another waits).
        let lock = "UPDATE leaf_worker SET fence_ms = 0 WHERE worker_id = -1";
        let read = format!(
            "SELECT owner, lease_until, {} FROM leaf_worker WHERE worker_id = -1",
            DB::NOW_MS
        );
        let insert = format!(
            "INSERT INTO leaf_worker (worker_id, owner, lease_until, fence_ms) VALUES (-1, {}, {}, 0)",
            p(1),
            DB::NOW_MS
        );
        let switch = format!(
            "UPDATE leaf_worker SET owner = {}, lease_until = {} WHERE worker_id = -1 AND owner <> {}",
            p(1),
            DB::NOW_MS,
            p(2)
        );
        // Nodes starting at once race for the first record (a unique clash, or on MySQL a
        // deadlock of their gap locks): the loser reads the winner's.
        let (read, insert, switch) = (&read, &insert, &switch);
        retry_conflicts(|| {
            committed(&self.pool, |mut tx| async move {
                sqlx::query(lock).execute(&mut *tx).await?;
                let current = format!("instance {}", DB::instance(&mut tx).await?);
                let rows = sqlx::query(read).fetch_all(&mut *tx).await?;
                let changed = match rows.first() {
                    // The table lost its rows (a wipe, or a restore of an empty table): a
                    // holder it no longer shows may still issue. Claimants wait a whole
                    // lease from now.
                    None => {
                        sqlx::query(insert)
                            .bind(current.as_str())
                            .execute(&mut *tx)
                            .await?;
                        // With row −1 the table lost row −3 too: recorded again.
                        sqlx::query(IDS_RECORD).execute(&mut *tx).await?;
                        true
                    }
                    Some(row) => {
                        let seen: String = row.try_get(0)?;
                        let (since, now): (i64, i64) = (row.try_get(1)?, row.try_get(2)?);
                        if seen == current {
                            now - since < window_ms
                        } else {
                            sqlx::query(switch)
                                .bind(current.as_str())
                                .bind(current.as_str())
                                .execute(&mut *tx)
                                .await?;
                            true
                        }
                    }
                };
                Ok((tx, changed))
            })
        })
        .await
    }

    async fn claim(
        &self,
        worker_id: i64,
        owner: &str,
        lease_ms: i64,
    ) -> Result<Option<i64>, StoreError> {
        let p = DB::placeholder;
        let insert = format!(
            "INSERT INTO leaf_worker (worker_id, owner, lease_until, fence_ms) VALUES ({}, {}, {} + {}, 0)",
            p(1),
            p(2),
            DB::NOW_MS,
            p(3)
        );
        let raise = format!(
            "UPDATE leaf_worker SET fence_ms = {} WHERE worker_id = -3 AND fence_ms < {}",
            p(1),
            p(2)
        );
        let settle = format!(
            "UPDATE leaf_worker SET lease_until = {} WHERE worker_id = -1",
            DB::NOW_MS
        );
        let (insert, raise, settle) = (&insert, &raise, &settle);
        // Retried on a deadlock (nodes starting at once); a unique clash means the row exists:
        // then it is taken only if expired. Row −3 holds the highest id ever given a row: a row
        // inserted for an id at or below it was deleted, and its holder may still issue, so
        // row −1 is marked as changed now, which makes this claimant (its check after the
        // claim) and any other within a lease wait one.
        let inserted = retry_conflicts(|| async move {
            let inserted = committed(&self.pool, |mut tx| async move {
                sqlx::query(insert)
                    .bind(worker_id)
                    .bind(owner)
                    .bind(lease_ms)
                    .execute(&mut *tx)
                    .await?;
                let highest = sqlx::query("SELECT fence_ms FROM leaf_worker WHERE worker_id = -3")
                    .fetch_all(&mut *tx)
                    .await?
                    .first()
                    .map(|row| row.try_get::<i64, _>(0))
                    .transpose()?;
                if highest.is_none_or(|id| id >= worker_id) {
                    sqlx::query(settle).execute(&mut *tx).await?;
                } else {
                    sqlx::query(raise)
                        .bind(worker_id)
                        .bind(worker_id)
                        .execute(&mut *tx)
                        .await?;
                }
                Ok((tx, highest.is_none()))
            })
            .await;
            match inserted {
                Ok(missing) => Ok(Some(missing)),
                Err(StoreError::WriteFailed(e)) if unique_violation(&e) => Ok(None),
                Err(e) => Err(e),
            }
        })
        .await?;
        if let Some(missing) = inserted {
            if missing {
                // Row −3 itself was deleted: recorded again from the rows there are, then
                // raised to this id whoever recorded it (a node racing here may have counted
                // the rows before this one's was committed).
                match sqlx::query(IDS_RECORD).execute(&self.pool).await {
                    Err(e) if !unique_violation(&e) => return Err(e.into()),
                    _ => {}
                }
                sqlx::query(raise)
                    .bind(worker_id)
                    .bind(worker_id)
                    .execute(&self.pool)
                    .await?;
            }
            return Ok(Some(0));
        }
        // Taken only when expired in the database's time; one statement, so exactly one
        // claimant wins. The fence is read in the same transaction.
        let take = format!(
            "UPDATE leaf_worker SET owner = {}, lease_until = {} + {} WHERE worker_id = {} AND lease_until < {}",
            p(1),
            DB::NOW_MS,
            p(2),
            p(3),
            DB::NOW_MS
        );
        let read = format!(
            "SELECT fence_ms FROM leaf_worker WHERE worker_id = {} AND owner = {}",
            p(1),
            p(2)
        );
        let (take, read) = (&take, &read);
        retry_conflicts(|| {
            committed(&self.pool, |mut tx| async move {
                let taken = sqlx::query(take)
                    .bind(owner)
                    .bind(lease_ms)
                    .bind(worker_id)
                    .execute(&mut *tx)
                    .await?;
                if taken.rows_affected() == 0 {
                    return Ok((tx, None));
                }
                let fence = sqlx::query(read)
                    .bind(worker_id)
                    .bind(owner)
                    .fetch_all(&mut *tx)
                    .await?
                    .first()
                    .map(|row| row.try_get::<i64, _>(0))
                    .transpose()?;
                Ok((tx, fence))
            })
        })
        .await
    }

    async fn renew(
        &self,
        worker_id: i64,
        owner: &str,
        lease_ms: i64,
        fence_ms: i64,
    ) -> Result<bool, StoreError> {
        let p = DB::placeholder;
        let renew = format!(
            "UPDATE leaf_worker SET lease_until = {} + {}, fence_ms = CASE WHEN fence_ms > {} THEN fence_ms ELSE {} END WHERE worker_id = {} AND owner = {}",
            DB::NOW_MS,
            p(1),
            p(2),
            p(3),
            p(4),
            p(5)
        );
        let read = format!(
            "SELECT lease_until, {} FROM leaf_worker WHERE worker_id = {}",
            DB::NOW_MS,
            p(1)
        );
        // The fence a renewal writes lets this node issue up to it: it counts only once
        // committed.
        let renew = &renew;
        let renewed = committed(&self.pool, |mut tx| async move {
            let done = sqlx::query(renew)
                .bind(lease_ms)
                .bind(fence_ms)
                .bind(fence_ms)
                .bind(worker_id)
                .bind(owner)
                .execute(&mut *tx)
                .await?;
            Ok((tx, done.rows_affected() == 1))
        })
        .await?;
        if renewed {
            return Ok(true);
        }
        // Not this node's row. Taken by a live holder: this node's lease is over. Gone, or
        // another holder's whose lease has run out: the table went back (a wipe, a restore),
        // and the id is claimed again after a whole lease.
        let rows = sqlx::query(&read)
            .bind(worker_id)
            .fetch_all(&self.pool)
            .await?;
        match rows.first() {
            Some(row) if row.try_get::<i64, _>(0)? >= row.try_get::<i64, _>(1)? => Ok(false),
            Some(_) => Err(StoreError::WentBack(format!(
                "leaf_worker shows worker id {worker_id} as another holder's, expired (this node's lease ran out, or the table went back)"
            ))),
            None => Err(StoreError::WentBack(format!(
                "leaf_worker has no row for worker id {worker_id}: the table lost its rows (a wipe, or a restore)"
            ))),
        }
    }

    async fn release(&self, worker_id: i64, owner: &str, fence_ms: i64) -> Result<(), StoreError> {
        let p = DB::placeholder;
        let release = format!(
            "UPDATE leaf_worker SET lease_until = 0, fence_ms = {} WHERE worker_id = {} AND owner = {}",
            p(1),
            p(2),
            p(3)
        );
        let release = &release;
        committed(&self.pool, |mut tx| async move {
            sqlx::query(release)
                .bind(fence_ms)
                .bind(worker_id)
                .bind(owner)
                .execute(&mut *tx)
                .await?;
            Ok((tx, ()))
        })
        .await
    }

    async fn record_layout(
        &self,
        expected: Option<&str>,
        layout: &str,
    ) -> Result<Option<String>, StoreError> {
        let p = DB::placeholder;
        // Each statement commits by itself: the record moves only from what the caller saw, so
        // of nodes racing with different layouts one wins and the others re-read.
        match expected {
            // Only asked what the record is.
            Some(expected) if expected == layout => {}
            None => {
                let insert = format!(
                    "INSERT INTO leaf_worker (worker_id, owner, lease_until, fence_ms) VALUES (-2, {}, 0, 0)",
                    p(1)
                );
                match sqlx::query(&insert).bind(layout).execute(&self.pool).await {
                    Err(e) if !unique_violation(&e) => return Err(e.into()),
                    _ => {}
                }
            }
            Some(expected) => {
                let switch = format!(
                    "UPDATE leaf_worker SET owner = {} WHERE worker_id = -2 AND owner = {}",
                    p(1),
                    p(2)
                );
                sqlx::query(&switch)
                    .bind(layout)
                    .bind(expected)
                    .execute(&self.pool)
                    .await?;
            }
        }
        let rows = sqlx::query("SELECT owner FROM leaf_worker WHERE worker_id = -2")
            .fetch_all(&self.pool)
            .await?;
        Ok(rows.first().map(|row| row.try_get(0)).transpose()?)
    }

    async fn workers(&self) -> Result<Vec<WorkerRow>, StoreError> {
        let list = format!(
            "SELECT worker_id, owner, lease_until, fence_ms, {} FROM leaf_worker WHERE worker_id >= 0 ORDER BY worker_id",
            DB::NOW_MS
        );
        let rows = sqlx::query(&list).fetch_all(&self.pool).await?;
        let workers = rows
            .iter()
            .map(|row| {
                let (lease_until, db_now): (i64, i64) = (row.try_get(2)?, row.try_get(4)?);
                Ok(WorkerRow {
                    worker_id: row.try_get(0)?,
                    owner: row.try_get(1)?,
                    lease: Lease::Timed(lease_until.saturating_sub(db_now)),
                    fence_ms: row.try_get(3)?,
                })
            })
            .collect::<Result<Vec<_>, sqlx::Error>>()?;
        Ok(workers)
    }
}
