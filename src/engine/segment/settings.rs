//! The segment engine's tuning, filled by the app from `[segment]`: step rules, limits, which
//! tags may be created on first use, and how each tag's IDs are handed out.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use super::{Interleave, OpaqueCipher, PeriodRule, TagRule};

/// Tuning of the engine (the app fills it from the `[segment]` config section).
#[derive(Debug, Clone)]
pub struct SegmentSettings {
    pub adaptive_step: bool,
    pub max_step: i64,
    /// Longest a request waits for a load when both buffers are empty.
    pub load_timeout: Duration,
    /// Most tags the table may hold; creating one more is refused.
    pub max_tags: usize,
    /// IDs an allocation skips when the database instance that made the tag's previous
    /// allocation is not the one answering (see `storage::failover`).
    pub failover_margin: i64,
    /// Unknown tags that may be created by their first use, and with what step.
    pub auto_create: Option<AutoCreate>,
    /// Which IDs each tag hands out (`segment.id_delta`/`id_remainder`), by tag; `None`: all.
    pub interleave: Interleave,
    pub tag_interleave: HashMap<String, Interleave>,
    /// Tags that hand out opaque IDs (`[[segment.opaque]]`), with their permutation.
    pub opaque: HashMap<String, Arc<OpaqueCipher>>,
    /// Tags whose IDs strictly increase across the cluster (`order = "strict"`).
    pub strict: HashSet<String>,
    /// Tags whose sequence restarts each period (`period = "daily"`, …), served strict.
    pub period: HashMap<String, Arc<PeriodRule>>,
    /// Tags this node's configuration lists (`[[segment.tags]]`, `[[segment.opaque]]`): their
    /// rule is the configuration's. Any other tag follows the rule its row records.
    pub configured: HashSet<String>,
}

impl Default for SegmentSettings {
    /// The `[segment]` section's defaults, every tag plain (tests and benchmarks start here).
    fn default() -> Self {
        SegmentSettings {
            adaptive_step: true,
            max_step: 1_000_000,
            load_timeout: Duration::from_secs(1),
            max_tags: 10_000,
            failover_margin: 10_000_000,
            auto_create: None,
            interleave: Interleave::default(),
            tag_interleave: HashMap::new(),
            opaque: HashMap::new(),
            strict: HashSet::new(),
            period: HashMap::new(),
            configured: HashSet::new(),
        }
    }
}

impl SegmentSettings {
    /// The interleave of `tag`: its own, else the cluster's.
    pub fn interleave_of(&self, tag: &str) -> Interleave {
        self.tag_interleave
            .get(tag)
            .copied()
            .unwrap_or(self.interleave)
    }

    /// Whether this node serves `tag` by the rule its row records: it does not configure the
    /// tag, and hands out the whole ID space (a strict or period tag cannot be split between
    /// clusters, so a node with a split never takes such a rule from a row).
    pub fn follows_row(&self, tag: &str) -> bool {
        !self.configured.contains(tag)
            && !self.opaque.contains_key(tag)
            && self.interleave_of(tag) == Interleave::default()
    }

    /// The rule this node's configuration gives `tag`.
    pub fn configured_rule(&self, tag: &str) -> TagRule {
        if let Some(rule) = self.period.get(tag) {
            TagRule::Period(rule.clone())
        } else if self.strict.contains(tag) {
            TagRule::Strict
        } else {
            TagRule::Trend
        }
    }

    /// The permutation of `tag`'s IDs, when it hands out opaque IDs.
    pub fn opaque_of(&self, tag: &str) -> Option<Arc<OpaqueCipher>> {
        self.opaque.get(tag).cloned()
    }
}

/// `segment.auto_create`: which unknown tags a request creates, and their step.
#[derive(Clone)]
pub struct AutoCreate {
    /// Whether a tag name may be created on first use (the configured pattern).
    pub allows: Arc<dyn Fn(&str) -> bool + Send + Sync>,
    pub step: i64,
}

impl std::fmt::Debug for AutoCreate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AutoCreate")
            .field("step", &self.step)
            .finish()
    }
}
