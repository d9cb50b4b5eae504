//! Metric names in one place, and each server's own Prometheus recorder: handles registered
//! once for the hot path, engine state copied into gauges only when `/metrics` is scraped.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use metrics::{Counter, Gauge, Key, KeyName, Label, Recorder, SharedString};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusRecorder};

pub const COMMANDS_TOTAL: &str = "leafd_commands_total";
pub const COMMAND_DURATION_SECONDS: &str = "leafd_command_duration_seconds";
pub const CONNECTIONS_OPEN: &str = "leafd_connections_open";
pub const CONNECTIONS_TOTAL: &str = "leafd_connections_total";
pub const CONNECTIONS_REJECTED_TOTAL: &str = "leafd_connections_rejected_total";
pub const SEGMENT_IDS_TOTAL: &str = "leafd_segment_ids_total";
pub const SEGMENT_LOADS_TOTAL: &str = "leafd_segment_loads_total";
pub const SEGMENT_LOAD_DURATION_SECONDS: &str = "leafd_segment_load_duration_seconds";
pub const SEGMENT_REMAINING_IDS: &str = "leafd_segment_remaining_ids";
pub const SEGMENT_PRELOAD_THRESHOLD_IDS: &str = "leafd_segment_preload_threshold_ids";
pub const SEGMENT_STEP: &str = "leafd_segment_step";
pub const SEGMENT_REQUEST_WAITS_TOTAL: &str = "leafd_segment_request_waits_total";
pub const SEGMENT_ROLLBACKS_TOTAL: &str = "leafd_segment_rollbacks_total";
pub const SNOWFLAKE_FENCE_AHEAD_SECONDS: &str = "leafd_snowflake_fence_ahead_seconds";
pub const SNOWFLAKE_LEASE_REMAINING_SECONDS: &str = "leafd_snowflake_lease_remaining_seconds";
pub const SNOWFLAKE_LEASE_FAILURES_TOTAL: &str = "leafd_snowflake_lease_failures_total";
pub const STORAGE_READY: &str = "leafd_storage_ready";
pub const SNOWFLAKE_IDS_TOTAL: &str = "leafd_snowflake_ids_total";
pub const SNOWFLAKE_SEQUENCE_WAITS_TOTAL: &str = "leafd_snowflake_sequence_waits_total";
pub const SNOWFLAKE_CLOCK_BACKWARD_TOTAL: &str = "leafd_snowflake_clock_backward_total";
pub const SNOWFLAKE_WORKER_ID: &str = "leafd_snowflake_worker_id";
pub const ZOOKEEPER_CONNECTED: &str = "leafd_zookeeper_connected";
pub const ZOOKEEPER_LAST_REPORT_AGE_SECONDS: &str = "leafd_zookeeper_last_report_age_seconds";

