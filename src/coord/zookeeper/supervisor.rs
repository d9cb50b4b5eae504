//! Keeping a ZooKeeper worker id: verify the liveness node, report the time and a fence one
//! lease ahead, reconnect after a lost session; stop issuing the moment the id may be another's.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use zookeeper_client::{Client, Error as ZkError, EventType, SessionState};

use super::registry::{persistent, Claim, Registered, Registry};
use super::ZkShared;
use crate::coord::IssueLimit;

/// The reason shown once a lease that began at `reported_ms` ends without a new report.
pub(super) fn lease_problem(reported_ms: u64) -> String {
    format!(
        "no ZooKeeper time report since {} ms (UNIX time); the worker id may be taken by another node",
        reported_ms
    )
}

/// What verifying `alive/{id}` found.
enum Alive {
    Ours,
    Taken,
}

/// Reports every interval (or at once when the liveness watch fires).
pub(super) async fn supervise(
    registry: Arc<Registry>,
    shared: Arc<ZkShared>,
    limit: Arc<IssueLimit>,
    mut client: Option<Client>,
    registered: Registered,
    stop: CancellationToken,
) {
    let id = registered.id;
    // What this node's reports never write below: the fence its id's previous holders left.
    // The first report goes out while the start may still wait for that fence (or be refused,
    // or killed): a lower one would let the next holder start below IDs already issued.
    let inherited = registered.floor_ms;
    let interval = Duration::from_millis(registry.cfg.report_interval_ms);
    let path = registry.forever_path(&registered.child);
    let watch_fired = Arc::new(Notify::new());
    let watch_armed = Arc::new(AtomicBool::new(false));
    let mut last_written = 0u64;
    let mut first = client.is_some();
    // The session a lost client had: its liveness node is ours, waited for, never taken.
    let mut old_session: Option<i64> = None;
    loop {
        if !first {
            tokio::select! {
                _ = stop.cancelled() => {
                    if let Some(client) = &client {
                        // Our own session's node: deleting it frees the id for our successor.
                        let _ = client.delete(&registry.alive_path(id), None).await;
                    }
                    return;
                }
                _ = tokio::time::sleep(interval) => {}
                _ = watch_fired.notified() => {}
            }
        }
        first = false;
        if client.is_none() {
            match reconnect(&registry, &path, id, old_session, inherited).await {
                Ok(Some(fresh)) => {
                    tracing::info!(worker_id = id, "ZooKeeper session re-established");
                    watch_armed.store(false, Ordering::SeqCst);
                    client = Some(fresh);
                }
                Ok(None) => {
                    limit.revoke(format!(
                        "worker id {id} was taken over by another node while this one was cut off from ZooKeeper"
                    ));
                    return;
                }
                Err(_) => continue,
            }
        }
        let Some(active) = &client else { continue };
        match verify_alive(&registry, active, id, &limit, &watch_armed, &watch_fired).await {
            Ok(Alive::Ours) => {}
            Ok(Alive::Taken) => {
                limit.revoke(format!(
                    "the liveness node of worker id {id} is held by another ZooKeeper session"
                ));
                return;
            }
            Err(e) => {
                if let Some(ended) = lost_contact(&shared, active, &e) {
                    old_session = Some(ended);
                    client = None;
                }
                continue;
            }
        }
        // Never write a smaller time than before: the clock may have stepped back.
        let now = registry.clock.now_millis().max(last_written);
        let fence = (now + registry.lease_ms()).max(inherited);
        match active
            .set_data(&path, &registry.data(id, now, fence), None)
            .await
        {
            Ok(_) => {
                last_written = now;
                // Another layout took the cluster over (its node bounded this layout's IDs a
                // lease past then): this node stops for good.
                match super::layout::recorded(&registry, active).await {
                    Ok(Some(recorded)) if recorded != registry.layout => {
                        limit.revoke(format!(
                            "the cluster's snowflake layout changed to {recorded} (ZooKeeper); this node issues {} and stopped",
                            registry.layout
                        ));
                        return;
                    }
                    Ok(_) => {}
                    Err(e) => {
                        limit.lease_failed();
                        if let Some(ended) = lost_contact(&shared, active, &e) {
                            old_session = Some(ended);
                            client = None;
                        }
                        continue;
                    }
                }
                // The fence is in ZooKeeper: whoever takes the id next starts past it.
                limit.set_lease(fence, Some(lease_problem(now)));
                shared.last_report_ms.store(now, Ordering::Relaxed);
                if !shared.connected.swap(true, Ordering::Relaxed) {
                    tracing::info!("ZooKeeper time reports succeed again");
                }
                registry.write_cache(id, now, fence, Some(active.session_id().0));
            }
            Err(ZkError::NoNode) => {
                limit.revoke(format!("the ZooKeeper node of worker id {id} was removed"));
                return;
            }
            Err(e) => {
                limit.lease_failed();
                if let Some(ended) = lost_contact(&shared, active, &e) {
                    old_session = Some(ended);
                    client = None;
                }
            }
        }
    }
}

