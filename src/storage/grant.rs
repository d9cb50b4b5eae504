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
/// it) is the period rule `marker` names (`period:daily:6`, or with the node's time zone
/// after it): the calendar and digits decide which ID a position is, the time zone which
/// date a position is served on, so both must agree where both name one. The prefix only
/// changes the string form and may differ.
pub fn same_rule(recorded: &str, marker: &str) -> bool {
    fn fields(rule: &str) -> Option<(&str, &str, Option<&str>)> {
        let mut parts = rule.strip_prefix(PERIOD_RECORD)?.splitn(4, ':');
        Some((parts.next()?, parts.next()?, parts.next()))
    }
    match (fields(recorded), fields(marker)) {
        (Some((cal, digits, zone)), Some((my_cal, my_digits, my_zone))) => {
            cal == my_cal
                && digits == my_digits
                && zone.zip(my_zone).is_none_or(|(zone, mine)| zone == mine)
        }
        _ => false,
    }
}

/// The calendar and digits of a period marker (`period:daily:6:UTC` → `period:daily:6`), what
/// the statements compare with a row's record; the time zone is checked on what they read.
pub fn position_marker(marker: &str) -> &str {
    leading_fields(marker, 2)
}

/// The calendar, digits and time zone of a whole period record, without its prefix
/// (`period:daily:6:UTC:ORD` → `period:daily:6:UTC`): how the node serves the tag, which a
/// row's record must agree with ([`same_rule`]); the prefix may differ.
pub fn served_marker(record: &str) -> &str {
    leading_fields(record, 3)
}

/// A period record cut to its first `fields` fields after `period:` (the whole of it when it
/// has no more, or is no period record).
fn leading_fields(record: &str, fields: usize) -> &str {
    let Some(rest) = record.strip_prefix(PERIOD_RECORD) else {
        return record;
    };
    match rest.match_indices(':').nth(fields - 1) {
        Some((at, _)) => &record[..PERIOD_RECORD.len() + at],
        None => record,
    }
}

/// How a strict tag's row records its order in its `split` column.
pub const STRICT_RECORD: &str = "order:strict";

/// How the caller serves the tag whose row it moves, which the row's record (its `split`
/// column) must admit before anything moves ([`rule_admits`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Serves {
    /// An admin move of a tag without a period (SKIP, SKIPALL): only a period record refuses.
    #[default]
    Unchecked,
    /// Trend order over `split` (`<delta>:<remainder>`; `None`: the whole ID space),
    /// `opaque`: through the opaque permutation (for the refusal's remedy).
    Trend {
        split: Option<Arc<str>>,
        opaque: bool,
    },
    /// Strict order across the cluster.
    Strict,
    /// A period's sequence under the rule its marker names (`period:daily:6`, with the node's
    /// time zone after it when it serves the tag: `period:daily:6:Asia/Shanghai`).
    Period(Arc<str>),
}

impl Serves {
    /// The period marker's calendar and digits, for the statements that check a period record
    /// themselves ([`position_marker`]).
    pub fn period_marker(&self) -> Option<&str> {
        match self {
            Serves::Period(marker) => Some(position_marker(marker)),
            _ => None,
        }
    }
}

/// Fewest and most decimal digits an opaque ID may have (10^18 still fits an `i64`).
pub const OPAQUE_MIN_DIGITS: u32 = 4;
pub const OPAQUE_MAX_DIGITS: u32 = 18;

/// The digit count an opaque key's marker names (`d10:…` → 10); `None` for anything else.
pub fn opaque_digits(marker: &str) -> Option<u32> {
    marker
        .strip_prefix('d')?
        .split(':')
        .next()?
        .parse()
        .ok()
        .filter(|d| (OPAQUE_MIN_DIGITS..=OPAQUE_MAX_DIGITS).contains(d))
}

/// A residue class as a row records it (`<delta>:<remainder>`, delta at least 1 and the
/// remainder below it); `None` for anything else.
pub fn parse_split(marker: &str) -> Option<(i64, i64)> {
    let (delta, remainder) = marker.split_once(':')?;
    let (delta, remainder) = (delta.parse::<i64>().ok()?, remainder.parse::<i64>().ok()?);
    (delta >= 1 && (0..delta).contains(&remainder)).then_some((delta, remainder))
}

/// True when every ID of the class `inner` is also one of `outer`'s (a split may narrow so,
/// from delta 2 remainder 0 to delta 4 remainder 0 or 2, without reaching another cluster's).
pub fn class_within(inner: (i64, i64), outer: (i64, i64)) -> bool {
    inner.0 % outer.0 == 0 && inner.1 % outer.0 == outer.1
}