/// The help text of every metric, shown as `# HELP` on `/metrics`.
const DESCRIPTIONS: &[(&str, &str)] = &[
    (
        COMMANDS_TOTAL,
        "Commands executed, by command name and result (ok or error).",
    ),
    (
        COMMAND_DURATION_SECONDS,
        "Time to execute a command, from parsed request to reply, in seconds.",
    ),
    (CONNECTIONS_OPEN, "Client connections currently open."),
    (
        CONNECTIONS_TOTAL,
        "Client connections accepted since start.",
    ),
    (
        CONNECTIONS_REJECTED_TOTAL,
        "Client connections refused because max_clients was reached.",
    ),
    (
        SEGMENT_IDS_TOTAL,
        "Segment IDs handed out by this node, by tag.",
    ),
    (
        SEGMENT_LOADS_TOTAL,
        "Segment loads from the database, by tag and result.",
    ),
    (
        SEGMENT_ROLLBACKS_TOTAL,
        "Segment loads refused because the database returned IDs below this node's high-water mark (restored backup, lossy failover), by tag.",
    ),
    (
        SNOWFLAKE_FENCE_AHEAD_SECONDS,
        "How far the durable snowflake time fence is ahead of the clock; at or below 0 SNOWFLAKE waits, then replies UNAVAILABLE.",
    ),
    (
        SNOWFLAKE_LEASE_FAILURES_TOTAL,
        "Failed attempts to extend the worker-id lease (database renewals, ZooKeeper reports).",
    ),
    (
        SNOWFLAKE_LEASE_REMAINING_SECONDS,
        "Time left on the coordinator's lease of the worker id (ZooKeeper: until the fence written there); 0 when it ended.",
    ),
    (
        SEGMENT_LOAD_DURATION_SECONDS,
        "Time of one segment load from the database, in seconds.",
    ),
    (
        SEGMENT_REMAINING_IDS,
        "IDs left in a tag's current or next buffer.",
    ),
    (
        SEGMENT_PRELOAD_THRESHOLD_IDS,
        "The next segment is loaded once the current buffer has this many IDs left or fewer.",
    ),
    (
        SEGMENT_STEP,
        "Step of the tag's last segment load (Leaf's adaptive step).",
    ),
    (
        SEGMENT_REQUEST_WAITS_TOTAL,
        "Requests that had to wait for a segment load because both buffers were empty.",
    ),
    (
        STORAGE_READY,
        "1 when the segment database answered and the tag list is loaded, else 0.",
    ),
    (SNOWFLAKE_IDS_TOTAL, "Snowflake IDs issued by this node."),
    (
        SNOWFLAKE_SEQUENCE_WAITS_TOTAL,
        "Times a millisecond's sequence ran out and the engine waited for the next one.",
    ),
    (
        SNOWFLAKE_CLOCK_BACKWARD_TOTAL,
        "Times the clock was found behind the last snowflake timestamp.",
    ),
    (SNOWFLAKE_WORKER_ID, "This node's snowflake worker id."),
    (
        ZOOKEEPER_CONNECTED,
        "1 while this node's ZooKeeper time reports succeed, else 0.",
    ),
    (
        ZOOKEEPER_LAST_REPORT_AGE_SECONDS,
        "Seconds since this node last reported its time to ZooKeeper.",
    ),
];

