//! A strict tag's batch gathered: before an allocation is sent, a short wait for the requesters
//! the previous one answered, when they come straight back, so they share one allocation.
//!
//! Without it, clients that send their next request as soon as a reply arrives split into
//! groups that take turns: the allocation for one group is under way when the other group's
//! replies go out, so each request waits for two allocations and the batches are half the size.
//! A requester is the task (the connection) that asked. An allocation waits only when, for the
//! two allocations before, three quarters of the requesters were queued again within half an
//! allocation's time (seen whether or not anyone waited for them), and only until three quarters
//! of the last one's are, for at most half an allocation: so requests arriving at random, or
//! clients that pause between requests, are not waited for, and a wait that runs out ends at the
//! first request after its time (or the timer's next millisecond).

use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task;
use tokio::time::Instant;

/// The longest wait. The timer's granularity is a millisecond: a wait that runs out lasts one
/// or two; one that ends on an arrival ends at once.
const MAX_WAIT: Duration = Duration::from_millis(1);

/// An allocation's requesters followed: the first this many.
const MAX_FOLLOWED: usize = 256;

#[derive(Default)]
pub(super) struct Gather {
    /// Woken when enough of the last allocation's requesters are queued again.
    returned: Notify,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// The last allocation's requesters, sorted, each with whether it is queued again.
    answered: Vec<(task::Id, bool)>,
    /// How many of them are.
    back: usize,
    /// How many of them were queued again within `soon` of `served_at`.
    back_soon: usize,
    /// When the last allocation's replies went out.
    served_at: Option<Instant>,
    /// Half the last allocation's time (at most [`MAX_WAIT`]): the longest wait worth it.
    soon: Duration,
    /// Allocations in a row whose requesters came back soon (at most 2): waits are worth it
    /// after two.
    came_back: u8,
    /// Until when the allocating holder waits, while it does.
    waiting_until: Option<Instant>,
}

/// `count` is at least three quarters of `of`.
fn three_quarters(count: usize, of: usize) -> bool {
    count * 4 >= of * 3
}

impl State {
    /// Enough of the last allocation's requesters are queued again.
    fn enough_back(&self) -> bool {
        three_quarters(self.back, self.answered.len())
    }

    fn mark_back(&mut self, from: task::Id, now: Instant) {
        if let Ok(i) = self.answered.binary_search_by_key(&from, |(id, _)| *id) {
            if !self.answered[i].1 {
                self.answered[i].1 = true;
                self.back += 1;
                if self.served_at.is_some_and(|at| now <= at + self.soon) {
                    self.back_soon += 1;
                }
            }
        }
    }
}

/// What [`Gather::wait`] did.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Waited {
    /// No wait: enough requesters were back already, or they do not come back soon.
    No,
    /// Enough came back in time.
    Paid,
    /// They did not.
    Missed,
}

