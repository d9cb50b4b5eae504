//! Leaf-snowflake: time-ordered 64-bit IDs from this node's worker id and clock, with the
//! clock rules that make a repeated or decreasing ID impossible.

pub mod layout;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub use crate::coord::IssueLimit;
pub use layout::{format_instant, parse_instant, Decoded, Layout};

use crate::clock::Clock;

/// Errors of the snowflake engine.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SnowflakeError {
    /// The clock is behind the last timestamp used by more than the tolerated wait.
    #[error("clock moved back {0} ms")]
    ClockBack(u64),
    /// The worker id is not (or no longer) safe to use, e.g. its ZooKeeper lease lapsed, or
    /// the time fence could not be extended.
    #[error("{0}")]
    Unavailable(String),
    #[error("clock is past the last timestamp the layout can hold")]
    Exhausted,
    /// The clock is not after the layout's epoch: IDs would be negative or zero.
    #[error("clock is not after the snowflake epoch")]
    BeforeEpoch,
}

/// Counters of the engine's activity.
#[derive(Debug, Default)]
pub struct SnowflakeStats {
    /// Times a millisecond's sequence ran out and the engine waited for the next millisecond.
    pub sequence_waits: AtomicU64,
    /// Times the clock was seen behind the last timestamp used.
    pub clock_backward_events: AtomicU64,
}

#[derive(Debug, Default)]
struct State {
    /// The step of the timestamp field (a millisecond, unless the layout's unit is longer) of
    /// the last ID issued.
    last_tick: u64,
    /// Whether any ID was issued yet (tick 0 is a valid step).
    issued: bool,
    sequence: u64,
    /// IDs issued (counted under the lock, so free).
    served: u64,
}

/// What a single attempt under the lock decided.
#[derive(Debug, PartialEq, Eq)]
pub enum Attempt {
    Ids(Vec<i64>),
    /// The clock is `behind` ms behind the last timestamp: wait that long and retry.
    ClockBehind(u64),
    /// This step's sequence is used up: retry in the next step (millisecond, or the unit).
    NextMillisecond,
    /// The clock is past the issue limit (the time fence or the lease): wait for it to move.
    Fenced,
}

/// Sequence numbers reserved by one attempt, before they are encoded into IDs.
enum Reserved {
    Ids {
        /// The step of the timestamp field (see [`Layout::tick`]).
        tick: u64,
        first_sequence: u64,
        count: u64,
    },
    ClockBehind(u64),
    NextMillisecond,
    Fenced,
}

/// The snowflake generator of one worker.
pub struct SnowflakeEngine {
    layout: Layout,
    worker_id: u64,
    max_backward_ms: u64,
    clock: Arc<dyn Clock>,
    limit: Arc<IssueLimit>,
    /// No ID carries a step before this one (see [`SnowflakeEngine::with_floor`]).
    floor_tick: u64,
    /// How long a request waits for the limit to move before it is refused.
    limit_wait: Duration,
    state: Mutex<State>,
    stats: SnowflakeStats,
}

impl SnowflakeEngine {
    /// `worker_id` must fit the layout; the coordinator checked it. IDs carry timestamps up to
    /// `limit` only; a request that meets it waits up to `limit_wait`, then is refused.
    pub fn new(
        layout: Layout,
        worker_id: u64,
        max_backward_ms: u64,
        clock: Arc<dyn Clock>,
        limit: Arc<IssueLimit>,
        limit_wait: Duration,
    ) -> SnowflakeEngine {
        debug_assert!(worker_id <= layout.max_worker_id());
        SnowflakeEngine {
            layout,
            worker_id,
            max_backward_ms,
            clock,
            limit,
            floor_tick: 0,
            limit_wait,
            state: Mutex::new(State::default()),
            stats: SnowflakeStats::default(),
        }
    }

    /// No ID will carry a time before `floor_ms`: the clock when the start checks passed (past
    /// every fence, a layout change accepted). A clock that steps back before the first ID is
    /// then a step back like any other, not a licence to reuse the time those checks cleared.
    pub fn with_floor(mut self, floor_ms: u64) -> SnowflakeEngine {
        if floor_ms > self.layout.epoch_ms {
            self.floor_tick = self
                .layout
                .tick(floor_ms.min(self.layout.max_timestamp_ms()));
        }
        self
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    pub fn worker_id(&self) -> u64 {
        self.worker_id
    }

    /// The time fence and lease this engine obeys.
    pub fn limit(&self) -> &Arc<IssueLimit> {
        &self.limit
    }

    pub fn stats(&self) -> &SnowflakeStats {
        &self.stats
    }

    /// IDs issued so far.
    pub fn ids_served(&self) -> u64 {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).served
    }

