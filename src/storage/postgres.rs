//! PostgreSQL store: allocation is one `UPDATE … RETURNING`, atomic under the row lock, so
//! concurrent nodes never receive overlapping segments.

use std::str::FromStr;

use async_trait::async_trait;
use sqlx::postgres::{PgConnectOptions, PgPool, PgRow};
use sqlx::Row;

use super::committed::{committed, pool_options};
use super::{insert_error, not_allocated, LeafAlloc, SegmentStore, StoreError};
use crate::config::StorageConfig;

pub struct PostgresStore {
    pool: PgPool,
}

impl PostgresStore {
    /// Connects (failing fast on a bad URL or credentials) and migrates when asked to.
    pub async fn open(config: &StorageConfig, migrate: bool) -> Result<PostgresStore, StoreError> {
        let options = PgConnectOptions::from_str(&config.url)?;
        let pool = pool_options(config).connect_with(options).await?;
        if migrate {
            sqlx::migrate!("./migrations/postgres").run(&pool).await?;
        }
        Ok(PostgresStore { pool })
    }
}

fn row_to_alloc(row: &PgRow) -> Result<LeafAlloc, sqlx::Error> {
    Ok(LeafAlloc {
        tag: row.try_get("biz_tag")?,
        max_id: row.try_get("max_id")?,
        step: i64::from(row.try_get::<i32, _>("step")?),
        description: row.try_get("description")?,
    })
}

#[async_trait]
impl SegmentStore for PostgresStore {
    async fn allocate(&self, tag: &str, step: Option<i64>) -> Result<LeafAlloc, StoreError> {
        committed(&self.pool, |mut tx| async move {
            let rows = sqlx::query(
                "UPDATE leaf_alloc SET max_id = max_id + COALESCE($1::BIGINT, step), \
                 update_time = CURRENT_TIMESTAMP \
                 WHERE biz_tag = $2 AND max_id <= 9223372036854775807 - COALESCE($1::BIGINT, step) \
                 RETURNING biz_tag, max_id, step, description",
            )
            .bind(step)
            .bind(tag)
            .fetch_all(&mut *tx)
            .await?;
            match rows.first() {
                Some(row) => {
                    let alloc = row_to_alloc(row)?;
                    Ok((tx, alloc))
                }
                None => {
                    let exists = sqlx::query("SELECT 1 FROM leaf_alloc WHERE biz_tag = $1")
                        .bind(tag)
                        .fetch_all(&mut *tx)
                        .await?;
                    Err(not_allocated(!exists.is_empty(), tag))
                }
            }
        })
        .await
    }

    async fn list(&self) -> Result<Vec<LeafAlloc>, StoreError> {
        let rows = sqlx::query(
            "SELECT biz_tag, max_id, step, description FROM leaf_alloc ORDER BY biz_tag",
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.iter().map(row_to_alloc).collect::<Result<_, _>>()?)
    }

    async fn create_tag(
        &self,
        tag: &str,
        step: i64,
        max_id: i64,
        description: Option<&str>,
    ) -> Result<(), StoreError> {
        committed(&self.pool, |mut tx| async move {
            sqlx::query(
                "INSERT INTO leaf_alloc (biz_tag, max_id, step, description) VALUES ($1, $2, $3::INT, $4)",
            )
            .bind(tag)
            .bind(max_id)
            .bind(step)
            .bind(description)
            .execute(&mut *tx)
            .await
            .map_err(|e| insert_error(e, tag))?;
            Ok((tx, ()))
        })
        .await
    }

    async fn set_step(&self, tag: &str, step: i64) -> Result<(), StoreError> {
        committed(&self.pool, |mut tx| async move {
            let done = sqlx::query(
                "UPDATE leaf_alloc SET step = $1::INT, update_time = CURRENT_TIMESTAMP WHERE biz_tag = $2",
            )
            .bind(step)
            .bind(tag)
            .execute(&mut *tx)
            .await?;
            if done.rows_affected() == 0 {
                return Err(StoreError::UnknownTag(tag.to_string()));
            }
            Ok((tx, ()))
        })
        .await
    }

    fn backend(&self) -> &'static str {
        "postgres"
    }

    async fn close(&self) {
        self.pool.close().await;
    }

    fn worker_leases(
        self: std::sync::Arc<Self>,
    ) -> Option<std::sync::Arc<dyn super::WorkerLeaseStore>> {
        Some(self)
    }
}

/// The database's clock in UNIX milliseconds.
const DB_NOW_MS: &str = "CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)";

super::workers::worker_lease_store!(PostgresStore, DB_NOW_MS, super::workers::dollar);
