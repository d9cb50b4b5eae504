//! Segment storage: the [`SegmentStore`] trait over Leaf's `leaf_alloc` table, one
//! implementation per database dialect, chosen by the storage URL.

mod batch;
pub(crate) mod committed;
mod common;
mod deferred;
pub(crate) mod failover;
mod locked;
mod marks;
mod memory;
mod migrate;
mod mysql;
mod on_runtime;
mod pg_hosts;
mod postgres;
mod returning;
pub mod session;
mod sqlite;
mod workers;

use std::sync::Arc;

use async_trait::async_trait;

use crate::config::StorageConfig;

pub use batch::AllocationBatcher;
pub use deferred::DeferredStore;
pub use failover::FailoverSkip;
pub use marks::SegmentMarks;
pub use memory::MemoryStore;
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

/// A tag to insert into `leaf_alloc`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewTag {
    pub tag: String,
    pub step: i64,
    /// The tag's first ID: its `max_id` and `exclusive_max`, as Leaf and leafd both read them.
    pub start: i64,
    pub description: Option<String>,
    /// The residue class the creating node hands out (`<delta>:<remainder>`), `None` for the
    /// whole space.
    pub split: Option<String>,
    /// The insert is refused when the table already holds this many tags (counted under the
    /// database-wide guard, so nodes creating at once stop at exactly the limit).
    pub max_tags: usize,
}

/// How a period tag's rule begins in its row's `split` column (`period:daily:6…`).
pub const PERIOD_RECORD: &str = "period:";

/// Whether the rule a row records (`period:daily:6`, or with the time zone and prefix after
/// it) is the period rule `marker` names: the calendar and digits decide which ID a position is.
pub fn same_rule(recorded: &str, marker: &str) -> bool {
    recorded
        .strip_prefix(marker)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with(':'))
}

/// Whether a row recording `recorded` (its `split` column) may be moved by an allocation or a
/// raise under the period rule `marker` (`None`: the caller applies none). A row that records a
/// period is moved only under that period's rule: under any other, its positions would be read
/// as other IDs, and a move would put later dates in every node's IDs.
pub fn rule_admits(recorded: Option<&str>, marker: Option<&str>) -> bool {
    match recorded {
        Some(r) if r.starts_with(PERIOD_RECORD) => marker.is_some_and(|m| same_rule(r, m)),
        _ => true,
    }
}

/// What one allocation asks of a row.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Grant {
    /// IDs to grant; `None`: the row's own step.
    pub step: Option<i64>,
    /// IDs skipped first when the row was last allocated by another database instance.
    pub failover_margin: i64,
    /// The window the granted range must stay inside (a period tag's numbers); `None`: the
    /// whole ID space.
    pub window: Option<Window>,
    /// The period rule the caller applies (`period:daily:6`), checked against the row's record
    /// before anything moves ([`rule_admits`]).
    pub period_rule: Option<Arc<str>>,
}

impl Grant {
    /// The row's own step, over the whole ID space, under no period rule.
    pub fn step(step: Option<i64>, failover_margin: i64) -> Grant {
        Grant {
            step,
            failover_margin,
            window: None,
            period_rule: None,
        }
    }
}

/// Positions come in windows of `span`, of which only the first `usable` may be granted (a
/// period tag: one window per period, its sequence numbers first, then a gap that is never
/// handed out). A grant never crosses the end of the usable part of the window its first
/// position lies in: it is refused whole ([`StoreError::PastEnd`]) and the row left as it was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub span: i64,
    pub usable: i64,
}

impl Window {
    /// The first position past the usable part of the window `position` lies in.
    pub fn end_of(&self, position: i64) -> i64 {
        position - position.rem_euclid(self.span) + self.usable
    }
}

/// One row of `leaf_alloc`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeafAlloc {
    pub tag: String,
    /// The table's `max_id`: as Leaf reads it, the next ID no allocation has granted yet (the
    /// end, exclusive, of the newest segment).
    pub max_id: i64,
    /// The first ID an allocation grants: it owns `first..max_id`. A listed row has no range
    /// (`first == max_id`).
    pub first: i64,
    /// The step stored in the table (the minimum of the adaptive step).
    pub step: i64,
    pub description: Option<String>,
    /// Set by an allocation that found the row last written by another database instance
    /// (a failover or restore): the IDs it left unused before the granted range.
    pub failover: Option<FailoverSkip>,
    /// The opaque-ID key the tag serves under (`d<digits>:<fingerprint>`), once one was claimed.
    pub opaque: Option<String>,
    /// The residue class the tag's cluster hands out (`<delta>:<remainder>`), as the row
    /// recorded it when it was read (for an allocation: in the same transaction).
    pub split: Option<String>,
    /// The row's `update_time` as the database prints it (listed rows only; Leaf's `/db`).
    pub update_time: Option<String>,
}

