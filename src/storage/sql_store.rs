//! A `SegmentStore` on an SQL database: a dialect's store says how it allocates, creates a tag,
//! sets a step and lists the tags; everything else is the statements every dialect shares.

use std::sync::Arc;

use async_trait::async_trait;
use sqlx::{ColumnIndex, Decode, Encode, Executor, IntoArguments, Pool, Type};

use super::common::{RowsAffected, SharedSql};
use super::dialect::Dialect;
use super::workers::LeaseTable;
use super::{Grant, LeafAlloc, NewTag, SegmentStore, StoreError, WorkerLeaseStore};

/// What a dialect's store does its own way; [`SegmentStore`] is implemented for every such
/// store, with the rest from [`SharedSql`] and the worker-id leases from [`LeaseTable`].
#[async_trait]
pub(crate) trait SqlStore: Send + Sync + 'static {
    type DB: Dialect;

    fn pool(&self) -> &Pool<Self::DB>;

    /// See [`SegmentStore::allocate`].
    async fn allocate(&self, tag: &str, grant: Grant) -> Result<LeafAlloc, StoreError>;

    /// See [`SegmentStore::allocate_many`].
    async fn allocate_many(
        &self,
        requests: &[(String, Grant)],
    ) -> Result<Vec<Result<LeafAlloc, StoreError>>, StoreError>;

    /// See [`SegmentStore::rules`].
    async fn rules(&self) -> Result<Vec<(String, Option<String>)>, StoreError>;

    /// See [`SegmentStore::rules_after`].
    async fn rules_after(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, Option<String>)>, StoreError>;

    /// See [`SegmentStore::create_tag`].
    async fn create_tag(&self, new: &NewTag) -> Result<(), StoreError>;

    /// See [`SegmentStore::set_step`].
    async fn set_step(&self, tag: &str, step: i64) -> Result<(), StoreError>;
}

#[async_trait]
impl<S, DB> SegmentStore for S
where
    S: SqlStore<DB = DB>,
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
    async fn allocate(&self, tag: &str, grant: Grant) -> Result<LeafAlloc, StoreError> {
        SqlStore::allocate(self, tag, grant).await
    }

    async fn allocate_many(
        &self,
        requests: &[(String, Grant)],
    ) -> Result<Vec<Result<LeafAlloc, StoreError>>, StoreError> {
        SqlStore::allocate_many(self, requests).await
    }

    async fn list(&self) -> Result<Vec<LeafAlloc>, StoreError> {
        SharedSql::list(self.pool()).await
    }

    async fn rules(&self) -> Result<Vec<(String, Option<String>)>, StoreError> {
        SqlStore::rules(self).await
    }

    async fn row(&self, tag: &str) -> Result<Option<LeafAlloc>, StoreError> {
        SharedSql::row(self.pool(), tag).await
    }

    async fn rules_after(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, Option<String>)>, StoreError> {
        SqlStore::rules_after(self, after, limit).await
    }

    async fn create_tag(&self, new: &NewTag) -> Result<(), StoreError> {
        SqlStore::create_tag(self, new).await
    }

    async fn claim_split(
        &self,
        tag: &str,
        expected: Option<&str>,
        split: Option<&str>,
    ) -> Result<Option<String>, StoreError> {
        SharedSql::claim_split(self.pool(), tag, expected, split).await
    }

    async fn resplit(&self, tag: &str, split: Option<&str>, start: i64) -> Result<i64, StoreError> {
        SharedSql::resplit(self.pool(), tag, split, start).await
    }

    async fn raise(&self, tag: &str, floor: i64, record: &str) -> Result<i64, StoreError> {
        SharedSql::raise(self.pool(), tag, floor, record).await
    }

    async fn claim_opaque(
        &self,
        tag: &str,
        marker: &str,
        below: i64,
    ) -> Result<(Option<String>, i64), StoreError> {
        SharedSql::claim_opaque(self.pool(), tag, marker, below).await
    }

    async fn set_step(&self, tag: &str, step: i64) -> Result<(), StoreError> {
        SqlStore::set_step(self, tag, step).await
    }

    async fn schema_version(&self) -> Option<i64> {
        SharedSql::schema_version(self.pool()).await
    }

    async fn identity(&self) -> Result<Option<super::DbIdentity>, StoreError> {
        SharedSql::identity(self.pool()).await
    }

    fn backend(&self) -> &'static str {
        DB::BACKEND
    }

    async fn close(&self) {
        self.pool().close().await;
    }

    fn worker_leases(self: Arc<Self>) -> Option<Arc<dyn WorkerLeaseStore>> {
        Some(Arc::new(LeaseTable::new(self.pool().clone())))
    }
}
