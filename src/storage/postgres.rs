//! PostgreSQL store: allocation is one `UPDATE … RETURNING`, atomic under the row lock, so
//! concurrent nodes never receive overlapping segments.

use std::collections::HashMap;
use std::str::FromStr;

use async_trait::async_trait;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool};
use sqlx::{Postgres, Row};

use super::committed::{connect_pool, pool_options};
use super::common::SharedSql;
use super::dialect::Dialect;
use super::locked::{InstanceFrom, LockedRow, LockedSql, LockedStatements};
use super::sql_store::SqlStore;
use super::workers::LeaseTable;
use super::{Grant, LeafAlloc, NewTag, StoreError};
use crate::config::StorageConfig;

pub struct PostgresStore {
    pool: PgPool,
}

impl PostgresStore {
    /// Connects (failing fast on a bad URL or credentials) and migrates when asked to.
    pub async fn open(config: &StorageConfig, migrate: bool) -> Result<PostgresStore, StoreError> {
        let pool = match super::pg_hosts::parse(&config.url)? {
            Some(hosts) => super::pg_hosts::connect(config, hosts).await?,
            None => {
                let options = super::session::postgres(PgConnectOptions::from_str(&config.url)?);
                connect_pool(pool_options(config), options).await?
            }
        };
        let mut created = false;
        if migrate {
            created = super::migrate::lease_table_missing(&pool).await?;
            // sqlx holds pg_advisory_lock (which blocks) around the migrations: nodes
            // starting at once wait for each other.
            super::migrate::compatible(sqlx::migrate!("./migrations/postgres"))
                .run(&pool)
                .await?;
        }
        if created {
            LeaseTable::new(pool.clone())
                .record_new_lease_table()
                .await?;
        }
        SharedSql::<sqlx::Postgres>::ensure_identity(&pool, created).await?;
        Ok(PostgresStore { pool })
    }
}

/// The instance a connection reaches, as an SQL expression: the cluster's system identifier
/// and the timeline it writes on. A standby shares the primary's identifier; its promotion
/// starts a new timeline, and so does a point-in-time restore.
macro_rules! instance_sql {
    () => {
        "('postgres:' || (SELECT system_identifier FROM pg_control_system())::text \
         || ':timeline:' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))"
    };
}

/// An allocation in one autocommitted `UPDATE … RETURNING` where the grant and the row allow
/// it ([`super::Grant::single_statement`]): the row lock is held while the statement runs,
/// not across a transaction's round trips. `None`: the statement moved nothing.
async fn one_statement(
    store: &PostgresStore,
    tag: &str,
    grant: &Grant,
) -> Result<Option<LeafAlloc>, StoreError> {
    let Some((step, seen)) = grant.single_statement() else {
        return Ok(None);
    };
    // fetch_all reads to the end of the reply, where a failed commit would show.
    let rows = sqlx::query(concat!(
        "UPDATE leaf_alloc SET max_id = max_id + $1, exclusive_max = max_id + $1, \
         update_time = CURRENT_TIMESTAMP \
         WHERE biz_tag = $2 AND split = $3 AND step = $4 AND opaque IS NULL \
         AND exclusive_max = max_id AND max_id <= 9223372036854775807 - $1 AND writer = ",
        instance_sql!(),
        " RETURNING biz_tag, max_id, step, description, opaque, split"
    ))
    .bind(step)
    .bind(tag)
    .bind(&*seen.record)
    .bind(seen.step)
    .fetch_all(&store.pool)
    .await
    .map_err(|e| super::committed::noted(StoreError::WriteFailed(e)))?;
    let Some(row) = rows.first() else {
        return Ok(None);
    };
    let mut alloc = LeafAlloc::from_row(row)?;
    alloc.first = alloc.max_id - step;
    Ok(Some(alloc))
}