/// Whether a row recording `recorded` (its `split` column) may be moved by an allocation or a
/// raise of a caller that serves the tag as `serves`: a period record only under that period's
/// rule (under any other its positions would be read as other IDs); strict order only by a
/// strict node (a trend node's buffered IDs would come back out of order); a split only by a
/// trend node whose class lies inside it (any other could reach another cluster's IDs). A row
/// without a record admits every caller, which records its rule after. A row with an opaque
/// key (`opaque`) admits no strict or period node, whose record would end its opaque IDs.
pub fn rule_admits(recorded: Option<&str>, opaque: Option<&str>, serves: &Serves) -> bool {
    if opaque.is_some() && matches!(serves, Serves::Strict | Serves::Period(_)) {
        return false;
    }
    let Some(r) = recorded else {
        return true;
    };
    let period = r.starts_with(PERIOD_RECORD);
    match serves {
        Serves::Unchecked => !period,
        Serves::Period(marker) => period && same_rule(r, marker),
        Serves::Strict => r == STRICT_RECORD,
        Serves::Trend { split, .. } => {
            let mine = split.as_deref().map_or(Some((1, 0)), parse_split);
            !period
                && !r.starts_with("order:")
                && parse_split(r)
                    .zip(mine)
                    .is_some_and(|(outer, mine)| class_within(mine, outer))
        }
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
    /// How the caller serves the tag, checked against the row's record before anything moves
    /// ([`rule_admits`]).
    pub serves: Serves,
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
            serves: Serves::Unchecked,
            seen: None,
        }
    }

    /// The step and the row the caller last saw, when one autocommitted statement may make
    /// this allocation: an explicit step, no window, no period. The statement moves the
    /// row only while it still shows what the caller saw, has no opaque marker, leaves nothing
    /// unserved (`exclusive_max = max_id`), was written last by the instance answering now
    /// (no failover margin) and has room for the step; otherwise it moves nothing and the
    /// locked transaction decides, with the same outcome as if it had run alone. Why: a
    /// strict tag's row is contended by every node, and a transaction holds its lock across
    /// four round trips, one statement only while it runs.
    pub fn single_statement(&self) -> Option<(i64, &SeenRow)> {
        match (self.step, &self.window, &self.serves, &self.seen) {
            (_, _, Serves::Period(_), _) => None,
            (Some(step), None, _, Some(seen)) if step >= 1 => Some((step, seen)),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_period_record_is_cut_to_its_leading_fields() {
        let record = "period:daily:6:Asia/Shanghai:ORD";
        assert_eq!(position_marker(record), "period:daily:6");
        assert_eq!(served_marker(record), "period:daily:6:Asia/Shanghai");
        assert_eq!(served_marker("period:daily:6:UTC:"), "period:daily:6:UTC");
        assert_eq!(served_marker("period:daily:6"), "period:daily:6");
        assert_eq!(position_marker("order:strict"), "order:strict");
    }

    #[test]
    fn a_split_may_only_narrow() {
        let whole = (1, 0);
        assert!(class_within((2, 0), whole));
        assert!(class_within((4, 2), (2, 0)));
        assert!(class_within((6, 3), (3, 0)));
        assert!(!class_within((4, 1), (2, 0)));
        assert!(
            !class_within((3, 1), (2, 0)),
            "3/1 holds 4, an ID of 2/1... and of 2/0"
        );
        assert!(!class_within(whole, (2, 0)));
        assert!(!class_within((2, 0), (4, 0)), "widening");
        assert_eq!(parse_split("4:3"), Some((4, 3)));
        assert_eq!(parse_split("4:4"), None);
        assert_eq!(parse_split("x"), None);
        assert_eq!(parse_split("0:0"), None);
    }

    /// Each record admits only the callers that serve the tag as it says, before the row moves.
    #[test]
    fn a_record_admits_only_its_own_kind() {
        let trend = |split: Option<&str>| Serves::Trend {
            split: split.map(Into::into),
            opaque: false,
        };
        let period = Serves::Period("period:daily:6".into());
        for serves in [&trend(None), &trend(Some("2:0")), &Serves::Strict, &period] {
            assert!(rule_admits(None, None, serves), "{serves:?}");
        }
        assert!(rule_admits(Some("period:daily:6:UTC:ORD"), None, &period));
        let shanghai = Serves::Period("period:daily:6:Asia/Shanghai".into());
        assert!(rule_admits(Some("period:daily:6"), None, &shanghai));
        assert!(rule_admits(
            Some("period:daily:6:Asia/Shanghai:"),
            None,
            &shanghai
        ));
        assert!(!rule_admits(
            Some("period:daily:6:UTC:ORD"),
            None,
            &shanghai
        ));
        assert!(!rule_admits(
            Some("period:daily:6:Asia/Shanghai2:"),
            None,
            &shanghai
        ));
        assert_eq!(shanghai.period_marker(), Some("period:daily:6"));
        assert_eq!(period.period_marker(), Some("period:daily:6"));
        assert!(!rule_admits(Some("period:daily:60:UTC:"), None, &period));
        assert!(!rule_admits(Some("period:daily:6"), None, &trend(None)));
        assert!(!rule_admits(Some("period:daily:6"), None, &Serves::Strict));
        assert!(!rule_admits(
            Some("period:daily:6"),
            None,
            &Serves::Unchecked
        ));
        assert!(rule_admits(Some(STRICT_RECORD), None, &Serves::Strict));
        assert!(rule_admits(Some(STRICT_RECORD), None, &Serves::Unchecked));
        assert!(!rule_admits(Some(STRICT_RECORD), None, &trend(None)));
        assert!(!rule_admits(Some(STRICT_RECORD), None, &period));
        assert!(rule_admits(Some("2:0"), None, &trend(Some("2:0"))));
        assert!(rule_admits(Some("2:0"), None, &trend(Some("4:2"))));
        assert!(!rule_admits(Some("2:0"), None, &trend(Some("4:1"))));
        assert!(!rule_admits(Some("2:0"), None, &trend(None)));
        assert!(!rule_admits(Some("2:0"), None, &Serves::Strict));
        assert!(!rule_admits(Some("garbage"), None, &trend(None)));
        assert!(rule_admits(None, Some("d10:ab"), &trend(None)));
        assert!(!rule_admits(None, Some("d10:ab"), &Serves::Strict));
        assert!(!rule_admits(None, Some("d10:ab"), &period));
    }
}
