//! MySQL / MariaDB store: allocation is `UPDATE` then `SELECT` in one InnoDB transaction; the
//! row lock taken by the update keeps concurrent nodes' segments apart.

use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use sqlx::mysql::{MySqlConnectOptions, MySqlConnection, MySqlPool};
use sqlx::MySql;

use super::committed::{connect_pool, pool_options};
use super::common::SharedSql;
use super::dialect::Dialect;
use super::locked::{InstanceFrom, LockedSql, LockedStatements};
use super::sql_store::SqlStore;
use super::workers::LeaseTable;
use super::{Grant, LeafAlloc, NewTag, StoreError};
use crate::config::StorageConfig;

pub struct MySqlStore {
    pool: MySqlPool,
    /// Set once any connection found a Galera cluster: its instance is the cluster's state
    /// UUID, read by its own statement; otherwise the server id comes with the locked row.
    galera: Arc<AtomicBool>,
}

impl MySqlStore {
    /// Connects (failing fast on a bad URL or credentials) and migrates when asked to.
    pub async fn open(config: &StorageConfig, migrate: bool) -> Result<MySqlStore, StoreError> {
        let options = MySqlConnectOptions::from_str(&config.url)?;
        let galera = Arc::new(AtomicBool::new(false));
        let seen = galera.clone();
        let pool = pool_options::<sqlx::MySql>(config).after_connect(move |conn, _| {
            let seen = seen.clone();
            Box::pin(async move {
                super::session::mysql(conn).await?;
                // A server joins or leaves a Galera cluster only by restarting, which closes
                // every connection: each new one looks again.
                if galera_uuid(conn).await?.is_some() {
                    seen.store(true, Ordering::Relaxed);
                }
                Ok(())
            })
        });
        let pool = connect_pool(pool, options).await?;
        let mut created = false;
        if migrate {
            created = super::migrate::lease_table_missing(&pool).await?;
            super::migrate::mysql(&pool, sqlx::migrate!("./migrations/mysql")).await?;
        }
        if created {
            LeaseTable::new(pool.clone())
                .record_new_lease_table()
                .await?;
        }
        SharedSql::<sqlx::MySql>::ensure_identity(&pool, created).await?;
        Ok(MySqlStore { pool, galera })
    }
}

/// The instance a server outside Galera is, as an SQL expression: its server id, which
/// replication requires to differ between a primary and its replicas.
macro_rules! server_instance_sql {
    () => {
        "CONCAT('mysql:server_id:', CAST(@@server_id AS CHAR))"
    };
}

/// An allocation in one autocommitted `UPDATE` where the grant and the row allow it
/// ([`super::Grant::single_statement`]), outside Galera (whose instance takes a statement of
/// its own): the row lock is held while the statement runs, not across a transaction's round
/// trips. The new `max_id` comes back in the reply's last-insert id (`LAST_INSERT_ID(expr)`),
/// the rest is what the statement required the row to show. `None`: it moved nothing.
async fn one_statement(
    store: &MySqlStore,
    tag: &str,
    grant: &Grant,
) -> Result<Option<LeafAlloc>, StoreError> {
    let Some((step, seen)) = grant.single_statement() else {
        return Ok(None);
    };
    if store.galera.load(Ordering::Relaxed) {
        return Ok(None);
    }
    // `exclusive_max` first: it reads the old `max_id` whether the server assigns left to right
    // (the default) or all at once (sql_mode SIMULTANEOUS_ASSIGNMENT). The texts compare as
    // bytes, as the locked transaction compares them (and whatever the columns' collation).
    let done = sqlx::query(concat!(
        "UPDATE leaf_alloc SET exclusive_max = max_id + ?, max_id = LAST_INSERT_ID(max_id + ?) \
         WHERE biz_tag = ? AND CAST(split AS BINARY) = CAST(? AS BINARY) AND step = ? \
         AND opaque IS NULL AND exclusive_max = max_id \
         AND max_id >= 0 AND max_id <= 9223372036854775807 - ? \
         AND CAST(writer AS BINARY) = CAST(",
        server_instance_sql!(),
        " AS BINARY)"
    ))
    .bind(step)
    .bind(step)
    .bind(tag)
    .bind(&*seen.record)
    .bind(seen.step)
    .bind(step)
    .execute(&store.pool)
    .await
    .map_err(|e| super::committed::noted(StoreError::WriteFailed(e)))?;
    if done.rows_affected() != 1 {
        return Ok(None);
    }
    // The row's max_id was at least 0, so the new one is at least the step: anything else is a
    // server that does not report LAST_INSERT_ID(expr), whose range must not be used.
    let max_id = i64::try_from(done.last_insert_id())
        .ok()
        .filter(|max_id| *max_id >= step)
        .ok_or_else(|| {
            StoreError::Unavailable(format!(
                "the allocation of '{tag}' reported max_id {}, below its step {step}: the server does not return LAST_INSERT_ID(expr)",
                done.last_insert_id()
            ))
        })?;
    Ok(Some(LeafAlloc {
        tag: tag.to_string(),
        max_id,
        first: max_id - step,
        step: seen.step,
        description: None,
        failover: None,
        opaque: None,
        split: Some(seen.record.to_string()),
        update_time: None,
    }))
}

