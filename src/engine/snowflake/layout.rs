//! The bit layout of a snowflake ID (sign 0 | timestamp | worker id | sequence), its time unit,
//! and the conversions between an ID and its fields.

use crate::coord::LayoutRecord;

/// Twitter's snowflake epoch (2010-11-04T01:42:54.657Z), the default Leaf uses.
pub const TWITTER_EPOCH_MS: u64 = 1_288_834_974_657;

/// How the bits of an ID are split (at most 63; 53 or fewer keep IDs exact in JavaScript), and
/// how long one step of the timestamp field lasts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub epoch_ms: u64,
    pub timestamp_bits: u32,
    pub worker_bits: u32,
    pub sequence_bits: u32,
    /// Milliseconds per step of the timestamp field (1 as Twitter, 10 as sonyflake, 1000 as
    /// uid-generator): all IDs of one step share its sequence.
    pub unit_ms: u64,
}

/// The fields of an ID.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decoded {
    /// Milliseconds since the UNIX epoch.
    pub timestamp_ms: u64,
    pub worker_id: u64,
    pub sequence: u64,
}

impl Default for Layout {
    fn default() -> Self {
        Layout {
            epoch_ms: TWITTER_EPOCH_MS,
            timestamp_bits: 41,
            worker_bits: 10,
            sequence_bits: 12,
            unit_ms: 1,
        }
    }
}

impl Layout {
    pub fn validate(&self) -> Result<(), String> {
        let total = self.timestamp_bits + self.worker_bits + self.sequence_bits;
        if total > 63 {
            return Err(format!(
                "snowflake bits must sum to 63 or less (timestamp {} + worker {} + sequence {} = {total})",
                self.timestamp_bits, self.worker_bits, self.sequence_bits
            ));
        }
        if !(28..=53).contains(&self.timestamp_bits)
            || self.worker_bits > 22
            || !(1..=22).contains(&self.sequence_bits)
        {
            return Err(
                "snowflake bits: timestamp 28 to 53, worker 0 to 22, sequence 1 to 22".into(),
            );
        }
        if !(1..=1000).contains(&self.unit_ms) {
            return Err("snowflake.time_unit_ms must be between 1 and 1000".into());
        }
        Ok(())
    }

    /// The layout as it is recorded beside the time fence, to notice a change
    /// (`epoch_ms=…,bits=41/10/12,unit_ms=1`).
    pub fn descriptor(&self) -> String {
        format!(
            "epoch_ms={},bits={}/{}/{},unit_ms={}",
            self.epoch_ms, self.timestamp_bits, self.worker_bits, self.sequence_bits, self.unit_ms
        )
    }

    /// The layout a [`Layout::descriptor`] names.
    pub fn from_descriptor(text: &str) -> Option<Layout> {
        let mut layout = Layout::default();
        for part in text.split(',') {
            let (key, value) = part.split_once('=')?;
            match key {
                "epoch_ms" => layout.epoch_ms = value.parse().ok()?,
                "unit_ms" => layout.unit_ms = value.parse().ok()?,
                "bits" => {
                    let mut bits = value.split('/').map(str::parse::<u32>);
                    layout.timestamp_bits = bits.next()?.ok()?;
                    layout.worker_bits = bits.next()?.ok()?;
                    layout.sequence_bits = bits.next()?.ok()?;
                }
                _ => return None,
            }
        }
        layout.validate().ok().map(|()| layout)
    }

    /// The largest ID this layout can have issued, by any worker, up to `fence_ms`.
    pub fn max_id_until(&self, fence_ms: u64) -> i64 {
        let until = fence_ms.clamp(self.epoch_ms, self.max_timestamp_ms());
        self.encode(until, self.max_worker_id(), self.max_sequence())
    }

    /// The step of the timestamp field that the millisecond `timestamp_ms` falls in.
    pub fn tick(&self, timestamp_ms: u64) -> u64 {
        let since_epoch = timestamp_ms - self.epoch_ms;
        // Every ID passes here: the default unit needs no division.
        if self.unit_ms == 1 {
            since_epoch
        } else {
            since_epoch / self.unit_ms
        }
    }

    /// The first millisecond of step `tick`.
    pub fn tick_start_ms(&self, tick: u64) -> u64 {
        self.epoch_ms + tick * self.unit_ms
    }

