//! MySQL / MariaDB store: allocation is `UPDATE` then `SELECT` in one InnoDB transaction; the
//! row lock taken by the update keeps concurrent nodes' segments apart.

use std::str::FromStr;

use async_trait::async_trait;
use sqlx::mysql::{MySqlConnectOptions, MySqlPool, MySqlPoolOptions, MySqlRow};
use sqlx::Row;

use super::{insert_error, not_allocated, LeafAlloc, SegmentStore, StoreError};
use crate::config::StorageConfig;

pub struct MySqlStore {
    pool: MySqlPool,
}

impl MySqlStore {
    /// Connects (failing fast on a bad URL or credentials) and migrates when asked to.
    pub async fn open(config: &StorageConfig, migrate: bool) -> Result<MySqlStore, StoreError> {
        let options = MySqlConnectOptions::from_str(&config.url)?;
        let pool = MySqlPoolOptions::new()
            .max_connections(config.max_connections)
            .acquire_timeout(config.acquire_timeout())
            .connect_with(options)
            .await?;
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
        let mut tx = self.pool.begin().await?;
        let updated = sqlx::query(
            "UPDATE leaf_alloc SET max_id = max_id + COALESCE(?, step) \
             WHERE biz_tag = ? AND max_id <= 9223372036854775807 - COALESCE(?, step)",
        )
        .bind(step)
        .bind(tag)
        .bind(step)
        .execute(&mut *tx)
        .await?;
        if updated.rows_affected() == 0 {
            let exists = sqlx::query("SELECT 1 FROM leaf_alloc WHERE biz_tag = ?")
                .bind(tag)
                .fetch_optional(&mut *tx)
                .await?
                .is_some();
            return Err(not_allocated(exists, tag));
        }
        let row = sqlx::query(&format!("{SELECT_ROW} WHERE biz_tag = ?"))
            .bind(tag)
            .fetch_one(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(row_to_alloc(&row)?)
    }

    async fn list(&self) -> Result<Vec<LeafAlloc>, StoreError> {
        let rows = sqlx::query(&format!("{SELECT_ROW} ORDER BY biz_tag"))
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
        sqlx::query(
            "INSERT INTO leaf_alloc (biz_tag, max_id, step, description) VALUES (?, ?, ?, ?)",
        )
        .bind(tag)
        .bind(max_id)
        .bind(step)
        .bind(description)
        .execute(&self.pool)
        .await
        .map_err(|e| insert_error(e, tag))?;
        Ok(())
    }

    async fn set_step(&self, tag: &str, step: i64) -> Result<(), StoreError> {
        // MySQL counts only changed rows, so an unchanged step must not read as "unknown tag".
        let known = sqlx::query(&format!("{SELECT_ROW} WHERE biz_tag = ?"))
            .bind(tag)
            .fetch_optional(&self.pool)
            .await?
            .is_some();
        if !known {
            return Err(StoreError::UnknownTag(tag.to_string()));
        }
        sqlx::query("UPDATE leaf_alloc SET step = ? WHERE biz_tag = ?")
            .bind(step)
            .bind(tag)
            .execute(&self.pool)
            .await?;
        Ok(())
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
