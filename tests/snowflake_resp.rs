//! Snowflake over RESP with a static worker id: SNOWFLAKE, INCR/GET snowflake, LEAF.DECODE.

mod common;

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use common::{resp, TestServer};
use leafd::config::Config;
use leafd::engine::snowflake::Layout;
use leafd::storage::MemoryStore;

async fn server(worker_id: u64) -> TestServer {
    let mut config = Config::default();
    config.snowflake.coordinator = leafd::config::CoordinatorKind::Static;
    config.snowflake.worker_id = worker_id;
    TestServer::start_with_store(config, Arc::new(MemoryStore::new())).await
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_decode_to_this_worker_and_now() {
    let server = server(37).await;
    let mut con = server.client().await;
    let layout = Layout::default();
    let mut last = 0i64;
    for command in ["SNOWFLAKE", "INCR", "GET", "INCRBY"] {
        let mut cmd = redis::cmd(command);
        if command != "SNOWFLAKE" {
            cmd.arg("snowflake");
        }
        if command == "INCRBY" {
            cmd.arg(1);
        }
        let id: i64 = cmd.query_async(&mut con).await.unwrap();
        let fields = layout.decode(id).unwrap();
        assert_eq!(fields.worker_id, 37, "{command}");
        assert!(
            now_ms().abs_diff(fields.timestamp_ms) < 1000,
            "{command}: {fields:?}"
        );
        assert!(id > last, "{command}: {id} after {last}");
        last = id;
    }
    let mut raw = server.raw().await;
    let get = raw.send(&resp(&[b"GET", b"snowflake"]), 2).await;
    assert!(
        get.starts_with("$19\r\n"),
        "GET answers a bulk string: {get}"
    );
    let batch: Vec<i64> = redis::cmd("SNOWFLAKE")
        .arg(4096)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(batch.len(), 4096);
    assert!(batch[0] > last);
    assert!(batch.windows(2).all(|w| w[0] < w[1]), "strictly increasing");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decode_reports_every_field() {
    let server = server(1).await;
    let mut raw = server.raw().await;
    // 1 ms after Twitter's epoch, worker 1, sequence 1.
    let reply = raw.send(&resp(&[b"LEAF.DECODE", b"4198401"]), 17).await;
    assert_eq!(
        reply,
        "*10\r\n$2\r\nid\r\n:4198401\r\n$12\r\ntimestamp_ms\r\n:1288834974658\r\n\
         $4\r\ntime\r\n$24\r\n2010-11-04T01:42:54.658Z\r\n$9\r\nworker_id\r\n:1\r\n\
         $8\r\nsequence\r\n:1\r\n"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_snowflake_input_gets_errors() {
    let server = server(2).await;
    let mut raw = server.raw().await;
    let cases: &[(&[&[u8]], &str)] = &[
        (
            &[b"SNOWFLAKE", b"0"],
            "-ERR count must be between 1 and 4096\r\n",
        ),
        (
            &[b"SNOWFLAKE", b"4097"],
            "-ERR count must be between 1 and 4096\r\n",
        ),
        (
            &[b"SNOWFLAKE", b"x"],
            "-ERR value is not an integer or out of range\r\n",
        ),
        (
            &[b"SNOWFLAKE", b"1", b"2"],
            "-ERR wrong number of arguments for 'snowflake' command\r\n",
        ),
        (
            &[b"GET", b"other"],
            "-ERR unsupported key 'other': GET only serves 'snowflake'\r\n",
        ),
        (
            &[b"INCRBY", b"snowflake", b"3"],
            "-ERR INCRBY snowflake takes only 1: use SNOWFLAKE <n> for more IDs\r\n",
        ),
        (
            &[b"LEAF.DECODE", b"-5"],
            "-ERR a snowflake ID is a positive integer\r\n",
        ),
        (
            &[b"LEAF.DECODE", b"abc"],
            "-ERR value is not an integer or out of range\r\n",
        ),
    ];
    for (command, expected) in cases {
        assert_eq!(&raw.send(&resp(command), 1).await, expected, "{command:?}");
        assert_eq!(raw.send(b"PING\r\n", 1).await, "+PONG\r\n");
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disabled_snowflake_says_so() {
    let mut config = Config::default();
    config.snowflake.enabled = false;
    let server = TestServer::start_with_store(config, Arc::new(MemoryStore::new())).await;
    let mut raw = server.raw().await;
    assert_eq!(
        raw.send(&resp(&[b"SNOWFLAKE"]), 1).await,
        "-ERR snowflake is disabled on this server\r\n"
    );
    server.stop().await;
}

/// The static coordinator across restarts of one node (one fence file): a clock stepped
/// back a little is waited out, far back is refused, and no ID repeats.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarts_with_the_clock_stepped_back_never_repeat_an_id() {
    use leafd::app::{App, AppError};
    use leafd::clock::{Clock, OffsetClock, SystemClock};
    use leafd::coord::CoordError;

    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::default();
    config.snowflake.fence_file = dir.path().join("fence.json").display().to_string();
    config.snowflake.fence_window_ms = 400;
    config.snowflake.max_start_wait_ms = 2000;
    let open = |offset_ms: i64| {
        let config = config.clone();
        async move {
            let clock: Arc<dyn Clock> =
                Arc::new(OffsetClock::new(Arc::new(SystemClock), offset_ms));
            App::with_store(config, Arc::new(MemoryStore::new()), clock).await
        }
    };
    let mut seen = std::collections::HashSet::new();
    let app = open(0).await.unwrap();
    let engine = app.snowflake().unwrap();
    for _ in 0..50 {
        for id in engine.next_ids(1000).await.unwrap() {
            assert!(seen.insert(id));
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    // No graceful close, as after kill -9: the file keeps a fence ahead of the clock (the
    // dropped app's keeper even goes on extending it, like a node not quite dead yet).
    drop(engine);
    drop(app);

    // 60 s back: refused, naming the gap.
    let err = open(-60_000).await.err().expect("refused");
    match &err {
        AppError::Coord(CoordError::ClockBehindFence { gap_ms, .. }) => {
            assert!((60_000..61_000).contains(gap_ms), "{gap_ms}")
        }
        other => panic!("{other}"),
    }
    assert!(err.to_string().contains("ms behind"), "{err}");

    // 300 ms back: waited out, then every ID is new.
    let started = std::time::Instant::now();
    let app = open(-300).await.unwrap();
    assert!(started.elapsed() >= std::time::Duration::from_millis(250));
    let engine = app.snowflake().unwrap();
    for id in engine.next_ids(4000).await.unwrap() {
        assert!(seen.insert(id), "repeated {id}");
    }
    app.close().await;
    assert_eq!(seen.len(), 54_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_epoch_in_the_future_is_refused_at_start() {
    let mut config = Config::default();
    config.snowflake.epoch_ms = now_ms() + 365 * 86_400_000;
    let err = leafd::app::App::with_store(
        common::own_state_dir(config),
        Arc::new(MemoryStore::new()),
        Arc::new(leafd::clock::SystemClock),
    )
    .await
    .err()
    .expect("refused");
    assert!(err.to_string().contains("in the future"), "{err}");
}

/// LEAF.FROMTIME through the `redis` crate and GET /fromtime over HTTP, checked on IDs really
/// issued either side of each instant: every ID issued before t is below FROMTIME(t), every one
/// issued at or after t is at least it. Times before the epoch or past the layout are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn from_time_splits_issued_ids_at_each_instant() {
    let server = server(5).await;
    let mut con = server.client().await;
    let layout = Layout::default();
    let mut issued: Vec<i64> = Vec::new();
    let started = now_ms();
    while now_ms() < started + 30 {
        let batch: Vec<i64> = redis::cmd("SNOWFLAKE")
            .arg(500)
            .query_async(&mut con)
            .await
            .unwrap();
        issued.extend(batch);
    }
    let stamp = |id: i64| layout.decode(id).unwrap().timestamp_ms;
    let mut instants: Vec<u64> = issued.iter().map(|&id| stamp(id)).collect();
    instants.dedup();
    assert!(instants.len() > 5, "{} instants", instants.len());
    for &t in &instants[1..] {
        let first: i64 = redis::cmd("LEAF.FROMTIME")
            .arg(t)
            .query_async(&mut con)
            .await
            .unwrap();
        let below = issued.iter().filter(|&&id| stamp(id) < t).max().unwrap();
        let above = issued.iter().filter(|&&id| stamp(id) >= t).min().unwrap();
        assert!(
            *below < first && first <= *above,
            "t={t}: {below} < {first} <= {above}"
        );
        let over_http = common::http_get(server.http_url(&format!("/fromtime/{t}")))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert_eq!(over_http, first.to_string());
    }
    // RFC 3339 in UTC names the same instant as its milliseconds.
    let rfc: i64 = redis::cmd("LEAF.FROMTIME")
        .arg("2025-11-24T16:00:00.123Z")
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(rfc, layout.first_id_at(1_764_000_000_123).unwrap());
    // Any offset names the instant it says, over RESP and HTTP alike, and LEAF.DECODE of the
    // answer gives that instant's milliseconds back.
    for text in [
        "2025-11-24T16:00:00.123Z",
        "2025-11-24T18:00:00.123+02:00",
        "2025-11-24T21:30:00.123+05:30",
        "2025-11-24T10:30:00.123-05:30",
        "2025-11-24T08:00:00.123-08:00",
        "2025-11-24T16:00:00.1234Z",
    ] {
        let id: i64 = redis::cmd("LEAF.FROMTIME")
            .arg(text)
            .query_async(&mut con)
            .await
            .unwrap();
        assert_eq!(id, rfc, "{text}");
        let path = format!("/fromtime/{}", text.replace('+', "%2B"));
        let over_http = common::http_get(server.http_url(&path))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert_eq!(over_http, rfc.to_string(), "{text}");
        let decoded: std::collections::HashMap<String, redis::Value> = redis::cmd("LEAF.DECODE")
            .arg(id)
            .query_async(&mut con)
            .await
            .unwrap();
        assert_eq!(
            decoded.get("timestamp_ms"),
            Some(&redis::Value::Int(1_764_000_000_123)),
            "{text}"
        );
    }
    let with_seconds_offset: i64 = redis::cmd("LEAF.FROMTIME")
        .arg("2025-11-24T18:00:00+02:00")
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(
        with_seconds_offset,
        layout.first_id_at(1_764_000_000_000).unwrap()
    );
    let mut raw = server.raw().await;
    assert_eq!(
        raw.send(&resp(&[b"LEAF.FROMTIME", b"2025-11-24T16:00:00.123"]), 1).await,
        "-ERR '2025-11-24T16:00:00.123' is not a time: it has no offset (add Z for UTC); give UNIX milliseconds or RFC 3339 with an offset (2026-12-03T10:00:00Z, 2026-12-03T12:00:00.250+02:00)\r\n"
    );
    assert_eq!(
        raw.send(&resp(&[b"LEAF.FROMTIME", b"1000"]), 1).await,
        "-ERR 1000 ms is before the snowflake epoch (1288834974657 ms)\r\n"
    );
    assert_eq!(
        raw.send(&resp(&[b"LEAF.FROMTIME", b"soon"]), 1).await,
        "-ERR 'soon' is not a time: it is not an RFC 3339 timestamp; give UNIX milliseconds or RFC 3339 with an offset (2026-12-03T10:00:00Z, 2026-12-03T12:00:00.250+02:00)\r\n"
    );
    let far = (layout.max_timestamp_ms() + 1).to_string();
    let (status, body) = {
        let r = common::http_get(server.http_url(&format!("/fromtime/{far}")))
            .await
            .unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    };
    assert_eq!(status, 400);
    assert!(body.contains("past the last millisecond"), "{body}");
    server.stop().await;
}

/// One config started twice (two nodes on one state directory with one static worker id)
/// would issue the same IDs: the second is refused while the first runs, and starts after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_static_worker_id_is_held_by_one_process_per_fence_file() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::default();
    config.storage.url = format!("sqlite://{}/leafd.db", dir.path().display());
    config.storage.state_dir = dir.path().display().to_string();
    config.snowflake.coordinator = leafd::config::CoordinatorKind::Static;
    config.snowflake.worker_id = 5;
    let config = common::test_config(config);
    let first = leafd::app::App::open(config.clone()).await.unwrap();
    let refused = leafd::app::App::open(config.clone())
        .await
        .err()
        .expect("a second holder of worker id 5 is refused")
        .to_string();
    assert!(
        refused.contains(
            "worker id 5 is in use by another process with the same fence file or state directory"
        ) && refused.contains("snowflake-fence-w5.json.lock"),
        "{refused}"
    );
    // The same state directory with another fence file is refused too.
    let mut elsewhere = config.clone();
    elsewhere.snowflake.fence_file = dir.path().join("other-fence.json").display().to_string();
    let refused = leafd::app::App::open(elsewhere)
        .await
        .err()
        .expect("the same id on the same state directory is refused")
        .to_string();
    assert!(refused.contains("snowflake-w5.lock"), "{refused}");
    first.close().await;
    let second = leafd::app::App::open(config).await.unwrap();
    second.snowflake().unwrap().next_ids(1).await.unwrap();
    second.close().await;
}