    /// The last millisecond of step `tick`: an ID of that step may be issued only when the
    /// time fence and the lease cover all of it.
    pub fn tick_last_ms(&self, tick: u64) -> u64 {
        self.tick_start_ms(tick) + self.unit_ms - 1
    }

    /// How long the layout lasts, in days from its epoch.
    pub fn lifetime_days(&self) -> u64 {
        ((1u64 << self.timestamp_bits) * self.unit_ms) / 86_400_000
    }

    pub fn max_worker_id(&self) -> u64 {
        (1u64 << self.worker_bits) - 1
    }

    pub fn max_sequence(&self) -> u64 {
        (1u64 << self.sequence_bits) - 1
    }

    /// The last millisecond (since the UNIX epoch) the timestamp field can hold.
    pub fn max_timestamp_ms(&self) -> u64 {
        self.tick_last_ms((1u64 << self.timestamp_bits) - 1)
    }

    /// The smallest ID of the millisecond `timestamp_ms` (worker 0, sequence 0): every ID
    /// issued at or after that instant is at least this, every one issued before is below, so
    /// `id >= first_id_at(t1) AND id < first_id_at(t2)` selects the IDs of `[t1, t2)`. With a
    /// unit over 1 ms, an instant stands for the whole step it falls in (rounded down).
    pub fn first_id_at(&self, timestamp_ms: u64) -> Result<i64, String> {
        if timestamp_ms < self.epoch_ms {
            return Err(format!(
                "{timestamp_ms} ms is before the snowflake epoch ({} ms)",
                self.epoch_ms
            ));
        }
        if timestamp_ms > self.max_timestamp_ms() {
            return Err(format!(
                "{timestamp_ms} ms is past the last millisecond this layout can encode ({} ms)",
                self.max_timestamp_ms()
            ));
        }
        Ok(self.encode(timestamp_ms, 0, 0))
    }

    /// Packs the fields; the caller guarantees each is in range.
    pub fn encode(&self, timestamp_ms: u64, worker_id: u64, sequence: u64) -> i64 {
        self.encode_tick(self.tick(timestamp_ms), worker_id, sequence)
    }

    /// [`Layout::encode`] of a step already computed from the time.
    pub fn encode_tick(&self, tick: u64, worker_id: u64, sequence: u64) -> i64 {
        ((tick << (self.worker_bits + self.sequence_bits))
            | (worker_id << self.sequence_bits)
            | sequence) as i64
    }

    /// The fields of `id`; `None` unless it is positive (0 is no ID any layout issues).
    pub fn decode(&self, id: i64) -> Option<Decoded> {
        if id <= 0 {
            return None;
        }
        let id = id as u64;
        Some(Decoded {
            timestamp_ms: self.tick_start_ms(id >> (self.worker_bits + self.sequence_bits)),
            worker_id: (id >> self.sequence_bits) & self.max_worker_id(),
            sequence: id & self.max_sequence(),
        })
    }
}

/// The coordinators record the layout beside fences and leases; a change is safe only when
/// the new layout's IDs start above everything the old one could have issued.
impl LayoutRecord for Layout {
    fn descriptor(&self) -> String {
        Layout::descriptor(self)
    }

    fn epoch_ms(&self) -> u64 {
        self.epoch_ms
    }

    fn last_ms(&self) -> u64 {
        self.max_timestamp_ms()
    }

    fn max_worker_id(&self) -> u64 {
        Layout::max_worker_id(self)
    }

    fn may_follow(&self, previous: &str, fence_ms: u64, now_ms: u64) -> Result<(), String> {
        if previous == self.descriptor() {
            return Ok(());
        }
        let old = Layout::from_descriptor(previous)
            .ok_or_else(|| format!("the recorded layout '{previous}' cannot be read"))?;
        let old_max = old.max_id_until(fence_ms);
        let first = self
            .first_id_at(now_ms.max(self.epoch_ms + 1))
            .map_err(|e| format!("the new layout {}: {e}", self.descriptor()))?;
        if first > old_max {
            return Ok(());
        }
        Err(format!(
            "IDs of {previous} may reach {old_max} (by its time fence at {fence_ms} ms), and {} would start at {first}: its IDs could repeat or go back. Keep the old layout, or choose an epoch, split or unit whose first ID now is above {old_max}",
            self.descriptor()
        ))
    }
}