/// The allocations of `requests` (a batch of different tags, see `storage::batch`) in one
/// transaction of four round trips whatever their number: one statement locks every row, in
/// the order of `requests` (which `storage::batch` sorts, and a node that locks its batch row
/// by row follows too), so two batches never wait for each other in a circle;
/// each request is planned as alone ([`LockedRow::allocate`]); one statement writes every row
/// that moved.
async fn allocate_batch(
    store: &PostgresStore,
    requests: &[(String, Grant)],
) -> Result<Vec<Result<LeafAlloc, StoreError>>, StoreError> {
    super::committed::committed(&store.pool, |mut tx| async move {
        let tags: Vec<&str> = requests.iter().map(|(tag, _)| tag.as_str()).collect();
        // Locked in the order of `tags` (FOR UPDATE locks rows as the sort hands them over).
        let rows = sqlx::query(concat!(
            "SELECT biz_tag, max_id, step, description, writer, opaque, exclusive_max, split, ",
            instance_sql!(),
            " AS instance FROM unnest($1::text[]) WITH ORDINALITY AS asked(tag, position) \
             JOIN leaf_alloc ON leaf_alloc.biz_tag = asked.tag \
             ORDER BY asked.position FOR UPDATE OF leaf_alloc"
        ))
        .bind(&tags)
        .fetch_all(&mut *tx)
        .await?;
        // Each row with the instance answering and whether an allocation moved it.
        let mut locked = HashMap::with_capacity(rows.len());
        for row in &rows {
            let current: String = row.try_get("instance")?;
            let row = LockedRow::decode(row, LeafAlloc::from_row)?;
            locked.insert(row.alloc.tag.clone(), (row, current, false));
        }
        let mut out = Vec::with_capacity(requests.len());
        for (tag, grant) in requests {
            let Some((row, current, moved)) = locked.get_mut(tag.as_str()) else {
                out.push(Err(StoreError::UnknownTag(tag.clone())));
                continue;
            };
            let alloc = row.allocate(tag, grant, current);
            *moved |= alloc.is_ok();
            out.push(alloc);
        }
        // Every moved row as its last allocation left it.
        let (mut moved, mut max_ids, mut writers) = (Vec::new(), Vec::new(), Vec::new());
        for (tag, (row, current, _)) in locked.iter().filter(|(_, (_, _, moved))| *moved) {
            moved.push(tag.as_str());
            max_ids.push(row.alloc.max_id);
            writers.push(current.as_str());
        }
        if !moved.is_empty() {
            sqlx::query(
                "UPDATE leaf_alloc AS a SET max_id = v.max_id, exclusive_max = v.max_id, \
                 writer = v.writer, update_time = CURRENT_TIMESTAMP \
                 FROM UNNEST($1::text[], $2::bigint[], $3::text[]) AS v(tag, max_id, writer) \
                 WHERE a.biz_tag = v.tag",
            )
            .bind(&moved)
            .bind(&max_ids)
            .bind(&writers)
            .execute(&mut *tx)
            .await?;
        }
        Ok((tx, out))
    })
    .await
}

/// The statements of a PostgreSQL allocation, tag creation and step change (see
/// [`LockedStatements`]).
const STATEMENTS: LockedStatements = LockedStatements {
    lock: concat!(
        "SELECT biz_tag, max_id, step, description, writer, opaque, exclusive_max, split, ",
        instance_sql!(),
        " AS instance FROM leaf_alloc WHERE biz_tag = $1 FOR UPDATE"
    ),
    advance: "UPDATE leaf_alloc SET max_id = $1, exclusive_max = $2, writer = $3, \
              update_time = CURRENT_TIMESTAMP WHERE biz_tag = $4",
    insert: "INSERT INTO leaf_alloc \
             (biz_tag, max_id, exclusive_max, step, description, writer, split) \
             VALUES ($1, $2, $3, $4::INT, $5, $6, $7)",
    set_step:
        "UPDATE leaf_alloc SET step = $1::INT, update_time = CURRENT_TIMESTAMP WHERE biz_tag = $2",
};

#[async_trait]
impl SqlStore for PostgresStore {
    type DB = Postgres;

    fn pool(&self) -> &PgPool {
        &self.pool
    }

    async fn allocate(&self, tag: &str, grant: Grant) -> Result<LeafAlloc, StoreError> {
        if let Some(alloc) = one_statement(self, tag, &grant).await? {
            return Ok(alloc);
        }
        // The lock statement computes the instance (one round trip less per allocation).
        LockedSql::allocate(
            &self.pool,
            &STATEMENTS,
            tag,
            &grant,
            InstanceFrom::LockedRow,
        )
        .await
    }

    async fn allocate_many(
        &self,
        requests: &[(String, Grant)],
    ) -> Result<Vec<Result<LeafAlloc, StoreError>>, StoreError> {
        allocate_batch(self, requests).await
    }

    async fn rules(&self) -> Result<Vec<(String, Option<String>)>, StoreError> {
        SharedSql::rules(&self.pool).await
    }

    async fn rules_after(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, Option<String>)>, StoreError> {
        SharedSql::rules_after(&self.pool, after, limit).await
    }

    async fn create_tag(&self, new: &NewTag) -> Result<(), StoreError> {
        LockedSql::create_tag(&self.pool, &STATEMENTS, new).await
    }

    async fn set_step(&self, tag: &str, step: i64) -> Result<(), StoreError> {
        LockedSql::set_step(&self.pool, &STATEMENTS, tag, step).await
    }
}

impl Dialect for Postgres {
    const BACKEND: &'static str = "postgres";
    const NOW_MS: &'static str = "CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)";

    fn placeholder(n: usize) -> String {
        format!("${n}")
    }

    /// [`instance_sql`].
    async fn instance(conn: &mut PgConnection) -> Result<String, sqlx::Error> {
        let (id,): (String,) = sqlx::query_as(concat!("SELECT ", instance_sql!()))
            .fetch_one(conn)
            .await?;
        Ok(id)
    }
}
