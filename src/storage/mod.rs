//! Segment storage: the [`SegmentStore`] trait over Leaf's `leaf_alloc` table, one
//! implementation per database dialect, chosen by the storage URL.

mod batch;
pub(crate) mod committed;
mod common;
mod deferred;
mod dialect;
mod error;
pub(crate) mod failover;
mod grant;
mod locked;
mod marks;
mod memory;
mod migrate;
mod mysql;
mod on_runtime;
mod pg_hosts;
mod postgres;
pub mod session;
mod sql_store;
mod sqlite;
mod workers;
mod writer_turns;

use std::sync::Arc;

use async_trait::async_trait;

use crate::config::StorageConfig;

/// What names one database for the segment marks ([`SegmentStore::identity`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DbIdentity {
    /// Random, written once by the first node that found the table empty.
    pub id: String,
    /// The row was added to a schema that may have served IDs before ids were kept (an
    /// upgrade, or a restore of a backup from before it): every mark the node holds applies.
    pub inherits: bool,
}

/// The bounds of a tag rule's values, the configuration's, for the rules admin commands and rows
/// carry too.
pub use crate::config::{zone_names_a_place, MAX_ID_DELTA};
pub use batch::AllocationBatcher;
pub use deferred::DeferredStore;
pub use error::StoreError;
pub(crate) use error::{check_step, opaque_claimable, refused_rule};
use error::{insert_error, not_allocated};
pub use failover::FailoverSkip;
pub use grant::{
    class_within, opaque_digits, parse_split, position_marker, rule_admits, same_rule,
    served_marker, Grant, LeafAlloc, NewTag, SeenRow, Serves, Window, OPAQUE_MAX_DIGITS,
    OPAQUE_MIN_DIGITS, PERIOD_RECORD, STRICT_RECORD,
};
pub use marks::SegmentMarks;
pub use memory::{MemoryRows, MemoryStore};
pub use migrate::statements as migration_statements;
pub use mysql::MySqlStore;
pub use on_runtime::OnRuntime;
pub use postgres::PostgresStore;
pub use sqlite::SqliteStore;

/// Every row of `leaf_alloc`, in the column order the dialects' row mappers read.
const LIST_ROWS: &str = "SELECT biz_tag, max_id, step, description, opaque, split, \
     CAST(update_time AS CHAR(32)) AS update_time FROM leaf_alloc ORDER BY biz_tag";
/// One row as [`LIST_ROWS`] reads it; the placeholder is appended by the dialect.
const ONE_ROW: &str = "SELECT biz_tag, max_id, step, description, opaque, split, \
     CAST(update_time AS CHAR(32)) AS update_time FROM leaf_alloc WHERE biz_tag = ";

/// The first statement of every tag creation: all creators, on every node and every member of
/// a multi-primary cluster, serialize on this row before counting the tags.
const GUARD_TAGS: &str = "UPDATE leafd_guard SET counter = counter + 1 WHERE name = 'tags'";
/// Puts the guard row back if an operator deleted it (a race here is a unique clash: retried).
const RESTORE_GUARD: &str = "INSERT INTO leafd_guard (name, counter) VALUES ('tags', 0)";
const COUNT_TAGS: &str = "SELECT COUNT(*) FROM leaf_alloc";

/// The short backend name a storage URL selects, or `None` for an unsupported scheme.
pub fn backend_of(url: &str) -> Option<&'static str> {
    if url.starts_with("sqlite:") {
        Some("sqlite")
    } else if url.starts_with("mysql://") || url.starts_with("mariadb://") {
        Some("mysql")
    } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Some("postgres")
    } else {
        None
    }
}

