//! The bit layout of a snowflake ID (sign 0 | timestamp | worker id | sequence) and the
//! conversions between an ID and its fields.

/// Twitter's snowflake epoch (2010-11-04T01:42:54.657Z), the default Leaf uses.
pub const TWITTER_EPOCH_MS: u64 = 1_288_834_974_657;

/// How the 63 usable bits are split; validated so that they sum to 63.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub epoch_ms: u64,
    pub timestamp_bits: u32,
    pub worker_bits: u32,
    pub sequence_bits: u32,
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
        }
    }
}

impl Layout {
    pub fn validate(&self) -> Result<(), String> {
        let total = self.timestamp_bits + self.worker_bits + self.sequence_bits;
        if total != 63 {
            return Err(format!(
                "snowflake bits must sum to 63 (timestamp {} + worker {} + sequence {} = {total})",
                self.timestamp_bits, self.worker_bits, self.sequence_bits
            ));
        }
        if self.timestamp_bits < 30
            || self.worker_bits > 20
            || !(1..=22).contains(&self.sequence_bits)
        {
            return Err(
                "snowflake bits: timestamp needs >= 30, worker <= 20, sequence 1 to 22".into(),
            );
        }
        Ok(())
    }

    pub fn max_worker_id(&self) -> u64 {
        (1u64 << self.worker_bits) - 1
    }

    pub fn max_sequence(&self) -> u64 {
        (1u64 << self.sequence_bits) - 1
    }

    /// The last millisecond (since the UNIX epoch) the timestamp field can hold.
    pub fn max_timestamp_ms(&self) -> u64 {
        self.epoch_ms + ((1u64 << self.timestamp_bits) - 1)
    }

    /// The smallest ID of the millisecond `timestamp_ms` (worker 0, sequence 0): every ID
    /// issued at or after that instant is at least this, every one issued before is below, so
    /// `id >= first_id_at(t1) AND id < first_id_at(t2)` selects the IDs of `[t1, t2)`.
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
        let since_epoch = timestamp_ms - self.epoch_ms;
        ((since_epoch << (self.worker_bits + self.sequence_bits))
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
            timestamp_ms: (id >> (self.worker_bits + self.sequence_bits)) + self.epoch_ms,
            worker_id: (id >> self.sequence_bits) & self.max_worker_id(),
            sequence: id & self.max_sequence(),
        })
    }
}

/// An instant as users write it: UNIX milliseconds, or RFC 3339 in UTC
/// (`2026-12-03T10:00:00Z`, `2026-12-03T10:00:00.250Z`).
pub fn parse_instant(text: &str) -> Result<u64, String> {
    if let Ok(ms) = text.parse::<u64>() {
        return Ok(ms);
    }
    humantime::parse_rfc3339_weak(text.trim_end_matches(['Z', 'z']))
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .and_then(|d| u64::try_from(d.as_millis()).ok())
        .ok_or_else(|| {
            format!("'{text}' is not a time: give UNIX milliseconds or RFC 3339 in UTC (2026-12-03T10:00:00Z)")
        })
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn bit_split_must_sum_to_63() {
        let mut layout = Layout::default();
        assert!(layout.validate().is_ok());
        layout.worker_bits = 11;
        assert!(layout.validate().unwrap_err().contains("sum to 63"));
        layout.timestamp_bits = 40;
        assert!(layout.validate().is_ok());
    }
}