/// Histogram bucket bounds from 10 µs to 2.5 s, in nanoseconds: fine enough below a millisecond.
const LATENCY_BOUNDS_NANOS: [u64; 17] = [
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
    sum_nanos: AtomicU64,
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
    fn render(&self, name: &str, labels: &str, out: &mut String) {
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

/// Command executions of one pipelined batch, counted per command on the connection and added
/// to the shared histograms once per batch: a batch of 32 INCRs costs two or three atomic
/// additions instead of 64, and the shared cache lines are touched once.
///
/// Timing costs two clock reads per batch, not one per command: the commands that finish
/// without waiting (nearly all) share the batch's time equally, and a command that had to
/// wait (for a segment load, the next snowflake millisecond) is timed on its own and recorded
/// at once.
#[derive(Default)]
pub struct BatchMetrics {
    /// Commands that finished without waiting, per command, timed together at the flush.
    quick: Vec<QuickCount>,
    /// When the time not yet given to a command began.
    since: Option<Instant>,
}

struct QuickCount {
    command: usize,
    count: u64,
    errors: u64,
}

fn nanos_of(elapsed: Duration) -> u64 {
    u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX)
}

fn bucket_of(nanos: u64) -> usize {
    LATENCY_BOUNDS_NANOS.partition_point(|&bound| bound < nanos)
}

impl BatchMetrics {
    /// Starts timing a batch: the commands recorded until [`BatchMetrics::flush`] share its time.
    pub fn start(&mut self) {
        self.since = Some(Instant::now());
    }

    /// Notes one execution of the command at `command` (an index for [`Metrics::command`]);
    /// `waited` when it did not finish at once, so it is timed on its own.
    pub fn record(&mut self, metrics: &Metrics, command: usize, failed: bool, waited: bool) {
        let failed = u64::from(failed);
        if waited {
            let now = Instant::now();
            let nanos = nanos_of(now.saturating_duration_since(self.since.unwrap_or(now)));
            self.since = Some(now);
            if let Some(shared) = metrics.command(command) {
                shared.add(bucket_of(nanos), 1, failed, nanos);
            }
            return;
        }
        match self.quick.iter_mut().find(|q| q.command == command) {
            Some(quick) => {
                quick.count += 1;
                quick.errors += failed;
            }
            None => self.quick.push(QuickCount {
                command,
                count: 1,
                errors: failed,
            }),
        }
    }

    /// Times the commands that finished at once, adds them to the shared metrics and empties
    /// the batch.
    pub fn flush(&mut self, metrics: &Metrics) {
        if !self.quick.is_empty() {
            let now = Instant::now();
            let total = nanos_of(now.saturating_duration_since(self.since.unwrap_or(now)));
            let commands: u64 = self.quick.iter().map(|q| q.count).sum();
            let each = total.checked_div(commands).unwrap_or(0);
            let bucket = bucket_of(each);
            for q in self.quick.drain(..) {
                if let Some(shared) = metrics.command(q.command) {
                    shared.add(bucket, q.count, q.errors, each * q.count);
                }
            }
        }
        self.since = None;
    }
}

/// The metrics of one command name. `leafd_commands_total` is derived at scrape time: the
/// histogram counts every execution, and only the (rare) errors have their own counter.
#[derive(Default)]
pub struct CommandMetrics {
    errors: AtomicU64,
    duration: LatencyHistogram,
}

impl CommandMetrics {
    /// `count` executions in `bucket`, `errors` of them failed, `nanos` in all.
    fn add(&self, bucket: usize, count: u64, errors: u64, nanos: u64) {
        self.duration.buckets[bucket].fetch_add(count, Ordering::Relaxed);
        self.duration.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
        if errors > 0 {
            self.errors.fetch_add(errors, Ordering::Relaxed);
        }
    }

    fn count(&self) -> u64 {
        self.duration
            .buckets
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .sum()
    }
}

/// A server's metrics registry.
pub struct Metrics {
    recorder: Option<PrometheusRecorder>,
    command_names: Vec<&'static str>,
    commands: Vec<CommandMetrics>,
    /// Segment load latency by tag (loads are rare, so a lock here is fine).
    segment_loads: Mutex<BTreeMap<String, Arc<LatencyHistogram>>>,
}

fn key(name: &'static str, labels: &[(&'static str, &str)]) -> Key {
    Key::from_parts(
        name,
        labels
            .iter()
            .map(|(k, v)| Label::new(*k, v.to_string()))
            .collect::<Vec<_>>(),
    )
}

const METADATA: metrics::Metadata<'static> =
    metrics::Metadata::new(module_path!(), metrics::Level::INFO, None);

