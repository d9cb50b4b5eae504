//! Latency histograms with fixed buckets, cheap enough for the request path, and the metrics
//! of one command name built on them.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Histogram bucket bounds from 10 µs to 2.5 s, in nanoseconds: fine enough below a millisecond.
pub(super) const LATENCY_BOUNDS_NANOS: [u64; 17] = [
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
];

/// A fixed-bucket latency histogram. Recording is two relaxed atomic additions with no
/// allocation, so it can sit on the request path; the exporter's own histograms buffer every
/// sample until a scrape, which costs more per record and grows when nobody scrapes.
pub struct LatencyHistogram {
    /// Per-bucket (not cumulative) counts; the last one is `+Inf`.
    buckets: [AtomicU64; LATENCY_BOUNDS_NANOS.len() + 1],
    pub(super) sum_nanos: AtomicU64,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        LatencyHistogram {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_nanos: AtomicU64::new(0),
        }
    }
}

impl LatencyHistogram {
    pub fn record(&self, elapsed: Duration) {
        let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        let bucket = LATENCY_BOUNDS_NANOS.partition_point(|&bound| bound < nanos);
        self.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        self.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// Appends the `_bucket`, `_sum` and `_count` lines of one labelled series.
    pub(super) fn render(&self, name: &str, labels: &str, out: &mut String) {
        let mut cumulative = 0;
        for (i, bucket) in self.buckets.iter().enumerate() {
            cumulative += bucket.load(Ordering::Relaxed);
            let le = match LATENCY_BOUNDS_NANOS.get(i) {
                Some(bound) => format!("{}", *bound as f64 / 1e9),
                None => "+Inf".into(),
            };
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{le}\"}} {cumulative}");
        }
        let sum = self.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9;
        let _ = writeln!(out, "{name}_sum{{{labels}}} {sum}");
        let _ = writeln!(out, "{name}_count{{{labels}}} {cumulative}");
    }
}

/// The metrics of one command name. `leafd_commands_total` is derived at scrape time: the
/// histogram counts every execution, and only the (rare) errors have their own counter.
#[derive(Default)]
pub struct CommandMetrics {
    pub(super) errors: AtomicU64,
    pub(super) duration: LatencyHistogram,
}

impl CommandMetrics {
    /// `count` executions in `bucket`, `errors` of them failed, `nanos` in all.
    pub(super) fn add(&self, bucket: usize, count: u64, errors: u64, nanos: u64) {
        self.duration.buckets[bucket].fetch_add(count, Ordering::Relaxed);
        self.duration.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
        if errors > 0 {
            self.errors.fetch_add(errors, Ordering::Relaxed);
        }
    }

    pub(super) fn count(&self) -> u64 {
        self.duration
            .buckets
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .sum()
    }
}
