//! The `SegmentStore` of a server database (PostgreSQL, MySQL/MariaDB): an allocation locks its
//! row, compares the instance that wrote it last with the one answering now, and writes both.

/// Implements [`super::SegmentStore`] for a store with a `pool` field. `$instance` names the
/// database instance a connection reaches (an async fn over the dialect's connection);
/// `$locked_instance` the same for an allocation, given the store, the connection and the
/// locked row, whose `instance` column saves the round trip where the dialect can compute it
/// in the lock statement; `$one_statement` an allocation made by one autocommitted statement
/// where the grant allows it ([`super::Grant::single_statement`]; `None`: the row was not in
/// that state, or the dialect cannot); `$allocate_many` a batch (`<store>::allocate_each`, which
/// this macro writes, for a dialect that locks a batch row by row). The SQL texts bind, in
/// order: `lock` the tag (a `SELECT … FOR
/// UPDATE` of `biz_tag, max_id, step, description, writer, opaque, exclusive_max, split,
/// instance`); `advance` the new max_id, the same again for
/// `exclusive_max`, the writer, the tag; `insert` tag, max_id, the same again for
/// `exclusive_max`, step, description, writer, split; `set_step` step then tag. Rows
/// map to a [`super::LeafAlloc`] by [`super::LeafAlloc::from_row`].
macro_rules! locked_segment_store {
    (
        $store:ty,
        backend: $backend:literal,
        placeholder: $placeholder:path,
        instance: $instance:path,
        locked_instance: $locked_instance:path,
        one_statement: $one_statement:path,
        allocate_many: $allocate_many:path,
        lock: $lock:expr,
        advance: $advance:expr,
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
                grant: $crate::storage::Grant,
            ) -> Result<$crate::storage::LeafAlloc, $crate::storage::StoreError> {
                let grant = &grant;
                if let Some(alloc) = $one_statement(self, tag, grant).await? {
                    return Ok(alloc);
                }
                $crate::storage::committed::committed(&self.pool, |mut tx| async move {
                    let alloc = $crate::storage::locked::allocate_in!(self, tx, tag, grant, $lock, $advance, $locked_instance)?;
                    Ok((tx, alloc?))
                })
                .await
            }

            async fn allocate_many(
                &self,
                requests: &[(String, $crate::storage::Grant)],
            ) -> Result<Vec<Result<$crate::storage::LeafAlloc, $crate::storage::StoreError>>, $crate::storage::StoreError> {
                $allocate_many(self, requests).await
            }

            async fn rules(
                &self,
            ) -> Result<Vec<(String, Option<String>)>, $crate::storage::StoreError> {
                Ok(sqlx::query_as("SELECT biz_tag, split FROM leaf_alloc")
                    .fetch_all(&self.pool)
                    .await?)
            }

            async fn create_tag(
                &self,
                new: &$crate::storage::NewTag,
            ) -> Result<(), $crate::storage::StoreError> {
                $crate::storage::committed::committed(&self.pool, |mut tx| async move {
                    $crate::storage::common::SharedSql::guard_tag_count(&mut tx, new.max_tags).await?;
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

        impl $store {
            /// The allocations of `requests` in one transaction, one after another (a dialect
            /// that can lock them all in one statement passes its own `allocate_many`).
            #[allow(dead_code)]
            async fn allocate_each(
                &self,
                requests: &[(String, $crate::storage::Grant)],
            ) -> Result<Vec<Result<$crate::storage::LeafAlloc, $crate::storage::StoreError>>, $crate::storage::StoreError> {
                $crate::storage::committed::committed(&self.pool, |mut tx| async move {
                    let mut out = Vec::with_capacity(requests.len());
                    for (tag, grant) in requests {
                        out.push($crate::storage::locked::allocate_in!(self, tx, tag, grant, $lock, $advance, $locked_instance)?);
                    }
                    Ok((tx, out))
                })
                .await
            }
        }
    };
}

pub(crate) use locked_segment_store;

/// A row an allocation locked: the row as a [`super::LeafAlloc`], the instance that wrote it
/// last and its `exclusive_max`.
#[derive(Debug, Clone)]
pub(crate) struct LockedRow {
    pub alloc: super::LeafAlloc,
    pub writer: Option<String>,
    pub exclusive_max: Option<i64>,
}

impl LockedRow {
    /// Decodes a locked row (`writer` and `exclusive_max` beside what `to_alloc` reads).
    pub fn decode<R: sqlx::Row>(
        row: &R,
        to_alloc: impl Fn(&R) -> Result<super::LeafAlloc, sqlx::Error>,
    ) -> Result<LockedRow, sqlx::Error>
    where
        for<'c> &'c str: sqlx::ColumnIndex<R>,
        for<'r> Option<String>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
        for<'r> Option<i64>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    {
        Ok(LockedRow {
            alloc: to_alloc(row)?,
            writer: row.try_get("writer")?,
            exclusive_max: row.try_get("exclusive_max")?,
        })
    }

    /// The allocation `grant` makes of this row when the instance `current` answers (see
    /// [`super::failover::plan`]); `Err`: refused before anything moved (another period rule,
    /// the end of a period, the end of the ID space). The row then shows the allocation, so
    /// a second request of the same tag in one transaction starts where this one ended.
    pub fn allocate(
        &mut self,
        tag: &str,
        grant: &super::Grant,
        current: &str,
    ) -> Result<super::LeafAlloc, super::StoreError> {
        if let Some(refused) = super::refused_rule(
            tag,
            self.alloc.split.as_deref(),
            grant.period_rule.as_deref(),
        ) {
            return Err(refused);
        }
        let (first, max_id, skip) = super::failover::plan(
            tag,
            self.alloc.max_id,
            self.exclusive_max,
            grant.step.unwrap_or(self.alloc.step),
            self.writer.as_deref(),
            current,
            grant,
        )?;
        let mut alloc = self.alloc.clone();
        alloc.max_id = max_id;
        alloc.first = first;
        alloc.failover = skip;
        self.alloc.max_id = max_id;
        self.exclusive_max = Some(max_id);
        self.writer = Some(current.to_string());
        Ok(alloc)
    }
}

/// One allocation inside the transaction `$tx`: `Err` for a statement that failed (the
/// transaction is lost), `Ok(Err(_))` for a refusal before anything moved (unknown tag, another
/// rule, the end of a period), which leaves the transaction usable for the next.
macro_rules! allocate_in {
    ($self:ident, $tx:ident, $tag:expr, $grant:expr, $lock:expr, $advance:expr, $locked_instance:path) => {
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
            let mut locked = $crate::storage::locked::LockedRow::decode(
                row,
                $crate::storage::LeafAlloc::from_row,
            )?;
            let alloc = match locked.allocate(tag, grant, &current) {
                Ok(alloc) => alloc,
                Err(refused) => return Ok(Err(refused)),
            };
            sqlx::query($advance)
                .bind(alloc.max_id)
                .bind(alloc.max_id)
                .bind(&current)
                .bind(tag)
                .execute(&mut *$tx)
                .await?;
            Ok::<_, $crate::storage::StoreError>(Ok(alloc))
        }
        .await
    };
}

pub(crate) use allocate_in;
