//! Per-connection counting of a batch of commands, added to the shared metrics once per batch.

use std::time::{Duration, Instant};

use super::histogram::LATENCY_BOUNDS_NANOS;
use super::Metrics;

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
