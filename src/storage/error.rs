//! What a storage call can fail with, and how a database's error or a refused allocation maps
//! to it (which failures a retry or another member resolves).

use super::{rule_admits, Grant, Serves, PERIOD_RECORD, STRICT_RECORD};

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
    /// The grant is larger than what is left before the end of the ID space; `left` IDs (at
    /// least 1) would still fit. The row was left as it was.
    #[error("tag '{tag}': only {left} IDs are left before the end of the ID space")]
    NearEnd { tag: String, left: i64 },
    /// The grant would cross the end of its [`Window`]; the row was left as it was. `max_id`
    /// is the row's, `left` the positions the window still had for a grant.
    #[error("tag '{tag}': only {left} IDs are left before the end of the window at {max_id}")]
    PastEnd { tag: String, max_id: i64, left: i64 },
    /// The row records a rule the caller does not serve the tag by ([`rule_admits`]); the row
    /// was left as it was. `max_id` is the row's.
    #[error("{}", rule_refusal(.tag, .recorded, .opaque.as_deref(), .serves, *.max_id))]
    RuleMismatch {
        tag: String,
        recorded: String,
        opaque: Option<String>,
        serves: Serves,
        max_id: i64,
    },
    /// An opaque node's claim of its key found the row recording strict order or a period,
    /// which opaque IDs cannot follow; the row was left as it was (no marker written).
    #[error("opaque IDs refused: tag '{tag}' records {recorded}, and opaque IDs are served in trend order only; nothing was written to its row: serve the tag as its row records it, or give the opaque use a tag of its own")]
    OpaqueRefused { tag: String, recorded: String },
    /// A node without the tag's opaque key would serve plain IDs below the end of the opaque
    /// range, which could repeat opaque IDs served; the row was left as it was.
    #[error("plain IDs refused: the tag served opaque IDs of {digits} digits ({marker}), and plain IDs below {past} could repeat them; configure it opaque again, or LEAF.TAG SKIP it past {past}")]
    PlainBelowOpaque {
        marker: String,
        digits: u32,
        past: i64,
    },
    /// The allocation's step (the row's, or the one asked for) is below 1: a row edited by hand
    /// would move backwards or not at all; the row was left as it was.
    #[error("IDs refused: tag '{tag}' would be allocated with step {step} (its row's step, or one derived from it), and a step below 1 moves the row back or not at all; nothing was taken: set a step of 1 or more with LEAF.TAG STEP {tag} <n>")]
    BadStep { tag: String, step: i64 },
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
    /// A value the store holds is none leafd writes (edited by hand, or damaged): the message
    /// names it and what to do. Nothing was taken on it.
    #[error("{0}")]
    Damaged(String),
}

/// The refusal of a node that serves a tag otherwise than its row records (`serves`), with
/// what to do.
pub(super) fn rule_refusal(
    tag: &str,
    recorded: &str,
    opaque: Option<&str>,
    serves: &Serves,
    max_id: i64,
) -> String {
    let (mine, opaque_node) = match serves {
        Serves::Strict => (STRICT_RECORD.to_string(), false),
        Serves::Period(marker) => (marker.to_string(), false),
        Serves::Unchecked => (String::new(), false),
        Serves::Trend { split, opaque } => (split.as_deref().unwrap_or("1:0").to_string(), *opaque),
    };
    let trend = matches!(serves, Serves::Trend { .. } | Serves::Unchecked);
    if let Some(opaque) = opaque.filter(|_| !trend) {
        return format!(
            "IDs refused: tag '{tag}' serves opaque IDs ({opaque}) and this node's rule for it is {mine}; its record would refuse every opaque node from then on; give this use a tag of its own"
        );
    }
    if (trend || *serves == Serves::Strict) && recorded.starts_with(PERIOD_RECORD) {
        return format!(
            "IDs refused: tag '{tag}' hands out period IDs ({recorded}) and this node has no period configured for it; its positions are not IDs"
        );
    }
    if trend && recorded == STRICT_RECORD {
        let remedy = if opaque_node {
            format!("opaque IDs are served in trend order only: once no node serves the tag strict, clear the record (UPDATE leaf_alloc SET split = NULL WHERE biz_tag = '{tag}'), or give the strict use a tag of its own")
        } else {
            "configure order = \"strict\" for the tag on this node".to_string()
        };
        return format!(
            "IDs refused: tag '{tag}' records strict order ({STRICT_RECORD}) and this node serves it in trend order, whose buffered IDs would come back out of order; {remedy}"
        );
    }
    if trend {
        let (delta, remainder) = mine.split_once(':').unwrap_or(("1", "0"));
        return format!(
            "IDs refused: the tag's split is recorded as id_delta:id_remainder {recorded} and this node's {delta}:{remainder} is not inside it, so it could repeat IDs another cluster served; once every node runs the new split, run LEAF.TAG SPLIT {tag} {delta} {remainder} <start> in every cluster, with <start> above every cluster's max_id (this cluster's is {max_id})"
        );
    }
    let kind = if recorded.starts_with(PERIOD_RECORD) {
        "the period rule"
    } else if recorded.starts_with("order:") {
        "the order rule"
    } else {
        "the split"
    };
    format!(
        "IDs refused: tag '{tag}' records {kind} {recorded} and this node's is {mine}; a node with another rule would repeat or misorder IDs; configure the tag as its row records it, or use a new tag"
    )
}