/// Errors of a storage call.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("unknown tag '{0}'")]
    UnknownTag(String),
    #[error("tag '{0}' already exists")]
    TagExists(String),
    /// The table holds `count` tags, at or past `segment.max_tags`.
    #[error("tag limit reached: the table has {count} tags (segment.max_tags = {limit})")]
    TagLimit { count: i64, limit: usize },
    /// The allocation would pass 2^63 − 1; the row was left as it was.
    #[error("tag '{0}' has exhausted its ID space")]
    Exhausted(String),
    /// The grant would cross the end of its [`Window`]; the row was left as it was. `max_id`
    /// is the row's, `left` the positions the window still had for a grant.
    #[error("tag '{tag}': only {left} IDs are left before the end of the window at {max_id}")]
    PastEnd { tag: String, max_id: i64, left: i64 },
    /// The row records a period rule the caller does not apply ([`rule_admits`]); the row was
    /// left as it was.
    #[error("{}", rule_refusal(.tag, .recorded, .mine.as_deref()))]
    RuleMismatch {
        tag: String,
        recorded: String,
        mine: Option<String>,
    },
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    /// A write (its statements or its commit) failed: nothing of it took effect, and nothing a
    /// statement returned before the failure may be used.
    #[error("database write failed: {0}")]
    WriteFailed(sqlx::Error),
    #[error("database migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("unsupported storage url '{0}': expected sqlite://, mysql:// or postgres://")]
    UnsupportedUrl(String),
    #[error("storage unavailable: {0}")]
    Unavailable(String),
    /// A file or directory the store needs cannot be made or opened (a permission, a read-only
    /// file system): the message names the path and the cause. It does not pass by itself.
    #[error("{0}")]
    FileAccess(String),
    /// The lease store went back (a wiped or restored etcd): a holder stops issuing at once
    /// and claims its id again, as a claimant after such a loss.
    #[error("{0}")]
    WentBack(String),
    /// The node's segment marks exist but none can be read: the message says what to do.
    #[error("{0}")]
    MarksUnreadable(String),
}

/// The refusal of a node whose period rule is not the one the row records.
fn rule_refusal(tag: &str, recorded: &str, mine: Option<&str>) -> String {
    match mine {
        None => format!(
            "IDs refused: tag '{tag}' hands out period IDs ({recorded}) and this node has no period configured for it; its positions are not IDs"
        ),
        Some(mine) => format!(
            "IDs refused: tag '{tag}' records the period rule {recorded} and this node's is {mine}; a node with another rule would repeat or misorder IDs; configure the tag as its row records it, or use a new tag"
        ),
    }
}

impl StoreError {
    /// True for failures that may pass by themselves (the server is down, restarting or out of
    /// reach), false for ones that need an operator (bad URL, wrong password, failed migration).
    pub fn is_transient(&self) -> bool {
        match self {
            StoreError::Unavailable(_) => true,
            StoreError::Database(err) | StoreError::WriteFailed(err) => match err {
                sqlx::Error::Io(_)
                | sqlx::Error::PoolTimedOut
                | sqlx::Error::PoolClosed
                | sqlx::Error::WorkerCrashed
                | sqlx::Error::Tls(_)
                | sqlx::Error::Protocol(_) => true,
                sqlx::Error::Database(db) => taking_over(db.as_ref()),
                _ => false,
            },
            _ => false,
        }
    }

    /// True for a clash with a concurrent transaction that a retry resolves: a deadlock or
    /// serialization failure (SQLSTATE 40001, 40P01; MySQL 1213; TiDB's optimistic write
    /// conflict 9007) or a unique-key race.
    pub fn is_conflict(&self) -> bool {
        match self {
            StoreError::Database(sqlx::Error::Database(db))
            | StoreError::WriteFailed(sqlx::Error::Database(db)) => {
                db.is_unique_violation()
                    || db
                        .code()
                        .is_some_and(|c| matches!(c.as_ref(), "40001" | "40P01"))
                    || db
                        .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
                        .is_some_and(|m| matches!(m.number(), 1213 | 9007))
            }
            _ => false,
        }
    }

    /// The error of a failed write transaction: a database error becomes
    /// [`StoreError::WriteFailed`]; typed outcomes (unknown tag, exhausted, …) stay as they are.
    fn into_write_failure(self) -> StoreError {
        match self {
            StoreError::Database(err) => StoreError::WriteFailed(err),
            other => other,
        }
    }
}

