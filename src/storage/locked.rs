//! The `SegmentStore` of a server database (PostgreSQL, MySQL/MariaDB): an allocation locks its
//! row, compares the instance that wrote it last with the one answering now, and writes both.

/// Implements [`super::SegmentStore`] for a store with a `pool` field. `$instance` names the
/// database instance a connection reaches (an async fn over the dialect's connection);
/// `$locked_instance` the same for an allocation, given the store, the connection and the
/// locked row, whose `instance` column saves the round trip where the dialect can compute it
/// in the lock statement. The SQL texts bind, in order: `lock` the tag (a `SELECT … FOR
/// UPDATE` of `biz_tag, max_id, step, description, writer, opaque, exclusive_max, split,
/// instance`); `advance` the new max_id, the same again for
/// `exclusive_max`, the writer, the tag; `insert` tag, max_id, the same again for
/// `exclusive_max`, step, description, writer, split; `set_step` step then tag. `$row` maps a locked row to a
/// [`super::LeafAlloc`].
macro_rules! locked_segment_store {
    (
        $store:ty,
        backend: $backend:literal,
        row: $row:path,
        placeholder: $placeholder:path,
        instance: $instance:path,
        locked_instance: $locked_instance:path,
        lock: $lock:expr,
        advance: $advance:expr,
        insert: $insert:expr,
        set_step: $set_step:expr $(,)?
    ) => {
        $crate::storage::common::sql_segment_store!(
            $store,
            backend: $backend,
            row: $row,
            placeholder: $placeholder,
            {
            async fn allocate(
                &self,
                tag: &str,
                grant: $crate::storage::Grant,
            ) -> Result<$crate::storage::LeafAlloc, $crate::storage::StoreError> {
                let grant = &grant;
                $crate::storage::committed::committed(&self.pool, |mut tx| async move {
                    let alloc = $crate::storage::locked::allocate_in!(self, tx, tag, grant, $lock, $advance, $row, $locked_instance)?;
                    Ok((tx, alloc?))
                })
                .await
            }

            async fn allocate_many(
                &self,
                requests: &[(String, $crate::storage::Grant)],
            ) -> Result<Vec<Result<$crate::storage::LeafAlloc, $crate::storage::StoreError>>, $crate::storage::StoreError> {
                $crate::storage::committed::committed(&self.pool, |mut tx| async move {
                    let mut out = Vec::with_capacity(requests.len());
                    for (tag, grant) in requests {
                        out.push($crate::storage::locked::allocate_in!(self, tx, tag, grant, $lock, $advance, $row, $locked_instance)?);
                    }
                    Ok((tx, out))
                })
                .await
            }

            async fn create_tag(
                &self,
                new: &$crate::storage::NewTag,
            ) -> Result<(), $crate::storage::StoreError> {
                $crate::storage::committed::committed(&self.pool, |mut tx| async move {
                    $crate::storage::common::guard_tag_count!(tx, new);
                    // The creating instance is recorded: a failover that loses the tag's
                    // first allocations is then seen like any other.
                    let current = $instance(&mut *tx).await?;
                    sqlx::query($insert)
                        .bind(&new.tag)
                        .bind(new.start)
                        .bind(new.start)
                        .bind(new.step)
                        .bind(new.description.as_deref())
                        .bind(&current)
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
                    // MySQL counts only changed rows, so an unchanged step must not read as
                    // "unknown tag": the row is looked up (and locked) first. The writer is
                    // left alone: only an allocation may say which instance holds the range.
                    let known = sqlx::query($lock).bind(tag).fetch_all(&mut *tx).await?;
                    if known.is_empty() {
                        return Err($crate::storage::StoreError::UnknownTag(tag.to_string()));
                    }
                    sqlx::query($set_step)
                        .bind(step)
                        .bind(tag)
                        .execute(&mut *tx)
                        .await?;
                    Ok((tx, ()))
                })
                .await
            }

            }
        );
    };
}

pub(crate) use locked_segment_store;

/// One allocation inside the transaction `$tx`: `Err` for a statement that failed (the
/// transaction is lost), `Ok(Err(_))` for a refusal before anything moved (unknown tag, another
/// rule, the end of a period), which leaves the transaction usable for the next.
macro_rules! allocate_in {
    ($self:ident, $tx:ident, $tag:expr, $grant:expr, $lock:expr, $advance:expr, $row:path, $locked_instance:path) => {
        async {
            let tag: &str = $tag;
            let grant: &$crate::storage::Grant = $grant;
            let rows = sqlx::query($lock).bind(tag).fetch_all(&mut *$tx).await?;
            let Some(row) = rows.first() else {
                return Ok(Err($crate::storage::StoreError::UnknownTag(
                    tag.to_string(),
                )));
            };
            let current = $locked_instance($self, &mut *$tx, row).await?;
            let mut alloc = $row(row)?;
            if let Some(refused) = $crate::storage::refused_rule(
                tag,
                alloc.split.as_deref(),
                grant.period_rule.as_deref(),
            ) {
                return Ok(Err(refused));
            }
            let writer: Option<String> = sqlx::Row::try_get(row, "writer")?;
            let exclusive_max: Option<i64> = sqlx::Row::try_get(row, "exclusive_max")?;
            let planned = $crate::storage::failover::plan(
                tag,
                alloc.max_id,
                exclusive_max,
                grant.step.unwrap_or(alloc.step),
                writer.as_deref(),
                &current,
                grant,
            );
            let (first, max_id, skip) = match planned {
                Ok(plan) => plan,
                Err(refused) => return Ok(Err(refused)),
            };
            sqlx::query($advance)
                .bind(max_id)
                .bind(max_id)
                .bind(&current)
                .bind(tag)
                .execute(&mut *$tx)
                .await?;
            alloc.max_id = max_id;
            alloc.first = first;
            alloc.failover = skip;
            Ok::<_, $crate::storage::StoreError>(Ok(alloc))
        }
        .await
    };
}

pub(crate) use allocate_in;
