//! Strictly increasing tags (`order = "strict"`): no buffer; every request is served from an
//! allocation made after it arrived, the requests waiting at that moment batched into one.
//!
//! Why that orders requests across the cluster: a request sent after another's reply arrived
//! reached its node after the other's allocation committed, and joins only an allocation that
//! has not yet been sent; that allocation locks the row after the commit, so its range starts
//! at or above the other's `max_id` (see `storage::SegmentStore::allocate`).

use std::sync::atomic::Ordering;

use tokio::sync::oneshot;

use super::gather::{Gather, Waited};
use super::{LoadFailure, PeriodRule, SegmentEngine, SegmentError, TagBuffer};
use crate::storage::StoreError;

/// A request waiting for the next allocation: how many IDs, and where its last one goes.
pub(super) struct Waiting {
    n: i64,
    reply: oneshot::Sender<Result<i64, SegmentError>>,
    /// The task that asked, when the tag gathers its batches.
    from: Option<tokio::task::Id>,
}

impl SegmentEngine {
    /// Hands out `n` consecutive IDs of a strict tag, above every ID handed out before this
    /// request arrived on any node, and returns the last.
    pub(super) async fn next_strict(
        &self,
        buffer: &TagBuffer,
        n: i64,
    ) -> Result<i64, SegmentError> {
        let (reply, mut answer) = oneshot::channel();
        let gather = buffer.strict_gather.as_deref();
        let from = gather.and_then(|_| Gather::requester());
        Self::strict_queue(buffer).push(Waiting { n, reply, from });
        if let Some(gather) = gather {
            gather.queued(from);
        }
        let served = async {
            loop {
                // One allocation of the tag at a time on this node; whoever holds the lock
                // serves every request waiting when it takes the queue, its own included
                // unless an earlier holder already served it.
                let _one_at_a_time = buffer.allocating.lock().await;
                match answer.try_recv() {
                    Ok(result) => return result,
                    // The holder that took this request gave up (its own caller timed out)
                    // and dropped the batch: nothing will answer. (The receiver is spent now:
                    // awaiting it again would panic.)
                    Err(oneshot::error::TryRecvError::Closed) => {
                        return Err(self.strict_lost(buffer))
                    }
                    Err(oneshot::error::TryRecvError::Empty) => {}
                }
                if let Some(gather) = gather {
                    match gather.wait().await {
                        Waited::No => {}
                        Waited::Paid => {
                            self.stats
                                .strict_gathers_paid
                                .fetch_add(1, Ordering::Relaxed);
                        }
                        Waited::Missed => {
                            self.stats
                                .strict_gathers_missed
                                .fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
                let batch = std::mem::take(&mut *Self::strict_queue(buffer));
                if batch.is_empty() {
                    // Taken by a holder whose answer is on its way: wait for the lock again.
                    continue;
                }
                // Empty (no allocation) when the tag does not gather.
                let requesters: Vec<_> = batch.iter().filter_map(|w| w.from).collect();
                let started = std::time::Instant::now();
                self.serve_batch(buffer, batch).await;
                if let Some(gather) = gather {
                    let queue = Self::strict_queue(buffer);
                    let queued = queue.iter().filter_map(|w| w.from);
                    gather.served(requesters.into_iter(), queued, started.elapsed());
                }
                drop(_one_at_a_time);
                return match answer.await {
                    Ok(result) => result,
                    Err(_) => Err(self.strict_lost(buffer)),
                };
            }
        };
        let deadline = tokio::time::Instant::now() + self.settings.load_timeout;
        match tokio::time::timeout_at(deadline, served).await {
            Ok(result) => result,
            // Whatever allocation this request joins later is skipped, never handed out twice.
            Err(_) => Err(SegmentError::Unavailable {
                tag: buffer.name.to_string(),
                reason: super::timed_out(
                    "no allocation",
                    self.settings.load_timeout,
                    super::LOAD_TIMEOUT_KEY,
                    deadline,
                ),
            }),
        }
    }

    /// The requests waiting for the tag's next allocation.
    fn strict_queue(buffer: &TagBuffer) -> std::sync::MutexGuard<'_, Vec<Waiting>> {
        buffer
            .strict_waiting
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// One allocation of exactly what `batch` asks for, handed out in its order. A period
    /// tag's allocation never crosses the end of its period: when the batch does not fit what
    /// the period has left, the requests that fit (in order) are served from an allocation of
    /// exactly their size and the others refused whole, so no number is lost or repeated and
    /// none is dated in a later period.
    async fn serve_batch(&self, buffer: &TagBuffer, mut batch: Vec<Waiting>) {
        self.stats
            .request_waits
            .fetch_add(batch.len() as u64, std::sync::atomic::Ordering::Relaxed);
        if let Some(rule) = buffer.kind.period() {
            if let Err(error) = self.enter_period(buffer, rule).await {
                for waiting in batch {
                    let _ = waiting.reply.send(Err(error.clone()));
                }
                return;
            }
        }
        // Each retry follows a refusal that served nobody yet; another node taking numbers
        // meanwhile can shrink what is left again, so the retries are bounded.
        let mut tries = 0;
        let outcome = loop {
            let total = batch.iter().try_fold(0i64, |sum, w| sum.checked_add(w.n));
            let Some(total) = total else {
                for waiting in batch {
                    let _ = waiting
                        .reply
                        .send(Err(SegmentError::Exhausted(buffer.name.to_string())));
                }
                return;
            };
            let started = std::time::Instant::now();
            let outcome = match self.allocate_guarded_locked(buffer, Some(total)).await {
                Ok(guarded) => guarded,
                Err(StoreError::PastEnd { max_id, left, .. }) if tries < 4 => {
                    tries += 1;
                    batch = self.refuse_past_end(buffer, batch, max_id, left);
                    if batch.is_empty() {
                        return;
                    }
                    continue;
                }
                Err(e) => Err(LoadFailure::from_store(&e)),
            };
            let mut st = buffer.lock();
            self.book_allocation(buffer, &mut st, started, outcome.as_ref());
            if outcome.is_ok() {
                st.served += total as u64;
            }
            break outcome;
        };
        match outcome {
            Ok(alloc) => {
                let mut next = alloc.first;
                for waiting in batch {
                    next += waiting.n;
                    let result = if next > alloc.max_id {
                        // The failover margin used the period up (an empty grant).
                        Err(self.period_used_up(buffer, alloc.max_id))
                    } else {
                        self.strict_id(buffer, next - waiting.n, next - 1)
                    };
                    let _ = waiting.reply.send(result);
                }
            }
            Err(failure) => {
                let error = self.failure_error(&buffer.name, failure);
                for waiting in batch {
                    let _ = waiting.reply.send(Err(error.clone()));
                }
            }
        }
    }

    /// A period's allocation was refused because `batch` does not fit the `left` numbers the
    /// row's period (at `max_id`) has: the requests that fit, in order, are returned to be
    /// served; the others are told how many numbers are left, or that none are.
    fn refuse_past_end(
        &self,
        buffer: &TagBuffer,
        batch: Vec<Waiting>,
        max_id: i64,
        left: i64,
    ) -> Vec<Waiting> {
        let Some(rule) = buffer.kind.period() else {
            return batch;
        };
        {
            let mut st = buffer.lock();
            st.max_id = st.max_id.max(max_id);
        }
        let period = rule.period_of(max_id);
        let mut room = left;
        let mut fit = Vec::with_capacity(batch.len());
        for waiting in batch {
            if waiting.n <= room {
                room -= waiting.n;
                fit.push(waiting);
            } else if room == 0 {
                let _ = waiting.reply.send(Err(self.period_used_up(buffer, max_id)));
            } else {
                // What is left after the requests before it in the batch.
                let _ = waiting.reply.send(Err(SegmentError::PeriodShort {
                    tag: buffer.name.to_string(),
                    period,
                    left: room,
                    asked: waiting.n,
                }));
            }
        }
        fit
    }

    /// The row's period (at `position`) has no number left: refused until the next period.
    fn period_used_up(&self, buffer: &TagBuffer, position: i64) -> SegmentError {
        let Some(rule) = buffer.kind.period() else {
            return SegmentError::Exhausted(buffer.name.to_string());
        };
        let period = rule.period_of(position);
        buffer.period_exhausted.fetch_max(period, Ordering::Relaxed);
        SegmentError::PeriodExhausted {
            tag: buffer.name.to_string(),
            period,
            last: rule.last_sequence(),
        }
    }

    /// The last ID of a request granted the positions `first..=last`: the position itself, or a
    /// period tag's date and sequence when the whole block lies within one period's numbers
    /// (the allocation's window makes sure of it; checked again here).
    fn strict_id(&self, buffer: &TagBuffer, first: i64, last: i64) -> Result<i64, SegmentError> {
        let Some(rule) = buffer.kind.period() else {
            return Ok(last);
        };
        match (rule.id_at(first), rule.id_at(last)) {
            (Some(_), Some(id)) if rule.period_of(first) == rule.period_of(last) => {
                self.check_position(buffer, rule, first, self.clock.now_millis())?;
                Ok(id)
            }
            _ => Err(self.period_used_up(buffer, last)),
        }
    }

    /// Before a period tag's allocation: the row is raised to this node's period when the
    /// last allocation this node saw was of an earlier one (a lagging clock never lowers it).
    async fn enter_period(
        &self,
        buffer: &TagBuffer,
        rule: &PeriodRule,
    ) -> Result<(), SegmentError> {
        let now_ms = self.clock.now_millis();
        let now = rule.period_at(now_ms);
        let exhausted = buffer.period_exhausted.load(Ordering::Relaxed);
        if exhausted >= now {
            return Err(SegmentError::PeriodExhausted {
                tag: buffer.name.to_string(),
                period: exhausted,
                last: rule.last_sequence(),
            });
        }
        let known = buffer.lock().max_id;
        if rule.period_of(known) >= now {
            return self.check_position(buffer, rule, known, now_ms);
        }
        // The row as it is before the raise moves it ([`PeriodRule::refuse_row`]).
        let row = match self.store.row(&buffer.name).await {
            Ok(row) => row,
            Err(e) => return Err(self.failure_error(&buffer.name, LoadFailure::from_store(&e))),
        };
        if let Some(row) = row {
            let refusal = rule.refuse_row(row.max_id, row.split.as_deref(), now_ms);
            self.refuse_row(buffer, row.max_id, refusal)?;
        }
        let floor = rule.first_position(now);
        let record = rule.record();
        let raised =
            super::admin::retry_conflicts(|| self.store.raise(&buffer.name, floor, &record)).await;
        match raised {
            Ok(max_id) => {
                {
                    let mut st = buffer.lock();
                    st.max_id = st.max_id.max(max_id);
                }
                self.check_position(buffer, rule, max_id, now_ms)
            }
            Err(e) => Err(self.failure_error(&buffer.name, LoadFailure::from_store(&e))),
        }
    }

    /// A period tag's row position may be served by this node only as a date of its rule, at
    /// or before the period its clock is in ([`PeriodRule::refuse_position`]): checked before
    /// an allocation moves the row, and again on the range it granted.
    fn check_position(
        &self,
        buffer: &TagBuffer,
        rule: &PeriodRule,
        position: i64,
        now_ms: u64,
    ) -> Result<(), SegmentError> {
        self.refuse_row(buffer, position, rule.refuse_position(position, now_ms))
    }

    /// The refusal of a row at `position` for `reason` (`None`: the row may be served).
    fn refuse_row(
        &self,
        buffer: &TagBuffer,
        position: i64,
        reason: Option<String>,
    ) -> Result<(), SegmentError> {
        let Some(reason) = reason else {
            return Ok(());
        };
        tracing::warn!(tag = %buffer.name, position, "{reason}");
        Err(self.failure_error(&buffer.name, LoadFailure::Unavailable(reason.into())))
    }

    /// The holder serving this request's batch went away (its own caller timed out).
    fn strict_lost(&self, buffer: &TagBuffer) -> SegmentError {
        SegmentError::Unavailable {
            tag: buffer.name.to_string(),
            reason: "database unreachable: the allocation serving this request was abandoned"
                .into(),
        }
    }
}