/// Records a failed call; the id of the session when it is over and a new one is needed
/// (its liveness node is then this node's own, to be waited for on reconnect).
fn lost_contact(shared: &ZkShared, active: &Client, error: &ZkError) -> Option<i64> {
    if shared.connected.swap(false, Ordering::Relaxed) {
        tracing::warn!(%error, "ZooKeeper time report failed; ID service continues until the lease ends");
    }
    // Within a session the client reconnects by itself; a dead session needs a new one.
    matches!(
        active.state(),
        SessionState::Expired | SessionState::Closed | SessionState::AuthFailed
    )
    .then(|| active.session_id().0)
}

/// Checks that `alive/{id}` is this session's, re-creating it if it vanished while nobody
/// else took it, and keeps a watch on it: if it is deleted, the lease ends at once and the
/// supervisor checks again.
async fn verify_alive(
    registry: &Registry,
    client: &Client,
    id: u64,
    limit: &Arc<IssueLimit>,
    armed: &Arc<AtomicBool>,
    fired: &Arc<Notify>,
) -> Result<Alive, ZkError> {
    let path = registry.alive_path(id);
    let (stat, watcher) = client.check_and_watch_stat(&path).await?;
    let ours = match stat {
        Some(stat) => stat.ephemeral_owner == client.session_id().0,
        None => registry.claim_alive(client, id, None).await? == Claim::Claimed,
    };
    if !ours {
        return Ok(Alive::Taken);
    }
    if !armed.swap(true, Ordering::SeqCst) {
        let limit = limit.clone();
        let armed = armed.clone();
        let fired = fired.clone();
        tokio::spawn(async move {
            let event = watcher.changed().await;
            // Deleted while our session lives: someone else may create it now, so stop at
            // once. A session that ended (or a lost connection) keeps the lease: the fence in
            // ZooKeeper already holds back whoever takes the id next.
            if event.event_type == EventType::NodeDeleted {
                limit.set_lease(
                    0,
                    Some(format!(
                        "the liveness node of worker id {id} was deleted; waiting to hold it again"
                    )),
                );
            }
            armed.store(false, Ordering::SeqCst);
            fired.notify_one();
        });
    }
    Ok(Alive::Ours)
}

/// A new session for a node that already has its id. `Ok(None)` when the id is no longer ours.
async fn reconnect(
    registry: &Registry,
    path: &str,
    id: u64,
    old_session: Option<i64>,
    inherited: u64,
) -> Result<Option<Client>, ZkError> {
    let client = registry.connect().await?;
    client.mkdir(&registry.alive, &persistent()).await?;
    match registry.read(&client, path).await? {
        Some((Ok(data), _)) if data.endpoint == registry.endpoint && data.worker_id == id => {}
        // Another's, or data that cannot be read: not known to be this node's any more.
        Some(_) => return Ok(None),
        None => {
            // Started from the cache with a node that never existed, or that was reused
            // away: it is ours only if no other node registered the id meanwhile.
            let now = registry.clock.now_millis();
            client.mkdir(&registry.forever, &persistent()).await?;
            let children = client.list_children(&registry.forever).await?;
            if children
                .iter()
                .filter_map(|c| super::registry::parse_child(c))
                .any(|(endpoint, other)| other == id && endpoint != registry.endpoint)
            {
                return Ok(None);
            }
            match client
                .create(path, &registry.data(id, now, inherited), &persistent())
                .await
            {
                Ok(_) | Err(ZkError::NodeExists) => {}
                Err(e) => return Err(e),
            }
        }
    }
    // The old session may not have expired on the server yet (a restarted ZooKeeper renews
    // its sessions): its liveness node is waited for; any other session's means the id was taken.
    match registry.claim_alive(&client, id, old_session).await? {
        Claim::Claimed => Ok(Some(client)),
        Claim::Taken => Ok(None),
    }
}
