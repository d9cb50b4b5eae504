//! MySQL / MariaDB store: allocation is `UPDATE` then `SELECT` in one InnoDB transaction; the
//! row lock taken by the update keeps concurrent nodes' segments apart.

use std::str::FromStr;

use async_trait::async_trait;
use sqlx::mysql::{MySqlConnectOptions, MySqlPool, MySqlRow};
use sqlx::Row;

use super::committed::{committed, pool_options};
use super::{insert_error, not_allocated, LeafAlloc, SegmentStore, StoreError};
use crate::config::StorageConfig;

pub struct MySqlStore {
    pool: MySqlPool,
}

impl MySqlStore {
    /// Connects (failing fast on a bad URL or credentials) and migrates when asked to.
    pub async fn open(config: &StorageConfig, migrate: bool) -> Result<MySqlStore, StoreError> {
        let options = MySqlConnectOptions::from_str(&config.url)?;
        let pool = pool_options(config).connect_with(options).await?;
        if migrate {
            sqlx::migrate!("./migrations/mysql").run(&pool).await?;
        }
        Ok(MySqlStore { pool })
    }
}

fn row_to_alloc(row: &MySqlRow) -> Result<LeafAlloc, sqlx::Error> {
    Ok(LeafAlloc {
        tag: row.try_get("biz_tag")?,
        max_id: row.try_get("max_id")?,
        step: i64::from(row.try_get::<i32, _>("step")?),
        description: row.try_get("description")?,
    })
}

const SELECT_ROW: &str = "SELECT biz_tag, max_id, step, description FROM leaf_alloc";

#[async_trait]
impl SegmentStore for MySqlStore {
    async fn allocate(&self, tag: &str, step: Option<i64>) -> Result<LeafAlloc, StoreError> {
        committed(&self.pool, |mut tx| async move {
            let updated = sqlx::query(
                "UPDATE leaf_alloc SET max_id = max_id + COALESCE(?, step) \
                 WHERE biz_tag = ? AND max_id <= 9223372036854775807 - COALESCE(?, step)",
            )
            .bind(step)
            .bind(tag)
            .bind(step)
            .execute(&mut *tx)
            .await?;
            let rows = sqlx::query(&format!("{SELECT_ROW} WHERE biz_tag = ?"))
                .bind(tag)
                .fetch_all(&mut *tx)
                .await?;
            match rows.first() {
                Some(row) if updated.rows_affected() == 1 => {
                    let alloc = row_to_alloc(row)?;
                    Ok((tx, alloc))
                }
                found => Err(not_allocated(found.is_some(), tag)),
            }
        })
        .await
    }

    async fn list(&self) -> Result<Vec<LeafAlloc>, StoreError> {
        let rows = sqlx::query(super::LIST_ROWS).fetch_all(&self.pool).await?;
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
                "INSERT INTO leaf_alloc (biz_tag, max_id, step, description) VALUES (?, ?, ?, ?)",
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
            // MySQL counts only changed rows, so an unchanged step must not read as "unknown
            // tag": the row is looked up (and locked) first.
            let known = sqlx::query(&format!("{SELECT_ROW} WHERE biz_tag = ? FOR UPDATE"))
                .bind(tag)
                .fetch_all(&mut *tx)
                .await?;
            if known.is_empty() {
                return Err(StoreError::UnknownTag(tag.to_string()));
            }
            sqlx::query("UPDATE leaf_alloc SET step = ? WHERE biz_tag = ?")
                .bind(step)
                .bind(tag)
                .execute(&mut *tx)
                .await?;
            Ok((tx, ()))
        })
        .await
    }

    fn backend(&self) -> &'static str {
        "mysql"
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
const DB_NOW_MS: &str = "CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED)";

super::workers::worker_lease_store!(MySqlStore, DB_NOW_MS, super::workers::question);
