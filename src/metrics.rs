//! Metric names in one place, and each server's own Prometheus recorder: handles registered
//! once for the hot path, engine state copied into gauges only when `/metrics` is scraped.

use std::time::Duration;

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Label, Recorder, SharedString};
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

/// Histogram buckets from 10 µs to 2.5 s, fine enough below a millisecond.
const LATENCY_BUCKETS: &[f64] = &[
    0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025,
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

/// The metrics of one command name.
pub struct CommandMetrics {
    ok: Counter,
    error: Counter,
    duration: Histogram,
}

impl CommandMetrics {
    /// Records one execution; a few atomic operations, no lookup.
    pub fn record(&self, failed: bool, elapsed: Duration) {
        if failed {
            self.error.increment(1);
        } else {
            self.ok.increment(1);
        }
        self.duration.record(elapsed.as_secs_f64());
    }
}

/// A server's metrics registry.
pub struct Metrics {
    recorder: Option<PrometheusRecorder>,
    commands: Vec<CommandMetrics>,
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
        let recorder = PrometheusBuilder::new()
            .set_buckets(LATENCY_BUCKETS)
            .expect("bucket list is not empty")
            .build_recorder();
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
            commands: Vec::new(),
        };
        metrics.commands = command_names
            .iter()
            .chain(std::iter::once(&"unknown"))
            .map(|name| CommandMetrics {
                ok: metrics.counter(COMMANDS_TOTAL, &[("command", name), ("result", "ok")]),
                error: metrics.counter(COMMANDS_TOTAL, &[("command", name), ("result", "error")]),
                duration: metrics.histogram(COMMAND_DURATION_SECONDS, &[("command", name)]),
            })
            .collect();
        metrics
    }

    /// Metrics that record nothing (benchmarks without a recorder, embedding without `/metrics`).
    pub fn disabled(command_count: usize) -> Metrics {
        Metrics {
            recorder: None,
            commands: (0..=command_count)
                .map(|_| CommandMetrics {
                    ok: Counter::noop(),
                    error: Counter::noop(),
                    duration: Histogram::noop(),
                })
                .collect(),
        }
    }

    /// The handles of the command at `index` of the list given to [`Metrics::new`]; an index
    /// past the end is the `unknown` command.
    pub fn command(&self, index: usize) -> &CommandMetrics {
        &self.commands[index.min(self.commands.len() - 1)]
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

    pub fn histogram(&self, name: &'static str, labels: &[(&'static str, &str)]) -> Histogram {
        match &self.recorder {
            Some(r) => r.register_histogram(&key(name, labels), &METADATA),
            None => Histogram::noop(),
        }
    }

    /// The Prometheus text exposition of everything recorded so far.
    pub fn render(&self) -> String {
        self.recorder
            .as_ref()
            .map(|r| r.handle().render())
            .unwrap_or_default()
    }
}