impl StoreError {
    /// True for failures that may pass by themselves (the server is down, restarting or out of
    /// reach), false for ones that need an operator (bad URL, wrong password, failed migration).
    pub fn is_transient(&self) -> bool {
        match self {
            StoreError::Unavailable(_) => true,
            StoreError::Database(err) | StoreError::WriteFailed(err) => transient(err),
            // A migration cut by a lost connection: the next attempt completes it.
            StoreError::Migrate(
                sqlx::migrate::MigrateError::Execute(err)
                | sqlx::migrate::MigrateError::ExecuteMigration(err, _),
            ) => transient(err),
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
    pub(super) fn into_write_failure(self) -> StoreError {
        match self {
            StoreError::Database(err) => StoreError::WriteFailed(err),
            other => other,
        }
    }
}

/// A connection lost or not had, or a database error [`taking_over`] names.
fn transient(err: &sqlx::Error) -> bool {
    match err {
        sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => taking_over(db.as_ref()),
        other => connection_lost(other),
    }
}

/// A statement's connection broke under it (closed, cut, or speaking nonsense).
pub(crate) fn connection_lost(err: &sqlx::Error) -> bool {
    matches!(
        err,
        sqlx::Error::Io(_) | sqlx::Error::Tls(_) | sqlx::Error::Protocol(_)
    )
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
pub(super) fn taking_over(db: &dyn sqlx::error::DatabaseError) -> bool {
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

/// Maps a failed INSERT of a tag: a primary-key clash means the tag exists.
pub(super) fn insert_error(err: sqlx::Error, tag: &str) -> StoreError {
    match &err {
        sqlx::Error::Database(db) if db.is_unique_violation() => {
            StoreError::TagExists(tag.to_string())
        }
        _ => StoreError::Database(err),
    }
}

/// An allocation's step must be 1 or more ([`StoreError::BadStep`]).
pub(crate) fn check_step(tag: &str, step: i64) -> Result<(), StoreError> {
    if step < 1 {
        return Err(StoreError::BadStep {
            tag: tag.to_string(),
            step,
        });
    }
    Ok(())
}

/// Whether an opaque key may be claimed on a row recording `split`: not on a strict or period
/// tag, whose order opaque IDs cannot keep ([`StoreError::OpaqueRefused`]).
pub(crate) fn opaque_claimable(tag: &str, split: Option<&str>) -> Result<(), StoreError> {
    match split {
        Some(r) if r.starts_with("order:") || r.starts_with(super::PERIOD_RECORD) => {
            Err(StoreError::OpaqueRefused {
                tag: tag.to_string(),
                recorded: r.to_string(),
            })
        }
        _ => Ok(()),
    }
}

/// A row's `max_id`, `exclusive_max`, `step` and `split`, as read after a guarded UPDATE.
pub(super) type AllocRow = (i64, Option<i64>, i64, Option<String>);

/// The refusal when a row at `max_id` recording `recorded` may not be moved by a caller that
/// serves the tag as `serves` ([`rule_admits`]).
pub(crate) fn refused_rule(
    tag: &str,
    recorded: Option<&str>,
    opaque: Option<&str>,
    serves: &Serves,
    max_id: i64,
) -> Option<StoreError> {
    if let (Serves::Trend { opaque: false, .. }, Some(marker)) = (serves, opaque) {
        let digits = super::opaque_digits(marker).unwrap_or(super::OPAQUE_MAX_DIGITS);
        let past = 10i64.pow(digits);
        if max_id < past {
            return Some(StoreError::PlainBelowOpaque {
                marker: marker.to_string(),
                digits,
                past,
            });
        }
    }
    (!rule_admits(recorded, opaque, serves)).then(|| StoreError::RuleMismatch {
        tag: tag.to_string(),
        recorded: recorded.unwrap_or_default().to_string(),
        opaque: opaque.map(str::to_string),
        serves: serves.clone(),
        max_id,
    })
}

/// Why a guarded UPDATE changed no row, from the row read after it (`max_id`, `exclusive_max`,
/// `step`): the tag is missing, the grant would cross its window's end, or it is at the end of
/// its space.
pub(super) fn not_allocated(row: Option<AllocRow>, tag: &str, grant: &Grant) -> StoreError {
    let Some((max_id, exclusive_max, step, split)) = row else {
        return StoreError::UnknownTag(tag.to_string());
    };
    // The opaque key is checked after the statement moved the row (and put back then).
    if let Some(refused) = refused_rule(tag, split.as_deref(), None, &grant.serves, max_id) {
        return refused;
    }
    if let Err(refused) = check_step(tag, grant.step.unwrap_or(step)) {
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
        // The statement's own bound: `max_id <= 9223372036854775806 - step`.
        _ => match i64::MAX - 1 - max_id {
            left if left >= 1 => StoreError::NearEnd {
                tag: tag.to_string(),
                left,
            },
            _ => StoreError::Exhausted(tag.to_string()),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sqlx::migrate::MigrateError;

    #[test]
    fn a_migration_cut_by_a_lost_connection_is_transient() {
        let eof = || {
            sqlx::Error::Io(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "expected to read 4 bytes, got 0 bytes at EOF",
            ))
        };
        assert!(StoreError::Migrate(MigrateError::ExecuteMigration(eof(), 3)).is_transient());
        assert!(StoreError::Migrate(MigrateError::Execute(eof())).is_transient());
        assert!(!StoreError::Migrate(MigrateError::Dirty(3)).is_transient());
    }
}
