//! Leaf-snowflake's ZooKeeper registry. Tree under `{root}/{cluster}`:
//! `forever/{ip}:{port}-{id}` (persistent, data = last reported time) and `alive/{id}`
//! (ephemeral liveness, also the lock that makes a worker id one node's at a time).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use zookeeper_client::{Acls, Client, CreateMode, Error as ZkError, SessionState, Stat};

use super::cache::{self, CachedWorker};
use super::CoordError;
use crate::config::ZookeeperConfig;
use crate::engine::clock::Clock;
use crate::engine::snowflake::WorkerLease;

/// What a node stores in its `forever` node.
#[derive(Debug, Serialize, Deserialize)]
struct NodeData {
    endpoint: String,
    worker_id: u64,
    timestamp: u64,
}

/// State shared between the supervisor task, the engine (as its lease) and INFO/metrics.
pub struct ZkShared {
    connected: AtomicBool,
    last_report_ms: AtomicU64,
    /// The engine refuses IDs when no report succeeded for this long (0 = never).
    lease_ms: u64,
    revoked: Mutex<Option<String>>,
}

impl ZkShared {
    pub fn connected(&self) -> bool {
        self.connected.load(Ordering::Relaxed)
    }

    /// Clock time of the last successful time report (or of the start from the cache).
    pub fn last_report_ms(&self) -> u64 {
        self.last_report_ms.load(Ordering::Relaxed)
    }

    fn revoke(&self, reason: String) {
        tracing::error!(%reason, "snowflake worker id revoked; SNOWFLAKE replies UNAVAILABLE");
        *self.revoked.lock().unwrap_or_else(|p| p.into_inner()) = Some(reason);
    }
}

impl WorkerLease for ZkShared {
    fn check(&self, now_ms: u64) -> Result<(), String> {
        if let Some(reason) = self
            .revoked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
        {
            return Err(reason.clone());
        }
        let silent = now_ms.saturating_sub(self.last_report_ms());
        if self.lease_ms > 0 && silent > self.lease_ms {
            return Err(format!(
                "no ZooKeeper time report for {} s; the worker id may be reused by another node",
                silent / 1000
            ));
        }
        Ok(())
    }
}

/// A worker id held through ZooKeeper, kept alive by a background task until closed.
pub struct ZkWorker {
    pub worker_id: u64,
    pub shared: Arc<ZkShared>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl ZkWorker {
    /// Stops reporting and removes the liveness node (the persistent node keeps the id).
    pub async fn close(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}

struct Registry {
    cfg: ZookeeperConfig,
    endpoint: String,
    max_worker_id: u64,
    clock: Arc<dyn Clock>,
    forever: String,
    alive: String,
}

fn persistent() -> zookeeper_client::CreateOptions<'static> {
    CreateMode::Persistent.with_acls(Acls::anyone_all())
}

/// Splits a `forever` child `{endpoint}-{id}` into its parts.
fn parse_child(child: &str) -> Option<(&str, u64)> {
    let (endpoint, id) = child.rsplit_once('-')?;
    Some((endpoint, id.parse().ok()?))
}

impl Registry {
    fn forever_path(&self, child: &str) -> String {
        format!("{}/{child}", self.forever)
    }

    fn alive_path(&self, id: u64) -> String {
        format!("{}/{id}", self.alive)
    }

    fn own_child(&self, id: u64) -> String {
        format!("{}-{id:010}", self.endpoint)
    }

    fn data(&self, id: u64, timestamp: u64) -> Vec<u8> {
        serde_json::to_vec(&NodeData {
            endpoint: self.endpoint.clone(),
            worker_id: id,
            timestamp,
        })
        .unwrap_or_default()
    }

    async fn connect(&self) -> Result<Client, ZkError> {
        let connecting = Client::connector()
            .with_session_timeout(Duration::from_millis(self.cfg.session_timeout_ms))
            .with_connection_timeout(Duration::from_millis(self.cfg.connect_timeout_ms))
            .connect(&self.cfg.connect);
        tokio::time::timeout(
            Duration::from_millis(self.cfg.connect_timeout_ms),
            connecting,
        )
        .await
        .unwrap_or(Err(ZkError::Timeout))
    }

