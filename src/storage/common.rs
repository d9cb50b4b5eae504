//! The statements the SQL dialects' `SegmentStore`s run alike, whatever their allocation: list
//! the table, record a tag's opaque-ID key and residue class, guard the tag count.

use std::marker::PhantomData;

use sqlx::{ColumnIndex, Decode, Encode, Executor, IntoArguments, Pool, Row, Transaction, Type};

use super::committed::committed;
use super::dialect::Dialect;
use super::{Grant, LeafAlloc, StoreError};

/// How many rows a statement changed: each sqlx dialect reports it by a method of its own.
pub(crate) trait RowsAffected {
    fn rows_affected(&self) -> u64;
}

impl RowsAffected for sqlx::mysql::MySqlQueryResult {
    fn rows_affected(&self) -> u64 {
        self.rows_affected()
    }
}

impl RowsAffected for sqlx::postgres::PgQueryResult {
    fn rows_affected(&self) -> u64 {
        self.rows_affected()
    }
}

impl RowsAffected for sqlx::sqlite::SqliteQueryResult {
    fn rows_affected(&self) -> u64 {
        self.rows_affected()
    }
}

/// The statements every SQL dialect runs alike, as functions generic over sqlx's database
/// (the bounds say once what they need of it: `leaf_alloc`'s columns decode, text and
/// integers bind).
pub(crate) struct SharedSql<DB>(PhantomData<DB>);

