//! The `SegmentStore` of a dialect that allocates with `UPDATE … RETURNING` in one statement
//! (SQLite; PostgreSQL locks the row first, as MySQL does: `locked.rs`).

/// Implements [`super::SegmentStore`] for a store with a `pool` field and a `writes` mutex that
/// lets one allocation of this process at a time ask for the file's write lock (`$rules` reads
/// the tag list): SQLite has one
/// writer, and connections that find it taken sleep in its busy handler (1 ms, 2 ms, 5 ms …)
/// while the lock, held a tenth of a millisecond, goes unused. The SQL texts bind, in
/// order: `allocate` the step (`Option<i64>`), the tag, the window's span and usable
/// positions (both `NULL` without a window) and the caller's period rule (`NULL`: none; a row
/// recording a period is moved only under it), returning `biz_tag, max_id, step,
/// description, opaque, split` (and setting `exclusive_max` to the new `max_id`: see
/// [`super::SegmentStore::allocate`]); `exists` the tag, selecting its `max_id`,
/// `exclusive_max`, `step` and `split`; `insert` tag, start (its `max_id` and
/// `exclusive_max`), step, description, split; `set_step` step then tag. Rows map to a
/// [`super::LeafAlloc`] by [`super::LeafAlloc::from_row`].
macro_rules! returning_segment_store {
    (
        $store:ty,
        backend: $backend:literal,
        placeholder: $placeholder:path,
        rules: $rules:path,
        allocate: $allocate:expr,
        exists: $exists:expr,
        insert: $insert:expr,
        set_step: $set_step:expr $(,)?
    ) => {
        $crate::storage::common::sql_segment_store!(
            $store,
            backend: $backend,
            placeholder: $placeholder,
            {
            async fn allocate(
                &self,
                tag: &str,
                // One file has one writer: a SQLite database has no replica to fail over to,
                // so the failover margin never applies.
                grant: $crate::storage::Grant,
            ) -> Result<$crate::storage::LeafAlloc, $crate::storage::StoreError> {
                let grant = &grant;
                let _one_writer = self.writes.lock().await;
                $crate::storage::committed::committed(&self.pool, |mut tx| async move {
                    let alloc = $crate::storage::common::SharedSql::allocate_returning(&mut tx, tag, grant, $allocate, $exists).await?;
                    Ok((tx, alloc?))
                })
                .await
            }

            async fn allocate_many(
                &self,
                requests: &[(String, $crate::storage::Grant)],
            ) -> Result<Vec<Result<$crate::storage::LeafAlloc, $crate::storage::StoreError>>, $crate::storage::StoreError> {
                let _one_writer = self.writes.lock().await;
                $crate::storage::committed::committed(&self.pool, |mut tx| async move {
                    let mut out = Vec::with_capacity(requests.len());
                    for (tag, grant) in requests {
                        out.push($crate::storage::common::SharedSql::allocate_returning(&mut tx, tag, grant, $allocate, $exists).await?);
                    }
                    Ok((tx, out))
                })
                .await
            }

            async fn rules(
                &self,
            ) -> Result<Vec<(String, Option<String>)>, $crate::storage::StoreError> {
                $rules(self).await
            }

            async fn create_tag(
                &self,
                new: &$crate::storage::NewTag,
            ) -> Result<(), $crate::storage::StoreError> {
                $crate::storage::committed::committed(&self.pool, |mut tx| async move {
                    $crate::storage::common::SharedSql::guard_tag_count(&mut tx, new.max_tags).await?;
                    sqlx::query($insert)
                        .bind(&new.tag)
                        .bind(new.start)
                        .bind(new.step)
                        .bind(new.description.as_deref())
                        .bind(new.split.as_deref())
                        .execute(&mut *tx)
                        .await
                        .map_err(|e| $crate::storage::insert_error(e, &new.tag))?;
                    Ok((tx, ()))
                })
                .await
            }

            async fn set_step(
                &self,
                tag: &str,
                step: i64,
            ) -> Result<(), $crate::storage::StoreError> {
                $crate::storage::committed::committed(&self.pool, |mut tx| async move {
                    let done = sqlx::query($set_step)
                        .bind(step)
                        .bind(tag)
                        .execute(&mut *tx)
                        .await?;
                    if done.rows_affected() == 0 {
                        return Err($crate::storage::StoreError::UnknownTag(tag.to_string()));
                    }
                    Ok((tx, ()))
                })
                .await
            }

            }
        );
    };
}

pub(crate) use returning_segment_store;