/// Access to `leaf_alloc`. Implementations make [`SegmentStore::allocate`] atomic, so that any
/// number of leafd nodes sharing one database never receive overlapping segments.
#[async_trait]
pub trait SegmentStore: Send + Sync + 'static {
    /// Grants `step` IDs (or, when `None`, the row's own step) past the tag's `max_id` and
    /// returns the row as updated, in one atomic operation: the caller owns
    /// `first..max_id`, read as Leaf reads the table. The range starts at the old `max_id` when
    /// the row's `exclusive_max` shows a leafd allocation left it unserved, else one above it
    /// (Leaf and older leafd releases may have served it: see migration 0005).
    /// When the row's last allocation was made by another database instance than the one
    /// answering (a failover or a restore that may have lost allocations), `failover_margin`
    /// more IDs are skipped first and [`LeafAlloc::failover`] says so. An allocation that would
    /// pass `i64::MAX` is refused, the row unchanged: [`StoreError::Exhausted`]; one that
    /// would cross the end of its [`Grant::window`] likewise: [`StoreError::PastEnd`], except
    /// when it is the failover margin that crosses it: the rest of the window is then used up
    /// (the row moves to its end and records the instance), and the grant is empty.
    async fn allocate(&self, tag: &str, grant: Grant) -> Result<LeafAlloc, StoreError>;

    /// Allocates for each request in turn in one transaction (one commit for all of them): the
    /// outer `Err` when a statement or the commit failed (nothing of it may be used), else one
    /// result per request, as [`SegmentStore::allocate`] would give it.
    async fn allocate_many(
        &self,
        requests: &[(String, Grant)],
    ) -> Result<Vec<Result<LeafAlloc, StoreError>>, StoreError>;

    /// Every row of the table.
    async fn list(&self) -> Result<Vec<LeafAlloc>, StoreError>;

    /// Every tag of the table with the rule its row records (`split`): what a node's tag map
    /// holds, read without the rest of each row.
    async fn rules(&self) -> Result<Vec<(String, Option<String>)>, StoreError>;

    /// Up to `limit` rows of [`SegmentStore::rules`] after the tag `after` (`None`: from the
    /// first), in the database's own order of `biz_tag`: the tag list read page by page.
    async fn rules_after(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, Option<String>)>, StoreError>;

    /// One row of the table (`None`: no such tag), for a tag a node meets for the first time:
    /// one indexed read, whatever the number of tags.
    async fn row(&self, tag: &str) -> Result<Option<LeafAlloc>, StoreError>;

    /// Inserts a tag, unless the table holds `new.max_tags` tags already
    /// ([`StoreError::TagLimit`]) or the tag exists ([`StoreError::TagExists`]): counted and
    /// inserted in one transaction behind the `leafd_guard` row.
    async fn create_tag(&self, new: &NewTag) -> Result<(), StoreError>;

    /// Moves the tag's recorded residue class from `expected` to `split` (`None`: the whole
    /// space) when it is still `expected`; returns the record after, in one transaction.
    async fn claim_split(
        &self,
        tag: &str,
        expected: Option<&str>,
        split: Option<&str>,
    ) -> Result<Option<String>, StoreError>;

    /// The operator's re-split: records `split` whatever was recorded, and moves `max_id` up to
    /// `start` when it is below (no ID under `start` is handed out from this row again);
    /// returns the `max_id` after.
    async fn resplit(&self, tag: &str, split: Option<&str>, start: i64) -> Result<i64, StoreError>;

    /// Moves the tag's `max_id` up to `floor` when it is below, so the next allocation starts
    /// exactly there (a period tag entering a new period under the node's whole period rule
    /// `record`, `period:daily:6:UTC:ORD`); returns the `max_id` after. A row that records
    /// another period rule is left as it was ([`StoreError::RuleMismatch`]); a row that records
    /// none, or only the calendar and digits, records `record` in the same write.
    async fn raise(&self, tag: &str, floor: i64, record: &str) -> Result<i64, StoreError>;

    /// Records `marker` as the key under which the tag hands out opaque IDs, unless it has one
    /// already or its `max_id` has reached `below` (plain IDs served into the opaque range);
    /// returns the recorded marker and the tag's `max_id`, in one transaction.
    async fn claim_opaque(
        &self,
        tag: &str,
        marker: &str,
        below: i64,
    ) -> Result<(Option<String>, i64), StoreError>;

    /// Changes a tag's stored step; [`StoreError::UnknownTag`] if absent.
    async fn set_step(&self, tag: &str, step: i64) -> Result<(), StoreError>;

    /// The newest schema migration applied to the database (`None`: none, or no migration
    /// table), so `leafd migrate` can say what it did. (No default, as no method here has one:
    /// a wrapper that forgot to forward a defaulted method broke LEAF.WORKERS once.)
    async fn schema_version(&self) -> Option<i64>;

    /// The database's identity (`leafd_identity`), which a backup and a restore keep and a new
    /// database does not have: the node's segment marks are kept per identity. `None`: a
    /// schema without the table (`storage.migrate = false` on an older one) or a store that
    /// is no database.
    async fn identity(&self) -> Result<Option<DbIdentity>, StoreError>;

    /// A short name of the backend for logs and INFO (`sqlite`, `mysql`, `postgres`, `memory`).
    fn backend(&self) -> &'static str;

    /// Closes the connection pool; later calls fail.
    async fn close(&self);

    /// The worker-id lease table in the same database, where the dialect has one.
    fn worker_leases(self: Arc<Self>) -> Option<Arc<dyn WorkerLeaseStore>>;
}

/// One worker id's lease, as its store keeps it (a row of `leaf_worker`, or etcd's keys).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerRow {
    pub worker_id: i64,
    pub owner: String,
    pub lease: Lease,
    /// UNIX ms, the holder's clock: no ID of it carries a later timestamp.
    pub fence_ms: i64,
}