impl Gather {
    /// The current task's identity as a requester (`None` outside a task: never waited for).
    pub fn requester() -> Option<task::Id> {
        task::try_id()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A request of `from` was queued.
    pub fn queued(&self, from: Option<task::Id>) {
        let now = Instant::now();
        let wake = {
            let mut state = self.state();
            if let Some(from) = from {
                state.mark_back(from, now);
            }
            // Ends a wait that has run out: sooner than the timer, under load.
            state
                .waiting_until
                .is_some_and(|until| state.enough_back() || now > until)
        };
        if wake {
            self.returned.notify_one();
        }
    }

    /// Waits, before an allocation is sent (by the node's one allocating holder), until enough
    /// of the last allocation's requesters are queued again, when they came back soon the two
    /// times before.
    pub async fn wait(&self) -> Waited {
        let started = Instant::now();
        let soon = {
            let mut state = self.state();
            if state.enough_back() || state.came_back < 2 {
                return Waited::No;
            }
            state.waiting_until = Some(started + state.soon);
            state.soon
        };
        let paid = loop {
            let returned = self.returned.notified();
            if self.state().enough_back() {
                break true;
            }
            if started.elapsed() > soon
                || tokio::time::timeout_at(started + soon, returned)
                    .await
                    .is_err()
            {
                break false;
            }
        };
        let mut state = self.state();
        state.waiting_until = None;
        if paid {
            Waited::Paid
        } else {
            // Not again until they are seen coming back soon twice.
            state.came_back = 0;
            Waited::Missed
        }
    }

    /// An allocation that took `allocation` answered the requests of `requesters`; `queued`
    /// are the requesters of the requests waiting now (some may be back already).
    pub fn served(
        &self,
        requesters: impl Iterator<Item = task::Id>,
        queued: impl Iterator<Item = task::Id>,
        allocation: Duration,
    ) {
        let mut answered: Vec<(task::Id, bool)> = requesters
            .take(MAX_FOLLOWED)
            .map(|id| (id, false))
            .collect();
        answered.sort_unstable();
        answered.dedup();
        let now = Instant::now();
        let mut state = self.state();
        // The allocation before's requesters: did they come back soon?
        let soon =
            !state.answered.is_empty() && three_quarters(state.back_soon, state.answered.len());
        state.came_back = if soon {
            (state.came_back + 1).min(2)
        } else {
            0
        };
        state.answered = answered;
        state.back = 0;
        state.back_soon = 0;
        state.served_at = Some(now);
        state.soon = (allocation / 2).min(MAX_WAIT);
        for from in queued {
            state.mark_back(from, now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// `count` requesters: tasks kept alive until the test ends, so their ids stay theirs.
    fn requesters(count: usize) -> (Vec<task::Id>, Vec<tokio::task::JoinHandle<()>>) {
        let handles: Vec<_> = (0..count)
            .map(|_| tokio::spawn(std::future::pending::<()>()))
            .collect();
        (handles.iter().map(|h| h.id()).collect(), handles)
    }

    fn each(ids: &[task::Id]) -> impl Iterator<Item = task::Id> + '_ {
        ids.iter().copied()
    }

    const ALLOCATION: Duration = Duration::from_millis(40);

    /// Two allocations whose requesters `ids` all came straight back, then one that answered
    /// them again: the next wait is worth it.
    fn came_back_soon(gather: &Gather, ids: &[task::Id]) {
        gather.served(each(ids), std::iter::empty(), ALLOCATION);
        for _ in 0..2 {
            for &id in ids {
                gather.queued(Some(id));
            }
            gather.served(each(ids), std::iter::empty(), ALLOCATION);
        }
    }

    #[tokio::test]
    async fn the_wait_ends_when_the_answered_requesters_are_back() {
        let gather = Arc::new(Gather::default());
        let (ids, _alive) = requesters(8);
        came_back_soon(&gather, &ids);
        let back = {
            let (gather, ids) = (gather.clone(), ids.clone());
            tokio::spawn(async move {
                for id in ids {
                    tokio::task::yield_now().await;
                    gather.queued(Some(id));
                    // Another requester's arrival does not count.
                    gather.queued(None);
                }
            })
        };
        let started = std::time::Instant::now();
        assert_eq!(gather.wait().await, Waited::Paid);
        assert!(started.elapsed() < Duration::from_millis(20));
        let back_when_done = gather.state().back;
        assert!(back_when_done >= 6, "ended with {back_when_done} of 8 back");
        back.await.unwrap();
    }

    #[tokio::test]
    async fn requesters_already_back_are_not_waited_for() {
        let gather = Gather::default();
        let (ids, _alive) = requesters(4);
        came_back_soon(&gather, &ids);
        for &id in &ids[..3] {
            gather.queued(Some(id));
        }
        assert_eq!(gather.wait().await, Waited::No);
        // A single requester, back before the next allocation (one client in a loop).
        gather.served(each(&ids[..1]), each(&ids[..1]), ALLOCATION);
        assert_eq!(gather.wait().await, Waited::No);
    }

    #[tokio::test]
    async fn requesters_that_came_back_late_are_not_waited_for() {
        let gather = Gather::default();
        let (ids, _alive) = requesters(8);
        // Back after more than half the allocation's 2 ms: requests at random, or clients
        // that pause between requests.
        gather.served(each(&ids), std::iter::empty(), Duration::from_millis(2));
        tokio::time::sleep(Duration::from_millis(5)).await;
        for &id in &ids {
            gather.queued(Some(id));
        }
        gather.served(each(&ids), std::iter::empty(), Duration::from_millis(2));
        let started = std::time::Instant::now();
        assert_eq!(gather.wait().await, Waited::No);
        assert!(started.elapsed() < Duration::from_millis(1));
        // Back soon once after that is not enough: twice in a row is.
        gather.served(each(&ids), std::iter::empty(), ALLOCATION);
        for round in 1..=2 {
            for &id in &ids {
                gather.queued(Some(id));
            }
            gather.served(each(&ids), std::iter::empty(), ALLOCATION);
            let expected = if round == 1 {
                Waited::No
            } else {
                Waited::Missed
            };
            assert_eq!(
                gather.wait().await,
                expected,
                "after {round} rounds back soon"
            );
        }
    }

    #[tokio::test]
    async fn requests_of_other_tasks_do_not_end_a_wait() {
        let gather = Gather::default();
        let (ids, _alive) = requesters(8);
        came_back_soon(&gather, &ids);
        let (others, _alive_too) = requesters(8);
        for &id in &others {
            gather.queued(Some(id));
        }
        assert_eq!(gather.wait().await, Waited::Missed);
    }

    #[tokio::test]
    async fn a_wait_that_runs_out_is_not_tried_again_until_they_come_back_soon() {
        let gather = Gather::default();
        let (ids, _alive) = requesters(8);
        came_back_soon(&gather, &ids);
        let started = std::time::Instant::now();
        // Nobody comes back: the wait runs out after about a millisecond (at most).
        assert_eq!(gather.wait().await, Waited::Missed);
        assert!(started.elapsed() < Duration::from_millis(50));
        assert_eq!(gather.wait().await, Waited::No);
        // They come back soon again: the next allocation's wait is worth it again.
        came_back_soon(&gather, &ids);
        for &id in &ids[..5] {
            gather.queued(Some(id));
        }
        assert_eq!(gather.wait().await, Waited::Missed);
    }
}