/// An instant as users write it: UNIX milliseconds, or an RFC 3339 timestamp with its offset
/// (`2026-12-03T10:00:00Z`, `2026-12-03T10:00:00.250+02:00`, `…-05:30`), converted exactly
/// (jiff); a fraction finer than a millisecond is cut to the millisecond holding the instant.
/// A time without an offset names no instant and is refused.
pub fn parse_instant(text: &str) -> Result<u64, String> {
    if let Ok(ms) = text.parse::<u64>() {
        return Ok(ms);
    }
    let refused = |why: &str| {
        format!(
            "'{text}' is not a time: {why}; give UNIX milliseconds or RFC 3339 with an offset (2026-12-03T10:00:00Z, 2026-12-03T12:00:00.250+02:00)"
        )
    };
    let instant = text.parse::<jiff::Timestamp>().map_err(|_| {
        if text.parse::<jiff::civil::DateTime>().is_ok() {
            refused("it has no offset (add Z for UTC)")
        } else {
            refused("it is not an RFC 3339 timestamp")
        }
    })?;
    u64::try_from(instant.as_millisecond()).map_err(|_| refused("it is before 1970"))
}

/// UNIX milliseconds as RFC 3339 in UTC with milliseconds (`2026-12-03T10:00:00.250Z`), the
/// form `parse_instant` reads back.
pub fn format_instant(ms: u64) -> String {
    i64::try_from(ms)
        .ok()
        .and_then(|ms| jiff::Timestamp::from_millisecond(ms).ok())
        .map_or_else(
            || format!("{ms} ms"),
            |t| t.strftime("%Y-%m-%dT%H:%M:%S%.3fZ").to_string(),
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formatted_instants_read_back() {
        assert_eq!(
            format_instant(1_796_292_000_250),
            "2026-12-03T10:00:00.250Z"
        );
        assert_eq!(
            format_instant(1_796_292_000_000),
            "2026-12-03T10:00:00.000Z"
        );
        assert_eq!(
            parse_instant(&format_instant(1_796_292_000_007)),
            Ok(1_796_292_000_007)
        );
    }

    #[test]
    fn instants_are_read_with_their_offset() {
        // 2026-12-03T10:00:00.250Z
        let utc = 1_796_292_000_250;
        for (text, ms) in [
            ("2026-12-03T10:00:00.250Z", utc),
            ("2026-12-03t10:00:00.250z", utc),
            ("2026-12-03T12:00:00.250+02:00", utc),
            ("2026-12-03T10:00:00.250+02:00", utc - 2 * 3_600_000),
            ("2026-12-03T15:30:00.250+05:30", utc),
            ("2026-12-03T04:30:00.250-05:30", utc),
            ("2026-12-03T05:00:00.250-05:00", utc),
            ("2026-12-03T10:00:00Z", utc - 250),
            ("2026-12-03T12:00:00+02:00", utc - 250),
            ("2026-12-03T10:00:00.2509Z", utc),
            ("2026-12-03T10:00:00.25Z", utc),
            ("1796292000250", utc),
        ] {
            assert_eq!(parse_instant(text), Ok(ms), "{text}");
        }
        let no_offset = parse_instant("2026-12-03T10:00:00.250").unwrap_err();
        assert!(
            no_offset.contains("it has no offset (add Z for UTC)"),
            "{no_offset}"
        );
        for bad in [
            "yesterday",
            "2026-13-03T10:00:00Z",
            "2026-12-03T10:00:00+26:00",
            "",
        ] {
            let err = parse_instant(bad).unwrap_err();
            assert!(
                err.starts_with(&format!("'{bad}' is not a time: ")),
                "{err}"
            );
        }
        assert!(parse_instant("1969-12-31T23:59:59Z")
            .unwrap_err()
            .contains("before 1970"));
    }

    #[test]
    fn decode_inverts_encode() {
        let layout = Layout::default();
        // 0 (the epoch's first millisecond, worker 0, sequence 0) is never issued: the clock
        // must be past the epoch at start.
        assert_eq!(layout.decode(layout.encode(TWITTER_EPOCH_MS, 0, 0)), None);
        for (ts, worker, seq) in [
            (TWITTER_EPOCH_MS, 0, 1),
            (1_764_000_000_123, 1023, 4095),
            (1_764_000_000_123, 17, 99),
            (layout.max_timestamp_ms(), 5, 1),
        ] {
            let id = layout.encode(ts, worker, seq);
            assert!(id >= 0);
            assert_eq!(
                layout.decode(id),
                Some(Decoded {
                    timestamp_ms: ts,
                    worker_id: worker,
                    sequence: seq
                })
            );
        }
    }

    #[test]
    fn first_id_at_bounds_the_ids_of_an_instant() {
        let layout = Layout::default();
        let t = 1_764_000_000_123;
        let first = layout.first_id_at(t).unwrap();
        assert_eq!(first, layout.encode(t, 0, 0));
        assert!(layout.encode(t - 1, 1023, 4095) < first);
        assert!(layout.encode(t, 0, 0) >= first);
        assert_eq!(
            layout.first_id_at(t + 1).unwrap(),
            layout.encode(t, 1023, 4095) + 1
        );
        assert!(layout
            .first_id_at(TWITTER_EPOCH_MS - 1)
            .unwrap_err()
            .contains("before the snowflake epoch"));
        assert!(layout
            .first_id_at(layout.max_timestamp_ms() + 1)
            .unwrap_err()
            .contains("past the last millisecond"));
        assert_eq!(parse_instant("1764000000123"), Ok(1_764_000_000_123));
        assert_eq!(
            parse_instant("2025-11-24T16:00:00.123Z"),
            Ok(1_764_000_000_123)
        );
        assert_eq!(parse_instant("2025-11-24T16:00:00Z"), Ok(1_764_000_000_000));
        assert!(parse_instant("yesterday").is_err());
    }

    #[test]
    fn known_id_has_known_fields() {
        // 1 ms after the epoch, worker 1, sequence 1: 1<<22 | 1<<12 | 1.
        let layout = Layout::default();
        assert_eq!(layout.encode(TWITTER_EPOCH_MS + 1, 1, 1), 4_198_401);
    }

    #[test]
    fn bit_split_must_sum_to_63_or_less() {
        let mut layout = Layout::default();
        assert!(layout.validate().is_ok());
        layout.worker_bits = 11;
        assert!(layout.validate().unwrap_err().contains("sum to 63 or less"));
        layout.timestamp_bits = 40;
        assert!(layout.validate().is_ok());
        layout.unit_ms = 0;
        assert!(layout.validate().unwrap_err().contains("time_unit_ms"));
    }

    /// 41 + 4 + 8 bits in 10 ms steps: every ID is at most 2^53 − 1 for all the years the
    /// layout lasts, fields come back rounded down to the step, and the step's bounds hold.
    #[test]
    fn a_javascript_safe_layout_with_a_10_ms_unit() {
        let layout = Layout {
            epoch_ms: TWITTER_EPOCH_MS,
            timestamp_bits: 41,
            worker_bits: 4,
            sequence_bits: 8,
            unit_ms: 10,
        };
        layout.validate().unwrap();
        let last = layout.encode(layout.max_timestamp_ms(), 15, 255);
        assert_eq!(last, (1i64 << 53) - 1);
        assert_eq!(layout.lifetime_days(), 254_516);
        // A step starts here: (t − epoch) is a multiple of 10.
        let t = 1_764_000_000_127;
        let id = layout.encode(t + 7, 3, 9);
        let fields = layout.decode(id).unwrap();
        assert_eq!(
            (fields.timestamp_ms, fields.worker_id, fields.sequence),
            (t, 3, 9)
        );
        assert_eq!(layout.tick_last_ms(layout.tick(t + 7)), t + 9);
        assert_eq!(layout.first_id_at(t + 9), layout.first_id_at(t));
        assert!(layout.first_id_at(t + 10).unwrap() > layout.encode(t + 9, 15, 255));
        assert_eq!(Layout::from_descriptor(&layout.descriptor()), Some(layout));
        assert_eq!(
            layout.descriptor(),
            "epoch_ms=1288834974657,bits=41/4/8,unit_ms=10"
        );
        assert_eq!(Layout::from_descriptor("bits=41/4"), None);
        assert!(layout.max_id_until(t) >= layout.encode(t, 15, 255));
    }
}
