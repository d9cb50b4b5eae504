//! Registration in Leaf-snowflake's ZooKeeper tree: finding or creating this node's
//! `forever/{endpoint}-{id}`, taking `alive/{id}` as the lock, reusing long-dead ids, clock skew.
//!
//! Leaf nodes share the tree (`root = "/snowflake"`, `cluster = leaf.name`) and, when they start,
//! split EVERY child of `forever` on '-' (`key.split("-")`: `[0]` the endpoint, `[1]` parsed as
//! an int), so a '-' in a child's endpoint (a host name such as `leafd-1`) makes every Leaf node
//! fail to start (`NumberFormatException`, then "Snowflake Id Gen is not init ok", or a start from
//! its cache file that never reports to ZooKeeper). The endpoint part of a name is therefore
//! encoded ([`child_endpoint`]): '%' as `%25`, '-' as `%2D`; a name written before the encoding
//! still parses, and is renamed when its node starts ([`Registry::adopt_name`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use zookeeper_client::{Acls, Client, CreateMode, Error as ZkError, Stat};

use super::super::CoordError;
use super::cache::{self, CachedWorker};
use crate::clock::Clock;
use crate::config::ZookeeperConfig;

/// What a node stores in its `forever` node.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct NodeData {
    pub endpoint: String,
    pub worker_id: u64,
    /// The node's clock at its last report.
    pub timestamp: u64,
    /// The node never issues an ID later than this (its lease end); whoever takes the id
    /// next waits until its own clock is past it.
    #[serde(default)]
    pub fence: u64,
}

impl NodeData {
    /// The time the next holder of this id must be past.
    pub fn floor(&self) -> u64 {
        self.fence.max(self.timestamp)
    }
}

/// What Leaf itself stores in its `forever` node (`SnowflakeZookeeperHolder.Endpoint`); it
/// reports every [`LEAF_REPORT_MS`], so it may have issued up to that long after the last.
#[derive(Deserialize)]
struct LeafData {
    ip: String,
    port: serde_json::Value,
    timestamp: u64,
}

/// How often a Leaf node writes its `timestamp` (`SnowflakeZookeeperHolder`'s schedule).
const LEAF_REPORT_MS: u64 = 3000;

/// The data at `path` (a `forever` child, whose name gives the worker id of Leaf's data).
fn parse_data(path: &str, bytes: &[u8]) -> Result<NodeData, String> {
    if let Ok(data) = serde_json::from_slice::<NodeData>(bytes) {
        return Ok(data);
    }
    let child = path.rsplit('/').next().unwrap_or(path);
    let leaf = serde_json::from_slice::<LeafData>(bytes)
        .ok()
        .zip(parse_child(child));
    let port = leaf.as_ref().and_then(|(leaf, _)| match &leaf.port {
        serde_json::Value::String(port) => Some(port.clone()),
        serde_json::Value::Number(port) => Some(port.to_string()),
        _ => None,
    });
    if let (Some((leaf, (_, worker_id))), Some(port)) = (leaf, port) {
        return Ok(NodeData {
            endpoint: format!("{}:{port}", leaf.ip),
            worker_id,
            timestamp: leaf.timestamp,
            fence: leaf.timestamp.saturating_add(LEAF_REPORT_MS),
        });
    }
    let shown: String = String::from_utf8_lossy(bytes).chars().take(80).collect();
    Err(format!(
        "ZooKeeper node {path} holds {shown:?}, neither leafd's nor Leaf's worker data: how far its last holder issued is not known; restore it, or delete the node to give the id up"
    ))
}

/// The outcome of trying to take `alive/{id}`.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Claim {
    Claimed,
    /// Another live session holds it.
    Taken,
}

/// A worker id this node holds: the id, its `forever` child and the floor its previous
/// holder left.
pub(super) struct Registered {
    pub id: u64,
    pub child: String,
    pub floor_ms: u64,
}

pub(super) struct Registry {
    pub cfg: ZookeeperConfig,
    pub endpoint: String,
    pub max_worker_id: u64,
    pub clock: Arc<dyn Clock>,
    pub forever: String,
    pub alive: String,
    /// The descriptor of this node's snowflake layout (see `zookeeper::layout`).
    pub layout: String,
}

pub(super) fn persistent() -> zookeeper_client::CreateOptions<'static> {
    CreateMode::Persistent.with_acls(Acls::anyone_all())
}

