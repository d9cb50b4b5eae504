//! Strictly increasing tags (`order = "strict"`): no buffer; every request is served from an
//! allocation made after it arrived, the requests waiting at that moment batched into one.
//!
//! Why that orders requests across the cluster: a request sent after another's reply arrived
//! reached its node after the other's allocation committed, and joins only an allocation that
//! has not yet been sent; that allocation locks the row after the commit, so its range starts
//! at or above the other's `max_id` (see `storage::SegmentStore::allocate`).

use std::sync::atomic::Ordering;

use tokio::sync::oneshot;

use super::{LoadFailure, PeriodRule, SegmentEngine, SegmentError, TagBuffer};

/// A request waiting for the next allocation: how many IDs, and where its last one goes.
pub(super) struct Waiting {
    n: i64,
    reply: oneshot::Sender<Result<i64, SegmentError>>,
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
        buffer
            .strict_waiting
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Waiting { n, reply });
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
                let batch = std::mem::take(
                    &mut *buffer
                        .strict_waiting
                        .lock()
                        .unwrap_or_else(|p| p.into_inner()),
                );
                if batch.is_empty() {
                    // Taken by a holder whose answer is on its way: wait for the lock again.
                    continue;
                }
                self.serve_batch(buffer, batch).await;
                drop(_one_at_a_time);
                return match answer.await {
                    Ok(result) => result,
                    Err(_) => Err(self.strict_lost(buffer)),
                };
            }
        };
        match tokio::time::timeout(self.settings.load_timeout, served).await {
            Ok(result) => result,
            // Whatever allocation this request joins later is skipped, never handed out twice.
            Err(_) => Err(SegmentError::Unavailable {
                tag: buffer.name.to_string(),
                reason: format!(
                    "database unreachable: no allocation within {} ms",
                    self.settings.load_timeout.as_millis()
                ),
            }),
        }
    }

    /// One allocation of exactly what `batch` asks for, handed out in its order.
    async fn serve_batch(&self, buffer: &TagBuffer, batch: Vec<Waiting>) {
        let total = batch.iter().try_fold(0i64, |sum, w| sum.checked_add(w.n));
        let Some(total) = total else {
            for waiting in batch {
                let _ = waiting
                    .reply
                    .send(Err(SegmentError::Exhausted(buffer.name.to_string())));
            }
            return;
        };
        self.stats
            .request_waits
            .fetch_add(batch.len() as u64, std::sync::atomic::Ordering::Relaxed);
        if let Some(rule) = &buffer.period {
            if let Err(error) = self.enter_period(buffer, rule).await {
                for waiting in batch {
                    let _ = waiting.reply.send(Err(error.clone()));
                }
                return;
            }
        }
        let started = std::time::Instant::now();
        let outcome = match self.allocate_guarded_locked(buffer, Some(total)).await {
            Ok(guarded) => guarded,
            Err(e) => Err(LoadFailure::from_store(&e)),
        };
        {
            let mut st = buffer.lock();
            self.book_allocation(buffer, &mut st, started, outcome.as_ref());
            if outcome.is_ok() {
                st.served += total as u64;
            }
        }
        match outcome {
            Ok(alloc) => {
                let mut next = alloc.first;
                for waiting in batch {
                    next += waiting.n;
                    let _ = waiting
                        .reply
                        .send(self.strict_id(buffer, next - waiting.n, next - 1));
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

    /// The last ID of a request granted the positions `first..=last`: the position itself, or a
    /// period tag's date and sequence when the whole block lies within the period's numbers.
    fn strict_id(&self, buffer: &TagBuffer, first: i64, last: i64) -> Result<i64, SegmentError> {
        let Some(rule) = &buffer.period else {
            return Ok(last);
        };
        match (rule.id_at(first), rule.id_at(last)) {
            (Some(_), Some(id)) => Ok(id),
            _ => {
                let period = rule.period_of(last);
                buffer.period_exhausted.fetch_max(period, Ordering::Relaxed);
                Err(SegmentError::PeriodExhausted {
                    tag: buffer.name.to_string(),
                    period,
                    last: rule.last_sequence(),
                })
            }
        }
    }

    /// Before a period tag's allocation: the row is raised to this node's period when the
    /// last allocation this node saw was of an earlier one (a lagging clock never lowers it).
    async fn enter_period(
        &self,
        buffer: &TagBuffer,
        rule: &PeriodRule,
    ) -> Result<(), SegmentError> {
        let now = rule.period_at(self.clock.now_millis());
        let exhausted = buffer.period_exhausted.load(Ordering::Relaxed);
        if exhausted >= now {
            return Err(SegmentError::PeriodExhausted {
                tag: buffer.name.to_string(),
                period: exhausted,
                last: rule.last_sequence(),
            });
        }
        if rule.period_of(buffer.lock().max_id) >= now {
            return Ok(());
        }
        let floor = rule.first_position(now);
        match super::tags::retry_conflicts(|| self.store.raise(&buffer.name, floor)).await {
            Ok(max_id) => {
                let mut st = buffer.lock();
                st.max_id = st.max_id.max(max_id);
                Ok(())
            }
            Err(e) => Err(self.failure_error(&buffer.name, LoadFailure::from_store(&e))),
        }
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
