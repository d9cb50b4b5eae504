//! The time fence's life: at start, wait until the clock is past every fence this node or its
//! worker id had (or refuse), then keep a durable fence ahead of the clock in the background.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::fence_file::FenceFile;
use super::CoordError;
use crate::clock::Clock;
use crate::coord::IssueLimit;

/// How the fence is kept.
#[derive(Debug, Clone, Copy)]
pub struct FenceSettings {
    /// How far ahead of the clock the fence is written.
    pub window_ms: u64,
    /// At start, a clock behind the fence by up to this much is waited out; more is refused.
    pub max_start_wait_ms: u64,
}

impl FenceSettings {
    /// How often the fence is moved ahead: a quarter of the window, so it is extended three
    /// times before the clock could reach it.
    fn tick(&self) -> Duration {
        Duration::from_millis((self.window_ms / 4).clamp(10, 1000))
    }
}

/// Waits until `clock` is past `floor_ms`, if that takes at most `max_wait_ms`; otherwise
/// returns [`CoordError::ClockBehindFence`] naming the gap. `what` names the fence's owner.
pub async fn wait_past(
    clock: &dyn Clock,
    floor_ms: u64,
    max_wait_ms: u64,
    what: &str,
) -> Result<(), CoordError> {
    let started = Instant::now();
    let mut logged = false;
    loop {
        let now = clock.now_millis();
        if now > floor_ms {
            return Ok(());
        }
        let gap = floor_ms - now + 1;
        let waited = started.elapsed().as_millis() as u64;
        if gap > max_wait_ms.saturating_sub(waited) {
            return Err(CoordError::ClockBehindFence {
                gap_ms: gap,
                what: what.to_string(),
                max_wait_ms,
            });
        }
        if !logged {
            tracing::warn!(
                gap_ms = gap,
                fence = what,
                "clock is behind the time fence; waiting until it has passed it"
            );
            logged = true;
        }
        tokio::time::sleep(Duration::from_millis(gap.min(100))).await;
    }
}

/// Keeps the durable fence of one node.
pub struct FenceKeeper {
    file: FenceFile,
    settings: FenceSettings,
    clock: Arc<dyn Clock>,
    limit: Arc<IssueLimit>,
}

impl FenceKeeper {
    pub fn new(
        file: FenceFile,
        settings: FenceSettings,
        clock: Arc<dyn Clock>,
        limit: Arc<IssueLimit>,
    ) -> FenceKeeper {
        FenceKeeper {
            file,
            settings,
            clock,
            limit,
        }
    }

    /// The fence this node's file holds (0 without a file).
    pub fn stored(&self) -> Result<u64, CoordError> {
        self.file.load().map_err(CoordError::Fence)
    }

    /// Waits until the clock is past both the stored fence and `coordinator_floor_ms` (the
    /// fence the coordinator recorded for this worker id), makes a first fence durable and
    /// publishes it. `extra_wait_ms` widens the allowed wait for the coordinator's floor (a
    /// lease written further ahead than the local window).
    pub async fn open(
        &self,
        coordinator_floor_ms: u64,
        extra_wait_ms: u64,
    ) -> Result<(), CoordError> {
        let local = self.stored()?;
        wait_past(
            self.clock.as_ref(),
            local,
            self.settings.max_start_wait_ms,
            &format!("this node's fence file {}", self.file.path().display()),
        )
        .await?;
        wait_past(
            self.clock.as_ref(),
            coordinator_floor_ms,
            self.settings.max_start_wait_ms + extra_wait_ms,
            "the fence the coordinator holds for this worker id",
        )
        .await?;
        let fence = self.clock.now_millis() + self.settings.window_ms;
        let file = self.file.clone();
        tokio::task::spawn_blocking(move || file.store(fence))
            .await
            .map_err(|e| CoordError::Fence(e.to_string()))?
            .map_err(CoordError::Fence)?;
        self.limit.publish_fence(fence);
        Ok(())
    }

    /// Extends the fence every tick until `stop`; a failed write is retried at the next tick
    /// while requests run into the old fence and get `UNAVAILABLE` naming the failure.
    pub fn spawn(self, stop: CancellationToken) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let mut failing = false;
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(self.settings.tick()) => {}
                }
                let target = self.clock.now_millis() + self.settings.window_ms;
                if target <= self.limit.fence_ms() {
                    continue; // the clock went back: the fence already covers it
                }
                let file = self.file.clone();
                let stored = tokio::task::spawn_blocking(move || file.store(target))
                    .await
                    .unwrap_or_else(|e| Err(e.to_string()));
                match stored {
                    Ok(()) => {
                        self.limit.publish_fence(target);
                        if std::mem::take(&mut failing) {
                            tracing::info!("snowflake time fence is extended again");
                        }
                    }
                    Err(e) => {
                        if !failing {
                            tracing::error!(error = %e, "cannot extend the snowflake time fence; SNOWFLAKE replies UNAVAILABLE once the clock reaches it");
                        }
                        failing = true;
                        self.limit.fence_failed(e);
                    }
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{ManualClock, SystemClock};

    #[tokio::test(flavor = "current_thread")]
    async fn a_small_gap_is_waited_out_a_large_one_refused() {
        let clock = SystemClock;
        let now = clock.now_millis();
        let started = Instant::now();
        wait_past(&clock, now + 150, 1000, "test").await.unwrap();
        assert!(clock.now_millis() > now + 150);
        assert!(started.elapsed() >= Duration::from_millis(140));
        let manual = ManualClock::new(10_000);
        match wait_past(&manual, 70_000, 5000, "test").await {
            Err(CoordError::ClockBehindFence { gap_ms, .. }) => assert_eq!(gap_ms, 60_001),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_fence_is_durable_before_it_is_published_and_moves_ahead() {
        let dir = tempfile::tempdir().unwrap();
        let file = FenceFile::new(dir.path().join("fence.json"));
        let limit = Arc::new(IssueLimit::new());
        // A window of 2 s (a tick of 0.5 s): an fsync slowed by a busy machine stays well
        // inside it.
        let settings = FenceSettings {
            window_ms: 2000,
            max_start_wait_ms: 1000,
        };
        let keeper = FenceKeeper::new(file.clone(), settings, Arc::new(SystemClock), limit.clone());
        keeper.open(0, 0).await.unwrap();
        let first = limit.fence_ms();
        assert_eq!(file.load(), Ok(first), "published only what is on disk");
        assert!(first > SystemClock.now_millis());
        let stop = CancellationToken::new();
        let task = keeper.spawn(stop.clone());
        tokio::time::sleep(Duration::from_millis(1200)).await;
        let later = limit.fence_ms();
        assert!(later > first + 400, "{later} vs {first}");
        assert!(file.load().unwrap() >= later);
        stop.cancel();
        task.await.unwrap();
    }
}