impl Metrics {
    /// A recorder with handles for `command_names` (plus `unknown`), in that order.
    pub fn new(command_names: &[&'static str]) -> Metrics {
        let recorder = PrometheusBuilder::new().build_recorder();
        for (name, help) in DESCRIPTIONS {
            // One describe call serves every kind: the exporter keeps the text by name.
            recorder.describe_counter(
                KeyName::from_const_str(name),
                None,
                SharedString::const_str(help),
            );
        }
        let mut metrics = Metrics {
            recorder: Some(recorder),
            command_names: command_names
                .iter()
                .copied()
                .chain(std::iter::once("unknown"))
                .collect(),
            commands: Vec::new(),
            segment_loads: Mutex::new(BTreeMap::new()),
        };
        metrics.commands = metrics
            .command_names
            .iter()
            .map(|_| CommandMetrics::default())
            .collect();
        metrics
    }

    /// False for [`Metrics::disabled`]: callers then skip even the clock reads.
    pub fn enabled(&self) -> bool {
        !self.commands.is_empty()
    }

    /// Metrics that record nothing (no HTTP listener to scrape them, or benchmarks without).
    pub fn disabled() -> Metrics {
        Metrics {
            recorder: None,
            command_names: Vec::new(),
            commands: Vec::new(),
            segment_loads: Mutex::new(BTreeMap::new()),
        }
    }

    /// The metrics of the command at `index` of the list given to [`Metrics::new`] (an index
    /// past the end is the `unknown` command); `None` when metrics are disabled.
    pub fn command(&self, index: usize) -> Option<&CommandMetrics> {
        let last = self.commands.len().checked_sub(1)?;
        self.commands.get(index.min(last))
    }

    pub fn counter(&self, name: &'static str, labels: &[(&'static str, &str)]) -> Counter {
        match &self.recorder {
            Some(r) => r.register_counter(&key(name, labels), &METADATA),
            None => Counter::noop(),
        }
    }

    pub fn gauge(&self, name: &'static str, labels: &[(&'static str, &str)]) -> Gauge {
        match &self.recorder {
            Some(r) => r.register_gauge(&key(name, labels), &METADATA),
            None => Gauge::noop(),
        }
    }

    /// Records the duration of one segment load of `tag`.
    pub fn segment_load(&self, tag: &str, elapsed: Duration) {
        if self.recorder.is_none() {
            return;
        }
        let histogram = {
            let mut loads = self.segment_loads.lock().unwrap_or_else(|p| p.into_inner());
            loads.entry(tag.to_string()).or_default().clone()
        };
        histogram.record(elapsed);
    }

    /// The Prometheus text exposition of everything recorded so far.
    pub fn render(&self) -> String {
        let Some(recorder) = &self.recorder else {
            return String::new();
        };
        let mut out = recorder.handle().render();
        let help = |name: &str| {
            DESCRIPTIONS
                .iter()
                .find(|(n, _)| *n == name)
                .map_or("", |(_, h)| *h)
        };
        let _ = writeln!(
            out,
            "# HELP {COMMANDS_TOTAL} {}\n# TYPE {COMMANDS_TOTAL} counter",
            help(COMMANDS_TOTAL)
        );
        for (name, command) in self.command_names.iter().zip(&self.commands) {
            let errors = command.errors.load(Ordering::Relaxed);
            let ok = command.count().saturating_sub(errors);
            let _ = writeln!(
                out,
                "{COMMANDS_TOTAL}{{command=\"{name}\",result=\"ok\"}} {ok}"
            );
            let _ = writeln!(
                out,
                "{COMMANDS_TOTAL}{{command=\"{name}\",result=\"error\"}} {errors}"
            );
        }
        let _ = writeln!(
            out,
            "# HELP {COMMAND_DURATION_SECONDS} {}\n# TYPE {COMMAND_DURATION_SECONDS} histogram",
            help(COMMAND_DURATION_SECONDS)
        );
        for (name, command) in self.command_names.iter().zip(&self.commands) {
            let labels = format!("command=\"{name}\"");
            command
                .duration
                .render(COMMAND_DURATION_SECONDS, &labels, &mut out);
        }
        let loads = self.segment_loads.lock().unwrap_or_else(|p| p.into_inner());
        if !loads.is_empty() {
            let _ = writeln!(
                out,
                "# HELP {SEGMENT_LOAD_DURATION_SECONDS} {}\n# TYPE {SEGMENT_LOAD_DURATION_SECONDS} histogram",
                help(SEGMENT_LOAD_DURATION_SECONDS)
            );
            for (tag, histogram) in loads.iter() {
                let tag = tag.replace('\\', "\\\\").replace('"', "\\\"");
                histogram.render(
                    SEGMENT_LOAD_DURATION_SECONDS,
                    &format!("tag=\"{tag}\""),
                    &mut out,
                );
            }
        }
        out
    }
}

impl crate::engine::segment::LoadObserver for Metrics {
    fn load_finished(&self, tag: &str, elapsed: Duration) {
        self.segment_load(tag, elapsed);
    }
}
