//! What an allocation asks of a tag's row (its step, its period's window and rule) and what a
//! row holds, with the rules a row's recorded `split` admits.

use std::sync::Arc;

use super::FailoverSkip;

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
    /// The row as the caller's last allocation of the tag found it, when the caller admits a
    /// row in that state as it is ([`Grant::single_statement`]).
    pub seen: Option<SeenRow>,
}

/// A row's record (its `split` column) and step, as an earlier allocation found them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeenRow {
    pub record: Arc<str>,
    pub step: i64,
}

impl Grant {
    /// The row's own step, over the whole ID space, under no period rule.
    pub fn step(step: Option<i64>, failover_margin: i64) -> Grant {
        Grant {
            step,
            failover_margin,
            window: None,
            period_rule: None,
            seen: None,
        }
    }

    /// The step and the row the caller last saw, when one autocommitted statement may make
    /// this allocation: an explicit step, no window, no period rule. The statement moves the
    /// row only while it still shows what the caller saw, has no opaque marker, leaves nothing
    /// unserved (`exclusive_max = max_id`), was written last by the instance answering now
    /// (no failover margin) and has room for the step; otherwise it moves nothing and the
    /// locked transaction decides, with the same outcome as if it had run alone. Why: a
    /// strict tag's row is contended by every node, and a transaction holds its lock across
    /// four round trips, one statement only while it runs.
    pub fn single_statement(&self) -> Option<(i64, &SeenRow)> {
        match (self.step, &self.window, &self.period_rule, &self.seen) {
            (Some(step), None, None, Some(seen)) if step >= 1 => Some((step, seen)),
            _ => None,
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

impl LeafAlloc {
    /// A row of `leaf_alloc` as any dialect returns it, before an allocation moved anything
    /// (`first == max_id`). `step` is read as `INT`, the width of the column in every dialect.
    pub(crate) fn from_row<R>(row: &R) -> Result<LeafAlloc, sqlx::Error>
    where
        R: sqlx::Row,
        &'static str: sqlx::ColumnIndex<R>,
        for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
        for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
        for<'r> i32: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    {
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
}
