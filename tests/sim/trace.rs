//! What happened in a run, in order, with the simulated time: printed when an invariant breaks.

use std::sync::Mutex;

pub struct Trace {
    start: tokio::time::Instant,
    lines: Mutex<Vec<String>>,
}

/// Lines kept: the end of a run is where a violation is.
const KEPT: usize = 400;

impl Trace {
    pub fn new() -> Trace {
        Trace {
            start: tokio::time::Instant::now(),
            lines: Mutex::new(Vec::new()),
        }
    }

    pub fn note(&self, line: String) {
        let at = self.start.elapsed().as_millis();
        let mut lines = self.lines.lock().unwrap();
        if lines.len() == 2 * KEPT {
            lines.drain(..KEPT);
        }
        lines.push(format!("{at:>8} ms  {line}"));
    }

    /// The last lines, joined.
    pub fn tail(&self) -> String {
        let lines = self.lines.lock().unwrap();
        let from = lines.len().saturating_sub(KEPT);
        lines[from..].join("\n")
    }

    /// Every line, for comparing two runs of one seed.
    pub fn all(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }
}
