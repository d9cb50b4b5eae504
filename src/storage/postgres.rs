//! PostgreSQL store: allocation is one `UPDATE … RETURNING`, atomic under the row lock, so
//! concurrent nodes never receive overlapping segments.

use std::str::FromStr;

use sqlx::postgres::{PgConnectOptions, PgPool, PgRow};
use sqlx::Row;

use super::committed::{connect_pool, pool_options};
use super::{LeafAlloc, StoreError};
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
        let store = PostgresStore { pool };
        if created {
            store.record_new_lease_table().await?;
        }
        Ok(store)
    }
}

fn row_to_alloc(row: &PgRow) -> Result<LeafAlloc, sqlx::Error> {
    Ok(LeafAlloc {
        tag: row.try_get("biz_tag")?,
        max_id: row.try_get("max_id")?,
        first: row.try_get("max_id")?,
        step: i64::from(row.try_get::<i32, _>("step")?),
        description: row.try_get("description")?,
        failover: None,
        opaque: row.try_get("opaque")?,
        split: row.try_get("split")?,
        // Only the list selects it.
        update_time: row
            .try_get::<Option<String>, _>("update_time")
            .ok()
            .flatten()
            .map(|t| t.trim().to_string()),
    })
}

/// The instance a connection reaches: the cluster's system identifier and the timeline it
/// writes on. A standby shares the primary's identifier; its promotion starts a new timeline,
/// and so does a point-in-time restore.
async fn instance(conn: &mut sqlx::PgConnection) -> Result<String, sqlx::Error> {
    let (id,): (String,) = sqlx::query_as(
        "SELECT 'postgres:' || system_identifier::text || ':timeline:' \
         || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8) FROM pg_control_system()",
    )
    .fetch_one(conn)
    .await?;
    Ok(id)
}

/// [`instance`], computed by the lock statement itself (one round trip less per allocation).
async fn locked_instance(
    _store: &PostgresStore,
    _conn: &mut sqlx::PgConnection,
    row: &sqlx::postgres::PgRow,
) -> Result<String, sqlx::Error> {
    sqlx::Row::try_get(row, "instance")
}

super::locked::locked_segment_store!(
    PostgresStore,
    backend: "postgres",
    row: row_to_alloc,
    placeholder: super::workers::dollar,
    instance: instance,
    locked_instance: locked_instance,
    lock: "SELECT biz_tag, max_id, step, description, writer, opaque, exclusive_max, split, \
           'postgres:' || (SELECT system_identifier FROM pg_control_system())::text \
           || ':timeline:' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8) AS instance \
           FROM leaf_alloc \
           WHERE biz_tag = $1 FOR UPDATE",
    advance: "UPDATE leaf_alloc SET max_id = $1, exclusive_max = $2, writer = $3, \
              update_time = CURRENT_TIMESTAMP WHERE biz_tag = $4",
    insert: "INSERT INTO leaf_alloc \
             (biz_tag, max_id, exclusive_max, step, description, writer, split) \
             VALUES ($1, $2, $3, $4::INT, $5, $6, $7)",
    set_step: "UPDATE leaf_alloc SET step = $1::INT, update_time = CURRENT_TIMESTAMP WHERE biz_tag = $2",
);

/// The database's clock in UNIX milliseconds.
const DB_NOW_MS: &str = "CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)";

super::workers::worker_lease_store!(PostgresStore, DB_NOW_MS, super::workers::dollar, instance);
