//! A tag's state on this node: its double buffer (built at the tag's first request) and its
//! entry in the engine's map of tags.

use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

use super::gather::Gather;
use super::table::TagTable;
use super::{
    strict, BufferState, OpaqueCipher, PeriodRule, SegmentError, SegmentSettings, TagRule,
};

/// A tag's double buffer and the signal that a load finished.
pub struct TagBuffer {
    pub(super) name: Arc<str>,
    pub(super) state: Mutex<BufferState>,
    /// Notified after every finished load, so waiting requests re-check the buffers. (A
    /// `Notify` wakes its waiters in a fixed order; a watch channel picks among its notifiers
    /// at random, which a simulation's seed cannot replay.)
    pub(super) loaded: Notify,
    /// One allocation of this tag at a time on this node (a background load or an INCRBY
    /// block), each checked against the high-water mark before the next is sent: responses of
    /// concurrent allocations could otherwise arrive out of order and look like a rollback,
    /// and a real rollback between two in-flight allocations could go unseen.
    pub(super) allocating: tokio::sync::Mutex<()>,
    /// How the tag hands out IDs.
    pub(super) kind: TagKind,
    /// The database confirmed that this tag serves opaque IDs under its key.
    pub(super) opaque_claimed: std::sync::atomic::AtomicBool,
    /// Strict requests waiting for the next allocation of the tag.
    pub(super) strict_waiting: Mutex<Vec<strict::Waiting>>,
    /// A strict tag's wait for the requesters its last allocation answered (`None`: not strict).
    pub(super) strict_gather: Option<Box<Gather>>,
    /// The period whose sequence numbers this node saw run out (0: none): no allocation is
    /// asked for until the node's clock reaches the next period.
    pub(super) period_exhausted: std::sync::atomic::AtomicI64,
    /// For a tag this node does not configure: the rule record it was built from (the row's),
    /// so a changed record builds it anew. `None` for a configured tag.
    pub(super) followed: Option<Option<String>>,
}

/// How a tag hands out IDs on a node: one of three kinds, so a combination the configuration
/// refuses (opaque IDs of a strict or period tag) cannot be built.
pub(super) enum TagKind {
    /// From buffered segments, trend-increasing; through the permutation when the tag hands
    /// out opaque IDs.
    Trend { opaque: Option<Arc<OpaqueCipher>> },
    /// Every request served from an allocation made after it arrived, batched ([`strict`]);
    /// the buffers stay empty, so the fast paths never serve it.
    Strict,
    /// A sequence that restarts each period, served strict.
    Period(Arc<PeriodRule>),
}

impl TagKind {
    /// The kind `rule` gives, with `opaque` when the tag is configured opaque. The
    /// configuration refuses an opaque strict or period tag; were one built anyway, it is
    /// served as opaque trend, which the row's record then refuses (`order = "strict"` or a
    /// period recorded): its IDs would not be served, never served twice.
    pub(super) fn of(rule: TagRule, opaque: Option<Arc<OpaqueCipher>>) -> TagKind {
        match (rule, opaque) {
            (_, Some(cipher)) => TagKind::Trend {
                opaque: Some(cipher),
            },
            (TagRule::Trend, None) => TagKind::Trend { opaque: None },
            (TagRule::Strict, None) => TagKind::Strict,
            (TagRule::Period(rule), None) => TagKind::Period(rule),
        }
    }

    /// Served strict (every request from an allocation made after it arrived).
    #[inline]
    pub(super) fn strict(&self) -> bool {
        !matches!(self, TagKind::Trend { .. })
    }

    pub(super) fn period(&self) -> Option<&Arc<PeriodRule>> {
        match self {
            TagKind::Period(rule) => Some(rule),
            _ => None,
        }
    }

    #[inline]
    pub(super) fn opaque(&self) -> Option<&Arc<OpaqueCipher>> {
        match self {
            TagKind::Trend { opaque } => opaque.as_ref(),
            _ => None,
        }
    }
}

