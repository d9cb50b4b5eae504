//! `[segment]`: Leaf's double buffer and adaptive step, the tags created at start, tags created
//! by their first use, the delta/remainder split and opaque tags.

use serde::{Deserialize, Serialize};

/// The segment engine: Leaf's double buffer and adaptive step.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct SegmentConfig {
    /// How often the tag list is re-read from the database, in seconds.
    pub refresh_interval_secs: u64,
    /// Leaf's adaptive step: double when a segment lasted < 15 min, halve when > 30 min.
    pub adaptive_step: bool,
    /// Upper bound of the adaptive step and of `LEAF.TAG` steps.
    pub max_step: i64,
    /// Longest a request waits for a segment load when both buffers are empty, in ms.
    pub load_timeout_ms: u64,
    /// Most tags `LEAF.TAG CREATE` (and the HTTP endpoint) may bring the table to.
    pub max_tags: usize,
    /// IDs an allocation skips when the tag's previous allocation was made by another
    /// database instance (a failover or restore may have lost allocations up to this many IDs).
    pub failover_margin: i64,
    /// This cluster hands out only segment IDs with `id % id_delta == id_remainder` (Tinyid's
    /// delta/remainder): clusters on separate databases with one delta and distinct remainders
    /// never collide. 1 and 0: every ID.
    pub id_delta: i64,
    pub id_remainder: i64,
    /// Create an unknown tag on its first use (`INCR segment:new`), when its name matches
    /// `auto_create_pattern`. Off: an unknown tag is an error.
    pub auto_create: bool,
    /// Redis-style glob (`*`, `?`, `[a-z]`) of the tag names `auto_create` may create;
    /// case-sensitive, as Redis's KEYS.
    pub auto_create_pattern: String,
    /// The step of a tag created on first use.
    pub auto_create_step: i64,
    /// Tags created at start when absent (`[[segment.tags]]`).
    pub tags: Vec<TagSeed>,
    /// The secret that keys opaque IDs: at least 16 characters, the same on every node that
    /// serves the tags (and in both clusters of an `id_delta` pair).
    pub opaque_key: String,
    /// Tags that hand out a keyed permutation of their IDs instead of the IDs
    /// (`[[segment.opaque]]`).
    pub opaque: Vec<OpaqueTag>,
}

/// The widest split a cluster may hand out (`segment.id_delta`, `LEAF.TAG SPLIT`).
pub const MAX_ID_DELTA: i64 = 1_000_000;

/// False for the time zone names the zone database holds that name no place's calendar:
/// `localtime` is whatever each host is set to, `posixrules` and `Factory` are the database's
/// own. A period rule recorded in a row must mean one calendar on every host.
pub fn zone_names_a_place(name: &str) -> bool {
    !["localtime", "posixrules", "factory"].contains(&name.to_ascii_lowercase().as_str())
}

/// A tag whose IDs are opaque: every ID has exactly `digits` decimal digits, and neither the
/// count nor the order of the IDs shows in them.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct OpaqueTag {
    pub tag: String,
    #[serde(default = "default_digits")]
    pub digits: u32,
}

fn default_digits() -> u32 {
    10
}

impl Default for SegmentConfig {
    fn default() -> Self {
        Self {
            refresh_interval_secs: 60,
            adaptive_step: true,
            max_step: 1_000_000,
            load_timeout_ms: 1000,
            max_tags: 10_000,
            failover_margin: 10_000_000,
            id_delta: 1,
            id_remainder: 0,
            auto_create: false,
            auto_create_pattern: "*".into(),
            auto_create_step: 1000,
            tags: Vec::new(),
            opaque_key: String::new(),
            opaque: Vec::new(),
        }
    }
}

