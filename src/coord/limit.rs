//! How far ahead the snowflake engine may issue: the durable time fence and the coordinator's
//! lease on the worker id, kept as two atomics the request path reads without a lock.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

/// The latest millisecond the engine may put into an ID. Two bounds, each moved by its owner:
/// the **fence** (a timestamp made durable before any ID uses it, so a restart knows what was
/// issued) and the **lease** (how long the coordinator is sure the worker id is still this
/// node's). An ID's timestamp must be at or below both; a revoked limit allows nothing, for good.
#[derive(Debug)]
pub struct IssueLimit {
    fence_ms: AtomicU64,
    lease_ms: AtomicU64,
    revoked: AtomicBool,
    /// Why the fence is not further ahead (set when extending it failed).
    fence_problem: Mutex<Option<String>>,
    /// Why the lease ends where it does (set by the coordinator).
    lease_problem: Mutex<Option<String>>,
    /// Failed attempts to extend the lease (coordinator reports or renewals).
    lease_failures: AtomicU64,
    /// The last renewal's error since the last success: the reply names the cause, not only
    /// that the lease ran out (an etcd that refuses the token is not "unreachable").
    last_lease_error: Mutex<Option<String>>,
}

impl Default for IssueLimit {
    fn default() -> Self {
        IssueLimit::new()
    }
}

impl IssueLimit {
    /// A limit that allows nothing until a fence is published; the lease is unbounded.
    pub fn new() -> IssueLimit {
        IssueLimit {
            fence_ms: AtomicU64::new(0),
            lease_ms: AtomicU64::new(u64::MAX),
            revoked: AtomicBool::new(false),
            fence_problem: Mutex::new(None),
            lease_problem: Mutex::new(None),
            lease_failures: AtomicU64::new(0),
            last_lease_error: Mutex::new(None),
        }
    }

    /// A limit with no bound at all (unit tests of the engine's own clock rules).
    pub fn unbounded() -> IssueLimit {
        let limit = IssueLimit::new();
        limit.publish_fence(u64::MAX);
        limit
    }

    /// True when an ID with timestamp `now_ms` may be issued.
    #[inline]
    pub fn allows(&self, now_ms: u64) -> bool {
        now_ms <= self.fence_ms.load(Ordering::Acquire)
            && now_ms <= self.lease_ms.load(Ordering::Acquire)
    }

    /// The durable fence: IDs may carry timestamps up to it. Call only once it is durable.
    pub fn fence_ms(&self) -> u64 {
        self.fence_ms.load(Ordering::Acquire)
    }

    /// Publishes a fence that has been made durable; never moves it back.
    pub fn publish_fence(&self, fence_ms: u64) {
        self.fence_ms.fetch_max(fence_ms, Ordering::AcqRel);
        *lock(&self.fence_problem) = None;
    }

    /// Records why the fence could not be extended (shown when a request reaches it).
    pub fn fence_failed(&self, problem: String) {
        *lock(&self.fence_problem) = Some(problem);
    }

    /// The end of the coordinator's lease (u64::MAX: no lease, as with a static worker id).
    pub fn lease_ms(&self) -> u64 {
        self.lease_ms.load(Ordering::Acquire)
    }

    /// Moves the lease's end (forwards or back: a lost liveness node ends it at once).
    pub fn set_lease(&self, until_ms: u64, problem: Option<String>) {
        let mut current = lock(&self.lease_problem);
        if self.is_revoked() {
            return;
        }
        *current = problem;
        *lock(&self.last_lease_error) = None;
        self.lease_ms.store(until_ms, Ordering::Release);
    }

    /// A renewal failed with `error`: named in the reply if the lease runs out before the
    /// next success.
    pub fn lease_error(&self, error: String) {
        self.lease_failed();
        *lock(&self.last_lease_error) = Some(error);
    }

    /// Ends the lease for good: the worker id belongs to another node now.
    pub fn revoke(&self, reason: String) {
        let mut current = lock(&self.lease_problem);
        *current = Some(reason);
        self.revoked.store(true, Ordering::Release);
        self.lease_ms.store(0, Ordering::Release);
    }

    /// Counts a failed attempt to extend the lease.
    pub fn lease_failed(&self) {
        self.lease_failures.fetch_add(1, Ordering::Relaxed);
    }

    pub fn lease_failures(&self) -> u64 {
        self.lease_failures.load(Ordering::Relaxed)
    }

    pub fn is_revoked(&self) -> bool {
        self.revoked.load(Ordering::Acquire)
    }

    /// `Err(reason)` when an ID with timestamp `now_ms` may not be issued.
    pub fn check(&self, now_ms: u64) -> Result<(), String> {
        if self.allows(now_ms) && !self.is_revoked() {
            return Ok(());
        }
        Err(self.reason(now_ms))
    }

    /// Why `now_ms` is beyond the limit, for the `UNAVAILABLE` reply.
    pub fn reason(&self, now_ms: u64) -> String {
        if now_ms > self.lease_ms() || self.is_revoked() {
            let problem = lock(&self.lease_problem)
                .clone()
                .unwrap_or_else(|| "the coordinator's lease on the worker id has ended".into());
            return match lock(&self.last_lease_error).as_ref() {
                Some(error) if !self.is_revoked() => {
                    format!("{problem} (last renewal error: {error})")
                }
                _ => problem,
            };
        }
        match lock(&self.fence_problem).as_ref() {
            Some(problem) => format!("time fence not extended: {problem}"),
            None => format!(
                "time fence at {} ms not extended in time (clock at {now_ms} ms)",
                self.fence_ms()
            ),
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_bounds_apply_and_revocation_is_final() {
        let limit = IssueLimit::new();
        assert!(!limit.allows(1), "nothing before a fence is published");
        limit.publish_fence(1000);
        assert!(limit.allows(1000) && !limit.allows(1001));
        limit.publish_fence(500);
        assert_eq!(limit.fence_ms(), 1000, "the fence never moves back");
        limit.set_lease(800, Some("no report".into()));
        assert!(limit.allows(800) && !limit.allows(801));
        assert_eq!(limit.check(900), Err("no report".into()));
        limit.fence_failed("disk full".into());
        limit.set_lease(u64::MAX, None);
        assert_eq!(
            limit.check(1001),
            Err("time fence not extended: disk full".into())
        );
        limit.revoke("taken over".into());
        assert_eq!(limit.check(10), Err("taken over".into()));
        limit.set_lease(u64::MAX, None);
        assert!(limit.check(10).is_err(), "revoked stays revoked");
    }
}