impl TagBuffer {
    /// A tag's buffer, by this node's configuration, or by `recorded` (the row's record) for a
    /// tag the node does not configure.
    pub(super) fn new(name: &str, settings: &SegmentSettings, recorded: Option<&str>) -> TagBuffer {
        let follows = settings.follows_row(name);
        let rule = if follows {
            TagRule::from_record(recorded)
        } else {
            settings.configured_rule(name)
        };
        let followed = follows.then(|| rule.record());
        let kind = TagKind::of(rule, settings.opaque_of(name));
        TagBuffer {
            name: name.into(),
            state: Mutex::new(BufferState {
                interleave: settings.interleave_of(name),
                ..BufferState::default()
            }),
            loaded: Notify::new(),
            allocating: tokio::sync::Mutex::new(()),
            opaque_claimed: std::sync::atomic::AtomicBool::new(false),
            strict_waiting: Mutex::new(Vec::new()),
            strict_gather: kind.strict().then(Box::default),
            period_exhausted: std::sync::atomic::AtomicI64::new(0),
            followed,
            kind,
        }
    }

    /// Whether this buffer still serves the rule `recorded` (the row's record) gives it: a
    /// configured tag always does; a followed one while the record's rule is unchanged.
    pub(super) fn serves_record(&self, recorded: Option<&str>) -> bool {
        match &self.followed {
            None => true,
            Some(built_from) => *built_from == TagRule::from_record(recorded).record(),
        }
    }

    /// What a request gets for the sequential ID `last`: itself, or its opaque ID (`None` past
    /// the opaque range: the tag's IDs are exhausted). Inlined: every INCR passes here.
    #[inline]
    pub(super) fn handed_out(&self, last: i64) -> Option<i64> {
        match self.kind.opaque() {
            None => Some(last),
            Some(cipher) => cipher.encode(last),
        }
    }

    /// [`TagBuffer::handed_out`] for a request that waited: past the opaque range the tag's
    /// IDs are exhausted, and it is told so.
    pub(super) fn hand_out(&self, last: i64) -> Result<i64, SegmentError> {
        self.handed_out(last)
            .ok_or_else(|| SegmentError::Exhausted(self.name.to_string()))
    }

    /// Opaque IDs are handed out one at a time: a block of them is not a range.
    pub(super) fn refuses_count(&self, n: i64) -> Option<SegmentError> {
        (n != 1 && self.kind.opaque().is_some()).then(|| {
            SegmentError::Invalid(format!(
                "tag '{}' hands out opaque IDs, one per request: a block of {n} is not a range of IDs (use INCR)",
                self.name
            ))
        })
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, BufferState> {
        // Nothing between lock and unlock can panic half-way through a change of state.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A tag of the table. Its buffers are built at its first request, so a tag never asked for
/// costs this entry only (nodes of SaaS users know hundreds of thousands of cold tags).
pub(super) struct TagEntry {
    /// The rule its row records (`split`), which a node that does not configure it follows.
    pub(super) recorded: Option<Box<str>>,
    pub(super) buffer: std::sync::OnceLock<Arc<TagBuffer>>,
    /// The sweep of the tag list that last found the row (or that was under way when the
    /// entry was added): an entry no complete sweep found has lost its row.
    pub(super) swept: std::sync::atomic::AtomicU32,
}

impl TagEntry {
    pub(super) fn new(recorded: Option<&str>) -> Arc<TagEntry> {
        Arc::new(TagEntry {
            recorded: recorded.map(Box::from),
            buffer: std::sync::OnceLock::new(),
            swept: Default::default(),
        })
    }

    pub(super) fn built(buffer: Arc<TagBuffer>, recorded: Option<&str>) -> Arc<TagEntry> {
        Arc::new(TagEntry {
            recorded: recorded.map(Box::from),
            buffer: std::sync::OnceLock::from(buffer),
            swept: Default::default(),
        })
    }

    /// The buffers, once a request built them.
    #[inline]
    pub(super) fn loaded(&self) -> Option<&Arc<TagBuffer>> {
        self.buffer.get()
    }

    /// The buffers, built now if this is the tag's first request (and the entry noted in
    /// `table` as in use).
    pub(super) fn buffer<'a>(
        self: &'a Arc<Self>,
        name: &str,
        settings: &SegmentSettings,
        table: &TagTable,
    ) -> &'a Arc<TagBuffer> {
        self.buffer.get_or_init(|| {
            table.note_used(self);
            Arc::new(TagBuffer::new(name, settings, self.recorded.as_deref()))
        })
    }

    /// Whether this entry still serves the row's record `recorded`.
    pub(super) fn serves_record(&self, recorded: Option<&str>) -> bool {
        match self.loaded() {
            Some(buffer) => buffer.serves_record(recorded),
            None => self.recorded.as_deref() == recorded,
        }
    }
}