    /// The last millisecond of the step the last ID was issued in (0 before the first): no ID
    /// carries a later time, so a fence lowered to it at shutdown still covers every ID.
    pub fn last_timestamp_ms(&self) -> u64 {
        let st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if st.issued {
            self.layout.tick_last_ms(st.last_tick)
        } else {
            0
        }
    }

    /// One attempt at `n` strictly increasing IDs, without waiting. IDs of one call share the
    /// current millisecond; a call asking for more than is left in it gets what is left and
    /// must call again (see [`SnowflakeEngine::next_ids`]).
    pub fn try_next(&self, n: usize) -> Result<Attempt, SnowflakeError> {
        Ok(match self.reserve(n)? {
            Reserved::Ids {
                tick,
                first_sequence,
                count,
            } => Attempt::Ids(
                (first_sequence..first_sequence + count)
                    .map(|seq| self.layout.encode_tick(tick, self.worker_id, seq))
                    .collect(),
            ),
            Reserved::ClockBehind(behind) => Attempt::ClockBehind(behind),
            Reserved::NextMillisecond => Attempt::NextMillisecond,
            Reserved::Fenced => Attempt::Fenced,
        })
    }

    /// Reserves up to `n` sequence numbers of the current millisecond under the lock.
    fn reserve(&self, n: usize) -> Result<Reserved, SnowflakeError> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        // Read under the lock: a time read before it could be older than what another thread
        // has since stored in `last_tick`, which would look like the clock going back.
        let now = self.clock.now_millis();
        if now > self.layout.max_timestamp_ms() {
            return Err(SnowflakeError::Exhausted);
        }
        if now <= self.layout.epoch_ms {
            return Err(SnowflakeError::BeforeEpoch);
        }
        let tick = self.layout.tick(now);
        // The fence and the lease: a timestamp beyond either could repeat after a crash or
        // belong to another node. A step longer than a millisecond is used only when all of it
        // is covered, so a node that waits past the fence after a crash is in a later step.
        if !self.limit.allows(self.layout.tick_last_ms(tick)) {
            return Ok(Reserved::Fenced);
        }
        // The lowest step allowed: the last ID's, or before the first ID the start's floor.
        let lowest = if st.issued {
            st.last_tick
        } else {
            self.floor_tick
        };
        if tick < lowest {
            // How long until the clock is back in that step.
            let behind = self.layout.tick_start_ms(lowest) - now;
            self.stats
                .clock_backward_events
                .fetch_add(1, Ordering::Relaxed);
            return if behind <= self.max_backward_ms {
                Ok(Reserved::ClockBehind(behind))
            } else {
                Err(SnowflakeError::ClockBack(behind))
            };
        }
        let max_sequence = self.layout.max_sequence();
        let mut first_sequence = if st.issued && tick == st.last_tick {
            if st.sequence >= max_sequence {
                self.stats.sequence_waits.fetch_add(1, Ordering::Relaxed);
                return Ok(Reserved::NextMillisecond);
            }
            st.sequence + 1
        } else {
            // A random start keeps low-traffic IDs from all being even (or all ending in 0);
            // below 100 and a sixteenth of the step's sequence, so a short sequence field (8
            // bits in the JavaScript-safe layout) loses at most 6 % of its IDs to it.
            fastrand::u64(0..100.min((max_sequence + 1) / 16).max(1))
        };
        if first_sequence > max_sequence {
            first_sequence = max_sequence;
        }
        let count = (n as u64).min(max_sequence - first_sequence + 1);
        st.last_tick = tick;
        st.issued = true;
        st.sequence = first_sequence + count - 1;
        st.served += count;
        Ok(Reserved::Ids {
            tick,
            first_sequence,
            count,
        })
    }

    /// `n` strictly increasing IDs, waiting out a full millisecond or a clock step back of up
    /// to `max_backward_ms`; a longer step back is an error until the clock has caught up.
    pub async fn next_ids(&self, n: usize) -> Result<Vec<i64>, SnowflakeError> {
        let mut ids = Vec::with_capacity(n);
        let mut waited_backwards = false;
        // The runtime's clock (the real one, except under a paused test runtime).
        let mut fenced_since: Option<tokio::time::Instant> = None;
        while ids.len() < n {
            match self.try_next(n - ids.len())? {
                Attempt::Ids(batch) => ids.extend(batch),
                Attempt::NextMillisecond => tokio::time::sleep(self.until_next_step()).await,
                Attempt::Fenced => {
                    let since = *fenced_since.get_or_insert_with(tokio::time::Instant::now);
                    if self.limit.is_revoked() || since.elapsed() >= self.limit_wait {
                        let reason = self.limit.reason(self.clock.now_millis());
                        return Err(SnowflakeError::Unavailable(reason));
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                Attempt::ClockBehind(behind) => {
                    if waited_backwards {
                        return Err(SnowflakeError::ClockBack(behind));
                    }
                    waited_backwards = true;
                    tokio::time::sleep(Duration::from_millis(behind)).await;
                }
            }
        }
        Ok(ids)
    }

    /// How long a request whose step's sequence is used up sleeps before it tries again: a
    /// tenth of a millisecond, or until the next step of a longer unit.
    fn until_next_step(&self) -> Duration {
        if self.layout.unit_ms == 1 {
            return Duration::from_micros(100);
        }
        let now = self.clock.now_millis();
        let into = now.saturating_sub(self.layout.epoch_ms) % self.layout.unit_ms;
        Duration::from_millis(self.layout.unit_ms - into)
    }

    /// One ID if it can be issued at once; `Ok(None)` when [`SnowflakeEngine::next_id`] would
    /// have to wait (the millisecond's sequence is used up, the clock is behind, the limit).
    pub fn try_next_id(&self) -> Result<Option<i64>, SnowflakeError> {
        Ok(match self.reserve(1)? {
            Reserved::Ids {
                tick,
                first_sequence,
                ..
            } => Some(
                self.layout
                    .encode_tick(tick, self.worker_id, first_sequence),
            ),
            _ => None,
        })
    }

    /// One ID, without the allocation of a batch.
    pub async fn next_id(&self) -> Result<i64, SnowflakeError> {
        match self.reserve(1)? {
            Reserved::Ids {
                tick,
                first_sequence,
                ..
            } => Ok(self
                .layout
                .encode_tick(tick, self.worker_id, first_sequence)),
            _ => Ok(self.next_ids(1).await?[0]),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;
    use crate::clock::ManualClock;

    const T0: u64 = 1_764_000_000_000;

    fn engine(clock: Arc<ManualClock>) -> SnowflakeEngine {
        SnowflakeEngine::new(
            Layout::default(),
            7,
            5,
            clock,
            Arc::new(IssueLimit::unbounded()),
            Duration::ZERO,
        )
    }

    fn ids(attempt: Attempt) -> Vec<i64> {
        match attempt {
            Attempt::Ids(ids) => ids,
            other => panic!("expected IDs, got {other:?}"),
        }
    }

    #[test]
    fn ids_carry_time_worker_and_a_random_start() {
        let clock = Arc::new(ManualClock::new(T0));
        let engine = engine(clock.clone());
        let mut starts = HashSet::new();
        for i in 0..200 {
            clock.set(T0 + i);
            let id = ids(engine.try_next(1).unwrap())[0];
            let d = Layout::default().decode(id).unwrap();
            assert_eq!((d.timestamp_ms, d.worker_id), (T0 + i, 7));
            assert!(d.sequence < 100);
            starts.insert(d.sequence);
        }
        assert!(starts.len() > 20, "sequence starts vary: {starts:?}");
    }

    /// An 8-bit sequence starts each step below 16 (a sixteenth of it), not below 100, which
    /// would leave 156 of its 256 IDs per step on average.
    #[test]
    fn a_short_sequence_starts_low() {
        let layout = Layout {
            timestamp_bits: 41,
            worker_bits: 4,
            sequence_bits: 8,
            unit_ms: 1,
            epoch_ms: Layout::default().epoch_ms,
        };
        let clock = Arc::new(ManualClock::new(T0));
        let limit = Arc::new(IssueLimit::unbounded());
        let engine = SnowflakeEngine::new(layout, 3, 5, clock.clone(), limit, Duration::ZERO);
        let mut starts = HashSet::new();
        for i in 0..200 {
            clock.set(T0 + i);
            let d = layout.decode(ids(engine.try_next(1).unwrap())[0]).unwrap();
            assert!(d.sequence < 16, "step {i} started at {}", d.sequence);
            starts.insert(d.sequence);
        }
        assert!(starts.len() > 8, "sequence starts vary: {starts:?}");
    }

    #[test]
    fn sequence_exhaustion_waits_for_the_next_millisecond() {
        let clock = Arc::new(ManualClock::new(T0));
        let engine = engine(clock.clone());
        let mut all = Vec::new();
        loop {
            match engine.try_next(1000).unwrap() {
                Attempt::Ids(batch) => all.extend(batch),
                Attempt::NextMillisecond => break,
                other => panic!("{other:?}"),
            }
        }
        let first_seq = Layout::default().decode(all[0]).unwrap().sequence;
        assert_eq!(
            all.len() as u64,
            4096 - first_seq,
            "the rest of the ms is used"
        );
        assert!(all.windows(2).all(|w| w[1] == w[0] + 1));
        assert_eq!(engine.stats().sequence_waits.load(Ordering::Relaxed), 1);
        clock.advance(1);
        let next = ids(engine.try_next(1).unwrap())[0];
        assert!(next > *all.last().unwrap());
    }

    #[test]
    fn clock_moving_back_never_yields_a_lower_id() {
        for back in [1u64, 5, 10_000] {
            let clock = Arc::new(ManualClock::new(T0));
            let engine = engine(clock.clone());
            let before = ids(engine.try_next(1).unwrap())[0];
            clock.set(T0 - back);
            match engine.try_next(1) {
                Ok(Attempt::ClockBehind(b)) => {
                    assert!(back <= 5);
                    assert_eq!(b, back);
                }
                Err(SnowflakeError::ClockBack(b)) => {
                    assert!(back > 5);
                    assert_eq!(b, back);
                    assert_eq!(
                        SnowflakeError::ClockBack(b).to_string(),
                        format!("clock moved back {back} ms")
                    );
                }
                other => panic!("back {back}: {other:?}"),
            }
            clock.set(T0);
            let same_ms = ids(engine.try_next(1).unwrap())[0];
            assert!(same_ms > before, "back {back}: {same_ms} <= {before}");
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn small_backward_step_is_waited_out_large_one_refused() {
        let clock = Arc::new(ManualClock::new(T0));
        let engine = engine(clock.clone());
        engine.next_id().await.unwrap();
        clock.set(T0 - 3);
        // The manual clock does not move while we wait, so the retry still sees it behind.
        assert_eq!(engine.next_id().await, Err(SnowflakeError::ClockBack(3)));
        clock.set(T0 - 10_000);
        assert_eq!(
            engine.next_id().await,
            Err(SnowflakeError::ClockBack(10_000))
        );
        clock.set(T0 + 1);
        assert!(engine.next_id().await.is_ok());
    }

    /// `per_thread` IDs from each of eight threads on the real clock: distinct, increasing per
    /// thread; returned all together.
    fn from_eight_threads(layout: Layout, worker_id: u64, per_thread: usize) -> HashSet<i64> {
        let engine = Arc::new(SnowflakeEngine::new(
            layout,
            worker_id,
            5,
            Arc::new(crate::clock::SystemClock),
            Arc::new(IssueLimit::unbounded()),
            Duration::ZERO,
        ));
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let engine = engine.clone();
                std::thread::spawn(move || {
                    let mut out = Vec::with_capacity(per_thread);
                    while out.len() < per_thread {
                        match engine.try_next(1).unwrap() {
                            Attempt::Ids(ids) => out.extend(ids),
                            _ => std::thread::yield_now(),
                        }
                    }
                    out
                })
            })
            .collect();
        let mut seen = HashSet::with_capacity(8 * per_thread);
        for handle in handles {
            let ids = handle.join().unwrap();
            assert!(ids.windows(2).all(|w| w[0] < w[1]), "per-thread increasing");
            for id in ids {
                assert!(seen.insert(id), "duplicate {id}");
            }
        }
        assert_eq!(seen.len(), 8 * per_thread);
        seen
    }

    #[test]
    fn a_million_ids_from_eight_threads_are_unique() {
        from_eight_threads(Layout::default(), 3, 125_000);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn no_id_passes_the_limit_and_a_late_fence_is_waited_for_a_bounded_time() {
        let clock = Arc::new(ManualClock::new(T0));
        let limit = Arc::new(IssueLimit::new());
        limit.publish_fence(T0 + 2);
        let engine = SnowflakeEngine::new(
            Layout::default(),
            7,
            5,
            clock.clone(),
            limit.clone(),
            Duration::from_millis(30),
        );
        let id = engine.next_id().await.unwrap();
        assert_eq!(Layout::default().decode(id).unwrap().timestamp_ms, T0);
        clock.set(T0 + 3);
        let started = std::time::Instant::now();
        match engine.next_id().await {
            Err(SnowflakeError::Unavailable(reason)) => {
                assert!(reason.contains("time fence"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
        assert!(started.elapsed() >= Duration::from_millis(30));
        limit.publish_fence(T0 + 10);
        let id = engine.next_id().await.unwrap();
        assert_eq!(Layout::default().decode(id).unwrap().timestamp_ms, T0 + 3);
        limit.revoke("taken over".into());
        let started = std::time::Instant::now();
        assert_eq!(
            engine.next_id().await,
            Err(SnowflakeError::Unavailable("taken over".into()))
        );
        assert!(
            started.elapsed() < Duration::from_millis(30),
            "revoked: no wait"
        );
    }

    /// 41 + 4 + 8 bits in 10 ms steps (JavaScript-safe): 20,000 IDs from eight threads (256 per
    /// step: most wait for the next step) are distinct, at most 2^53 − 1 and increasing per thread; a step is used only when the limit
    /// covers all of it, and its sequence runs on across the milliseconds inside it.
    #[test]
    fn a_53_bit_layout_with_a_10_ms_unit() {
        let layout = Layout {
            timestamp_bits: 41,
            worker_bits: 4,
            sequence_bits: 8,
            unit_ms: 10,
            // Steps start at T0 + 10·k.
            epoch_ms: 1_700_000_000_000,
        };
        for id in from_eight_threads(layout, 15, 2_500) {
            assert!(id < (1i64 << 53), "{id} is past 2^53 - 1");
            assert_eq!(layout.decode(id).unwrap().worker_id, 15);
        }

        // The step T0 + 120 ..= T0 + 129: with the fence at T0 + 125 none of it is used.
        let clock = Arc::new(ManualClock::new(T0 + 121));
        let limit = Arc::new(IssueLimit::new());
        limit.publish_fence(T0 + 125);
        let engine =
            SnowflakeEngine::new(layout, 1, 5, clock.clone(), limit.clone(), Duration::ZERO);
        assert_eq!(engine.try_next(1), Ok(Attempt::Fenced));
        limit.publish_fence(T0 + 129);
        let first = ids(engine.try_next(1).unwrap())[0];
        clock.set(T0 + 128);
        let second = ids(engine.try_next(1).unwrap())[0];
        assert_eq!(second, first + 1, "one step, one sequence");
        assert_eq!(
            engine.last_timestamp_ms(),
            T0 + 129,
            "the step's last millisecond"
        );
        // Back 3 ms but inside the step: no clock-back, the sequence goes on.
        clock.set(T0 + 125);
        assert_eq!(ids(engine.try_next(1).unwrap())[0], second + 1);
        // Into the step before: behind by the time until the step of the last ID.
        clock.set(T0 + 118);
        assert_eq!(engine.try_next(1), Ok(Attempt::ClockBehind(2)));
    }

    /// Before its first ID the engine still refuses times before its floor (the start's clock):
    /// a step back between the start checks and the first request is a step back.
    #[test]
    fn no_id_before_the_floor_even_before_the_first_one() {
        let clock = Arc::new(ManualClock::new(T0 - 3));
        let engine = engine(clock.clone()).with_floor(T0);
        assert_eq!(engine.try_next(1), Ok(Attempt::ClockBehind(3)));
        clock.set(T0 - 60_000);
        assert_eq!(engine.try_next(1), Err(SnowflakeError::ClockBack(60_000)));
        clock.set(T0);
        let id = ids(engine.try_next(1).unwrap())[0];
        assert_eq!(Layout::default().decode(id).unwrap().timestamp_ms, T0);
    }

    #[test]
    fn a_clock_at_or_before_the_epoch_is_an_error_not_a_zero_or_negative_id() {
        for offset in [-1i64, 0] {
            let epoch = Layout::default().epoch_ms;
            let clock = Arc::new(ManualClock::new(epoch.saturating_add_signed(offset)));
            let engine = engine(clock);
            assert_eq!(engine.try_next(1), Err(SnowflakeError::BeforeEpoch));
        }
    }
}
