//! The ZooKeeper worker-id registry against a real ZooKeeper (LEAFD_TEST_ZOOKEEPER, e.g.
//! 127.0.0.1:2181). Each test uses its own cluster name, so tests never share ids.

mod common;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use common::backends::required_env;
use common::proxy::TcpProxy;
use common::scenarios::unique_tag;
use leafd::clock::{Clock, OffsetClock, SystemClock};
use leafd::config::{CoordinatorKind, ZookeeperConfig};
use leafd::coord::zookeeper::{self, ZkWorker};
use leafd::coord::CoordError;
use leafd::coord::CoordinatorStatus;
use leafd::engine::snowflake::Layout;

const MAX_WORKER_ID: u64 = 1023;

struct Cluster {
    cfg: ZookeeperConfig,
    _dir: tempfile::TempDir,
}

impl Cluster {
    /// A fresh cluster name on the test ZooKeeper, or `None` when the variable is unset.
    fn new(test: &str) -> Option<Cluster> {
        let connect = required_env("LEAFD_TEST_ZOOKEEPER", test)?;
        let dir = tempfile::tempdir().unwrap();
        let cfg = ZookeeperConfig {
            connect,
            cluster: unique_tag("zk"),
            session_timeout_ms: 2000,
            connect_timeout_ms: 2000,
            report_interval_ms: 200,
            lease_ms: 1000,
            reuse_after_secs: 0,
            ..ZookeeperConfig::default()
        };
        Some(Cluster { cfg, _dir: dir })
    }

    /// The configuration of one node, with its own cache file.
    fn node(&self, name: &str) -> ZookeeperConfig {
        let mut cfg = self.cfg.clone();
        cfg.cache_file = self
            ._dir
            .path()
            .join(format!("{name}.json"))
            .display()
            .to_string();
        cfg
    }

    async fn acquire(&self, endpoint: &str) -> Result<ZkWorker, CoordError> {
        self.acquire_with(
            &self.node(endpoint),
            endpoint,
            MAX_WORKER_ID,
            Arc::new(SystemClock),
        )
        .await
    }

    async fn acquire_with(
        &self,
        cfg: &ZookeeperConfig,
        endpoint: &str,
        max_worker_id: u64,
        clock: Arc<dyn Clock>,
    ) -> Result<ZkWorker, CoordError> {
        zookeeper::acquire(cfg, endpoint, max_worker_id, &Layout::default(), clock).await
    }

    async fn client(&self) -> zookeeper_client::Client {
        zookeeper_client::Client::connect(&self.cfg.connect)
            .await
            .unwrap()
    }

    fn forever(&self) -> String {
        format!("{}/{}/forever", self.cfg.root, self.cfg.cluster)
    }
}