/// A tag to create at start if the table does not have it yet.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TagSeed {
    pub tag: String,
    pub step: i64,
    /// The first ID the tag hands out.
    #[serde(default = "default_start")]
    pub start: i64,
    #[serde(default)]
    pub description: Option<String>,
    /// This tag's own `id_delta` / `id_remainder` (else the section's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delta: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remainder: Option<i64>,
    /// `trend` (Leaf's: increasing per node, trend-increasing across nodes) or `strict`: a
    /// request sent after another's reply arrived gets a larger ID, on any node.
    #[serde(default)]
    pub order: TagOrder,
    /// A sequence that restarts each period: IDs are the period's date in `time_zone` and a
    /// sequence from 1 of `sequence_digits` digits (`20261204000123`), served in strict order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub period: Option<Period>,
    /// The IANA time zone whose calendar the period follows (`Asia/Shanghai`).
    #[serde(default = "default_time_zone")]
    pub time_zone: String,
    #[serde(default = "default_sequence_digits")]
    pub sequence_digits: u32,
    /// Put before the number by `LEAF.CODE` (`ORD20261204000123`).
    #[serde(default)]
    pub prefix: String,
}

impl TagSeed {
    /// A tag with `step` and every other key at its default, as a `[[segment.tags]]` entry with
    /// only `tag` and `step` reads.
    pub fn new(tag: impl Into<String>, step: i64) -> TagSeed {
        TagSeed {
            tag: tag.into(),
            step,
            start: default_start(),
            description: None,
            delta: None,
            remainder: None,
            order: TagOrder::default(),
            period: None,
            time_zone: default_time_zone(),
            sequence_digits: default_sequence_digits(),
            prefix: String::new(),
        }
    }
}

/// How often a period tag's sequence restarts at 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Period {
    /// `YYYYMMDD` then the sequence.
    Daily,
    /// `YYYYMM` then the sequence.
    Monthly,
    /// `YYYY` then the sequence.
    Yearly,
}

impl Period {
    /// Digits of the period's date in an ID.
    pub fn date_digits(self) -> u32 {
        match self {
            Period::Daily => 8,
            Period::Monthly => 6,
            Period::Yearly => 4,
        }
    }

    /// Most sequence digits: the table's position keeps one digit more than the ID (see
    /// `engine::segment::period`) and must stay within 18 digits.
    pub fn max_sequence_digits(self) -> u32 {
        17 - self.date_digits()
    }
}

fn default_time_zone() -> String {
    "UTC".into()
}

fn default_sequence_digits() -> u32 {
    6
}

/// How a tag's IDs are ordered across the cluster.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TagOrder {
    /// Leaf's double buffer: IDs increase on each node, and only by trend across nodes.
    #[default]
    Trend,
    /// Every request allocates in the table (its row lock orders them, batched per node):
    /// if a reply came before a request was sent, anywhere, the later ID is larger.
    Strict,
}

fn default_start() -> i64 {
    1
}

impl SegmentConfig {
    /// The `[segment]` section's own rules; the message names the key.
    pub(crate) fn validate(&self) -> Result<(), String> {
        if !(1..=i32::MAX as i64).contains(&self.max_step) {
            return Err("segment.max_step must be between 1 and 2147483647".into());
        }
        if self.refresh_interval_secs == 0 || self.load_timeout_ms == 0 {
            return Err("segment.refresh_interval_secs and load_timeout_ms must be > 0".into());
        }
        if self.auto_create && !(1..=self.max_step).contains(&self.auto_create_step) {
            return Err(format!(
                "segment.auto_create_step must be between 1 and {}",
                self.max_step
            ));
        }
        check_interleave("segment", self.id_delta, self.id_remainder)?;
        for seed in &self.tags {
            if seed.delta.is_some() || seed.remainder.is_some() {
                let delta = seed.delta.unwrap_or(self.id_delta);
                let remainder = seed.remainder.unwrap_or(0);
                check_interleave(&format!("segment.tags '{}'", seed.tag), delta, remainder)?;
            }
        }
        self.validate_opaque()?;
        if self.failover_margin < 0 {
            return Err("segment.failover_margin must be 0 or more IDs".into());
        }
        for seed in self.tags.iter().filter(|s| s.order == TagOrder::Strict) {
            let delta = seed.delta.unwrap_or(self.id_delta);
            if delta != 1 {
                return Err(format!(
                    "segment.tags '{}': order = \"strict\" cannot be combined with an id_delta split ({delta}): clusters on separate databases have no common order",
                    seed.tag
                ));
            }
            if self.opaque.iter().any(|o| o.tag == seed.tag) {
                return Err(format!(
                    "segment.tags '{}': order = \"strict\" cannot be combined with opaque IDs, whose order is hidden",
                    seed.tag
                ));
            }
        }
        for seed in &self.tags {
            self.validate_period(seed)?;
        }
        for seed in &self.tags {
            if !(1..=self.max_step).contains(&seed.step) {
                return Err(format!(
                    "segment.tags '{}': step must be between 1 and {}",
                    seed.tag, self.max_step
                ));
            }
        }
        Ok(())
    }
}

