//! The holder's side of a worker-id lease kept in a store (the database, or etcd): a renewal
//! every fifth of the lease, stopping at once when the store went back, and the claim again.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::clock::Clock;
use crate::coord::IssueLimit;
use crate::storage::WorkerLeaseStore;

/// Why IDs stopped: `holder` ("the database", "etcd") renewed no lease for half of it.
pub(super) fn renew_problem(since_ms: u64, holder: &str) -> String {
    format!(
        "no successful worker-id lease renewal since {since_ms} ms (UNIX time): {holder} did not renew it for half the lease"
    )
}

/// Claims `worker_id` again for `owner` after the store lost its leases, starting the store's
/// settling period (claimants wait a whole lease); the fence of the holder before (a node that
/// held the id meanwhile), or `None` when another node holds it now.
async fn claim_again(
    store: &dyn WorkerLeaseStore,
    worker_id: u64,
    owner: &str,
    lease: i64,
) -> Result<Option<i64>, crate::storage::StoreError> {
    store.instance_changed_within(lease).await?;
    store.claim(worker_id as i64, owner, lease).await
}

/// How soon a failed lease renewal is tried again (a few statements a second per node).
pub(super) const RETRY_FAILED_RENEWAL: Duration = Duration::from_millis(200);

/// A holder's renewals of its worker-id lease, run by [`LeaseRenewal::run`] until `stop`.
pub(super) struct LeaseRenewal {
    /// Who holds the leases, as a sentence names it ("the database", "etcd").
    pub holder: &'static str,
    pub link: Option<Arc<super::LinkStatus>>,
    /// The layout this node issues in; another recorded layout stops it.
    pub layout: String,
    pub store: Arc<dyn WorkerLeaseStore>,
    pub owner: String,
    pub worker_id: u64,
    pub lease: i64,
    pub interval: Duration,
    pub half_lease_ms: u64,
    /// The fence the id's previous holders left: what this node writes never goes below it
    /// (etcd's renewal replaces the value; a crash before this node's clock passed it must
    /// not leave the next holder less).
    pub inherited_ms: u64,
    pub clock: Arc<dyn Clock>,
    pub limit: Arc<IssueLimit>,
    pub stop: CancellationToken,
}

impl LeaseRenewal {
    /// Renews the lease every `interval`; a renewal that finds the row another owner's revokes
    /// the id for good.
    pub(super) async fn run(self) {
        let LeaseRenewal {
            holder,
            link,
            layout,
            store,
            owner,
            worker_id,
            lease,
            interval,
            half_lease_ms,
            mut inherited_ms,
            clock,
            limit,
            stop,
        } = self;
        let mut failing = false;
        // After the store went back: no ID until this time (a whole lease after the id was
        // claimed again), and whether the claim is still to be made.
        let mut resume_at_ms = 0u64;
        let mut reclaim = false;
        loop {
            // After a failed renewal, try again soon: the database may take writes again within
            // a second (a failover, a Galera member rejoining), and the lease stops IDs at its half.
            let pause = if failing {
                interval.min(RETRY_FAILED_RENEWAL)
            } else {
                interval
            };
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(pause) => {}
            }
            let now = clock.now_millis();
            if reclaim {
                match claim_again(store.as_ref(), worker_id, &owner, lease).await {
                    Ok(Some(fence)) => {
                        let fence = match super::lease::inherited_fence(
                            store.keeper().place,
                            worker_id,
                            fence,
                        ) {
                            Ok(fence) => fence,
                            Err(why) => {
                                limit.revoke(format!("{why}; this node stopped issuing"));
                                return;
                            }
                        };
                        reclaim = false;
                        inherited_ms = inherited_ms.max(fence);
                        // A whole lease from when the claim committed, not from when it was
                        // sent: a claim held up (a stalled link, lock waits) for longer than a
                        // lease would otherwise resume at once beside a holder of the lost state.
                        resume_at_ms = (clock.now_millis() + 2 * half_lease_ms).max(fence);
                        tracing::warn!(worker_id, resume_at_ms, "worker id claimed again after the store went back; issuing resumes after a whole lease");
                    }
                    Ok(None) => {
                        limit.revoke(format!(
                        "worker id {worker_id} was taken by another node after {holder} lost its leases; restart this node to lease another"
                    ));
                        return;
                    }
                    Err(e) => {
                        limit.lease_error(e.to_string());
                        continue;
                    }
                }
            }
            let fence = now + half_lease_ms + interval.as_millis() as u64;
            match store
                .renew(
                    worker_id as i64,
                    &owner,
                    lease,
                    fence.max(inherited_ms) as i64,
                )
                .await
            {
                Ok(true) if now < resume_at_ms => {
                    // Held again, and its fence written; IDs wait for the end of the lease.
                    failing = true;
                }
                Ok(true) => {
                    // Another layout took the table over (its nodes checked that their IDs start
                    // above this layout's up to a lease from then): this node stops for good.
                    match store.record_layout(Some(&layout), &layout).await {
                        Ok(Some(recorded)) if recorded != layout => {
                            limit.revoke(format!(
                            "the cluster's snowflake layout changed to {recorded}; this node issues {layout} and stopped"
                        ));
                            return;
                        }
                        Ok(_) => {}
                        Err(e) => {
                            limit.lease_failed();
                            tracing::warn!(error = %e, worker_id, "cannot read the layout record; the lease is not extended");
                            failing = true;
                            continue;
                        }
                    }
                    limit.set_lease(fence, Some(renew_problem(now, holder)));
                    if let Some(link) = &link {
                        link.reported(now);
                    }
                    if std::mem::take(&mut failing) {
                        tracing::info!(worker_id, "worker-id lease renewals succeed again");
                    }
                }
                Ok(false) => {
                    limit.revoke(format!(
                    "worker id {worker_id} is leased by another node (this node's lease expired)"
                ));
                    return;
                }
                Err(crate::storage::StoreError::WentBack(why)) => {
                    // Stop at once: a claimant in the new state may take this id (it waits a
                    // whole lease first); this node claims it again and waits as long.
                    limit.set_lease(
                    now,
                    Some(format!(
                        "{why}; this node stopped issuing and claims worker id {worker_id} again, then waits a whole lease"
                    )),
                );
                    tracing::warn!(worker_id, error = %why, "the lease store went back: stopped issuing; claiming the worker id again");
                    reclaim = true;
                    failing = true;
                }
                Err(e) => {
                    limit.lease_error(e.to_string());
                    if !failing {
                        tracing::warn!(error = %e, worker_id, "worker-id lease renewal failed; SNOWFLAKE continues until half the lease has passed");
                    }
                    failing = true;
                }
            }
        }
    }
}