/// The endpoint as written in a `forever` child's name: no '-' (Leaf's separator), reversible,
/// so distinct endpoints keep distinct names. An endpoint without '-' or '%' (an `ip:port`, what
/// Leaf writes) is unchanged.
pub(super) fn child_endpoint(endpoint: &str) -> String {
    endpoint.replace('%', "%25").replace('-', "%2D")
}

/// The endpoint of a child name's endpoint part: `%2D` and `%25` decoded (the inverse of
/// [`child_endpoint`]), any other text kept as it is (a name written before the encoding:
/// `leafd-1:6380`).
fn decode_endpoint(part: &str) -> String {
    let mut out = String::with_capacity(part.len());
    let mut rest = part;
    while let Some(at) = rest.find('%') {
        out.push_str(&rest[..at]);
        let escape = &rest[at..];
        if let Some(after) = escape.strip_prefix("%2D") {
            out.push('-');
            rest = after;
        } else if let Some(after) = escape.strip_prefix("%25") {
            out.push('%');
            rest = after;
        } else {
            out.push('%');
            rest = &escape[1..];
        }
    }
    out.push_str(rest);
    out
}

/// Splits a `forever` child `{endpoint}-{id}` into the endpoint (decoded) and the id; the id is
/// what follows the last '-', so a name written before the encoding parses too.
pub(super) fn parse_child(child: &str) -> Option<(String, u64)> {
    let (endpoint, id) = child.rsplit_once('-')?;
    Some((decode_endpoint(endpoint), id.parse().ok()?))
}

impl Registry {
    pub fn forever_path(&self, child: &str) -> String {
        format!("{}/{child}", self.forever)
    }

    /// `{root}/{cluster}/layout`, beside `forever` and `alive`.
    pub fn layout_path(&self) -> String {
        match self.forever.rsplit_once('/') {
            Some((base, _)) => format!("{base}/layout"),
            None => "/layout".into(),
        }
    }

    pub fn alive_path(&self, id: u64) -> String {
        format!("{}/{id}", self.alive)
    }

    /// This node's child for `id`, named as Leaf can parse it.
    pub fn own_child(&self, id: u64) -> String {
        format!("{}-{id:010}", child_endpoint(&self.endpoint))
    }

