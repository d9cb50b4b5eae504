//! What the SQL dialects' `SegmentStore`s do alike, whatever their allocation: list the table,
//! record a tag's opaque-ID key and residue class, close the pool and lend the lease table.

/// Implements [`super::SegmentStore`] for a store with a `pool` field: the methods every SQL
/// dialect shares, and the ones given in braces (its allocation, its writes and its tag list). `$row` maps a
/// row to a [`super::LeafAlloc`], `$p` numbers placeholders (see `storage::workers`).
macro_rules! sql_segment_store {
    (
        $store:ty,
        backend: $backend:literal,
        row: $row:path,
        placeholder: $p:path,
        { $($own:item)* } $(,)?
    ) => {
        #[async_trait::async_trait]
        impl $crate::storage::SegmentStore for $store {
        $($own)*

        async fn list(&self) -> Result<Vec<$crate::storage::LeafAlloc>, $crate::storage::StoreError> {
            let rows = sqlx::query($crate::storage::LIST_ROWS)
                .fetch_all(&self.pool)
                .await?;
            Ok(rows.iter().map($row).collect::<Result<Vec<_>, _>>()?)
        }

        async fn row(
            &self,
            tag: &str,
        ) -> Result<Option<$crate::storage::LeafAlloc>, $crate::storage::StoreError> {
            let sql = format!("{}{}", $crate::storage::ONE_ROW, $p(1));
            let rows = sqlx::query(&sql).bind(tag).fetch_all(&self.pool).await?;
            Ok(rows.first().map($row).transpose()?)
        }

        async fn claim_opaque(
            &self,
            tag: &str,
            marker: &str,
            below: i64,
        ) -> Result<(Option<String>, i64), $crate::storage::StoreError> {
            let claim = format!(
                "UPDATE leaf_alloc SET opaque = {} WHERE biz_tag = {} AND opaque IS NULL AND max_id < {}",
                $p(1),
                $p(2),
                $p(3)
            );
            let read = format!("SELECT opaque, max_id FROM leaf_alloc WHERE biz_tag = {}", $p(1));
            let (claim, read) = (&claim, &read);
            $crate::storage::committed::committed(&self.pool, |mut tx| async move {
                sqlx::query(claim)
                    .bind(marker)
                    .bind(tag)
                    .bind(below)
                    .execute(&mut *tx)
                    .await?;
                let row: Option<(Option<String>, i64)> =
                    sqlx::query_as(read).bind(tag).fetch_optional(&mut *tx).await?;
                match row {
                    Some(recorded) => Ok((tx, recorded)),
                    None => Err($crate::storage::StoreError::UnknownTag(tag.to_string())),
                }
            })
            .await
        }

        async fn claim_split(
            &self,
            tag: &str,
            expected: Option<&str>,
            split: Option<&str>,
        ) -> Result<Option<String>, $crate::storage::StoreError> {
            let claim = match expected {
                Some(_) => format!(
                    "UPDATE leaf_alloc SET split = {} WHERE biz_tag = {} AND split = {}",
                    $p(1),
                    $p(2),
                    $p(3)
                ),
                None => format!(
                    "UPDATE leaf_alloc SET split = {} WHERE biz_tag = {} AND split IS NULL",
                    $p(1),
                    $p(2)
                ),
            };
            let read = format!("SELECT split FROM leaf_alloc WHERE biz_tag = {}", $p(1));
            let (claim, read) = (&claim, &read);
            $crate::storage::committed::committed(&self.pool, |mut tx| async move {
                let mut query = sqlx::query(claim).bind(split).bind(tag);
                if let Some(expected) = expected {
                    query = query.bind(expected);
                }
                query.execute(&mut *tx).await?;
                let row: Option<(Option<String>,)> =
                    sqlx::query_as(read).bind(tag).fetch_optional(&mut *tx).await?;
                match row {
                    Some((recorded,)) => Ok((tx, recorded)),
                    None => Err($crate::storage::StoreError::UnknownTag(tag.to_string())),
                }
            })
            .await
        }

        async fn resplit(
            &self,
            tag: &str,
            split: Option<&str>,
            start: i64,
        ) -> Result<i64, $crate::storage::StoreError> {
            let record = format!(
                "UPDATE leaf_alloc SET split = {} WHERE biz_tag = {}",
                $p(1),
                $p(2)
            );
            let (record, move_up) = (&record, &$crate::storage::common::move_up_sql($p));
            $crate::storage::committed::committed(&self.pool, |mut tx| async move {
                sqlx::query(record)
                    .bind(split)
                    .bind(tag)
                    .execute(&mut *tx)
                    .await?;
                $crate::storage::common::move_up!(tx, move_up, tag, start)
            })
            .await
        }

        async fn raise(
            &self,
            tag: &str,
            floor: i64,
            marker: &str,
        ) -> Result<i64, $crate::storage::StoreError> {
            let (guarded, read) = &$crate::storage::common::raise_sql($p);
            let like = format!("{marker}:%");
            let like = &like;
            $crate::storage::committed::committed(&self.pool, |mut tx| async move {
                sqlx::query(guarded)
                    .bind(floor)
                    .bind(floor)
                    .bind(floor)
                    .bind(floor)
                    .bind(tag)
                    .bind(marker)
                    .bind(like)
                    .execute(&mut *tx)
                    .await?;
                let row: Option<(i64, Option<String>)> =
                    sqlx::query_as(read).bind(tag).fetch_optional(&mut *tx).await?;
                let Some((max_id, split)) = row else {
                    return Err($crate::storage::StoreError::UnknownTag(tag.to_string()));
                };
                if let Some(refused) =
                    $crate::storage::refused_rule(tag, split.as_deref(), Some(marker))
                {
                    return Err(refused);
                }
                Ok((tx, max_id))
            })
            .await
        }

        async fn schema_version(&self) -> Option<i64> {
            sqlx::query_scalar::<_, Option<i64>>("SELECT MAX(version) FROM _sqlx_migrations")
                .fetch_one(&self.pool)
                .await
                .ok()
                .flatten()
        }

        fn backend(&self) -> &'static str {
            $backend
        }

        async fn close(&self) {
            self.pool.close().await;
        }

        fn worker_leases(
            self: std::sync::Arc<Self>,
        ) -> Option<std::sync::Arc<dyn $crate::storage::WorkerLeaseStore>> {
            Some(self)
        }
        }
    };
}

