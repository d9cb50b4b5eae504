//! Wall-clock time in milliseconds behind a trait: the system clock in production, a
//! manually driven clock in tests; the engines and coordinators apply the clock rules.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the UNIX epoch.
pub trait Clock: Send + Sync + 'static {
    fn now_millis(&self) -> u64;
}

/// The operating system's real-time clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_millis(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0)
    }
}

/// A clock that only moves when told to, forwards or backwards.
#[derive(Debug, Default)]
pub struct ManualClock {
    now: AtomicU64,
}

impl ManualClock {
    pub fn new(start_millis: u64) -> ManualClock {
        ManualClock {
            now: AtomicU64::new(start_millis),
        }
    }

    pub fn set(&self, millis: u64) {
        self.now.store(millis, Ordering::SeqCst);
    }

    pub fn advance(&self, millis: u64) {
        self.now.fetch_add(millis, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_millis(&self) -> u64 {
        self.now.load(Ordering::SeqCst)
    }
}

/// Another clock shifted by a fixed offset: a node whose clock is wrong, for tests and drills.
pub struct OffsetClock {
    inner: std::sync::Arc<dyn Clock>,
    offset_ms: i64,
}

impl OffsetClock {
    pub fn new(inner: std::sync::Arc<dyn Clock>, offset_ms: i64) -> OffsetClock {
        OffsetClock { inner, offset_ms }
    }
}

impl Clock for OffsetClock {
    fn now_millis(&self) -> u64 {
        self.inner
            .now_millis()
            .saturating_add_signed(self.offset_ms)
    }
}