    /// Leaves this node's `forever` child for `id` under its own name ([`Registry::own_child`])
    /// and removes the other names it had (`names`: every child of this endpoint and id, e.g.
    /// `leafd-1:6380-0000000003` written before names were encoded, which stops Leaf nodes from
    /// starting). An older name's data is copied first, so the id stays recorded at every moment
    /// (a crash in between leaves both names; the next start finishes). Called with `alive/{id}`
    /// held, so no other leafd node uses these children meanwhile.
    pub async fn adopt_name(
        &self,
        client: &Client,
        id: u64,
        names: &[String],
    ) -> Result<String, ZkError> {
        let own = self.own_child(id);
        if !names.contains(&own) {
            if let Some(old) = names.first() {
                let (data, _) = client.get_data(&self.forever_path(old)).await?;
                match client
                    .create(&self.forever_path(&own), &data, &persistent())
                    .await
                {
                    Ok(_) | Err(ZkError::NodeExists) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        for old in names.iter().filter(|name| **name != own) {
            match client.delete(&self.forever_path(old), None).await {
                Ok(()) | Err(ZkError::NoNode) => {}
                Err(e) => return Err(e),
            }
            tracing::info!(worker_id = id, old = %old, new = %own, "renamed this node's ZooKeeper node to a name Leaf can parse");
        }
        Ok(own)
    }

    /// How far ahead of the clock this node's fence is written into ZooKeeper.
    pub fn lease_ms(&self) -> u64 {
        self.cfg.lease_ms
    }

    pub fn data(&self, id: u64, timestamp: u64, fence: u64) -> Vec<u8> {
        serde_json::to_vec(&NodeData {
            endpoint: self.endpoint.clone(),
            worker_id: id,
            timestamp,
            fence,
        })
        .unwrap_or_default()
    }

    pub async fn connect(&self) -> Result<Client, ZkError> {
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

    /// A `forever` node's data: leafd's, or Leaf's own (read as leafd's, its fence a report
    /// interval past its last report), or why it is neither (`Err`: a node edited by hand or
    /// damaged, whose holder's last ID is not known). `None` when the node does not exist.
    pub async fn read(
        &self,
        client: &Client,
        path: &str,
    ) -> Result<Option<(Result<NodeData, String>, Stat)>, ZkError> {
        match client.get_data(path).await {
            Ok((bytes, stat)) => Ok(Some((parse_data(path, &bytes), stat))),
            Err(ZkError::NoNode) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Creates `alive/{id}` in this client's session. A node held by `previous_session` (this
    /// node's own session before a restart) is waited for until ZooKeeper expires it; one
    /// held by any other session means the id is taken. Never deletes a liveness node.
    pub async fn claim_alive(
        &self,
        client: &Client,
        id: u64,
        previous_session: Option<i64>,
    ) -> Result<Claim, ZkError> {
        let path = self.alive_path(id);
        let options = CreateMode::Ephemeral.with_acls(Acls::anyone_all());
        // The previous session expires at most one session timeout after it was last heard.
        let deadline = Instant::now() + Duration::from_millis(self.cfg.session_timeout_ms * 2);
        let mut logged = false;
        loop {
            match client
                .create(&path, self.endpoint.as_bytes(), &options)
                .await
            {
                Ok(_) => return Ok(Claim::Claimed),
                Err(ZkError::NodeExists) => {}
                Err(e) => return Err(e),
            }
            let Some(stat) = client.check_stat(&path).await? else {
                continue; // expired between the two calls
            };
            if stat.ephemeral_owner == client.session_id().0 {
                return Ok(Claim::Claimed);
            }
            if Some(stat.ephemeral_owner) != previous_session || Instant::now() > deadline {
                return Ok(Claim::Taken);
            }
            if !logged {
                tracing::info!(
                    worker_id = id,
                    "worker id still held by this node's previous session; waiting for ZooKeeper to expire it"
                );
                logged = true;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Finds or creates this node's worker id.
    pub async fn register(
        &self,
        client: &Client,
        previous_session: Option<i64>,
    ) -> Result<Registered, CoordError> {
        client.mkdir(&self.forever, &persistent()).await?;
        client.mkdir(&self.alive, &persistent()).await?;
        let children = client.list_children(&self.forever).await?;

        // 1. This endpoint registered before: reuse its id, unless another live session (a
        //    second node configured with the same identity) holds it. One id may have two
        //    names (its name before the encoding, and the encoded one).
        let mut own: std::collections::BTreeMap<u64, Vec<String>> = Default::default();
        for child in &children {
            if let Some((endpoint, id)) = parse_child(child) {
                if endpoint == self.endpoint {
                    own.entry(id).or_default().push(child.clone());
                }
            }
        }
        for (id, names) in own {
            if id > self.max_worker_id {
                continue;
            }
            // Every child naming the id counts, not only this endpoint's: a node that reused
            // it while this one was dead left its own child beside a name of this endpoint's
            // it did not delete (one id may have two names), and its fence may be ahead.
            let mut floor_ms = 0;
            for child in children
                .iter()
                .filter(|child| parse_child(child).is_some_and(|(_, other)| other == id))
            {
                if let Some((data, _)) = self.read(client, &self.forever_path(child)).await? {
                    floor_ms = floor_ms.max(data.map_err(CoordError::NoFreeWorkerId)?.floor());
                }
            }
            if self.claim_alive(client, id, previous_session).await? == Claim::Claimed {
                let child = self.adopt_name(client, id, &names).await?;
                return Ok(Registered {
                    id,
                    child,
                    floor_ms,
                });
            }
            tracing::warn!(
                worker_id = id,
                endpoint = %self.endpoint,
                "this endpoint's worker id is held by another live ZooKeeper session: two nodes share one identity (set snowflake.zookeeper.advertise per node); taking another id"
            );
        }

        // 2. A new sequential node: ZooKeeper's sequence number is the worker id, never used.
        let now = self.clock.now_millis();
        let prefix = self.forever_path(&format!("{}-", child_endpoint(&self.endpoint)));
        let sequential = CreateMode::PersistentSequential.with_acls(Acls::anyone_all());
        let (_, seq) = client
            .create(&prefix, &self.data(0, now, 0), &sequential)
            .await?;
        let seq = seq.into_i64();
        let child = format!("{}-{seq:010}", child_endpoint(&self.endpoint));
        if seq >= 0 && (seq as u64) <= self.max_worker_id {
            let id = seq as u64;
            // The wait below is in the node from the start: a start killed during it, or
            // refused, must not leave the next start of this endpoint a shorter one.
            client
                .set_data(
                    &self.forever_path(&child),
                    &self.data(id, now, now + self.cfg.lease_ms),
                    None,
                )
                .await?;
            if self.claim_alive(client, id, None).await? == Claim::Claimed {
                // A sequence number ZooKeeper never gave before, as far as it remembers: after
                // a wipe or a restore it gives the same numbers again, while the nodes that
                // hold them in the lost state issue until their lease without a report ends.
                // So the first ID waits a whole lease (the cost of every new registration).
                return Ok(Registered {
                    id,
                    child,
                    floor_ms: now + self.cfg.lease_ms,
                });
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
    ) -> Result<Registered, CoordError> {
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
            // An id whose data cannot be read is not reused: its holder's fence is unknown.
            if let Some((Ok(data), _)) = self.read(client, &self.forever_path(child)).await? {
                candidates.push((data.timestamp, id, child.clone()));
            }
        }
        candidates.sort();
        for (_, id, child) in candidates {
            let path = self.forever_path(&child);
            // The liveness node doubles as the lock: only one claimant can create it.
            if self.claim_alive(client, id, None).await? != Claim::Claimed {
                continue;
            }
            let now = self.clock.now_millis();
            let dead_long_enough = match self.read(client, &path).await? {
                // Our clock must be past the dead owner's fence: then no ID we issue can equal
                // one it issued.
                Some((Ok(data), stat))
                    if now.saturating_sub(data.timestamp) >= grace_ms && now > data.floor() =>
                {
                    Some((stat.version, data.floor()))
                }
                _ => None,
            };
            let taken = match dead_long_enough {
                Some((version, floor)) => match client.delete(&path, Some(version)).await {
                    Ok(()) => Some(floor),
                    Err(ZkError::NoNode | ZkError::BadVersion) => None,
                    Err(e) => return Err(e.into()),
                },
                None => None,
            };
            let Some(floor_ms) = taken else {
                // Ours (just created in this session), so deleting it releases only our claim.
                let _ = client.delete(&self.alive_path(id), None).await;
                continue;
            };
            let own = self.own_child(id);
            client
                .create(
                    &self.forever_path(&own),
                    &self.data(id, now, floor_ms),
                    &persistent(),
                )
                .await?;
            tracing::info!(worker_id = id, previous = %child, "reused the worker id of a dead node");
            return Ok(Registered {
                id,
                child: own,
                floor_ms,
            });
        }
        Err(CoordError::NoFreeWorkerId(format!(
            "all {} ids are held by live nodes or by nodes dead for less than {} s",
            self.max_worker_id + 1,
            self.cfg.reuse_after_secs
        )))
    }

    /// Compares this node's clock with the other live nodes', each against ZooKeeper's clock
    /// (the `mtime` of a node against the time written into it). Writes the first report.
    pub async fn check_skew(
        &self,
        client: &Client,
        registered: &Registered,
    ) -> Result<(), CoordError> {
        let id = registered.id;
        let written = self.clock.now_millis();
        let data = self.data(id, written, registered.floor_ms);
        let stat = client
            .set_data(&self.forever_path(&registered.child), &data, None)
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
            if let Some((Ok(data), stat)) = self.read(client, &self.forever_path(&child)).await? {
                skews.push(data.timestamp as i64 - stat.mtime);
            }
        }
        if skews.is_empty() {
            return Ok(());
        }
        let average = skews.iter().sum::<i64>() / skews.len() as i64;
        let skew = own_skew - average;
        if skew.unsigned_abs() > self.cfg.max_clock_skew_ms {
            // Our own session's node: releasing it frees the id we just claimed.
            let _ = client.delete(&self.alive_path(id), None).await;
            return Err(CoordError::ClockSkew {
                skew,
                max: self.cfg.max_clock_skew_ms,
            });
        }
        Ok(())
    }

    pub fn read_cache(&self) -> Result<Option<CachedWorker>, CoordError> {
        Ok(cache::load(self.cfg.cache_file.as_ref())?.filter(|c| {
            c.endpoint == self.endpoint
                && c.cluster == self.cfg.cluster
                && c.worker_id <= self.max_worker_id
        }))
    }

    pub fn write_cache(&self, id: u64, timestamp: u64, fence: u64, session_id: Option<i64>) {
        let worker = CachedWorker {
            cluster: self.cfg.cluster.clone(),
            endpoint: self.endpoint.clone(),
            worker_id: id,
            last_timestamp_ms: timestamp,
            session_id,
            fence_ms: Some(fence),
            layout: Some(self.layout.clone()),
        };
        if let Err(e) = cache::store(self.cfg.cache_file.as_ref(), &worker) {
            tracing::warn!(error = %e, "cannot write the worker-id cache");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_forever_children() {
        assert_eq!(
            parse_child("10.0.0.1:6380-0000000042"),
            Some(("10.0.0.1:6380".to_string(), 42))
        );
        assert_eq!(
            parse_child("[::1]:6380-0000000001"),
            Some(("[::1]:6380".to_string(), 1))
        );
        assert_eq!(parse_child("garbage"), None);
        // A name written before the encoding, and the same endpoint encoded.
        assert_eq!(
            parse_child("leafd-1:6380-0000000003"),
            Some(("leafd-1:6380".to_string(), 3))
        );
        assert_eq!(
            parse_child("leafd%2D1:6380-0000000003"),
            Some(("leafd-1:6380".to_string(), 3))
        );
    }

    /// What Leaf's SnowflakeZookeeperHolder does with every child of `forever`: split on '-',
    /// `[0]` the endpoint, `[1]` Integer.parseInt (Java's split drops trailing empty strings).
    fn leaf_parse(child: &str) -> Option<(&str, i32)> {
        let mut parts: Vec<&str> = child.split('-').collect();
        while parts.last() == Some(&"") {
            parts.pop();
        }
        // Java also takes a leading '+'; a '-' cannot be left in a part after the split.
        let id = parts.get(1)?.trim_start_matches('+');
        if id.is_empty() || !id.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        Some((parts[0], id.parse().ok()?))
    }

    #[test]
    fn leaf_parses_every_name_leafd_writes() {
        for endpoint in [
            "10.0.0.1:6380",
            "leafd-1:6380",
            "leafd-0.leafd-headless.ns-1.svc:6380",
            "[fe80::1%eth0]:6380",
            "a%2Db:1",
            "--:-",
        ] {
            let name = format!("{}-{:010}", child_endpoint(endpoint), 7);
            let (leaf_endpoint, leaf_id) = leaf_parse(&name).unwrap_or_else(|| panic!("{name}"));
            assert_eq!(leaf_id, 7, "{name}");
            assert!(!leaf_endpoint.contains('-'), "{name}");
            assert_eq!(
                parse_child(&name),
                Some((endpoint.to_string(), 7)),
                "leafd reads back its own endpoint from {name}"
            );
        }
        // Leaf's own names are left as they are and read as Leaf wrote them.
        assert_eq!(child_endpoint("192.168.1.5:8080"), "192.168.1.5:8080");
        assert_eq!(
            parse_child("192.168.1.5:8080-0000000000"),
            Some(("192.168.1.5:8080".to_string(), 0))
        );
        // What the encoding prevents: Leaf cannot parse the old name of a host with '-'.
        assert_eq!(leaf_parse("leafd-1:6380-0000000003"), None);
    }

    #[test]
    fn distinct_endpoints_get_distinct_names() {
        let endpoints = ["a-b:1", "a%2Db:1", "a%b:1", "a%25b:1", "a_b:1", "ab:1"];
        let names: std::collections::HashSet<String> =
            endpoints.into_iter().map(child_endpoint).collect();
        assert_eq!(names.len(), endpoints.len(), "{names:?}");
    }

    #[test]
    fn old_node_data_without_a_fence_still_parses() {
        let data: NodeData =
            serde_json::from_str(r#"{"endpoint":"a:1","worker_id":3,"timestamp":99}"#).unwrap();
        assert_eq!((data.fence, data.floor()), (0, 99));
    }

    #[test]
    fn leafs_own_data_reads_with_a_fence_one_report_past_it_and_other_data_is_refused() {
        let path = "/snowflake/leaf/forever/10.0.0.7:8080-0000000005";
        let leaf = parse_data(
            path,
            br#"{"ip":"10.0.0.7","port":"8080","timestamp":1765000000000}"#,
        )
        .unwrap();
        assert_eq!(
            (leaf.endpoint.as_str(), leaf.worker_id, leaf.floor()),
            ("10.0.0.7:8080", 5, 1765000003000)
        );
        let numeric = parse_data(path, br#"{"ip":"10.0.0.7","port":8080,"timestamp":7}"#).unwrap();
        assert_eq!(
            (numeric.endpoint.as_str(), numeric.floor()),
            ("10.0.0.7:8080", 3007)
        );
        let ours = parse_data(
            path,
            br#"{"endpoint":"a:1","worker_id":3,"timestamp":99,"fence":120}"#,
        )
        .unwrap();
        assert_eq!((ours.worker_id, ours.floor()), (3, 120));
        for garbage in [&b"garbage"[..], br#"{"ip":"10.0.0.7","timestamp":-1}"#, b""] {
            let err = parse_data(path, garbage).unwrap_err();
            assert!(
                err.starts_with(&format!("ZooKeeper node {path} holds "))
                    && err.contains("neither leafd's nor Leaf's worker data"),
                "{err}"
            );
        }
    }
}