    async fn read(&self, client: &Client, path: &str) -> Result<Option<(NodeData, Stat)>, ZkError> {
        match client.get_data(path).await {
            Ok((bytes, stat)) => Ok(serde_json::from_slice(&bytes).ok().map(|d| (d, stat))),
            Err(ZkError::NoNode) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Creates `alive/{id}` for this node. An existing one left by this node's previous,
    /// not yet expired session is replaced; one of another node means the id is taken.
    async fn claim_alive(&self, client: &Client, id: u64) -> Result<bool, ZkError> {
        let path = self.alive_path(id);
        let options = CreateMode::Ephemeral.with_acls(Acls::anyone_all());
        match client
            .create(&path, self.endpoint.as_bytes(), &options)
            .await
        {
            Ok(_) => Ok(true),
            Err(ZkError::NodeExists) => match client.get_data(&path).await {
                Ok((owner, stat)) if owner == self.endpoint.as_bytes() => {
                    match client.delete(&path, Some(stat.version)).await {
                        Ok(()) | Err(ZkError::NoNode) => {}
                        Err(e) => return Err(e),
                    }
                    match client
                        .create(&path, self.endpoint.as_bytes(), &options)
                        .await
                    {
                        Ok(_) => Ok(true),
                        Err(ZkError::NodeExists) => Ok(false),
                        Err(e) => Err(e),
                    }
                }
                Ok(_) => Ok(false),
                Err(ZkError::NoNode) => Box::pin(self.claim_alive(client, id)).await,
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        }
    }

    /// Finds or creates this node's worker id; returns it with its `forever` child name.
    async fn register(&self, client: &Client) -> Result<(u64, String), CoordError> {
        client.mkdir(&self.forever, &persistent()).await?;
        client.mkdir(&self.alive, &persistent()).await?;
        let now = self.clock.now_millis();
        let children = client.list_children(&self.forever).await?;

        // 1. This endpoint registered before: reuse its id, after the clock check.
        let own = children.iter().find_map(|child| {
            parse_child(child)
                .filter(|(endpoint, _)| *endpoint == self.endpoint)
                .map(|(_, id)| (child.clone(), id))
        });
        if let Some((child, id)) = own {
            if let Some((data, _)) = self.read(client, &self.forever_path(&child)).await? {
                if now < data.timestamp {
                    return Err(CoordError::ClockBehindLastReport(data.timestamp - now));
                }
            }
            if id <= self.max_worker_id && self.claim_alive(client, id).await? {
                return Ok((id, child));
            }
            tracing::warn!(
                worker_id = id,
                "this node's old worker id is held by another node; registering anew"
            );
        }

        // 2. A new sequential node: ZooKeeper's sequence number is the worker id.
        let prefix = self.forever_path(&format!("{}-", self.endpoint));
        let sequential = CreateMode::PersistentSequential.with_acls(Acls::anyone_all());
        let (_, seq) = client
            .create(&prefix, &self.data(0, now), &sequential)
            .await?;
        let seq = seq.into_i64();
        let child = format!("{}-{seq:010}", self.endpoint);
        if seq >= 0 && (seq as u64) <= self.max_worker_id {
            let id = seq as u64;
            client
                .set_data(&self.forever_path(&child), &self.data(id, now), None)
                .await?;
            if self.claim_alive(client, id).await? {
                return Ok((id, child));
            }
        }
        client.delete(&self.forever_path(&child), None).await?;

        // 3. Every id has been handed out: take over one whose node is long dead.
        self.reuse_dead_id(client, &children).await
    }

    async fn reuse_dead_id(
        &self,
        client: &Client,
        children: &[String],
    ) -> Result<(u64, String), CoordError> {
        if self.cfg.reuse_after_secs == 0 {
            return Err(CoordError::NoFreeWorkerId(format!(
                "all {} ids were handed out and reuse is off (reuse_after_secs = 0)",
                self.max_worker_id + 1
            )));
        }
        let grace_ms = self.cfg.reuse_after_secs * 1000;
        let alive: Vec<String> = client.list_children(&self.alive).await?;
        let mut candidates = Vec::new();
        for child in children {
            let Some((_, id)) = parse_child(child) else {
                continue;
            };
            if id > self.max_worker_id || alive.iter().any(|a| a == &id.to_string()) {
                continue;
            }
            if let Some((data, _)) = self.read(client, &self.forever_path(child)).await? {
                candidates.push((data.timestamp, id, child.clone()));
            }
        }
        candidates.sort();
        for (_, id, child) in candidates {
            let now = self.clock.now_millis();
            let path = self.forever_path(&child);
            // The liveness node doubles as the lock: only one claimant can create it.
            if !self.claim_alive(client, id).await? {
                continue;
            }
            let dead_long_enough = match self.read(client, &path).await? {
                // Our clock must be past the dead owner's last report: then no ID we issue can
                // equal one it issued.
                Some((data, stat))
                    if now.saturating_sub(data.timestamp) >= grace_ms && now > data.timestamp =>
                {
                    Some(stat.version)
                }
                _ => None,
            };
            let taken = match dead_long_enough {
                Some(version) => match client.delete(&path, Some(version)).await {
                    Ok(()) => true,
                    Err(ZkError::NoNode | ZkError::BadVersion) => false,
                    Err(e) => return Err(e.into()),
                },
                None => false,
            };
            if !taken {
                let _ = client.delete(&self.alive_path(id), None).await;
                continue;
            }
            let own = self.own_child(id);
            client
                .create(&self.forever_path(&own), &self.data(id, now), &persistent())
                .await?;
            tracing::info!(worker_id = id, previous = %child, "reused the worker id of a dead node");
            return Ok((id, own));
        }
        Err(CoordError::NoFreeWorkerId(format!(
            "all {} ids are held by live nodes or by nodes dead for less than {} s",
            self.max_worker_id + 1,
            self.cfg.reuse_after_secs
        )))
    }

    /// Compares this node's clock with the other live nodes', each against ZooKeeper's clock
    /// (the `mtime` of a node against the time written into it).
    async fn check_skew(
        &self,
        client: &Client,
        own_child: &str,
        id: u64,
    ) -> Result<(), CoordError> {
        let written = self.clock.now_millis();
        let stat = client
            .set_data(&self.forever_path(own_child), &self.data(id, written), None)
            .await?;
        let own_skew = written as i64 - stat.mtime;
        let alive: Vec<String> = client.list_children(&self.alive).await?;
        let mut skews = Vec::new();
        for child in client.list_children(&self.forever).await? {
            let Some((endpoint, other)) = parse_child(&child) else {
                continue;
            };
            if other == id
                || endpoint == self.endpoint
                || !alive.iter().any(|a| a == &other.to_string())
            {
                continue;
            }
            if let Some((data, stat)) = self.read(client, &self.forever_path(&child)).await? {
                skews.push(data.timestamp as i64 - stat.mtime);
            }
        }
        if skews.is_empty() {
            return Ok(());
        }
        let average = skews.iter().sum::<i64>() / skews.len() as i64;
        let skew = own_skew - average;
        if skew.unsigned_abs() > self.cfg.max_clock_skew_ms {
            let _ = client.delete(&self.alive_path(id), None).await;
            return Err(CoordError::ClockSkew {
                skew,
                max: self.cfg.max_clock_skew_ms,
            });
        }
        Ok(())
    }

    fn cache_path(&self) -> PathBuf {
        PathBuf::from(&self.cfg.cache_file)
    }

    fn write_cache(&self, id: u64, timestamp: u64) {
        let worker = CachedWorker {
            cluster: self.cfg.cluster.clone(),
            endpoint: self.endpoint.clone(),
            worker_id: id,
            last_timestamp_ms: timestamp,
        };
        if let Err(e) = cache::store(&self.cache_path(), &worker) {
            tracing::warn!(error = %e, "cannot write the worker-id cache");
        }
    }
}

/// Obtains this node's worker id from ZooKeeper (or, if ZooKeeper is unreachable, from the
/// local cache) and starts the task that reports the time every `report_interval_ms`.
pub async fn acquire(
    cfg: &ZookeeperConfig,
    endpoint: &str,
    max_worker_id: u64,
    clock: Arc<dyn Clock>,
) -> Result<ZkWorker, CoordError> {
    let base = format!("{}/{}", cfg.root, cfg.cluster);
    let registry = Arc::new(Registry {
        cfg: cfg.clone(),
        endpoint: endpoint.to_string(),
        max_worker_id,
        clock: clock.clone(),
        forever: format!("{base}/forever"),
        alive: format!("{base}/alive"),
    });
    let shared = Arc::new(ZkShared {
        connected: AtomicBool::new(false),
        last_report_ms: AtomicU64::new(clock.now_millis()),
        lease_ms: cfg.reuse_after_secs * 1000 / 2,
        revoked: Mutex::new(None),
    });
    let (client, id, child) = match registry.connect().await {
        Ok(client) => {
            let (id, child) = registry.register(&client).await?;
            registry.check_skew(&client, &child, id).await?;
            registry.write_cache(id, clock.now_millis());
            shared.connected.store(true, Ordering::Relaxed);
            tracing::info!(worker_id = id, node = %registry.forever_path(&child), "snowflake worker id from ZooKeeper");
            (Some(client), id, child)
        }
        Err(e) => {
            let cached = cache::load(&registry.cache_path())?
                .filter(|c| {
                    c.endpoint == endpoint
                        && c.cluster == cfg.cluster
                        && c.worker_id <= max_worker_id
                })
                .ok_or_else(|| CoordError::Unreachable(e.to_string()))?;
            let now = clock.now_millis();
            if now < cached.last_timestamp_ms {
                return Err(CoordError::ClockBehindLastReport(
                    cached.last_timestamp_ms - now,
                ));
            }
            tracing::warn!(worker_id = cached.worker_id, error = %e, "ZooKeeper unreachable; using the cached worker id and reconnecting in the background");
            (None, cached.worker_id, registry.own_child(cached.worker_id))
        }
    };
    let stop = CancellationToken::new();
    let task = tokio::spawn(supervise(
        registry,
        shared.clone(),
        client,
        id,
        child,
        stop.clone(),
    ));
    Ok(ZkWorker {
        worker_id: id,
        shared,
        stop,
        task,
    })
}

/// Reports the time every interval; on a lost session reconnects and re-creates the liveness
/// node, unless the id was taken over meanwhile (then the id is revoked).
async fn supervise(
    registry: Arc<Registry>,
    shared: Arc<ZkShared>,
    mut client: Option<Client>,
    id: u64,
    child: String,
    stop: CancellationToken,
) {
    let interval = Duration::from_millis(registry.cfg.report_interval_ms);
    let path = registry.forever_path(&child);
    let mut last_written = 0u64;
    loop {
        tokio::select! {
            _ = stop.cancelled() => {
                if let Some(client) = &client {
                    let _ = client.delete(&registry.alive_path(id), None).await;
                }
                return;
            }
            _ = tokio::time::sleep(interval) => {}
        }
        if client.is_none() {
            match reconnect(&registry, &path, id).await {
                Ok(Some(fresh)) => {
                    tracing::info!(worker_id = id, "ZooKeeper session re-established");
                    client = Some(fresh);
                }
                Ok(None) => {
                    shared.revoke(format!(
                        "worker id {id} was taken over by another node while this one was cut off from ZooKeeper"
                    ));
                    return;
                }
                Err(_) => continue,
            }
        }
        let Some(active) = &client else { continue };
        // Never write a smaller time than before: the clock may have stepped back.
        let now = registry.clock.now_millis().max(last_written);
        match active.set_data(&path, &registry.data(id, now), None).await {
            Ok(_) => {
                last_written = now;
                shared
                    .last_report_ms
                    .store(registry.clock.now_millis(), Ordering::Relaxed);
                if !shared.connected.swap(true, Ordering::Relaxed) {
                    tracing::info!("ZooKeeper time reports succeed again");
                }
                registry.write_cache(id, now);
            }
            Err(ZkError::NoNode) => {
                shared.revoke(format!("the ZooKeeper node of worker id {id} was removed"));
                return;
            }
            Err(e) => {
                if shared.connected.swap(false, Ordering::Relaxed) {
                    tracing::warn!(error = %e, "ZooKeeper time report failed; ID service continues");
                }
                // Within a session the client reconnects by itself; a dead session needs a new one.
                if matches!(
                    active.state(),
                    SessionState::Expired | SessionState::Closed | SessionState::AuthFailed
                ) {
                    client = None;
                }
            }
        }
    }
}

/// A new session for a node that already has its id. `Ok(None)` when the id is no longer ours.
async fn reconnect(registry: &Registry, path: &str, id: u64) -> Result<Option<Client>, ZkError> {
    let client = registry.connect().await?;
    client.mkdir(&registry.alive, &persistent()).await?;
    match registry.read(&client, path).await? {
        Some(data) if data.0.endpoint == registry.endpoint && data.0.worker_id == id => {}
        Some(_) => return Ok(None),
        None => {
            // Started from the cache with a node that never existed, or that was reused
            // away: it is ours only if no other node registered the id meanwhile.
            let now = registry.clock.now_millis();
            client.mkdir(&registry.forever, &persistent()).await?;
            let children = client.list_children(&registry.forever).await?;
            if children
                .iter()
                .filter_map(|c| parse_child(c))
                .any(|(endpoint, other)| other == id && endpoint != registry.endpoint)
            {
                return Ok(None);
            }
            match client
                .create(path, &registry.data(id, now), &persistent())
                .await
            {
                Ok(_) | Err(ZkError::NodeExists) => {}
                Err(e) => return Err(e),
            }
        }
    }
    if registry.claim_alive(&client, id).await? {
        Ok(Some(client))
    } else {
        Ok(None)
    }
}

/// The `ip:port` this node registers as: `advertise`, else the RESP bind address.
pub fn endpoint_for(cfg: &ZookeeperConfig, bind: &str) -> String {
    cfg.advertise.clone().unwrap_or_else(|| bind.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_forever_children() {
        assert_eq!(
            parse_child("10.0.0.1:6380-0000000042"),
            Some(("10.0.0.1:6380", 42))
        );
        assert_eq!(
            parse_child("[::1]:6380-0000000001"),
            Some(("[::1]:6380", 1))
        );
        assert_eq!(parse_child("garbage"), None);
    }
}