impl<DB> SharedSql<DB>
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
    pub(crate) async fn list(pool: &Pool<DB>) -> Result<Vec<LeafAlloc>, StoreError> {
        let rows = sqlx::query(super::LIST_ROWS).fetch_all(pool).await?;
        Ok(rows
            .iter()
            .map(LeafAlloc::from_row)
            .collect::<Result<Vec<_>, _>>()?)
    }

    /// The tag list, `(tag, recorded rule)`.
    pub(crate) async fn rules(
        pool: &Pool<DB>,
    ) -> Result<Vec<(String, Option<String>)>, StoreError> {
        let rows = sqlx::query("SELECT biz_tag, split FROM leaf_alloc")
            .fetch_all(pool)
            .await?;
        Ok(rows
            .iter()
            .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
            .collect::<Result<Vec<_>, sqlx::Error>>()?)
    }

    /// [`super::SegmentStore::rules_after`]: keyset pages in the column's own collation (whose
    /// order is the one `>` follows, so every row is read once).
    pub(crate) async fn rules_after(
        pool: &Pool<DB>,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, Option<String>)>, StoreError> {
        let rows = match after {
            None => {
                let sql =
                    format!("SELECT biz_tag, split FROM leaf_alloc ORDER BY biz_tag LIMIT {limit}");
                sqlx::query(&sql).fetch_all(pool).await?
            }
            Some(after) => {
                let sql = format!(
                    "SELECT biz_tag, split FROM leaf_alloc WHERE biz_tag > {} ORDER BY biz_tag LIMIT {limit}",
                    DB::placeholder(1)
                );
                sqlx::query(&sql).bind(after).fetch_all(pool).await?
            }
        };
        Ok(rows
            .iter()
            .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
            .collect::<Result<Vec<_>, sqlx::Error>>()?)
    }

    pub(crate) async fn row(pool: &Pool<DB>, tag: &str) -> Result<Option<LeafAlloc>, StoreError> {
        let p = DB::placeholder;
        let sql = format!("{}{}", super::ONE_ROW, p(1));
        let rows = sqlx::query(&sql).bind(tag).fetch_all(pool).await?;
        Ok(rows.first().map(LeafAlloc::from_row).transpose()?)
    }

    /// Records `marker` as the tag's opaque-ID key unless one is recorded, `max_id` reached
    /// `below` or the row records strict order or a period (refused, nothing written); the
    /// record and `max_id` after.
    pub(crate) async fn claim_opaque(
        pool: &Pool<DB>,
        tag: &str,
        marker: &str,
        below: i64,
    ) -> Result<(Option<String>, i64), StoreError> {
        let p = DB::placeholder;
        let claim = format!(
            "UPDATE leaf_alloc SET opaque = {} WHERE biz_tag = {} AND opaque IS NULL AND max_id < {} AND (split IS NULL OR (split NOT LIKE 'order:%' AND split NOT LIKE 'period:%'))",
            p(1),
            p(2),
            p(3)
        );
        let read = format!(
            "SELECT opaque, max_id, split FROM leaf_alloc WHERE biz_tag = {}",
            p(1)
        );
        let (claim, read) = (&claim, &read);
        committed(pool, |mut tx| async move {
            sqlx::query(claim)
                .bind(marker)
                .bind(tag)
                .bind(below)
                .execute(&mut *tx)
                .await?;
            let row = Self::read_back(&mut tx, read, tag).await?;
            let (opaque, max_id, split): (Option<String>, i64, Option<String>) =
                (row.try_get(0)?, row.try_get(1)?, row.try_get(2)?);
            super::opaque_claimable(tag, split.as_deref())?;
            Ok((tx, (opaque, max_id)))
        })
        .await
    }

    /// Moves the tag's residue-class record to `split` when it is `expected`; the record after.
    pub(crate) async fn claim_split(
        pool: &Pool<DB>,
        tag: &str,
        expected: Option<&str>,
        split: Option<&str>,
    ) -> Result<Option<String>, StoreError> {
        let p = DB::placeholder;
        let claim = match expected {
            Some(_) => format!(
                "UPDATE leaf_alloc SET split = {} WHERE biz_tag = {} AND split = {}",
                p(1),
                p(2),
                p(3)
            ),
            None => format!(
                "UPDATE leaf_alloc SET split = {} WHERE biz_tag = {} AND split IS NULL",
                p(1),
                p(2)
            ),
        };
        let read = format!("SELECT split FROM leaf_alloc WHERE biz_tag = {}", p(1));
        let (claim, read) = (&claim, &read);
        committed(pool, |mut tx| async move {
            let mut query = sqlx::query(claim).bind(split).bind(tag);
            if let Some(expected) = expected {
                query = query.bind(expected);
            }
            query.execute(&mut *tx).await?;
            let row = Self::read_back(&mut tx, read, tag).await?;
            Ok((tx, row.try_get(0)?))
        })
        .await
    }

    /// Records `split` as the tag's residue class and moves `max_id` up to `start` (never down):
    /// a re-split; `max_id` after.
    pub(crate) async fn resplit(
        pool: &Pool<DB>,
        tag: &str,
        split: Option<&str>,
        start: i64,
    ) -> Result<i64, StoreError> {
        let p = DB::placeholder;
        let record = format!(
            "UPDATE leaf_alloc SET split = {} WHERE biz_tag = {}",
            p(1),
            p(2)
        );
        let (record, [update, read]) = (&record, &move_up_sql(p));
        committed(pool, |mut tx| async move {
            sqlx::query(record)
                .bind(split)
                .bind(tag)
                .execute(&mut *tx)
                .await?;
            sqlx::query(update)
                .bind(start)
                .bind(start)
                .bind(start)
                .bind(start)
                .bind(tag)
                .execute(&mut *tx)
                .await?;
            let row = Self::read_back(&mut tx, read, tag).await?;
            Ok((tx, row.try_get(0)?))
        })
        .await
    }

    /// Moves a period tag's `max_id` up to `floor` (never down) unless its row records another
    /// period rule than `record` (this node's whole rule), recording it on a row that records
    /// none; `max_id` after.
    pub(crate) async fn raise(
        pool: &Pool<DB>,
        tag: &str,
        floor: i64,
        record: &str,
    ) -> Result<i64, StoreError> {
        let p = DB::placeholder;
        let (guarded, read) = &raise_sql(p);
        // The statement compares the calendar and digits; the time zone is checked on the row
        // it read, and a refusal rolls the raise back (its record with it).
        let position = super::position_marker(record);
        let like = format!("{position}:%");
        let like = &like;
        committed(pool, |mut tx| async move {
            sqlx::query(guarded)
                .bind(floor)
                .bind(floor)
                .bind(floor)
                .bind(floor)
                .bind(position)
                .bind(record)
                .bind(tag)
                .bind(position)
                .bind(like.as_str())
                .execute(&mut *tx)
                .await?;
            let row = Self::read_back(&mut tx, read, tag).await?;
            let (max_id, split, opaque): (i64, Option<String>, Option<String>) =
                (row.try_get(0)?, row.try_get(1)?, row.try_get(2)?);
            let serves = super::Serves::Period(super::served_marker(record).into());
            let (split, opaque) = (split.as_deref(), opaque.as_deref());
            if let Some(refused) = super::refused_rule(tag, split, opaque, &serves, max_id) {
                return Err(refused);
            }
            Ok((tx, max_id))
        })
        .await
    }

    /// The start of every tag creation, inside its transaction: takes the `leafd_guard` row
    /// (putting it back if it is missing), then counts the tags; `Err(TagLimit)` at `max_tags`.
    pub(crate) async fn guard_tag_count(
        tx: &mut Transaction<'static, DB>,
        max_tags: usize,
    ) -> Result<(), StoreError> {
        let guarded = sqlx::query(super::GUARD_TAGS).execute(&mut **tx).await?;
        if guarded.rows_affected() == 0 {
            sqlx::query(super::RESTORE_GUARD).execute(&mut **tx).await?;
        }
        let row = sqlx::query(super::COUNT_TAGS).fetch_one(&mut **tx).await?;
        let count: i64 = row.try_get(0)?;
        if count >= i64::try_from(max_tags).unwrap_or(i64::MAX) {
            return Err(StoreError::TagLimit {
                count,
                limit: max_tags,
            });
        }
        Ok(())
    }

    /// One allocation by a dialect's `UPDATE … RETURNING` (`allocate`, then `exists` when it
    /// moved nothing: see `returning_segment_store!` for what they bind), inside `tx`: `Err`
    /// for a statement that failed, `Ok(Err(_))` for a refusal that moved nothing (unknown tag,
    /// another rule, the end of a period).
    pub(crate) async fn allocate_returning(
        tx: &mut Transaction<'static, DB>,
        tag: &str,
        grant: &Grant,
        allocate: &str,
        exists: &str,
    ) -> Result<Result<LeafAlloc, StoreError>, StoreError> {
        let step = grant.step;
        // The statement takes the write lock at once (a read first would have to upgrade its
        // lock, which SQLite refuses to a second writer); a row whose record the caller may
        // not move under is put back to the savepoint, in the same transaction.
        sqlx::query("SAVEPOINT leafd_allocation")
            .execute(&mut **tx)
            .await?;
        let window = grant.window;
        // fetch_all steps the statement to its end, where its changes are written.
        let rows = sqlx::query(allocate)
            .bind(step)
            .bind(tag)
            .bind(window.map(|w| w.span))
            .bind(window.map(|w| w.usable))
            .bind(grant.serves.period_marker())
            .fetch_all(&mut **tx)
            .await?;
        let outcome = match rows.first() {
            Some(row) => {
                let mut alloc = LeafAlloc::from_row(row)?;
                alloc.first = alloc.max_id - step.unwrap_or(alloc.step);
                let (split, opaque) = (alloc.split.as_deref(), alloc.opaque.as_deref());
                match super::refused_rule(tag, split, opaque, &grant.serves, alloc.first) {
                    Some(refused) => {
                        sqlx::query("ROLLBACK TO leafd_allocation")
                            .execute(&mut **tx)
                            .await?;
                        Err(refused)
                    }
                    None => Ok(alloc),
                }
            }
            None => {
                let row = Self::exists_row(tx, exists, tag).await?;
                Err(super::not_allocated(row, tag, grant))
            }
        };
        sqlx::query("RELEASE leafd_allocation")
            .execute(&mut **tx)
            .await?;
        Ok(outcome)
    }

    /// The row as `exists` reads it (`max_id`, `exclusive_max`, `step`, `split`).
    async fn exists_row(
        tx: &mut Transaction<'static, DB>,
        exists: &str,
        tag: &str,
    ) -> Result<Option<super::error::AllocRow>, StoreError> {
        let row = sqlx::query(exists)
            .bind(tag)
            .fetch_optional(&mut **tx)
            .await?;
        Ok(match row {
            Some(row) => Some((
                row.try_get(0)?,
                row.try_get(1)?,
                row.try_get(2)?,
                row.try_get(3)?,
            )),
            None => None,
        })
    }

    /// The tag's row as `read` (binding the tag) selects it after a change in `tx`: the
    /// unknown-tag error when the table has none.
    async fn read_back(
        tx: &mut Transaction<'static, DB>,
        read: &str,
        tag: &str,
    ) -> Result<DB::Row, StoreError> {
        sqlx::query(read)
            .bind(tag)
            .fetch_optional(&mut **tx)
            .await?
            .ok_or_else(|| StoreError::UnknownTag(tag.to_string()))
    }

    /// The newest migration applied (`None` before the first, or when it cannot be read).
    /// Writes the database's identity unless a row is there (a random id; `created`: this
    /// start made the schema, so no ID was served from it before), then reads it back.
    /// `None` when the table is missing (an older schema not migrated).
    pub(crate) async fn ensure_identity(
        pool: &Pool<DB>,
        created: bool,
    ) -> Result<Option<super::DbIdentity>, StoreError> {
        let p = DB::placeholder;
        let id = format!("{:032x}", fastrand::u128(..));
        let insert = format!(
            "INSERT INTO leafd_identity (slot, id, origin) VALUES (1, {}, {})",
            p(1),
            p(2)
        );
        let origin = if created { "new" } else { "upgrade" };
        match sqlx::query(&insert)
            .bind(id.as_str())
            .bind(origin)
            .execute(pool)
            .await
        {
            Ok(_) => {}
            Err(sqlx::Error::Database(db)) if db.is_unique_violation() => {}
            Err(e) if super::migrate::missing_table(&e) => return Ok(None),
            Err(e) => return Err(e.into()),
        }
        Self::identity(pool).await
    }

    /// The database's identity row (`None`: no table, or no row yet).
    pub(crate) async fn identity(pool: &Pool<DB>) -> Result<Option<super::DbIdentity>, StoreError> {
        let rows = match sqlx::query("SELECT id, origin FROM leafd_identity WHERE slot = 1")
            .fetch_all(pool)
            .await
        {
            Ok(rows) => rows,
            Err(e) if super::migrate::missing_table(&e) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        let (id, origin): (String, String) = (row.try_get(0)?, row.try_get(1)?);
        // An id is what leafd writes: a value edited into something else names no database.
        if id.is_empty() || id.len() > 64 || !id.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return Err(StoreError::Unavailable(format!(
                "leafd_identity holds the id '{id}', which no leafd wrote: restore the row, or delete it so the next start writes a new one (the marks of the old id then no longer apply)"
            )));
        }
        Ok(Some(super::DbIdentity {
            id,
            inherits: origin != "new",
        }))
    }

    pub(crate) async fn schema_version(pool: &Pool<DB>) -> Option<i64> {
        let row = sqlx::query("SELECT MAX(version) FROM _sqlx_migrations")
            .fetch_one(pool)
            .await
            .ok()?;
        row.try_get::<Option<i64>, _>(0).ok().flatten()
    }
}
/// The statements that move a tag's `max_id` (and `exclusive_max`, so the next allocation
/// starts exactly there) up to a floor, leaving a higher value alone; then read it back.
/// `exclusive_max` comes first: MySQL's SET sees the values assigned to its left.
fn move_up_sql(p: fn(usize) -> String) -> [String; 2] {
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

/// [`move_up_sql`] for a period tag entering a period under the rule whose calendar and digits
/// are bound 5th and 8th (and, with `:%` appended, 9th): a row that records another rule (or has
/// an opaque key) is not moved. A row that records no rule, or only the calendar and digits (an
/// older release's record), records the node's whole rule (bound 6th) in the same write, so the
/// move and the record cannot be split by another node's (two nodes in different zones racing
/// on an unrecorded row). The read returns `max_id`, `split` and `opaque`, so the caller can tell.
fn raise_sql(p: fn(usize) -> String) -> (String, String) {
    (
        format!(
            "UPDATE leaf_alloc SET \
             exclusive_max = CASE WHEN max_id < {} THEN {} ELSE exclusive_max END, \
             max_id = CASE WHEN max_id < {} THEN {} ELSE max_id END, \
             split = CASE WHEN split IS NULL OR split = {} THEN {} ELSE split END \
             WHERE biz_tag = {} AND opaque IS NULL AND (split IS NULL OR split = {} OR split LIKE {})",
            p(1),
            p(2),
            p(3),
            p(4),
            p(5),
            p(6),
            p(7),
            p(8),
            p(9)
        ),
        format!(
            "SELECT max_id, split, opaque FROM leaf_alloc WHERE biz_tag = {}",
            p(1)
        ),
    )
}
