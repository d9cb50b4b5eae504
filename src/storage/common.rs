//! What the SQL dialects' `SegmentStore`s do alike, whatever their allocation: list the table,
//! record a tag's opaque-ID key, close the pool and lend the lease table of the same database.

/// Implements [`super::SegmentStore`] for a store with a `pool` field: the methods every SQL
/// dialect shares, and the ones given in braces (its allocation and its writes). `$row` maps a
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

pub(crate) use sql_segment_store;