/// The start of every tag creation, inside its transaction `$tx`: takes the `leafd_guard` row
/// (putting it back if it is missing), then counts the tags; `Err(TagLimit)` at the limit.
macro_rules! guard_tag_count {
    ($tx:expr, $new:expr) => {{
        let guarded = sqlx::query($crate::storage::GUARD_TAGS)
            .execute(&mut *$tx)
            .await?;
        if guarded.rows_affected() == 0 {
            sqlx::query($crate::storage::RESTORE_GUARD)
                .execute(&mut *$tx)
                .await?;
        }
        let (count,): (i64,) = sqlx::query_as($crate::storage::COUNT_TAGS)
            .fetch_one(&mut *$tx)
            .await?;
        if count >= i64::try_from($new.max_tags).unwrap_or(i64::MAX) {
            return Err($crate::storage::StoreError::TagLimit {
                count,
                limit: $new.max_tags,
            });
        }
    }};
}

pub(crate) use guard_tag_count;
/// The statements that move a tag's `max_id` (and `exclusive_max`, so the next allocation
/// starts exactly there) up to a floor, leaving a higher value alone; then read it back.
/// `exclusive_max` comes first: MySQL's SET sees the values assigned to its left.
pub(crate) fn move_up_sql<S: std::fmt::Display>(p: fn(usize) -> S) -> [String; 2] {
    [
        format!(
            "UPDATE leaf_alloc SET \
             exclusive_max = CASE WHEN max_id < {} THEN {} ELSE exclusive_max END, \
             max_id = CASE WHEN max_id < {} THEN {} ELSE max_id END WHERE biz_tag = {}",
            p(1),
            p(2),
            p(3),
            p(4),
            p(5)
        ),
        format!("SELECT max_id FROM leaf_alloc WHERE biz_tag = {}", p(1)),
    ]
}

/// [`move_up_sql`] for a period tag entering a period under the rule bound 6th (and, with
/// `:%` appended, 7th): a row that records another period rule is not moved. The read returns
/// `max_id` and `split`, so the caller can tell.
pub(crate) fn raise_sql<S: std::fmt::Display>(p: fn(usize) -> S) -> (String, String) {
    let [update, _] = move_up_sql(p);
    (
        format!(
            "{update} AND (split IS NULL OR split NOT LIKE 'period:%' OR split = {} OR split LIKE {})",
            p(6),
            p(7)
        ),
        format!("SELECT max_id, split FROM leaf_alloc WHERE biz_tag = {}", p(1)),
    )
}

/// Runs [`move_up_sql`] in `$tx`; evaluates to the `(tx, max_id)` a `committed` body returns.
macro_rules! move_up {
    ($tx:ident, $sql:expr, $tag:expr, $floor:expr) => {{
        let [update, read] = $sql;
        sqlx::query(update)
            .bind($floor)
            .bind($floor)
            .bind($floor)
            .bind($floor)
            .bind($tag)
            .execute(&mut *$tx)
            .await?;
        let row: Option<(i64,)> = sqlx::query_as(read)
            .bind($tag)
            .fetch_optional(&mut *$tx)
            .await?;
        match row {
            Some((max_id,)) => Ok(($tx, max_id)),
            None => Err($crate::storage::StoreError::UnknownTag($tag.to_string())),
        }
    }};
}

pub(crate) use move_up;
pub(crate) use sql_segment_store;
