//! The database coordinator (`snowflake.coordinator = "database"`): worker ids leased from
//! `leaf_worker` in the segment database, on SQLite and, when their URLs are set, MariaDB and
//! PostgreSQL. Each test uses its own database (or file) and state directories.

mod common;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use common::backends::Backend;
use leafd::app::App;
use leafd::clock::{Clock, SystemClock};
use leafd::config::{Config, CoordinatorKind};
use leafd::engine::snowflake::Layout;
use leafd::storage::Lease;

fn node_config(url: &str, state: &tempfile::TempDir, lease_ms: u64) -> Config {
    let mut config = Config::default();
    config.storage.url = url.to_string();
    config.storage.state_dir = state.path().display().to_string();
    config.snowflake.coordinator = CoordinatorKind::Database;
    config.snowflake.database_lease_ms = lease_ms;
    common::test_config(config)
}

/// Three nodes on one database get three ids, their IDs never collide, a node that finds its
/// row taken stops for good, and a released id is free again.
async fn nodes_share_one_lease_table(url: &str) {
    let states: Vec<_> = (0..4).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut apps = Vec::new();
    for state in &states[..3] {
        apps.push(
            App::open(node_config(url, state, 2000))
                .await
                .expect("starts"),
        );
    }
    let ids: Vec<u64> = apps
        .iter()
        .map(|a| a.snowflake().unwrap().worker_id())
        .collect();
    assert_eq!(
        ids.iter().collect::<HashSet<_>>().len(),
        3,
        "distinct ids {ids:?}"
    );
    let mut seen = HashSet::new();
    for app in &apps {
        let engine = app.snowflake().unwrap();
        for _ in 0..10 {
            for id in engine.next_ids(1000).await.unwrap() {
                assert!(seen.insert(id), "repeated {id}");
                assert_eq!(
                    Layout::default().decode(id).unwrap().worker_id,
                    engine.worker_id()
                );
            }
        }
    }
    assert_eq!(seen.len(), 30_000);

    // Another owner takes the first node's row (as after its lease expired): at its next
    // renewal it stops for good.
    let victim = apps[0].snowflake().unwrap();
    let leases = apps[1].segments.store().clone().worker_leases().unwrap();
    let row = leases
        .workers()
        .await
        .unwrap()
        .into_iter()
        .find(|r| r.worker_id == victim.worker_id() as i64)
        .unwrap();
    assert!(
        row.owner.contains('#'),
        "owner names address and instance: {}",
        row.owner
    );
    assert!(
        matches!(row.lease, Lease::Timed(left) if left > 0) && row.fence_ms > 0,
        "{row:?}"
    );
    leases
        .release(row.worker_id, &row.owner, row.fence_ms)
        .await
        .unwrap();
    assert_eq!(
        leases
            .claim(row.worker_id, "intruder#1", 60_000)
            .await
            .unwrap(),
        Some(row.fence_ms),
        "the next holder learns the fence it must pass"
    );
    let mut refused = None;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if let Err(reason) = victim.limit().check(SystemClock.now_millis()) {
            refused = Some(reason);
            break;
        }
    }
    let refused = refused.expect("the node whose row was taken stops");
    assert!(refused.contains("leased by another node"), "{refused}");
    assert!(victim.limit().is_revoked());

    // A graceful stop releases the lease: a new node may take that id (after the never-used).
    let released = apps[2].snowflake().unwrap().worker_id();
    apps.pop().unwrap().close().await;
    let rows = leases.workers().await.unwrap();
    let row = rows
        .iter()
        .find(|r| r.worker_id == released as i64)
        .unwrap();
    assert!(!row.lease.live(), "released at once: {row:?}");
    let newcomer = App::open(node_config(url, &states[3], 2000)).await.unwrap();
    let newcomer_id = newcomer.snowflake().unwrap().worker_id();
    assert!(!ids[..2].contains(&newcomer_id), "{newcomer_id} vs {ids:?}");
    newcomer.close().await;
    for app in apps {
        app.close().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_nodes_share_one_lease_table() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/leafd.db", dir.path().display());
    nodes_share_one_lease_table(&url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_nodes_share_one_lease_table() {
    let Some(url) = Backend::MySql
        .fresh_database("mysql_nodes_share_one_lease_table")
        .await
    else {
        return;
    };
    nodes_share_one_lease_table(&url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_nodes_share_one_lease_table() {
    let Some(url) = Backend::Postgres
        .fresh_database("postgres_nodes_share_one_lease_table")
        .await
    else {
        return;
    };
    nodes_share_one_lease_table(&url).await;
}

/// A restart with the clock stepped back does not repeat: the fence in the row (and the local
/// file) holds the new holder back, here refused since the step is far beyond the wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fence_in_the_row_outlives_the_node() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/leafd.db", dir.path().display());
    let state = tempfile::tempdir().unwrap();
    // Worker id 0 is the only one, so the second node gets the first one's id and its fence.
    let one_worker = |state: &tempfile::TempDir| {
        let mut config = node_config(&url, state, 2000);
        config.snowflake.worker_id_bits = 0;
        config.snowflake.timestamp_bits = 51;
        config
    };
    let app = App::open(one_worker(&state)).await.unwrap();
    app.snowflake().unwrap().next_ids(10).await.unwrap();
    app.close().await;
    // Another node, its own state directory, its clock 60 s behind: the id's fence stops it.
    let other = tempfile::tempdir().unwrap();
    let behind = Arc::new(leafd::clock::OffsetClock::new(
        Arc::new(SystemClock),
        -60_000,
    ));
    let mut config = one_worker(&other);
    config.snowflake.max_start_wait_ms = 1000;
    let err = App::open_with_clock(config, behind)
        .await
        .err()
        .expect("refused");
    assert!(err.to_string().contains("ms behind"), "{err}");
}

/// Many nodes starting at once each get their own id, and LEAF.WORKERS lists the leases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_starting_at_once_get_distinct_ids_and_leaf_workers_lists_them() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/leafd.db", dir.path().display());
    // The schema first, so the four nodes race for ids, not for the migration.
    let states: Vec<_> = (0..5).map(|_| tempfile::tempdir().unwrap()).collect();
    let first = App::open(node_config(&url, &states[4], 5000))
        .await
        .unwrap();
    let (a, b, c, d) = tokio::join!(
        App::open(node_config(&url, &states[0], 5000)),
        App::open(node_config(&url, &states[1], 5000)),
        App::open(node_config(&url, &states[2], 5000)),
        App::open(node_config(&url, &states[3], 5000)),
    );
    let apps = vec![first, a.unwrap(), b.unwrap(), c.unwrap(), d.unwrap()];
    let ids: HashSet<u64> = apps
        .iter()
        .map(|a| a.snowflake().unwrap().worker_id())
        .collect();
    assert_eq!(ids, (0..5).collect::<HashSet<u64>>());
    let server = common::TestServer::serve_app(apps[0].clone()).await;
    let mut raw = server.raw().await;
    let reply = raw.send(&common::resp(&[b"LEAF.WORKERS"]), 1 + 5 * 9).await;
    assert!(reply.starts_with("*5\r\n"), "{reply}");
    for id in 0..5 {
        assert!(
            reply.contains(&format!("$9\r\nworker_id\r\n:{id}\r\n")),
            "{reply}"
        );
    }
    assert!(
        reply.contains("lease_ms_left") && reply.contains("fence_ms"),
        "{reply}"
    );
    for app in apps {
        app.close().await;
    }
}

/// Database outages: shorter than half the lease do not interrupt SNOWFLAKE; longer stop it
/// (UNAVAILABLE) until a renewal succeeds again.
async fn outages_shorter_and_longer_than_half_the_lease(url: &str) {
    let (prefix, target) = common::proxy::split_server_url(url);
    let proxy = common::proxy::TcpProxy::start(target.clone(), true).await;
    let routed = url.replacen(
        &format!("{prefix}{target}"),
        &format!("{prefix}{}", proxy.addr),
        1,
    );
    let state = tempfile::tempdir().unwrap();
    let mut config = node_config(&routed, &state, 4000);
    config.storage.acquire_timeout_ms = 300;
    config.snowflake.fence_wait_ms = 100;
    let app = App::open(config).await.unwrap();
    let engine = app.snowflake().unwrap();
    engine.next_id().await.unwrap();
    // 1.2 s without the database (half the lease is 2 s): IDs keep coming.
    proxy.cut();
    let until = std::time::Instant::now() + Duration::from_millis(1200);
    while std::time::Instant::now() < until {
        engine
            .next_id()
            .await
            .expect("served through a short outage");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    proxy.restore();
    tokio::time::sleep(Duration::from_millis(1500)).await; // a renewal gets through
    engine.next_id().await.unwrap();
    // 4 s without it: refused once half the lease (plus one renewal interval) has passed.
    proxy.cut();
    tokio::time::sleep(Duration::from_millis(4000)).await;
    match engine.next_id().await {
        Err(leafd::engine::snowflake::SnowflakeError::Unavailable(reason)) => {
            assert!(reason.contains("lease renewal"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    proxy.restore();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        if engine.next_id().await.is_ok() {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "never recovered");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    app.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_outages_shorter_and_longer_than_half_the_lease() {
    let Some(url) = Backend::MySql
        .fresh_database("mysql_outages_half_lease")
        .await
    else {
        return;
    };
    outages_shorter_and_longer_than_half_the_lease(&url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_outages_shorter_and_longer_than_half_the_lease() {
    let Some(url) = Backend::Postgres
        .fresh_database("postgres_outages_half_lease")
        .await
    else {
        return;
    };
    outages_shorter_and_longer_than_half_the_lease(&url).await;
}

/// A failover of the database behind the lease table, as a claimant sees it: the instance that
/// answered the last claim is not the one answering now. Renewals (even the claim) of a holder
/// may be lost, and that holder issues until half a lease past its last renewal, so a node
/// claiming within a lease of the switch waits a whole lease before its first ID; one started
/// with no switch, or a lease after it, does not.
async fn a_claim_after_a_failover_waits_a_lease(url: &str, backend: Backend) {
    let lease_ms = 3000;
    let states: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let started = std::time::Instant::now();
    let first = App::open(node_config(url, &states[0], lease_ms))
        .await
        .expect("starts");
    assert!(
        started.elapsed() < Duration::from_millis(lease_ms / 2),
        "no failover seen: no wait ({:?})",
        started.elapsed()
    );
    first.close().await;
    let switch = "UPDATE leaf_worker SET owner = 'instance the old primary' WHERE worker_id = -1";
    backend.execute(url, switch).await;
    // The first claim after the switch, and (not shown) any other within a lease of it, waits.
    let started = std::time::Instant::now();
    let app = App::open(node_config(url, &states[1], lease_ms))
        .await
        .expect("starts");
    app.snowflake().unwrap().next_ids(1).await.unwrap();
    assert!(
        started.elapsed() >= Duration::from_millis(lease_ms - 100),
        "within a lease of the switch a claimant waits a lease ({:?})",
        started.elapsed()
    );
    // A lease after the switch every holder whose renewals were lost has stopped: no wait.
    let started = std::time::Instant::now();
    let later = App::open(node_config(url, &states[2], lease_ms))
        .await
        .expect("starts");
    later.snowflake().unwrap().next_ids(1).await.unwrap();
    assert!(
        started.elapsed() < Duration::from_millis(lease_ms / 2),
        "a lease after the switch: no wait ({:?})",
        started.elapsed()
    );
    app.close().await;
    later.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_a_claim_after_a_failover_waits_a_lease() {
    let Some(url) = Backend::MySql
        .fresh_database("mysql_claim_after_failover")
        .await
    else {
        return;
    };
    a_claim_after_a_failover_waits_a_lease(&url, Backend::MySql).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_claim_after_a_failover_waits_a_lease() {
    let Some(url) = Backend::Postgres
        .fresh_database("postgres_claim_after_failover")
        .await
    else {
        return;
    };
    a_claim_after_a_failover_waits_a_lease(&url, Backend::Postgres).await;
}

/// Runs `sql` on the database `url` names (SQLite, MariaDB or PostgreSQL).
async fn execute_on(url: &str, sql: &str) {
    if url.starts_with("sqlite:") {
        use sqlx::Connection;
        let mut db = sqlx::SqliteConnection::connect(url).await.unwrap();
        sqlx::query(sql).execute(&mut db).await.unwrap();
    } else {
        Backend::of(url).execute(url, sql).await;
    }
}

/// `leaf_worker` loses its rows (`DELETE`, as a wipe or a restore of an empty table leaves it)
/// while a node holds worker id 0 and issues: that node stops issuing at its next renewal,
/// claims its id again and issues again a lease later by itself; a node starting meanwhile
/// waits a whole lease before its first ID. No ID is issued twice.
/// The wipes tried, each on a new database: the whole table, the lease rows only (rows −1 to
/// −3 kept), the holder's row only.
const WIPES: [&str; 3] = [
    "DELETE FROM leaf_worker",
    "DELETE FROM leaf_worker WHERE worker_id >= 0",
    "DELETE FROM leaf_worker WHERE worker_id = 0",
];

async fn lease_rows_lost(url: &str, wipe: &str) {
    let lease_ms = 3000;
    let states: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let holder = App::open(node_config(url, &states[0], lease_ms))
        .await
        .expect("starts");
    let issuer = holder.snowflake().unwrap();
    let mut ids: Vec<i64> = issuer.next_ids(1000).await.unwrap();
    assert_eq!(issuer.worker_id(), 0, "{wipe}");
    execute_on(url, wipe).await;
    let wiped = std::time::Instant::now();
    // Issues until its next renewal (a fifth of the lease) finds its row gone, then stops (a
    // request then waits for the lease a while before its error).
    let mut last_issued = wiped;
    while issuer.next_ids(1).await.map(|got| ids.extend(got)).is_ok() {
        last_issued = std::time::Instant::now();
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(
        last_issued - wiped < Duration::from_millis(lease_ms / 2),
        "the holder issued {:?} after the wipe",
        last_issued - wiped
    );
    let refusal = issuer.next_ids(1).await.unwrap_err().to_string();
    assert!(
        refusal.contains("leaf_worker has no row for worker id"),
        "{refusal}"
    );
    // Its claim again (within a renewal retry) comes before the newcomer's.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let started = std::time::Instant::now();
    let newcomer = App::open(node_config(url, &states[1], lease_ms))
        .await
        .expect("starts");
    ids.extend(newcomer.snowflake().unwrap().next_ids(1000).await.unwrap());
    assert!(
        started.elapsed() >= Duration::from_millis(lease_ms - 700),
        "{wipe}: a claimant after it waits a lease ({:?})",
        started.elapsed()
    );
    assert_ne!(
        newcomer.snowflake().unwrap().worker_id(),
        issuer.worker_id()
    );
    // The holder serves again by itself, a lease after its claim again.
    let deadline = std::time::Instant::now() + Duration::from_millis(3 * lease_ms);
    loop {
        match issuer.next_ids(1000).await {
            Ok(got) => {
                ids.extend(got);
                break;
            }
            Err(e) => assert!(
                std::time::Instant::now() < deadline,
                "the holder does not issue again: {e}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let unique: HashSet<i64> = ids.iter().copied().collect();
    assert_eq!(unique.len(), ids.len(), "an ID was issued twice");
    holder.close().await;
    newcomer.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_wiped_lease_table() {
    for wipe in WIPES {
        let dir = tempfile::tempdir().unwrap();
        lease_rows_lost(&format!("sqlite://{}/leafd.db", dir.path().display()), wipe).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_a_wiped_lease_table() {
    for wipe in WIPES {
        let Some(url) = Backend::MySql
            .fresh_database("mysql_a_wiped_lease_table")
            .await
        else {
            return;
        };
        lease_rows_lost(&url, wipe).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_wiped_lease_table() {
    for wipe in WIPES {
        let Some(url) = Backend::Postgres
            .fresh_database("postgres_a_wiped_lease_table")
            .await
        else {
            return;
        };
        lease_rows_lost(&url, wipe).await;
    }
}

/// Two processes sharing one state directory (one working directory, one config) hold two
/// worker ids and two fence files: the second starts at once instead of waiting out the first
/// one's fence (written `fence_window_ms` ahead), and neither repeats the other's IDs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_sharing_a_state_directory_do_not_wait_for_each_other() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/leafd.db", dir.path().display());
    let first = App::open(node_config(&url, &dir, 2000)).await.unwrap();
    first.snowflake().unwrap().next_ids(1).await.unwrap();
    let started = std::time::Instant::now();
    let second = App::open(node_config(&url, &dir, 2000)).await.unwrap();
    let second_ids = second.snowflake().unwrap().next_ids(1000).await.unwrap();
    assert!(
        started.elapsed() < Duration::from_millis(1000),
        "the second node waited {:?} for a fence that is not its own",
        started.elapsed()
    );
    let first_ids = first.snowflake().unwrap().next_ids(1000).await.unwrap();
    let all: HashSet<i64> = first_ids.iter().chain(&second_ids).copied().collect();
    assert_eq!(all.len(), 2000);
    for app in [&first, &second] {
        let id = app.snowflake().unwrap().worker_id();
        assert!(
            dir.path()
                .join(format!("snowflake-fence-w{id}.json"))
                .exists(),
            "worker {id} keeps its own fence file"
        );
    }
    first.close().await;
    second.close().await;
}

/// 41 timestamp + 4 worker + 8 sequence bits in 10 ms steps: IDs exact in JavaScript.
fn javascript_safe(config: &mut Config) {
    config.snowflake.timestamp_bits = 41;
    config.snowflake.worker_id_bits = 4;
    config.snowflake.sequence_bits = 8;
    config.snowflake.time_unit_ms = 10;
}

/// A node with the JavaScript-safe layout on a new SQLite file: the server, the database URL,
/// the database's directory and the state directory (both kept for the node's life).
async fn javascript_safe_node() -> (
    common::TestServer,
    String,
    tempfile::TempDir,
    tempfile::TempDir,
) {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/leafd.db", dir.path().display());
    let state = tempfile::tempdir().unwrap();
    let mut config = node_config(&url, &state, 2000);
    javascript_safe(&mut config);
    (common::TestServer::start(config).await, url, dir, state)
}

/// The 53-bit layout under load: four clients at once (batches of 100 and single IDs
/// pipelined), 16,000 IDs past the 25,600-per-second ceiling of one worker, so most requests
/// wait for the next step: all distinct, at most 2^53 − 1, increasing per client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_53_bit_layout_under_concurrent_clients() {
    let (server, _url, _dir, _state) = javascript_safe_node().await;
    let mut clients = Vec::new();
    for _ in 0..4 {
        let mut con = server.client().await;
        clients.push(tokio::spawn(async move {
            let mut ids = Vec::new();
            for _ in 0..20 {
                let batch: Vec<i64> = redis::cmd("SNOWFLAKE")
                    .arg(100)
                    .query_async(&mut con)
                    .await
                    .unwrap();
                ids.extend(batch);
                let mut pipe = redis::pipe();
                for _ in 0..100 {
                    pipe.cmd("SNOWFLAKE");
                }
                let singles: Vec<i64> = pipe.query_async(&mut con).await.unwrap();
                ids.extend(singles);
            }
            ids
        }));
    }
    let mut all = std::collections::HashSet::new();
    for client in clients {
        let ids = client.await.unwrap();
        assert_eq!(ids.len(), 4_000);
        for pair in ids.windows(2) {
            assert!(pair[0] < pair[1], "{} then {}", pair[0], pair[1]);
        }
        for id in ids {
            assert!(id > 0 && id < 1 << 53, "{id} is past 2^53 - 1");
            assert!(all.insert(id), "{id} handed out twice");
        }
    }
    assert_eq!(all.len(), 16_000);
    server.stop().await;
}

/// A 53-bit layout with a 10 ms unit through the server: SNOWFLAKE over RESP and HTTP gives
/// increasing IDs of at most 2^53 − 1; LEAF.DECODE and LEAF.FROMTIME follow the unit. Then the
/// layout record: the default 63-bit layout may follow it (its first ID is above any a 53-bit
/// layout can issue), the 53-bit one may not follow that again: refused by the table (a node
/// with a fresh state directory) and by the fence file (the static coordinator).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_53_bit_layout_and_layout_changes_that_could_go_back() {
    let (server, url, _dir, state) = javascript_safe_node().await;
    let mut con = server.client().await;
    let mut last = 0i64;
    for _ in 0..30 {
        let ids: Vec<i64> = redis::cmd("SNOWFLAKE")
            .arg(100)
            .query_async(&mut con)
            .await
            .unwrap();
        for id in ids {
            assert!(id > last && id < 1 << 53, "{id} after {last}");
            last = id;
        }
    }
    let url_http = server.http_url("/api/snowflake/get/any");
    let over_http: i64 = common::http_get(&url_http)
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
        .parse()
        .unwrap();
    assert!(over_http > last && over_http < 1 << 53);
    let fields: std::collections::HashMap<String, redis::Value> = redis::cmd("LEAF.DECODE")
        .arg(over_http)
        .query_async(&mut con)
        .await
        .unwrap();
    let timestamp_ms: i64 = redis::from_redis_value(fields["timestamp_ms"].clone()).unwrap();
    assert_eq!((timestamp_ms - 1_288_834_974_657) % 10, 0, "{timestamp_ms}");
    let next_step: i64 = redis::cmd("LEAF.FROMTIME")
        .arg(timestamp_ms + 10)
        .query_async(&mut con)
        .await
        .unwrap();
    let this_step: i64 = redis::cmd("LEAF.FROMTIME")
        .arg(timestamp_ms + 9)
        .query_async(&mut con)
        .await
        .unwrap();
    assert!(this_step <= over_http && over_http < next_step);
    last = over_http;
    server.stop().await;

    // The default layout after the 53-bit one: its IDs start far above.
    let app = App::open(node_config(&url, &state, 2000)).await.unwrap();
    let id = app.snowflake().unwrap().next_ids(1).await.unwrap()[0];
    assert!(id > last);
    app.close().await;

    // The 53-bit layout again: its IDs would go back. Refused by the table, for this node and
    // for one with no history of its own.
    for state in [&state, &tempfile::tempdir().unwrap()] {
        let mut config = node_config(&url, state, 2000);
        javascript_safe(&mut config);
        let err = App::open(config).await.err().expect("refused");
        let text = err.to_string();
        assert!(text.contains("snowflake layout change refused"), "{text}");
        assert!(text.contains("recorded in leaf_worker"), "{text}");
    }

    // The static coordinator: the fence file alone holds the record.
    let static_state = tempfile::tempdir().unwrap();
    let static_config = |javascript: bool| {
        let mut config = node_config(&url, &static_state, 2000);
        config.snowflake.coordinator = CoordinatorKind::Static;
        config.snowflake.worker_id = 3;
        if javascript {
            javascript_safe(&mut config);
        }
        config
    };
    let app = App::open(static_config(false)).await.unwrap();
    app.snowflake().unwrap().next_ids(10).await.unwrap();
    app.close().await;
    let err = App::open(static_config(true)).await.err().expect("refused");
    assert!(err.to_string().contains("snowflake-fence-w3.json"), "{err}");
}

/// Nodes of different layouts on one table: while a node holds a lease, a node with another
/// layout is refused; and a node whose layout the table no longer records (another node won a
/// race to change it) stops issuing at its next renewal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_stops_when_the_table_changes_layout_under_it() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/leafd.db", dir.path().display());
    let states = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let mut config = node_config(&url, &states[0], 2000);
    javascript_safe(&mut config);
    let js = leafd::app::snowflake_layout(&config.snowflake).descriptor();
    let app = App::open(config).await.unwrap();
    let engine = app.snowflake().unwrap();
    engine.next_ids(10).await.unwrap();

    let err = App::open(node_config(&url, &states[1], 2000))
        .await
        .err()
        .expect("refused while a node of the other layout holds a lease");
    assert!(
        err.to_string()
            .contains("are leased by nodes issuing IDs of"),
        "{err}"
    );

    // The record moves to the default layout as if another node had won a race.
    let default = Layout::default().descriptor();
    let mut storage = Config::default().storage;
    storage.url = url.clone();
    let store = leafd::storage::open(&storage, false).await.unwrap();
    let leases = store.worker_leases().unwrap();
    assert_eq!(
        leases.record_layout(Some(&js), &default).await.unwrap(),
        Some(default.clone())
    );
    // A renewal every lease / 5 = 400 ms finds it and stops the node.
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    let reason = loop {
        match engine.next_ids(1).await {
            Err(e) => break e.to_string(),
            Ok(_) if std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Ok(_) => panic!("still issuing 3 s after the layout record changed"),
        }
    };
    assert!(reason.contains("snowflake layout changed"), "{reason}");
    app.close().await;
}

/// A layout change is judged at the clock of the start; a clock that steps back before the
/// first ID must not take the new layout below that moment (where its IDs could meet the old
/// layout's): the first SNOWFLAKE is refused as a step back until the clock is past it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clock_step_back_after_an_accepted_layout_change_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/leafd.db", dir.path().display());
    let states = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let app = App::open(node_config(&url, &states[0], 2000))
        .await
        .unwrap();
    let old: Vec<i64> = app.snowflake().unwrap().next_ids(1000).await.unwrap();
    app.close().await;

    // 11 s earlier epoch, 41/16/6: its IDs now are above the old layout's for 11 s to come.
    let mut config = node_config(&url, &states[1], 2000);
    config.snowflake.epoch_ms -= 11_000;
    config.snowflake.worker_id_bits = 16;
    config.snowflake.sequence_bits = 6;
    let now = SystemClock.now_millis();
    let clock = Arc::new(leafd::clock::ManualClock::new(now));
    let app = App::open_with_clock(config, clock.clone()).await.unwrap();
    let engine = app.snowflake().unwrap();
    clock.set(now - 30_000);
    let refused = engine.next_ids(1).await;
    assert!(
        matches!(
            refused,
            Err(leafd::engine::snowflake::SnowflakeError::ClockBack(_))
        ),
        "{refused:?}"
    );
    clock.set(now + 1);
    // One ID: the manual clock does not move on to a next millisecond.
    let new = engine.next_ids(1).await.unwrap();
    assert!(
        new[0] > *old.last().unwrap(),
        "{} vs {}",
        new[0],
        old.last().unwrap()
    );
    app.close().await;
}

/// A layout whose timestamp field ran out before now is refused at start with what to change,
/// instead of starting and refusing every SNOWFLAKE.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_layout_that_has_already_ended_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/leafd.db", dir.path().display());
    let state = tempfile::tempdir().unwrap();
    let mut config = node_config(&url, &state, 2000);
    config.snowflake.timestamp_bits = 28;
    let err = App::open(config).await.err().expect("refused");
    assert!(
        err.to_string().contains("the snowflake layout ends at"),
        "{err}"
    );
}

/// A node started while its database is down (a deferred store) leases its worker id once the
/// database answers, and LEAF.WORKERS shows the lease table from then on: the deferred store
/// once dropped the table (a defaulted trait method it did not forward) for the life of the
/// process.
async fn leaf_workers_after_a_deferred_start(url: &str) {
    let (prefix, target) = common::proxy::split_server_url(url);
    let proxy = common::proxy::TcpProxy::start(target.clone(), false).await;
    let routed = url.replacen(
        &format!("{prefix}{target}"),
        &format!("{prefix}{}", proxy.addr),
        1,
    );
    let state = tempfile::tempdir().unwrap();
    let mut config = node_config(&routed, &state, 2000);
    config.storage.acquire_timeout_ms = 300;
    let app = App::open(config)
        .await
        .expect("starts without its database");
    let server = common::TestServer::serve_app(app).await;
    let mut con = server.client().await;
    let before: redis::RedisResult<redis::Value> =
        redis::cmd("LEAF.WORKERS").query_async(&mut con).await;
    assert!(before.is_err(), "{before:?}");
    proxy.restore();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let id: i64 = loop {
        match redis::cmd("SNOWFLAKE").query_async(&mut con).await {
            Ok(id) => break id,
            Err(e) if std::time::Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("no snowflake ID after the database came up: {e}"),
        }
    };
    let workers: Vec<std::collections::HashMap<String, redis::Value>> = redis::cmd("LEAF.WORKERS")
        .query_async(&mut con)
        .await
        .expect("LEAF.WORKERS answers once the database is connected");
    let worker = Layout::default().decode(id).unwrap().worker_id as i64;
    assert!(
        workers
            .iter()
            .any(|w| w.get("worker_id") == Some(&redis::Value::Int(worker))),
        "worker id {worker} not in {workers:?}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_leaf_workers_after_a_deferred_start() {
    let test = "mysql_leaf_workers_after_a_deferred_start";
    let Some(url) = Backend::MySql.fresh_database(test).await else {
        return;
    };
    leaf_workers_after_a_deferred_start(&url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_leaf_workers_after_a_deferred_start() {
    let test = "postgres_leaf_workers_after_a_deferred_start";
    let Some(url) = Backend::Postgres.fresh_database(test).await else {
        return;
    };
    leaf_workers_after_a_deferred_start(&url).await;
}