/// True for the errors a database gives while it starts, stops or fails over, and for the
/// conflicts a retry resolves: SQLSTATE 08 (connection exception), 57 (operator intervention:
/// starting up, shutting down), 25006 (read-only transaction: a standby or a demoted primary),
/// 55000 (PostgreSQL's "recovery is in progress"), 55P03 (lock_timeout: a paused node holds the
/// row lock until the database aborts its idle transaction; see `session`), 40001 and 40P01 (serialization failure,
/// deadlock; Galera's certification failure); MySQL/MariaDB's 1205 (lock wait timeout), 1290
/// (`--read-only`), 1047 (WSREP has not yet prepared the node), 1180 (Galera: a streaming
/// replication fragment could not be appended, seen during a state transfer) and 1792
/// (read-only transaction); TiDB's 8022 (a KV error safe to retry), 8028 (the schema changed
/// under the transaction) and 9007 (optimistic write conflict at COMMIT).
fn taking_over(db: &dyn sqlx::error::DatabaseError) -> bool {
    if let Some(mysql) = db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
        if matches!(
            mysql.number(),
            1047 | 1180 | 1205 | 1213 | 1290 | 1792 | 8022 | 8028 | 9007
        ) {
            return true;
        }
    }
    db.code().is_some_and(|code| {
        code.starts_with("08")
            || code.starts_with("57")
            || matches!(
                code.as_ref(),
                "25006" | "55000" | "55P03" | "40001" | "40P01"
            )
    })
}

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
    /// exactly there (a period tag entering a new period under the period rule `marker`);
    /// returns the `max_id` after. A row that records another period rule is left as it was
    /// ([`StoreError::RuleMismatch`]).
    async fn raise(&self, tag: &str, floor: i64, marker: &str) -> Result<i64, StoreError>;

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

    /// A short name of the backend for logs and INFO (`sqlite`, `mysql`, `postgres`, `memory`).
    fn backend(&self) -> &'static str;

    /// Closes the connection pool; later calls fail.
    async fn close(&self);

    /// The worker-id lease table in the same database, where the dialect has one.
    fn worker_leases(self: Arc<Self>) -> Option<Arc<dyn WorkerLeaseStore>>;
}

/// One row of `leaf_worker`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerRow {
    pub worker_id: i64,
    pub owner: String,
    /// UNIX ms, database time.
    pub lease_until: i64,
    /// UNIX ms, the holder's clock: no ID of it carries a later timestamp.
    pub fence_ms: i64,
    /// The database's clock when the row was read (UNIX ms).
    pub db_now: i64,
}

/// Snowflake worker-id leases in `leaf_worker`; every method is one atomic statement (plus a
/// read), and expiry is judged by the database's clock, never the node's.
#[async_trait]
pub trait WorkerLeaseStore: Send + Sync + 'static {
    /// True when the database instance answering differs from the one that answered the
    /// previous call, or became the one within the last `window_ms` (database time): a failover
    /// or restore may have lost lease renewals and claims, so a holder the table no longer
    /// shows may still be issuing. Records the instance answering.
    async fn instance_changed_within(&self, window_ms: i64) -> Result<bool, StoreError> {
        let _ = window_ms;
        Ok(false)
    }

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

/// Maps a failed INSERT of a tag: a primary-key clash means the tag exists.
fn insert_error(err: sqlx::Error, tag: &str) -> StoreError {
    match &err {
        sqlx::Error::Database(db) if db.is_unique_violation() => {
            StoreError::TagExists(tag.to_string())
        }
        _ => StoreError::Database(err),
    }
}

/// A row's `max_id`, `exclusive_max`, `step` and `split`, as read after a guarded UPDATE.
type AllocRow = (i64, Option<i64>, i64, Option<String>);

/// The refusal when a row recording `recorded` may not be moved under the period rule
/// `marker` ([`rule_admits`]).
pub(crate) fn refused_rule(
    tag: &str,
    recorded: Option<&str>,
    marker: Option<&str>,
) -> Option<StoreError> {
    (!rule_admits(recorded, marker)).then(|| StoreError::RuleMismatch {
        tag: tag.to_string(),
        recorded: recorded.unwrap_or_default().to_string(),
        mine: marker.map(str::to_string),
    })
}

/// Why a guarded UPDATE changed no row, from the row read after it (`max_id`, `exclusive_max`,
/// `step`): the tag is missing, the grant would cross its window's end, or it is at the end of
/// its space.
fn not_allocated(row: Option<AllocRow>, tag: &str, grant: &Grant) -> StoreError {
    let Some((max_id, exclusive_max, step, split)) = row else {
        return StoreError::UnknownTag(tag.to_string());
    };
    if let Some(refused) = refused_rule(tag, split.as_deref(), grant.period_rule.as_deref()) {
        return refused;
    }
    let base = max_id.saturating_add(i64::from(exclusive_max != Some(max_id)));
    match grant.window {
        Some(window)
            if base
                .checked_add(grant.step.unwrap_or(step))
                .is_none_or(|end| end > window.end_of(base)) =>
        {
            StoreError::PastEnd {
                tag: tag.to_string(),
                max_id,
                left: (window.end_of(base) - base).max(0),
            }
        }
        _ => StoreError::Exhausted(tag.to_string()),
    }
}