/// Why the worker stopped issuing, once it does within `wait` (checked every 10 ms).
async fn refused_within(worker: &ZkWorker, wait: Duration) -> Option<String> {
    let deadline = std::time::Instant::now() + wait;
    while std::time::Instant::now() < deadline {
        if let Err(reason) = worker.limit.check(SystemClock.now_millis()) {
            return Some(reason);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    None
}

fn timestamp_of(data: &[u8]) -> u64 {
    let value: serde_json::Value = serde_json::from_slice(data).unwrap();
    value["timestamp"].as_u64().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_get_distinct_ids_and_a_restart_gets_its_old_one() {
    let Some(cluster) = Cluster::new("three_nodes_get_distinct_ids") else {
        return;
    };
    let a = cluster.acquire("10.0.0.1:6380").await.unwrap();
    let b = cluster.acquire("10.0.0.2:6380").await.unwrap();
    let c = cluster.acquire("10.0.0.3:6380").await.unwrap();
    let ids: Vec<u64> = vec![a.worker_id, b.worker_id, c.worker_id];
    assert_eq!(
        ids,
        vec![0, 1, 2],
        "sequential nodes number 0, 1, 2 in a fresh cluster"
    );
    let b_id = b.worker_id;
    b.close().await;
    let b_again = cluster.acquire("10.0.0.2:6380").await.unwrap();
    assert_eq!(b_again.worker_id, b_id, "a restarted node keeps its id");
    let children = cluster
        .client()
        .await
        .list_children(&cluster.forever())
        .await
        .unwrap();
    assert_eq!(children.len(), 3, "no new node for a restart: {children:?}");
    for worker in [a, b_again, c] {
        worker.close().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_starts_from_its_cache_while_zookeeper_is_down_and_reconnects() {
    let Some(cluster) = Cluster::new("starts_from_cache") else {
        return;
    };
    let endpoint = "10.0.1.1:6380";
    let first = cluster.acquire(endpoint).await.unwrap();
    let id = first.worker_id;
    first.close().await;

    // ZooKeeper unreachable: a proxy that refuses everything stands where it was.
    let proxy = TcpProxy::start(cluster.cfg.connect.clone(), false).await;
    let mut cfg = cluster.node(endpoint);
    cfg.connect = proxy.addr.to_string();
    let cached = cluster
        .acquire_with(&cfg, endpoint, MAX_WORKER_ID, Arc::new(SystemClock))
        .await
        .unwrap();
    assert_eq!(cached.worker_id, id, "the cached id is used");
    assert!(!cached.shared.connected());

    // A node without a cache cannot start while ZooKeeper is down.
    let mut stranger = cluster.node("stranger");
    stranger.connect = proxy.addr.to_string();
    let err = cluster
        .acquire_with(
            &stranger,
            "10.0.1.2:6380",
            MAX_WORKER_ID,
            Arc::new(SystemClock),
        )
        .await;
    assert!(
        matches!(err, Err(CoordError::Unreachable(_))),
        "{:?}",
        err.err()
    );

    proxy.restore();
    for _ in 0..100 {
        if cached.shared.connected() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        cached.shared.connected(),
        "reconnects once ZooKeeper is back"
    );
    cached.close().await;
}

/// While ZooKeeper cannot be asked, another layout may have taken the cluster over, or another
/// node this id; both start above every recorded fence. So a start from the cache issues nothing
/// past the fence of its last report, and never in another layout than the one it cached.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_from_the_cache_stops_at_its_last_fence_and_keeps_its_layout() {
    let Some(cluster) = Cluster::new("cache_fence") else {
        return;
    };
    let endpoint = "10.0.1.5:6380";
    // A lease longer than the failed connection attempts of the starts below.
    let mut cfg = cluster.node(endpoint);
    cfg.lease_ms = 20_000;
    let first = cluster
        .acquire_with(&cfg, endpoint, MAX_WORKER_ID, Arc::new(SystemClock))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await; // a report or two
    first.close().await;
    let cache: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&cfg.cache_file).unwrap()).unwrap();
    let fence = cache["fence_ms"]
        .as_u64()
        .expect("the cache holds the fence");
    assert_eq!(cache["layout"], Layout::default().descriptor().as_str());

    let proxy = TcpProxy::start(cluster.cfg.connect.clone(), false).await;
    cfg.connect = proxy.addr.to_string();
    let other_layout = Layout {
        worker_bits: 11,
        sequence_bits: 11,
        ..Layout::default()
    };
    let err = zookeeper::acquire(
        &cfg,
        endpoint,
        MAX_WORKER_ID,
        &other_layout,
        Arc::new(SystemClock),
    )
    .await
    .err()
    .expect("another layout never starts from the cache");
    assert!(
        err.to_string()
            .contains("a layout changes only with ZooKeeper answering"),
        "{err}"
    );

    // Before the fence the cached id serves; past it, nothing until ZooKeeper answers.
    let cached = cluster
        .acquire_with(&cfg, endpoint, MAX_WORKER_ID, Arc::new(SystemClock))
        .await
        .unwrap();
    let now = SystemClock.now_millis();
    assert!(now < fence, "the restart came within the lease");
    assert_eq!(cached.limit.check(now), Ok(()));
    let reason = cached.limit.check(fence + 1).unwrap_err();
    assert!(
        reason.contains("no ID past the fence of the last report"),
        "{reason}"
    );
    cached.close().await;

    // A cache whose fence has passed starts, issues nothing, and serves once ZooKeeper is back.
    tokio::time::sleep(Duration::from_millis(
        fence.saturating_sub(SystemClock.now_millis()) + 50,
    ))
    .await;
    let late = cluster
        .acquire_with(&cfg, endpoint, MAX_WORKER_ID, Arc::new(SystemClock))
        .await
        .unwrap();
    assert!(late.limit.check(SystemClock.now_millis()).is_err());
    proxy.restore();
    assert_eq!(
        refused_within_or_serving(&late, Duration::from_secs(10)).await,
        Ok(()),
        "serves once ZooKeeper answers"
    );
    late.close().await;

    // A cache of an older release (no fence, no layout) does not start without ZooKeeper.
    std::fs::write(
        &cfg.cache_file,
        format!(
            r#"{{"cluster":"{}","endpoint":"{endpoint}","worker_id":0,"last_timestamp_ms":1}}"#,
            cluster.cfg.cluster
        ),
    )
    .unwrap();
    proxy.cut();
    let err = cluster
        .acquire_with(&cfg, endpoint, MAX_WORKER_ID, Arc::new(SystemClock))
        .await
        .err()
        .expect("an old cache proves nothing");
    assert!(err.to_string().contains("older release"), "{err}");
}

/// `Ok(())` once the worker may issue again, within `wait`.
async fn refused_within_or_serving(worker: &ZkWorker, wait: Duration) -> Result<(), String> {
    let deadline = std::time::Instant::now() + wait;
    loop {
        match worker.limit.check(SystemClock.now_millis()) {
            Ok(()) => return Ok(()),
            Err(reason) if std::time::Instant::now() > deadline => return Err(reason),
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_reports_the_fence_its_previous_run_left_in_zookeeper() {
    let Some(cluster) = Cluster::new("fence_in_zookeeper") else {
        return;
    };
    let endpoint = "10.0.2.1:6380";
    let worker = cluster.acquire(endpoint).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await; // at least one report
    let reported = SystemClock.now_millis();
    worker.close().await;
    // The next holder must start past the fence: one lease ahead of the last report.
    let again = cluster.acquire(endpoint).await.unwrap();
    let lease = cluster.cfg.lease_ms;
    assert!(
        again.floor_ms + 1000 >= reported + lease && again.floor_ms <= reported + lease + 1000,
        "floor {} vs report {reported} + lease {lease}",
        again.floor_ms
    );
    again.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clock_far_from_the_other_nodes_refuses_to_start() {
    let Some(cluster) = Cluster::new("clock_skew") else {
        return;
    };
    let a = cluster.acquire("10.0.3.1:6380").await.unwrap();
    let b = cluster.acquire("10.0.3.2:6380").await.unwrap();
    let ahead = Arc::new(OffsetClock::new(Arc::new(SystemClock), 30_000));
    let err = cluster
        .acquire_with(&cluster.node("c"), "10.0.3.3:6380", MAX_WORKER_ID, ahead)
        .await
        .err()
        .expect("must refuse");
    match err {
        CoordError::ClockSkew { skew, max } => {
            assert!((29_000..=31_000).contains(&skew), "{skew}");
            assert_eq!(max, 5000);
        }
        other => panic!("{other}"),
    }
    a.close().await;
    b.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_periodic_report_updates_the_node() {
    let Some(cluster) = Cluster::new("periodic_report") else {
        return;
    };
    let worker = cluster.acquire("10.0.4.1:6380").await.unwrap();
    let client = cluster.client().await;
    let path = format!(
        "{}/10.0.4.1:6380-{:010}",
        cluster.forever(),
        worker.worker_id
    );
    let (first, _) = client.get_data(&path).await.unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await;
    let (second, stat) = client.get_data(&path).await.unwrap();
    assert!(timestamp_of(&second) > timestamp_of(&first));
    assert!(
        stat.version >= 2,
        "several reports: version {}",
        stat.version
    );
    assert!(worker.shared.last_report_ms() + 1000 > SystemClock.now_millis());
    worker.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_nodes_ids_are_reused_only_after_the_grace_period() {
    let Some(cluster) = Cluster::new("reuse_after_grace") else {
        return;
    };
    // Two ids only (0 and 1), and a 2-second grace period.
    let mut cfg = cluster.node("x");
    cfg.reuse_after_secs = 2;
    let acquire = |endpoint: &'static str| {
        let mut cfg = cfg.clone();
        cfg.cache_file = format!("{}.{endpoint}", cfg.cache_file);
        let cluster = &cluster;
        async move {
            cluster
                .acquire_with(&cfg, endpoint, 1, Arc::new(SystemClock))
                .await
        }
    };
    let live = acquire("10.0.5.1:6380").await.unwrap();
    let dead = acquire("10.0.5.2:6380").await.unwrap();
    assert_eq!((live.worker_id, dead.worker_id), (0, 1));
    dead.close().await;

    let err = acquire("10.0.5.3:6380")
        .await
        .err()
        .expect("no free id before the grace period");
    assert!(matches!(err, CoordError::NoFreeWorkerId(_)), "{err}");

    tokio::time::sleep(Duration::from_millis(2300)).await;
    let newcomer = acquire("10.0.5.3:6380").await.unwrap();
    assert_eq!(
        newcomer.worker_id, 1,
        "the dead node's id, never the live node's"
    );
    let children: HashSet<String> = cluster
        .client()
        .await
        .list_children(&cluster.forever())
        .await
        .unwrap()
        .into_iter()
        .collect();
    assert!(
        children.contains("10.0.5.3:6380-0000000001"),
        "{children:?}"
    );
    assert!(
        !children.iter().any(|c| c.starts_with("10.0.5.2:6380")),
        "{children:?}"
    );

    // The node whose id was reused comes back: it gets no id rather than a shared one.
    let err = acquire("10.0.5.2:6380")
        .await
        .err()
        .expect("both ids are live");
    assert!(matches!(err, CoordError::NoFreeWorkerId(_)), "{err}");
    live.close().await;
    newcomer.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lease_stops_ids_only_once_the_fence_written_into_zookeeper_is_reached() {
    let Some(cluster) = Cluster::new("lease") else {
        return;
    };
    let proxy = TcpProxy::start(cluster.cfg.connect.clone(), true).await;
    let mut cfg = cluster.node("lease");
    cfg.connect = proxy.addr.to_string();
    cfg.reuse_after_secs = 2;
    let worker = cluster
        .acquire_with(&cfg, "10.0.6.1:6380", MAX_WORKER_ID, Arc::new(SystemClock))
        .await
        .unwrap();
    proxy.cut();
    // ZooKeeper being unreachable does not stop ID service at once...
    assert_eq!(worker.limit.check(SystemClock.now_millis()), Ok(()));
    // ...but once the fence last written into ZooKeeper is reached, the id may go to another
    // node, so this one must stop.
    tokio::time::sleep(Duration::from_millis(cfg.lease_ms + 300)).await;
    let refused = worker.limit.check(SystemClock.now_millis()).unwrap_err();
    assert!(refused.contains("no ZooKeeper time report"), "{refused}");
    worker.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snowflake_over_resp_uses_the_zookeeper_worker_id() {
    let Some(cluster) = Cluster::new("snowflake_over_resp") else {
        return;
    };
    // Take id 0 first, so the server's id is 1 and cannot be mistaken for the default.
    let other = cluster.acquire("10.0.7.1:6380").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut config = common::sqlite_config(&dir);
    config.snowflake.coordinator = CoordinatorKind::Zookeeper;
    config.snowflake.zookeeper = cluster.node("server");
    config.snowflake.zookeeper.advertise = Some("10.0.7.2:6380".into());
    let server = common::TestServer::start(config).await;
    let mut con = server.client().await;
    let id: i64 = redis::cmd("SNOWFLAKE").query_async(&mut con).await.unwrap();
    let fields = Layout::default().decode(id).unwrap();
    assert_eq!(fields.worker_id, 1);
    assert!(SystemClock.now_millis().abs_diff(fields.timestamp_ms) < 1000);
    let info: String = redis::cmd("INFO")
        .arg("leafd")
        .query_async(&mut con)
        .await
        .unwrap();
    assert!(info.contains("snowflake_worker_id:1\r\n"), "{info}");
    assert!(info.contains("zookeeper_connected:1\r\n"), "{info}");
    server.stop().await;
    other.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_live_nodes_with_one_identity_get_different_ids() {
    let Some(cluster) = Cluster::new("shared_identity") else {
        return;
    };
    let endpoint = "10.0.8.1:6380";
    let first = cluster.acquire(endpoint).await.unwrap();
    // Same endpoint, its own cache: a second process configured like the first.
    let second = cluster
        .acquire_with(
            &cluster.node("second"),
            endpoint,
            MAX_WORKER_ID,
            Arc::new(SystemClock),
        )
        .await
        .unwrap();
    assert_ne!(first.worker_id, second.worker_id);
    // The first still holds its liveness node: nobody deleted it.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(first.limit.check(SystemClock.now_millis()), Ok(()));
    assert_eq!(second.limit.check(SystemClock.now_millis()), Ok(()));
    first.close().await;
    second.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_liveness_node_is_taken_stops_at_once() {
    let Some(cluster) = Cluster::new("liveness_taken") else {
        return;
    };
    let worker = cluster.acquire("10.0.9.1:6380").await.unwrap();
    let path = format!(
        "{}/{}/alive/{}",
        cluster.cfg.root, cluster.cfg.cluster, worker.worker_id
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    // An operator (or a buggy peer) replaces the node with one of another session, in one
    // transaction.
    let intruder = cluster.client().await;
    let ephemeral =
        zookeeper_client::CreateMode::Ephemeral.with_acls(zookeeper_client::Acls::anyone_all());
    let mut replace = intruder.new_multi_writer();
    replace.add_delete(&path, None).unwrap();
    replace.add_create(&path, b"intruder", &ephemeral).unwrap();
    replace.commit().await.unwrap();
    let refused = refused_within(&worker, Duration::from_millis(500))
        .await
        .expect("stops issuing within 500 ms, well before its lease ends");
    assert!(refused.contains("liveness node"), "{refused}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        worker.limit.is_revoked(),
        "held by another session: revoked for good"
    );
    worker.close().await;
}

/// The cluster's layout lives in `{root}/{cluster}/layout`: another layout is refused while a
/// node is alive; a node whose layout the record no longer names stops at its next report; and
/// once no node is alive, a layout whose IDs could go back is still refused by the value check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_layout_is_recorded_in_zookeeper_and_a_change_is_checked() {
    let Some(cluster) = Cluster::new("layout_record") else {
        return;
    };
    let javascript_safe = Layout {
        timestamp_bits: 41,
        worker_bits: 4,
        sequence_bits: 8,
        unit_ms: 10,
        ..Layout::default()
    };
    let default = Layout::default();
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let endpoint = "10.0.9.2:6380";
    let worker = zookeeper::acquire(&cluster.node("a"), endpoint, 15, &default, clock.clone())
        .await
        .unwrap();
    let layout_path = format!("{}/{}/layout", cluster.cfg.root, cluster.cfg.cluster);
    let client = cluster.client().await;
    let (recorded, _) = client.get_data(&layout_path).await.unwrap();
    assert_eq!(recorded, default.descriptor().into_bytes());

    let err = zookeeper::acquire(
        &cluster.node("b"),
        "10.0.9.3:6380",
        15,
        &javascript_safe,
        clock.clone(),
    )
    .await
    .err()
    .expect("refused while a node is alive");
    assert!(err.to_string().contains("are alive in ZooKeeper"), "{err}");

    // The record names another layout, as if a node of it had won a race: the running node
    // stops at its next report (every 200 ms).
    client
        .set_data(&layout_path, javascript_safe.descriptor().as_bytes(), None)
        .await
        .unwrap();
    let refused = refused_within(&worker, Duration::from_secs(1))
        .await
        .expect("stops within a second");
    assert!(refused.contains("snowflake layout changed"), "{refused}");
    worker.close().await;

    // Back to the default layout with no node alive: allowed (its IDs start above 2^53).
    let back = zookeeper::acquire(&cluster.node("a"), endpoint, 15, &default, clock.clone())
        .await
        .unwrap();
    back.close().await;
    // And the 53-bit layout after it: its IDs would go back.
    let err = zookeeper::acquire(
        &cluster.node("c"),
        "10.0.9.4:6380",
        15,
        &javascript_safe,
        clock,
    )
    .await
    .err()
    .expect("refused: IDs would go back");
    assert!(
        err.to_string().contains("snowflake layout change refused"),
        "{err}"
    );
    assert!(err.to_string().contains("may reach"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forever_node_leaf_wrote_sets_the_floor_and_one_nobody_can_read_is_refused() {
    let Some(cluster) = Cluster::new("forever_data_read") else {
        return;
    };
    let zk = cluster.client().await;
    let persistent =
        zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
    for path in [
        cluster.cfg.root.clone(),
        format!("{}/{}", cluster.cfg.root, cluster.cfg.cluster),
        cluster.forever(),
    ] {
        match zk.create(&path, b"", &persistent).await {
            Ok(_) | Err(zookeeper_client::Error::NodeExists) => {}
            Err(e) => panic!("{path}: {e}"),
        }
    }
    // A Leaf node that ran on this address, its last report 5 s ahead of this clock (Leaf
    // reports every 3 s, so it may have issued up to 3 s past it).
    let leaf_endpoint = "10.0.9.1:8080";
    let ahead = SystemClock.now_millis() + 5000;
    zk.create(
        &format!("{}/{leaf_endpoint}-0000000004", cluster.forever()),
        format!(r#"{{"ip":"10.0.9.1","port":"8080","timestamp":{ahead}}}"#).as_bytes(),
        &persistent,
    )
    .await
    .unwrap();
    let worker = cluster.acquire(leaf_endpoint).await.unwrap();
    assert_eq!((worker.worker_id, worker.floor_ms), (4, ahead + 3000));
    worker.close().await;

    // Data edited by hand under another address: refused before its liveness node exists.
    let damaged = "10.0.9.2:8080";
    let path = format!("{}/{damaged}-0000000007", cluster.forever());
    zk.create(&path, b"{\"endpoint\":", &persistent)
        .await
        .unwrap();
    let err = match cluster.acquire(damaged).await {
        Err(e) => e.to_string(),
        Ok(w) => panic!("took worker id {} from data nobody can read", w.worker_id),
    };
    assert_eq!(
        err,
        format!("no free worker id: ZooKeeper node {path} holds \"{{\\\"endpoint\\\":\", neither leafd's nor Leaf's worker data: how far its last holder issued is not known; restore it, or delete the node to give the id up")
    );
    let alive = format!("{}/{}/alive", cluster.cfg.root, cluster.cfg.cluster);
    let held = zk.list_children(&alive).await.unwrap_or_default();
    assert!(!held.contains(&"7".to_string()), "{held:?}");
}

/// A node that reused this endpoint's id while it was dead left its own child beside this
/// endpoint's stale one: the restart takes the id back only past the fence that node wrote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_onto_an_id_another_node_reused_waits_for_that_nodes_fence() {
    let Some(cluster) = Cluster::new("reused_under_two_names") else {
        return;
    };
    let zk = cluster.client().await;
    let persistent =
        zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
    for path in [
        cluster.cfg.root.clone(),
        format!("{}/{}", cluster.cfg.root, cluster.cfg.cluster),
        cluster.forever(),
    ] {
        match zk.create(&path, b"", &persistent).await {
            Ok(_) | Err(zookeeper_client::Error::NodeExists) => {}
            Err(e) => panic!("{path}: {e}"),
        }
    }
    let now = SystemClock.now_millis();
    let mine = "10.0.8.1:8080";
    zk.create(
        &format!("{}/{mine}-0000000006", cluster.forever()),
        format!(
            r#"{{"endpoint":"{mine}","worker_id":6,"timestamp":{},"fence":0}}"#,
            now - 600_000
        )
        .as_bytes(),
        &persistent,
    )
    .await
    .unwrap();
    let fence = now + 4000;
    zk.create(
        &format!("{}/10.0.8.2:8080-0000000006", cluster.forever()),
        format!(
            r#"{{"endpoint":"10.0.8.2:8080","worker_id":6,"timestamp":{now},"fence":{fence}}}"#
        )
        .as_bytes(),
        &persistent,
    )
    .await
    .unwrap();
    let worker = cluster.acquire(mine).await.unwrap();
    assert_eq!((worker.worker_id, worker.floor_ms), (6, fence));
    worker.close().await;
}

/// The reports of a node that inherited a fence ahead of its clock keep that fence: a start that
/// is then refused (the clock too far behind it) or killed while it waits must not leave the
/// next holder a lower one (helper-7: 3,861,697 repeated IDs on the next start).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_never_write_a_fence_below_the_one_inherited() {
    let Some(cluster) = Cluster::new("inherited_fence_kept") else {
        return;
    };
    let zk = cluster.client().await;
    let persistent =
        zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
    for path in [
        cluster.cfg.root.clone(),
        format!("{}/{}", cluster.cfg.root, cluster.cfg.cluster),
        cluster.forever(),
    ] {
        match zk.create(&path, b"", &persistent).await {
            Ok(_) | Err(zookeeper_client::Error::NodeExists) => {}
            Err(e) => panic!("{path}: {e}"),
        }
    }
    let endpoint = "10.0.7.1:8080";
    let path = format!("{}/{endpoint}-0000000002", cluster.forever());
    let fence = SystemClock.now_millis() + 60_000;
    zk.create(
        &path,
        format!(
            r#"{{"endpoint":"{endpoint}","worker_id":2,"timestamp":{},"fence":{fence}}}"#,
            fence - 1000
        )
        .as_bytes(),
        &persistent,
    )
    .await
    .unwrap();
    let worker = cluster.acquire(endpoint).await.unwrap();
    assert_eq!((worker.worker_id, worker.floor_ms), (2, fence));
    // Several reports (every 200 ms), each a lease (1 s) ahead of this clock.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let (data, _) = zk.get_data(&path).await.unwrap();
    let written: serde_json::Value = serde_json::from_slice(&data).unwrap();
    assert!(
        written["timestamp"].as_u64().unwrap() < fence - 1000,
        "reported: {written}"
    );
    assert_eq!(written["fence"].as_u64(), Some(fence), "{written}");
    // Killed here (no clean stop): the next start still waits for that fence.
    worker.close().await;
    let again = cluster.acquire(endpoint).await.unwrap();
    assert_eq!((again.worker_id, again.floor_ms), (2, fence));
    again.close().await;
}
