//! `leaf_worker` for each dialect: the same statements, differing only in placeholders and in
//! how the database tells its own time in UNIX milliseconds.

/// Implements [`super::WorkerLeaseStore`] for a store with a `pool` field. `$now` is the
/// dialect's expression for the database's clock in UNIX ms; `$p` numbers placeholders
/// (`?` for SQLite and MySQL, `$1…` for PostgreSQL); `$instance` names the database instance
/// a connection reaches (see `storage::failover`).
///
/// Row −1 is not a worker id: its owner is the instance that answered the last claim and its
/// `lease_until` the database time at which that instance was first seen. A start that creates
/// the schema records the instance it reached as first seen at 0 (no holder ever: no wait, yet
/// a failover before the first claims replicated is still seen); when it is missing later,
/// `leaf_worker` lost its rows while holders may still issue, and it is written again as first
/// seen now. Row −3 holds the highest worker id ever given a row.
macro_rules! worker_lease_store {
    ($store:ty, $now:expr, $p:path, $instance:path) => {
        impl $store {
            /// Row −1 for a database this start created the schema of: the instance reached,
            /// first seen at 0 (kept if another node's claim wrote it first).
            pub(super) async fn record_new_lease_table(
                &self,
            ) -> Result<(), $crate::storage::StoreError> {
                let insert = format!(
                    "INSERT INTO leaf_worker (worker_id, owner, lease_until, fence_ms) VALUES (-1, {}, 0, 0)",
                    $p(1)
                );
                let mut conn = self.pool.acquire().await?;
                let current = format!("instance {}", $instance(&mut *conn).await?);
                match sqlx::query(&insert).bind(&current).execute(&mut *conn).await {
                    Err(e) if !$crate::storage::unique_violation(&e) => Err(e.into()),
                    _ => Ok(()),
                }
            }
        }

        #[async_trait::async_trait]
        impl $crate::storage::WorkerLeaseStore for $store {
            fn keeper(&self) -> $crate::storage::LeaseKeeper {
                $crate::storage::LeaseKeeper::DATABASE
            }

            async fn instance_changed_within(
                &self,
                window_ms: i64,
            ) -> Result<bool, $crate::storage::StoreError> {
                // A write first takes the lock (the row's, or SQLite's whole-file write lock,
                // which a transaction that read first could not take while another waits).
                let lock = "UPDATE leaf_worker SET fence_ms = 0 WHERE worker_id = -1";
                let read = format!(
                    "SELECT owner, lease_until, {} FROM leaf_worker WHERE worker_id = -1",
                    $now
                );
                let insert = format!(
                    "INSERT INTO leaf_worker (worker_id, owner, lease_until, fence_ms) VALUES (-1, {}, {}, 0)",
                    $p(1), $now
                );
                let switch = format!(
                    "UPDATE leaf_worker SET owner = {}, lease_until = {} WHERE worker_id = -1 AND owner <> {}",
                    $p(1), $now, $p(2)
                );
                // Nodes starting at once race for the first record (a unique clash, or on
                // MySQL a deadlock of their gap locks): the loser reads the winner's.
                let (read, insert, switch) = (&read, &insert, &switch);
                $crate::storage::committed::retry_conflicts(|| {
                    $crate::storage::committed::committed(&self.pool, |mut tx| async move {
                        sqlx::query(lock).execute(&mut *tx).await?;
                        let current = format!("instance {}", $instance(&mut *tx).await?);
                        let rows: Vec<(String, i64, i64)> =
                            sqlx::query_as(read).fetch_all(&mut *tx).await?;
                        let changed = match rows.first() {
                            // The table lost its rows (a wipe, or a restore of an empty
                            // table): a holder it no longer shows may still issue. Claimants
                            // wait a whole lease from now.
                            None => {
                                sqlx::query(insert).bind(&current).execute(&mut *tx).await?;
                                // With row −1 the table lost row −3 too: recorded again.
                                sqlx::query($crate::storage::workers::IDS_RECORD)
                                    .execute(&mut *tx)
                                    .await?;
                                true
                            }
                            Some((seen, since, now)) if *seen == current => now - since < window_ms,
                            Some(_) => {
                                sqlx::query(switch)
                                    .bind(&current)
                                    .bind(&current)
                                    .execute(&mut *tx)
                                    .await?;
                                true
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
            ) -> Result<Option<i64>, $crate::storage::StoreError> {
                let insert = format!(
                    "INSERT INTO leaf_worker (worker_id, owner, lease_until, fence_ms) VALUES ({}, {}, {} + {}, 0)",
                    $p(1), $p(2), $now, $p(3)
                );
                let raise = format!(
                    "UPDATE leaf_worker SET fence_ms = {} WHERE worker_id = -3 AND fence_ms < {}",
                    $p(1), $p(2)
                );
                let settle = format!(
                    "UPDATE leaf_worker SET lease_until = {} WHERE worker_id = -1",
                    $now
                );
                let (insert, raise, settle) = (&insert, &raise, &settle);
                // Retried on a deadlock (nodes starting at once); a unique clash means the row
                // exists: then it is taken only if expired. Row −3 holds the highest id ever
                // given a row: a row inserted for an id at or below it was deleted, and its
                // holder may still issue, so row −1 is marked as changed now, which makes this
                // claimant (its check after the claim) and any other within a lease wait one.
                let inserted = $crate::storage::committed::retry_conflicts(|| async move {
                    let inserted = $crate::storage::committed::committed(&self.pool, |mut tx| async move {
                        sqlx::query(insert)
                            .bind(worker_id)
                            .bind(owner)
                            .bind(lease_ms)
                            .execute(&mut *tx)
                            .await?;
                        let highest: Vec<(i64,)> =
                            sqlx::query_as("SELECT fence_ms FROM leaf_worker WHERE worker_id = -3")
                                .fetch_all(&mut *tx)
                                .await?;
                        let deleted = highest.first().is_none_or(|(id,)| *id >= worker_id);
                        if deleted {
                            sqlx::query(settle).execute(&mut *tx).await?;
                        } else {
                            sqlx::query(raise)
                                .bind(worker_id)
                                .bind(worker_id)
                                .execute(&mut *tx)
                                .await?;
                        }
                        Ok((tx, highest.is_empty()))
                    })
                    .await;
                    match inserted {
                        Ok(missing) => Ok(Some(missing)),
                        Err($crate::storage::StoreError::WriteFailed(e))
                            if $crate::storage::unique_violation(&e) => Ok(None),
                        Err(e) => Err(e),
                    }
                })
                .await?;
                if let Some(missing) = inserted {
                    if missing {
                        // Row −3 itself was deleted: recorded again from the rows there are,
                        // then raised to this id whoever recorded it (a node racing here may
                        // have counted the rows before this one's was committed).
                        match sqlx::query($crate::storage::workers::IDS_RECORD).execute(&self.pool).await {
                            Err(e) if !$crate::storage::unique_violation(&e) => return Err(e.into()),
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
                // Taken only when expired in the database's time; one statement, so exactly
                // one claimant wins. The fence is read in the same transaction.
                let take = format!(
                    "UPDATE leaf_worker SET owner = {}, lease_until = {} + {} WHERE worker_id = {} AND lease_until < {}",
                    $p(1), $now, $p(2), $p(3), $now
                );
                let read = format!(
                    "SELECT fence_ms FROM leaf_worker WHERE worker_id = {} AND owner = {}",
                    $p(1), $p(2)
                );
                let (take, read) = (&take, &read);
                $crate::storage::committed::retry_conflicts(|| $crate::storage::committed::committed(&self.pool, |mut tx| async move {
                    let taken = sqlx::query(take)
                        .bind(owner)
                        .bind(lease_ms)
                        .bind(worker_id)
                        .execute(&mut *tx)
                        .await?;
                    if taken.rows_affected() == 0 {
                        return Ok((tx, None));
                    }
                    let fence: Vec<(i64,)> = sqlx::query_as(read)
                        .bind(worker_id)
                        .bind(owner)
                        .fetch_all(&mut *tx)
                        .await?;
                    Ok((tx, fence.first().map(|(f,)| *f)))
                }))
                .await
            }

            async fn renew(
                &self,
                worker_id: i64,
                owner: &str,
                lease_ms: i64,
                fence_ms: i64,
            ) -> Result<bool, $crate::storage::StoreError> {
                let renew = format!(
                    "UPDATE leaf_worker SET lease_until = {} + {}, fence_ms = CASE WHEN fence_ms > {} THEN fence_ms ELSE {} END WHERE worker_id = {} AND owner = {}",
                    $now, $p(1), $p(2), $p(3), $p(4), $p(5)
                );
                let read = format!(
                    "SELECT lease_until, {} FROM leaf_worker WHERE worker_id = {}",
                    $now, $p(1)
                );
                // The fence a renewal writes lets this node issue up to it: it counts only
                // once committed.
                let renewed = $crate::storage::committed::committed(&self.pool, |mut tx| async move {
                    let done = sqlx::query(&renew)
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
                // Not this node's row. Taken by a live holder: this node's lease is over. Gone,
                // or another holder's whose lease has run out: the table went back (a wipe, a
                // restore), and the id is claimed again after a whole lease.
                let rows: Vec<(i64, i64)> = sqlx::query_as(&read)
                    .bind(worker_id)
                    .fetch_all(&self.pool)
                    .await?;
                match rows.first() {
                    Some((until, now)) if until >= now => Ok(false),
                    Some(_) => Err($crate::storage::StoreError::WentBack(format!(
                        "leaf_worker shows worker id {worker_id} as another holder's, expired (this node's lease ran out, or the table went back)"
                    ))),
                    None => Err($crate::storage::StoreError::WentBack(format!(
                        "leaf_worker has no row for worker id {worker_id}: the table lost its rows (a wipe, or a restore)"
                    ))),
                }
            }

            async fn release(
                &self,
                worker_id: i64,
                owner: &str,
                fence_ms: i64,
            ) -> Result<(), $crate::storage::StoreError> {
                let release = format!(
                    "UPDATE leaf_worker SET lease_until = 0, fence_ms = {} WHERE worker_id = {} AND owner = {}",
                    $p(1), $p(2), $p(3)
                );
                $crate::storage::committed::committed(&self.pool, |mut tx| async move {
                    sqlx::query(&release)
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
            ) -> Result<Option<String>, $crate::storage::StoreError> {
                // Each statement commits by itself: the record moves only from what the caller
                // saw, so of nodes racing with different layouts one wins and the others re-read.
                match expected {
                    // Only asked what the record is.
                    Some(expected) if expected == layout => {}
                    None => {
                        let insert = format!(
                            "INSERT INTO leaf_worker (worker_id, owner, lease_until, fence_ms) VALUES (-2, {}, 0, 0)",
                            $p(1)
                        );
                        let inserted = sqlx::query(&insert).bind(layout).execute(&self.pool).await;
                        match inserted {
                            Err(e) if !$crate::storage::unique_violation(&e) => return Err(e.into()),
                            _ => {}
                        }
                    }
                    Some(expected) => {
                        let switch = format!(
                            "UPDATE leaf_worker SET owner = {} WHERE worker_id = -2 AND owner = {}",
                            $p(1), $p(2)
                        );
                        sqlx::query(&switch)
                            .bind(layout)
                            .bind(expected)
                            .execute(&self.pool)
                            .await?;
                    }
                }
                let rows: Vec<(String,)> =
                    sqlx::query_as("SELECT owner FROM leaf_worker WHERE worker_id = -2")
                        .fetch_all(&self.pool)
                        .await?;
                Ok(rows.into_iter().next().map(|(owner,)| owner))
            }

            async fn workers(
                &self,
            ) -> Result<Vec<$crate::storage::WorkerRow>, $crate::storage::StoreError> {
                let list = format!(
                    "SELECT worker_id, owner, lease_until, fence_ms, {} FROM leaf_worker WHERE worker_id >= 0 ORDER BY worker_id",
                    $now
                );
                let rows: Vec<(i64, String, i64, i64, i64)> =
                    sqlx::query_as(&list).fetch_all(&self.pool).await?;
                Ok(rows
                    .into_iter()
                    .map(|(worker_id, owner, lease_until, fence_ms, db_now)| {
                        $crate::storage::WorkerRow {
                            worker_id,
                            owner,
                            lease: $crate::storage::Lease::Timed(lease_until - db_now),
                            fence_ms,
                        }
                    })
                    .collect())
            }
        }
    };
}

pub(crate) use worker_lease_store;

/// Row −3 recorded again from the rows there are, unless it exists. (The aggregate is a derived
/// table: an aggregate alone gives its one row even when a WHERE beside it is false.)
pub(crate) const IDS_RECORD: &str = "INSERT INTO leaf_worker (worker_id, owner, lease_until, fence_ms) SELECT -3, 'ids', 0, highest FROM (SELECT COALESCE(MAX(worker_id), -1) AS highest FROM leaf_worker WHERE worker_id >= 0) AS ids WHERE NOT EXISTS (SELECT 1 FROM leaf_worker WHERE worker_id = -3)";

/// `?` whatever the position (SQLite, MySQL).
pub(crate) fn question(_: usize) -> &'static str {
    "?"
}

/// `$n` (PostgreSQL).
pub(crate) fn dollar(n: usize) -> String {
    format!("${n}")
}