/// A worker id's lease when it was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lease {
    /// Ends this many ms later by the store's clock; negative: ended that long ago.
    Timed(i64),
    /// Held while its holder keeps it alive; the store keeps no end time (etcd).
    KeptAlive,
    /// Not held, and the store keeps no time it ended (etcd).
    Ended,
}

impl Lease {
    /// Someone may be issuing IDs with the worker id.
    pub fn live(self) -> bool {
        match self {
            Lease::Timed(left) => left >= 0,
            Lease::KeptAlive => true,
            Lease::Ended => false,
        }
    }

    /// What is left of a lease with an end time.
    pub fn left_ms(self) -> Option<i64> {
        match self {
            Lease::Timed(left) => Some(left),
            Lease::KeptAlive | Lease::Ended => None,
        }
    }

    /// How long ago an ended lease ended, as far as the store knows (no time: the longest).
    pub fn ended_ms_ago(self) -> Option<i64> {
        match self {
            Lease::Timed(left) if left < 0 => Some(-left),
            Lease::Ended => Some(i64::MAX),
            _ => None,
        }
    }
}

/// Who keeps a store's worker-id leases, as the coordinator's messages and INFO name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseKeeper {
    /// The coordinator's name (`snowflake.coordinator`): `database` or `etcd`.
    pub kind: &'static str,
    /// As a sentence names it: "the database", "etcd".
    pub holder: &'static str,
    /// Where the leases are: `leaf_worker`, `etcd`.
    pub place: &'static str,
}

impl LeaseKeeper {
    /// `leaf_worker` in the segment database.
    pub const DATABASE: LeaseKeeper = LeaseKeeper {
        kind: "database",
        holder: "the database",
        place: "leaf_worker",
    };
}

/// Snowflake worker-id leases in `leaf_worker`; each method's change commits at once (one
/// transaction), and expiry is judged by the database's clock, never the node's.
#[async_trait]
pub trait WorkerLeaseStore: Send + Sync + 'static {
    /// Who keeps the leases.
    fn keeper(&self) -> LeaseKeeper;

    /// True when the database instance answering differs from the one that answered the
    /// previous call, or became the one within the last `window_ms` (database time), or the
    /// table lost its rows within it (row −1 missing, or a deleted row claimed again): a holder
    /// the table no longer shows may still be issuing. Records the instance answering (and
    /// row −3 again when the table lost it).
    async fn instance_changed_within(&self, window_ms: i64) -> Result<bool, StoreError>;

    /// Takes `worker_id` for `owner` for `lease_ms` if the row does not exist yet (`Some(0)`)
    /// or its lease has expired (`Some(previous fence)`); `None` when another owner holds it.
    async fn claim(
        &self,
        worker_id: i64,
        owner: &str,
        lease_ms: i64,
    ) -> Result<Option<i64>, StoreError>;
    /// Extends `owner`'s lease and records its fence; false when the row is no longer its.
    async fn renew(
        &self,
        worker_id: i64,
        owner: &str,
        lease_ms: i64,
        fence_ms: i64,
    ) -> Result<bool, StoreError>;
    /// Ends `owner`'s lease at once, leaving `fence_ms` for the next holder.
    async fn release(&self, worker_id: i64, owner: &str, fence_ms: i64) -> Result<(), StoreError>;
    /// Every row, by worker id.
    async fn workers(&self) -> Result<Vec<WorkerRow>, StoreError>;
    /// The snowflake layout the table's worker ids were issued in (row −2's owner), moved to
    /// `layout` when it is still `expected` (`None`: no record yet); returns the record after.
    /// `expected == layout` only reads it.
    async fn record_layout(
        &self,
        expected: Option<&str>,
        layout: &str,
    ) -> Result<Option<String>, StoreError>;
}

/// True for a primary-key clash (the row exists already).
fn unique_violation(err: &sqlx::Error) -> bool {
    matches!(err, sqlx::Error::Database(db) if db.is_unique_violation())
}

/// Opens the store the URL names and, when `migrate` is set, brings its schema up to date.
pub async fn open(
    config: &StorageConfig,
    migrate: bool,
) -> Result<Arc<dyn SegmentStore>, StoreError> {
    match backend_of(&config.url) {
        Some("sqlite") => Ok(Arc::new(SqliteStore::open(config, migrate).await?)),
        Some("mysql") => {
            let mut config = config.clone();
            if let Some(rest) = config.url.strip_prefix("mariadb://") {
                config.url = format!("mysql://{rest}");
            }
            Ok(Arc::new(MySqlStore::open(&config, migrate).await?))
        }
        Some("postgres") => Ok(Arc::new(PostgresStore::open(config, migrate).await?)),
        _ => Err(StoreError::UnsupportedUrl(config.redacted_url())),
    }
}