impl SegmentConfig {
    /// A period tag: a known time zone, digits that fit, and none of what a period cannot carry
    /// (a split, opaque IDs, a start: its positions are the period's).
    fn validate_period(&self, seed: &TagSeed) -> Result<(), String> {
        let Some(period) = seed.period else {
            return Ok(());
        };
        let what = format!("segment.tags '{}'", seed.tag);
        if jiff::tz::TimeZone::get(&seed.time_zone).is_err() || !zone_names_a_place(&seed.time_zone)
        {
            return Err(format!(
                "{what}: time_zone '{}' is not an IANA time zone (e.g. \"UTC\", \"Asia/Shanghai\")",
                seed.time_zone
            ));
        }
        let most = period.max_sequence_digits();
        if !(1..=most).contains(&seed.sequence_digits) {
            return Err(format!(
                "{what}: sequence_digits must be between 1 and {most} for period = \"{}\"",
                format!("{period:?}").to_lowercase()
            ));
        }
        let delta = seed.delta.unwrap_or(self.id_delta);
        if delta != 1 {
            return Err(format!(
                "{what}: a period cannot be combined with an id_delta split ({delta}): give each data centre its own tag"
            ));
        }
        if self.opaque.iter().any(|o| o.tag == seed.tag) {
            return Err(format!(
                "{what}: a period cannot be combined with opaque IDs (the date is in the ID)"
            ));
        }
        if seed.start != 1 {
            return Err(format!(
                "{what}: a period tag's sequence starts at 1 each period; remove start"
            ));
        }
        // 64: the row records the prefix with the rule, in a column of 255 characters.
        if seed.prefix.chars().any(|c| !c.is_ascii_graphic()) || seed.prefix.len() > 64 {
            return Err(format!(
                "{what}: prefix must be printable ASCII without spaces, at most 64 characters"
            ));
        }
        Ok(())
    }

    fn validate_opaque(&self) -> Result<(), String> {
        if self.opaque.is_empty() {
            return Ok(());
        }
        if self.opaque_key.len() < 16 {
            return Err(
                "segment.opaque_key must be at least 16 characters when [[segment.opaque]] tags are configured"
                    .into(),
            );
        }
        for (i, entry) in self.opaque.iter().enumerate() {
            if !(4..=18).contains(&entry.digits) {
                return Err(format!(
                    "segment.opaque '{}': digits must be between 4 and 18",
                    entry.tag
                ));
            }
            if self.opaque[..i].iter().any(|e| e.tag == entry.tag) {
                return Err(format!("segment.opaque '{}' is listed twice", entry.tag));
            }
        }
        Ok(())
    }
}

/// A delta of 1 to 1,000,000 and a remainder below it.
fn check_interleave(what: &str, delta: i64, remainder: i64) -> Result<(), String> {
    if !(1..=MAX_ID_DELTA).contains(&delta) || !(0..delta).contains(&remainder) {
        return Err(format!(
            "{what}: the delta must be between 1 and 1000000 and the remainder between 0 and delta - 1 (got {delta} and {remainder})"
        ));
    }
    Ok(())
}