/// The state UUID of the Galera cluster the server belongs to, if it does.
async fn galera_uuid(conn: &mut MySqlConnection) -> Result<Option<String>, sqlx::Error> {
    let galera: Vec<(String, String)> =
        sqlx::query_as("SHOW GLOBAL STATUS LIKE 'wsrep_cluster_state_uuid'")
            .fetch_all(&mut *conn)
            .await?;
    Ok(galera
        .into_iter()
        .map(|(_, uuid)| uuid)
        .find(|uuid| !uuid.is_empty()))
}

/// The statements of a MySQL allocation, tag creation and step change (see
/// [`LockedStatements`]).
const STATEMENTS: LockedStatements = LockedStatements {
    lock: concat!(
        "SELECT biz_tag, max_id, step, description, writer, opaque, exclusive_max, split, ",
        server_instance_sql!(),
        " AS instance FROM leaf_alloc WHERE biz_tag = ? FOR UPDATE"
    ),
    advance: "UPDATE leaf_alloc SET max_id = ?, exclusive_max = ?, writer = ? WHERE biz_tag = ?",
    insert: "INSERT INTO leaf_alloc \
             (biz_tag, max_id, exclusive_max, step, description, writer, split) \
             VALUES (?, ?, ?, ?, ?, ?, ?)",
    set_step: "UPDATE leaf_alloc SET step = ? WHERE biz_tag = ?",
};

impl MySqlStore {
    /// Where an allocation learns the instance: a server outside Galera gives its id in the
    /// lock statement (two round trips less per allocation).
    fn instance_from(&self) -> InstanceFrom {
        if self.galera.load(Ordering::Relaxed) {
            InstanceFrom::OwnStatement
        } else {
            InstanceFrom::LockedRow
        }
    }
}

#[async_trait]
impl SqlStore for MySqlStore {
    type DB = MySql;

    fn pool(&self) -> &MySqlPool {
        &self.pool
    }

    async fn allocate(&self, tag: &str, grant: Grant) -> Result<LeafAlloc, StoreError> {
        if let Some(alloc) = one_statement(self, tag, &grant).await? {
            return Ok(alloc);
        }
        LockedSql::allocate(&self.pool, &STATEMENTS, tag, &grant, self.instance_from()).await
    }

    async fn allocate_many(
        &self,
        requests: &[(String, Grant)],
    ) -> Result<Vec<Result<LeafAlloc, StoreError>>, StoreError> {
        LockedSql::allocate_each(&self.pool, &STATEMENTS, requests, self.instance_from()).await
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

impl Dialect for MySql {
    const BACKEND: &'static str = "mysql";
    const NOW_MS: &'static str = "CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED)";

    fn placeholder(_: usize) -> String {
        "?".into()
    }

    /// A Galera cluster's state UUID (every node of it holds every commit), otherwise
    /// [`server_instance_sql`].
    async fn instance(conn: &mut MySqlConnection) -> Result<String, sqlx::Error> {
        if let Some(uuid) = galera_uuid(conn).await? {
            return Ok(format!("galera:{uuid}"));
        }
        let (id,): (String,) = sqlx::query_as(concat!("SELECT ", server_instance_sql!()))
            .fetch_one(&mut *conn)
            .await?;
        Ok(id)
    }
}
