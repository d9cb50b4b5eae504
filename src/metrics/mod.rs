//! Each server's own Prometheus registry: handles registered once for the hot path, names in
//! `names.rs`; the context copies engine state into it only when `/metrics` is scraped.

mod batch;
mod histogram;
mod names;
mod tags;

pub use batch::BatchMetrics;
pub use histogram::{CommandMetrics, LatencyHistogram};
use names::DESCRIPTIONS;
pub use names::*;
pub use tags::{render_tag_series, TagFigures, OTHER_TAGS};

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use metrics::{Counter, Gauge, Key, KeyName, Label, Recorder, SharedString};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusRecorder};

/// A server's metrics registry.
pub struct Metrics {
    recorder: Option<PrometheusRecorder>,
    /// CPU, memory, open files and threads of this process, read at each scrape.
    process: metrics_process::Collector,
    command_names: Vec<&'static str>,
    commands: Vec<CommandMetrics>,
    /// Segment load latency by tag (loads are rare, so a lock here is fine): the first
    /// `tag_series` tags that load have their own, later ones share `_other`'s.
    segment_loads: Mutex<BTreeMap<String, Arc<LatencyHistogram>>>,
    /// How many tags get series of their own (`http.metrics_tags`).
    tag_series: usize,
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
        let process = metrics_process::Collector::default();
        metrics::with_local_recorder(&recorder, || process.describe());
        let mut metrics = Metrics {
            recorder: Some(recorder),
            process,
            command_names: command_names
                .iter()
                .copied()
                .chain(std::iter::once("unknown"))
                .collect(),
            commands: Vec::new(),
            segment_loads: Mutex::new(BTreeMap::new()),
            tag_series: 100,
        };
        metrics.commands = metrics
            .command_names
            .iter()
            .map(|_| CommandMetrics::default())
            .collect();
        metrics
    }

    /// Per command that ran: its name, calls, total microseconds and failed calls (INFO
    /// commandstats). Empty when metrics are disabled.
    pub fn command_stats(&self) -> Vec<(&'static str, u64, u64, u64)> {
        self.command_names
            .iter()
            .zip(&self.commands)
            .map(|(name, c)| {
                let micros = c.duration.sum_nanos.load(Ordering::Relaxed) / 1000;
                (*name, c.count(), micros, c.errors.load(Ordering::Relaxed))
            })
            .filter(|(_, calls, _, _)| *calls > 0)
            .collect()
    }

    /// False for [`Metrics::disabled`]: callers then skip even the clock reads.
    pub fn enabled(&self) -> bool {
        !self.commands.is_empty()
    }

    /// Metrics that record nothing (no HTTP listener to scrape them, or benchmarks without).
    pub fn disabled() -> Metrics {
        Metrics {
            recorder: None,
            process: metrics_process::Collector::default(),
            command_names: Vec::new(),
            commands: Vec::new(),
            segment_loads: Mutex::new(BTreeMap::new()),
            tag_series: 0,
        }
    }

    /// Gives at most `tags` tags series of their own (`http.metrics_tags`).
    pub fn with_tag_series(mut self, tags: usize) -> Metrics {
        self.tag_series = tags;
        self
    }

    /// How many tags get series of their own.
    pub fn tag_series(&self) -> usize {
        self.tag_series
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
            match loads.get(tag) {
                Some(histogram) => histogram.clone(),
                // One own series per tag up to the limit (plus `_other`'s).
                None if loads.len() < self.tag_series => {
                    loads.entry(tag.to_string()).or_default().clone()
                }
                None => loads.entry(OTHER_TAGS.to_string()).or_default().clone(),
            }
        };
        histogram.record(elapsed);
    }

    /// The Prometheus text exposition of everything recorded so far.
    pub fn render(&self) -> String {
        let Some(recorder) = &self.recorder else {
            return String::new();
        };
        metrics::with_local_recorder(recorder, || self.process.collect());
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
                let tag = tags::escaped(tag);
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
