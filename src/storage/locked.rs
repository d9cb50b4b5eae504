//! The `SegmentStore` allocation of a server database (PostgreSQL, MySQL/MariaDB): an allocation
//! locks its row, compares the instance that wrote it last with the one answering now, and
//! writes both.

use std::marker::PhantomData;

use sqlx::{ColumnIndex, Decode, Encode, Executor, IntoArguments, Pool, Row, Transaction, Type};

use super::committed::committed;
use super::common::{RowsAffected, SharedSql};
use super::dialect::Dialect;
use super::{Grant, LeafAlloc, NewTag, StoreError};

/// A locking dialect's statements. They bind, in order: `lock` the tag (a `SELECT … FOR
/// UPDATE` of `biz_tag, max_id, step, description, writer, opaque, exclusive_max, split,
/// instance`); `advance` the new max_id, the same again for `exclusive_max`, the writer, the
/// tag; `insert` tag, max_id, the same again for `exclusive_max`, step, description, writer,
/// split; `set_step` step then tag.
pub(crate) struct LockedStatements {
    pub lock: &'static str,
    pub advance: &'static str,
    pub insert: &'static str,
    pub set_step: &'static str,
}

/// Where an allocation learns the instance answering: from the lock statement's `instance`
/// column (one round trip less), or by [`Dialect::instance`] (a Galera cluster, whose
/// instance takes a statement of its own).
#[derive(Clone, Copy, Debug)]
pub(crate) enum InstanceFrom {
    LockedRow,
    OwnStatement,
}

/// The allocation, tag creation and step change of a locking dialect, generic over sqlx's
/// database as [`SharedSql`] is.
pub(crate) struct LockedSql<DB>(PhantomData<DB>);

impl<DB> LockedSql<DB>
where
    DB: Dialect,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    &'static str: ColumnIndex<DB::Row>,
    usize: ColumnIndex<DB::Row>,
    for<'r> String: Decode<'r, DB> + Type<DB>,
    for<'r> i64: Decode<'r, DB> + Type<DB>,
    for<'r> i32: Decode<'r, DB> + Type<DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> Option<&'q str>: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB>,
    for<'q> Option<i64>: Encode<'q, DB> + Type<DB>,
    for<'r> Option<i64>: Decode<'r, DB>,
    DB::QueryResult: RowsAffected,
{
    /// One allocation in a transaction of its own.
    pub(crate) async fn allocate(
        pool: &Pool<DB>,
        sql: &LockedStatements,
        tag: &str,
        grant: &Grant,
        instance: InstanceFrom,
    ) -> Result<LeafAlloc, StoreError> {
        committed(pool, |mut tx| async move {
            let alloc = Self::allocate_in(&mut tx, sql, tag, grant, instance).await?;
            Ok((tx, alloc?))
        })
        .await
    }

    /// The allocations of `requests` in one transaction, one after another (a dialect that
    /// can lock them all in one statement has its own).
    pub(crate) async fn allocate_each(
        pool: &Pool<DB>,
        sql: &LockedStatements,
        requests: &[(String, Grant)],
        instance: InstanceFrom,
    ) -> Result<Vec<Result<LeafAlloc, StoreError>>, StoreError> {
        committed(pool, |mut tx| async move {
            let mut out = Vec::with_capacity(requests.len());
            for (tag, grant) in requests {
                out.push(Self::allocate_in(&mut tx, sql, tag, grant, instance).await?);
            }
            Ok((tx, out))
        })
        .await
    }

    /// One allocation inside `tx`: `Err` for a statement that failed (the transaction is
    /// lost), `Ok(Err(_))` for a refusal before anything moved (unknown tag, another rule, the
    /// end of a period), which leaves the transaction usable for the next.
    async fn allocate_in(
        tx: &mut Transaction<'static, DB>,
        sql: &LockedStatements,
        tag: &str,
        grant: &Grant,
        instance: InstanceFrom,
    ) -> Result<Result<LeafAlloc, StoreError>, StoreError> {
        let rows = sqlx::query(sql.lock).bind(tag).fetch_all(&mut **tx).await?;
        let Some(row) = rows.first() else {
            return Ok(Err(StoreError::UnknownTag(tag.to_string())));
        };
        let current: String = match instance {
            InstanceFrom::LockedRow => row.try_get("instance")?,
            InstanceFrom::OwnStatement => DB::instance(tx).await?,
        };
        let mut locked = LockedRow::decode(row, LeafAlloc::from_row)?;
        let alloc = match locked.allocate(tag, grant, &current) {
            Ok(alloc) => alloc,
            Err(refused) => return Ok(Err(refused)),
        };
        sqlx::query(sql.advance)
            .bind(alloc.max_id)
            .bind(alloc.max_id)
            .bind(current.as_str())
            .bind(tag)
            .execute(&mut **tx)
            .await?;
        Ok(Ok(alloc))
    }

    /// Creates a tag, recording the creating instance: a failover that loses the tag's first
    /// allocations is then seen like any other.
    pub(crate) async fn create_tag(
        pool: &Pool<DB>,
        sql: &LockedStatements,
        new: &NewTag,
    ) -> Result<(), StoreError> {
        committed(pool, |mut tx| async move {
            SharedSql::guard_tag_count(&mut tx, new.max_tags).await?;
            let current = DB::instance(&mut tx).await?;
            sqlx::query(sql.insert)
                .bind(new.tag.as_str())
                .bind(new.start)
                .bind(new.start)
                .bind(new.step)
                .bind(new.description.as_deref())
                .bind(current.as_str())
                .bind(new.split.as_deref())
                .execute(&mut *tx)
                .await
                .map_err(|e| super::insert_error(e, &new.tag))?;
            Ok((tx, ()))
        })
        .await
    }

    /// Sets a tag's step. MySQL counts only changed rows, so an unchanged step must not read
    /// as "unknown tag": the row is looked up (and locked) first. The writer is left alone:
    /// only an allocation may say which instance holds the range.
    pub(crate) async fn set_step(
        pool: &Pool<DB>,
        sql: &LockedStatements,
        tag: &str,
        step: i64,
    ) -> Result<(), StoreError> {
        committed(pool, |mut tx| async move {
            let known = sqlx::query(sql.lock).bind(tag).fetch_all(&mut *tx).await?;
            if known.is_empty() {
                return Err(StoreError::UnknownTag(tag.to_string()));
            }
            sqlx::query(sql.set_step)
                .bind(step)
                .bind(tag)
                .execute(&mut *tx)
                .await?;
            Ok((tx, ()))
        })
        .await
    }
}

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
        &'static str: sqlx::ColumnIndex<R>,
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
            self.alloc.opaque.as_deref(),
            &grant.serves,
            self.alloc.max_id,
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
