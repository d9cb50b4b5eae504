//! How a tag's IDs are ordered (trend, strict, or a period's sequence), as this node serves it:
//! from its configuration, or from the rule the tag's row records.

use std::sync::Arc;

/// What a strict tag's row records (in its `split` column, which a strict tag does not
/// otherwise use): a node serving the tag in trend order is refused.
pub const STRICT_MARKER: &str = crate::storage::STRICT_RECORD;

use super::{Calendar, PeriodRule};

/// Longest prefix of a period tag's string form: its row records the prefix with the rule, in
/// a column of 255 characters.
pub const MAX_PREFIX_LEN: usize = 64;

/// How a tag's IDs are ordered, as this node serves it: its configuration's rule, or for a tag
/// it does not configure, the rule the tag's row records.
#[derive(Debug, Clone)]
pub enum TagRule {
    /// Leaf's double buffer (with the node's split or opaque IDs, if any).
    Trend,
    /// Strictly increasing across the cluster.
    Strict,
    /// A sequence that restarts each period (served strict).
    Period(Arc<PeriodRule>),
}

impl TagRule {
    /// What the tag's row records of the rule (`None`: trend, whose row may record a split).
    pub fn record(&self) -> Option<String> {
        match self {
            TagRule::Trend => None,
            TagRule::Strict => Some(STRICT_MARKER.to_string()),
            TagRule::Period(rule) => Some(rule.record()),
        }
    }

    /// The rule an admin names at run time (`LEAF.TAG CREATE … ORDER strict PERIOD daily ZONE
    /// Asia/Shanghai DIGITS 6 PREFIX ORD`, or the same fields over HTTP), checked as the
    /// configuration's keys are; the message names what is wrong.
    pub fn named(
        order: Option<&str>,
        period: Option<&str>,
        time_zone: Option<&str>,
        digits: Option<u32>,
        prefix: Option<&str>,
    ) -> Result<TagRule, String> {
        let strict = match order.map(str::to_ascii_lowercase).as_deref() {
            None | Some("trend") => false,
            Some("strict") => true,
            Some(other) => return Err(format!("ORDER must be strict or trend, not '{other}'")),
        };
        let Some(period) = period else {
            if time_zone.is_some() || digits.is_some() || prefix.is_some() {
                return Err("ZONE, DIGITS and PREFIX belong to a PERIOD".into());
            }
            return Ok(if strict {
                TagRule::Strict
            } else {
                TagRule::Trend
            });
        };
        if order.is_some() && !strict {
            return Err(
                "a period tag is served in strict order: ORDER trend does not apply".into(),
            );
        }
        let calendar = Calendar::from_name(period)
            .ok_or_else(|| format!("PERIOD must be daily, monthly or yearly, not '{period}'"))?;
        let zone_name = time_zone.unwrap_or("UTC");
        let zone = jiff::tz::TimeZone::get(zone_name)
            .ok()
            .filter(|_| super::zone_names_a_place(zone_name))
            .ok_or_else(|| {
                format!("ZONE '{zone_name}' is not an IANA time zone (e.g. UTC, Asia/Shanghai)")
            })?;
        let digits = digits.unwrap_or(6);
        let most = calendar.max_sequence_digits();
        if !(1..=most).contains(&digits) {
            return Err(format!(
                "DIGITS must be between 1 and {most} for a {} period",
                calendar.name()
            ));
        }
        let prefix = prefix.unwrap_or("");
        if prefix.chars().any(|c| !c.is_ascii_graphic()) || prefix.len() > MAX_PREFIX_LEN {
            return Err(format!(
                "PREFIX must be printable ASCII without spaces, at most {MAX_PREFIX_LEN} characters"
            ));
        }
        let rule = PeriodRule::new(calendar, zone, zone_name, digits, prefix);
        Ok(TagRule::Period(Arc::new(rule)))
    }

    /// The rule a row's record gives a node that does not configure the tag: a period
    /// recorded in full, strict order, or else trend (which the allocation then checks).
    pub fn from_record(recorded: Option<&str>) -> TagRule {
        match recorded {
            Some(STRICT_MARKER) => TagRule::Strict,
            Some(r) => PeriodRule::from_record(r)
                .map(|rule| TagRule::Period(Arc::new(rule)))
                .unwrap_or(TagRule::Trend),
            None => TagRule::Trend,
        }
    }
}
