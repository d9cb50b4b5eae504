//! Every error of docs/reference/errors.md that no other test produced, made to happen for
//! real and checked word for word: option errors of LEAF.TAG CREATE, LEAF.TAG REVEAL and
//! LEAF.WORKERS, the snowflake clock, fence, lease and layout replies (SQLite, a manual clock
//! where the clock is the cause), and the binary's start errors on stderr.
//! (`scripts/check-docs.py` checks that each listed error appears in a test.)

mod common;

use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{resp, sqlite_config, RawClient, TestServer};
use leafd::app::App;
use leafd::clock::{Clock, ManualClock, SystemClock};
use leafd::config::{Config, CoordinatorKind, OpaqueTag, TagSeed};
use leafd::engine::snowflake::Layout;

/// One command, its one-line reply (the connection stays usable: checked with a PING).
async fn one_line(raw: &mut RawClient, args: &[&[u8]]) -> String {
    let reply = raw.send(&resp(args), 1).await;
    assert_eq!(raw.send(b"PING\r\n", 1).await, "+PONG\r\n", "after {reply}");
    reply
}

/// Sends `SNOWFLAKE` until its reply starts with `prefix` (or `deadline` passes): a condition
/// a background task (the fence keeper, a lease renewal) notices on its next round.
async fn snowflake_until(raw: &mut RawClient, prefix: &str, within: Duration) -> String {
    let deadline = Instant::now() + within;
    loop {
        let reply = raw.send(&resp(&[b"SNOWFLAKE"]), 1).await;
        if reply.starts_with(prefix) {
            return reply;
        }
        assert!(
            Instant::now() < deadline,
            "no '{prefix}' within {within:?}; last reply {reply}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Runs a statement on a SQLite database file.
async fn sqlite_execute(url: &str, sql: &str) {
    use sqlx::Connection;
    let mut db = sqlx::SqliteConnection::connect(url).await.unwrap();
    sqlx::query(sql).execute(&mut db).await.unwrap();
}

/// The binary with `args` (logs off): its exit status and stderr. Killed if it is still running
/// after 30 s (it was expected to refuse to start).
fn leafd(args: &[&str]) -> (i32, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_leafd"))
        .args(args)
        .env_remove("RUST_BACKTRACE")
        .env_remove("LEAFD_CONFIG")
        .env("RUST_LOG", "off")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("leafd {args:?} still running after 30 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    (status.code().unwrap_or(-1), err)
}

/// `serve` arguments on ports the system picks and a SQLite file in `dir`.
fn serve_args(dir: &std::path::Path) -> Vec<String> {
    vec![
        "--bind".into(),
        "127.0.0.1:0".into(),
        "--http-bind".into(),
        "127.0.0.1:0".into(),
        "--storage-url".into(),
        format!("sqlite://{}/leafd.db", dir.display()),
    ]
}

fn strs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

// ---------------------------------------------------------------- LEAF.TAG

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaf_tag_create_refuses_each_option_out_of_range() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(sqlite_config(&dir)).await;
    let mut raw = server.raw().await;
    let cases: &[(&[&[u8]], &str)] = &[
        (
            &[b"LEAF.TAG", b"CREATE", b"t", b"10", b"ORDER", b"sideways"],
            "-ERR ORDER must be strict or trend, not 'sideways'\r\n",
        ),
        (
            &[b"LEAF.TAG", b"CREATE", b"t", b"10", b"PERIOD", b"weekly"],
            "-ERR PERIOD must be daily, monthly or yearly, not 'weekly'\r\n",
        ),
        (
            &[
                b"LEAF.TAG",
                b"CREATE",
                b"t",
                b"10",
                b"PERIOD",
                b"daily",
                b"ZONE",
                b"Mars/Olympus_Mons",
            ],
            "-ERR ZONE 'Mars/Olympus_Mons' is not an IANA time zone (e.g. UTC, Asia/Shanghai)\r\n",
        ),
        (
            &[
                b"LEAF.TAG", b"CREATE", b"t", b"10", b"PERIOD", b"daily", b"DIGITS", b"99",
            ],
            "-ERR DIGITS must be between 1 and 9 for a daily period\r\n",
        ),
        (
            &[b"LEAF.TAG", b"CREATE", b"t", b"10", b"DIGITS", b"6"],
            "-ERR ZONE, DIGITS and PREFIX belong to a PERIOD\r\n",
        ),
        (
            &[b"LEAF.TAG", b"CREATE", b"t", b"10", b"PREFIX", b"INV"],
            "-ERR ZONE, DIGITS and PREFIX belong to a PERIOD\r\n",
        ),
        (
            &[
                b"LEAF.TAG", b"CREATE", b"t", b"10", b"ORDER", b"trend", b"PERIOD", b"daily",
            ],
            "-ERR a period tag is served in strict order: ORDER trend does not apply\r\n",
        ),
        (
            &[b"LEAF.TAG", b"CREATE", b"t", b"10", b"COLOUR", b"red"],
            "-ERR unknown option 'COLOUR' of LEAF.TAG CREATE: expected ORDER, PERIOD, ZONE, DIGITS or PREFIX\r\n",
        ),
        (
            &[b"LEAF.TAG", b"CREATE", b"t", b"10", b"ORDER"],
            "-ERR ORDER needs a value\r\n",
        ),
        (
            &[
                b"LEAF.TAG", b"CREATE", b"t", b"10", b"ORDER", b"strict", b"ORDER", b"strict",
            ],
            "-ERR ORDER is given twice\r\n",
        ),
        (
            &[b"LEAF.TAG", b"CREATE", b"t", b"10", b"5", b"PERIOD", b"daily"],
            "-ERR a period tag's sequence starts at 1 each period: give no start\r\n",
        ),
        (
            &[b"LEAF.TAG", b"CREATE", b"two words", b"10"],
            "-ERR tag may only contain printable ASCII characters without spaces\r\n",
        ),
        (
            &[b"LEAF.TAG", b"CREATE", b"tab\there", b"10"],
            "-ERR tag may only contain printable ASCII characters without spaces\r\n",
        ),
    ];
    for (command, expected) in cases {
        assert_eq!(&one_line(&mut raw, command).await, expected, "{command:?}");
    }
    // None of them created the tag.
    assert_eq!(
        one_line(&mut raw, &[b"LEAF.TAG", b"CREATE", b"t", b"10"]).await,
        "+OK\r\n"
    );
    // Over HTTP: the same text without the first word, status 400.
    let response = common::http_client()
        .post(server.http_url("/api/segment/tags"))
        .body(r#"{"tag": "h", "step": 5, "order": "sideways"}"#)
        .header("content-type", "application/json")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 400);
    assert_eq!(
        response.text().await.unwrap(),
        "ORDER must be strict or trend, not 'sideways'\n"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaf_tag_reveal_of_a_number_outside_the_opaque_range() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = sqlite_config(&dir);
    config.segment.opaque_key = "a key of at least sixteen characters".into();
    config.segment.opaque.push(OpaqueTag {
        tag: "invoices".into(),
        digits: 10,
    });
    let server = TestServer::start(config).await;
    let mut raw = server.raw().await;
    assert_eq!(
        one_line(&mut raw, &[b"LEAF.TAG", b"REVEAL", b"invoices", b"5"]).await,
        "-ERR 5 is not an opaque ID of tag 'invoices': they are 1000000000 to 9999999999\r\n"
    );
    assert_eq!(
        one_line(
            &mut raw,
            &[b"LEAF.TAG", b"REVEAL", b"invoices", b"10000000000"]
        )
        .await,
        "-ERR 10000000000 is not an opaque ID of tag 'invoices': they are 1000000000 to 9999999999\r\n"
    );
    server.stop().await;
}

// ---------------------------------------------------------------- segment refusals

/// The refusals of a tag's kind and of its row's record, each on the request that meets it:
/// a block of opaque IDs, REVEAL of a plain tag, ORDER for a configured tag, SPLIT of a strict
/// tag, and a row whose record (strict order, another opaque key, opaque IDs below a plain
/// tag's range) this node must not serve; then a table gone from under the node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn segment_requests_refused_by_the_tag_kind_or_its_row() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("leafd.db").display());
    let mut config = sqlite_config(&dir);
    config.segment.opaque_key = "a key of at least sixteen characters".into();
    for tag in ["invoices", "receipts"] {
        config.segment.opaque.push(OpaqueTag {
            tag: tag.into(),
            digits: 10,
        });
    }
    config.segment.tags = vec![
        TagSeed::new("conf", 10),
        TagSeed::new("trend", 10),
        TagSeed::new("plain", 10),
        TagSeed::new("gone", 10),
        TagSeed::new("invoices", 10),
        TagSeed::new("receipts", 10),
    ];
    let server = TestServer::start(config).await;
    let mut raw = server.raw().await;

    assert_eq!(
        one_line(&mut raw, &[b"INCRBY", b"segment:invoices", b"3"]).await,
        "-ERR tag 'invoices' hands out opaque IDs, one per request: a block of 3 is not a range of IDs (use INCR)\r\n"
    );
    assert_eq!(
        one_line(&mut raw, &[b"LEAF.TAG", b"REVEAL", b"conf", b"5"]).await,
        "-ERR tag 'conf' does not hand out opaque IDs\r\n"
    );
    assert_eq!(
        one_line(&mut raw, &[b"LEAF.TAG", b"CREATE", b"conf", b"10", b"ORDER", b"strict"]).await,
        "-ERR tag 'conf' is configured on this node (or this node hands out a split of the ID space): its order and period come from the configuration; create it without ORDER or PERIOD\r\n"
    );
    assert_eq!(
        one_line(
            &mut raw,
            &[
                b"LEAF.TAG",
                b"CREATE",
                b"ordered",
                b"10",
                b"ORDER",
                b"strict"
            ]
        )
        .await,
        "+OK\r\n"
    );
    assert_eq!(
        one_line(&mut raw, &[b"LEAF.TAG", b"SPLIT", b"ordered", b"2", b"1", b"1000"]).await,
        "-ERR tag 'ordered' records order:strict: a strict or period tag has one order across the cluster and cannot be split between clusters; give each data centre its own tag\r\n"
    );

    // Rows changed under the node before its first request of each tag.
    sqlite_execute(
        &url,
        "UPDATE leaf_alloc SET split = 'order:strict' WHERE biz_tag = 'trend'",
    )
    .await;
    sqlite_execute(
        &url,
        "UPDATE leaf_alloc SET opaque = 'd9:0000000000000000' WHERE biz_tag = 'receipts'",
    )
    .await;
    sqlite_execute(
        &url,
        "UPDATE leaf_alloc SET opaque = 'd10:0000000000000000' WHERE biz_tag = 'plain'",
    )
    .await;
    assert_eq!(
        one_line(&mut raw, &[b"INCR", b"segment:trend"]).await,
        "-UNAVAILABLE segment for 'trend' exhausted and IDs refused: tag 'trend' records strict order (order:strict) and this node serves it in trend order, whose buffered IDs would come back out of order; configure order = \"strict\" for the tag on this node\r\n"
    );
    // An opaque tag cannot be configured strict: refused before its key is claimed.
    sqlite_execute(
        &url,
        "UPDATE leaf_alloc SET split = 'order:strict' WHERE biz_tag = 'invoices'",
    )
    .await;
    assert_eq!(
        one_line(&mut raw, &[b"INCR", b"segment:invoices"]).await,
        "-UNAVAILABLE segment for 'invoices' exhausted and opaque IDs refused: tag 'invoices' records order:strict, and opaque IDs are served in trend order only; nothing was written to its row: serve the tag as its row records it, or give the opaque use a tag of its own\r\n"
    );
    let refused = one_line(&mut raw, &[b"INCR", b"segment:receipts"]).await;
    assert!(
        refused.starts_with("-UNAVAILABLE segment for 'receipts' exhausted and opaque IDs refused: the tag served opaque IDs under another key or digit count (recorded d9:0000000000000000"),
        "{refused}"
    );
    let refused = one_line(&mut raw, &[b"INCR", b"segment:plain"]).await;
    assert!(
        refused.starts_with("-UNAVAILABLE segment for 'plain' exhausted and plain IDs refused: the tag served opaque IDs of 10 digits (d10:0000000000000000)"),
        "{refused}"
    );

    // The table is gone: an allocation's statement fails inside its transaction (a write that
    // failed), and the read of a tag the node does not know fails outright (not a lost
    // connection, so the database is said to have failed).
    sqlite_execute(&url, "DROP TABLE leaf_alloc").await;
    assert_eq!(
        one_line(&mut raw, &[b"INCR", b"segment:gone"]).await,
        "-UNAVAILABLE segment for 'gone' exhausted and database write failed: error returned from database: (code: 1) no such table: leaf_alloc\r\n"
    );
    assert_eq!(
        one_line(&mut raw, &[b"INCR", b"segment:unknown"]).await,
        "-UNAVAILABLE segment for 'unknown' exhausted and database failed: database error: error returned from database: (code: 1) no such table: leaf_alloc\r\n"
    );
    server.stop().await;
}

// ---------------------------------------------------------------- LEAF.WORKERS

/// A node started while its database does not answer (nothing listens on the port) cannot read
/// the lease table until it connects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaf_workers_before_the_database_answered() {
    let port = common::binary::free_port();
    let mut config = Config::default();
    config.storage.url = format!("mysql://root@127.0.0.1:{port}/leafd");
    config.storage.acquire_timeout_ms = 300;
    let server = TestServer::start(config).await;
    let mut raw = server.raw().await;
    assert_eq!(
        one_line(&mut raw, &[b"LEAF.WORKERS"]).await,
        "-UNAVAILABLE worker-id lease table: the database has not answered since this node started\r\n"
    );
    server.stop().await;
}

/// SQLite has the table; once it is gone, LEAF.WORKERS says why it cannot read it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaf_workers_when_the_lease_table_cannot_be_read() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = sqlite_config(&dir);
    config.snowflake.enabled = false;
    let url = config.storage.url.clone();
    let server = TestServer::start(config).await;
    let mut raw = server.raw().await;
    assert!(
        one_line(&mut raw, &[b"LEAF.WORKERS"])
            .await
            .starts_with("*"),
        "the table is read while it exists"
    );
    sqlite_execute(&url, "DROP TABLE leaf_worker").await;
    let reply = one_line(&mut raw, &[b"LEAF.WORKERS"]).await;
    assert!(
        reply.starts_with("-UNAVAILABLE worker-id lease table: ")
            && reply.ends_with("no such table: leaf_worker\r\n"),
        "{reply}"
    );
    server.stop().await;
}

// ---------------------------------------------------------------- snowflake

/// A static worker id on SQLite with a clock the test moves: a step back beyond
/// `max_backward_ms`, then a clock past the layout's last timestamp.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snowflake_refuses_a_clock_moved_back_or_past_the_layout() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = sqlite_config(&dir);
    config.snowflake.coordinator = CoordinatorKind::Static;
    config.snowflake.worker_id = 9;
    let now = SystemClock.now_millis();
    let clock = Arc::new(ManualClock::new(now));
    let app = App::open_with_clock(common::test_config(config), clock.clone())
        .await
        .unwrap();
    let server = TestServer::serve_app(app).await;
    let mut raw = server.raw().await;
    assert!(one_line(&mut raw, &[b"SNOWFLAKE"]).await.starts_with(':'));
    clock.set(now - 250);
    assert_eq!(
        one_line(&mut raw, &[b"SNOWFLAKE"]).await,
        "-CLOCKBACK clock moved back 250 ms\r\n"
    );
    clock.set(now);
    assert!(one_line(&mut raw, &[b"SNOWFLAKE"]).await.starts_with(':'));
    let last = Layout::default().max_timestamp_ms();
    clock.set(last + 1);
    assert_eq!(
        one_line(&mut raw, &[b"SNOWFLAKE"]).await,
        "-ERR clock is past the last timestamp the layout can hold\r\n"
    );
    // LEAF.FROMTIME beyond the layout, whatever the clock.
    let past = (last + 1).to_string();
    assert_eq!(
        one_line(&mut raw, &[b"LEAF.FROMTIME", past.as_bytes()]).await,
        format!(
            "-ERR {} ms is past the last millisecond this layout can encode ({last} ms)\r\n",
            last + 1
        )
    );
    server.stop().await;
}

/// The fence file's directory replaced by a file: the fence cannot be extended, and once the
/// clock reaches the last fence written (400 ms window, 100 ms wait) SNOWFLAKE names why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snowflake_unavailable_when_the_time_fence_cannot_be_written() {
    let dir = tempfile::tempdir().unwrap();
    let fence_dir = dir.path().join("fence");
    let fence_file = fence_dir.join("snowflake-fence.json");
    let mut config = sqlite_config(&dir);
    config.snowflake.coordinator = CoordinatorKind::Static;
    config.snowflake.worker_id = 4;
    config.snowflake.fence_file = fence_file.display().to_string();
    config.snowflake.fence_window_ms = 400;
    config.snowflake.fence_wait_ms = 100;
    let server = TestServer::start(config).await;
    let mut raw = server.raw().await;
    assert!(one_line(&mut raw, &[b"SNOWFLAKE"]).await.starts_with(':'));
    std::fs::remove_dir_all(&fence_dir).unwrap();
    std::fs::write(&fence_dir, b"not a directory").unwrap();
    let reply = snowflake_until(
        &mut raw,
        "-UNAVAILABLE snowflake: time fence not extended: ",
        Duration::from_secs(10),
    )
    .await;
    // The fence file of worker id 4 beside the configured name; its directory cannot be made.
    assert_eq!(
        reply,
        format!(
            "-UNAVAILABLE snowflake: time fence not extended: {}: File exists (os error 17)\r\n",
            fence_dir.join("snowflake-fence-w4.json").display()
        )
    );
    // The directory back: the fence is extended again and IDs follow.
    std::fs::remove_file(&fence_dir).unwrap();
    std::fs::create_dir(&fence_dir).unwrap();
    snowflake_until(&mut raw, ":", Duration::from_secs(10)).await;
    server.stop().await;
}

/// `leaf_worker` loses the node's row (a wipe, a restore): the next renewal stops the node,
/// which claims its id again and issues again a lease later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snowflake_unavailable_when_the_lease_table_lost_its_rows() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = sqlite_config(&dir);
    config.snowflake.coordinator = CoordinatorKind::Database;
    config.snowflake.database_lease_ms = 1000;
    let url = config.storage.url.clone();
    let server = TestServer::start(config).await;
    let mut raw = server.raw().await;
    let first = one_line(&mut raw, &[b"SNOWFLAKE"]).await;
    let id: i64 = first.trim_start_matches(':').trim_end().parse().unwrap();
    let worker = Layout::default().decode(id).unwrap().worker_id;
    sqlite_execute(&url, "DELETE FROM leaf_worker WHERE worker_id >= 0").await;
    let reply = snowflake_until(&mut raw, "-UNAVAILABLE", Duration::from_secs(10)).await;
    assert_eq!(
        reply,
        format!(
            "-UNAVAILABLE snowflake: leaf_worker has no row for worker id {worker}: the table lost its rows (a wipe, or a restore); this node stopped issuing and claims worker id {worker} again, then waits a whole lease\r\n"
        )
    );
    snowflake_until(&mut raw, ":", Duration::from_secs(10)).await;
    server.stop().await;
}

/// The table's layout record moves to another layout (as when a node of it won the race to
/// change it): this node stops at its next renewal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snowflake_unavailable_when_the_cluster_layout_changed() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = sqlite_config(&dir);
    config.snowflake.coordinator = CoordinatorKind::Database;
    config.snowflake.database_lease_ms = 1000;
    config.snowflake.worker_id_bits = 4;
    config.snowflake.sequence_bits = 8;
    config.snowflake.time_unit_ms = 10;
    let mine = leafd::app::snowflake_layout(&config.snowflake).descriptor();
    let storage = config.storage.clone();
    let server = TestServer::start(config).await;
    let mut raw = server.raw().await;
    assert!(one_line(&mut raw, &[b"SNOWFLAKE"]).await.starts_with(':'));
    let other = Layout::default().descriptor();
    let store = leafd::storage::open(&storage, false).await.unwrap();
    let recorded = store
        .clone()
        .worker_leases()
        .unwrap()
        .record_layout(Some(&mine), &other)
        .await
        .unwrap();
    assert_eq!(recorded.as_deref(), Some(other.as_str()));
    store.close().await;
    let reply = snowflake_until(&mut raw, "-UNAVAILABLE", Duration::from_secs(10)).await;
    assert_eq!(
        reply,
        format!(
            "-UNAVAILABLE snowflake: the cluster's snowflake layout changed to {other}; this node issues {mine} and stopped\r\n"
        )
    );
    server.stop().await;
}

// ---------------------------------------------------------------- errors at start

#[test]
fn start_refuses_an_unreadable_config_file() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.toml");
    let (code, err) = leafd(&["check-config", "--config", missing.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert_eq!(
        err,
        format!(
            "leafd: cannot read config file {}: No such file or directory (os error 2)\n",
            missing.display()
        )
    );
}

#[test]
fn start_refuses_an_invalid_configuration() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("leafd.toml");
    std::fs::write(
        &file,
        "[snowflake]\ncoordinator = \"static\"\nworker_id = 1024\n",
    )
    .unwrap();
    let (code, err) = leafd(&["check-config", "--config", file.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert_eq!(
        err,
        "leafd: invalid configuration: snowflake.worker_id 1024 does not fit in 10 bits\n"
    );
}

#[test]
fn start_refuses_a_port_in_use() {
    let dir = tempfile::tempdir().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let mut args = serve_args(dir.path());
    args[1] = format!("127.0.0.1:{port}");
    let (code, err) = leafd(&strs(&args));
    assert_eq!(code, 1);
    assert_eq!(
        err,
        format!(
            "leafd: cannot listen on 127.0.0.1:{port} (server.bind): Address already in use (os error 98)\n"
        )
    );
}

#[test]
fn start_refuses_tls_files_it_cannot_read() {
    let dir = tempfile::tempdir().unwrap();
    let cert = dir.path().join("no-cert.pem");
    let key = dir.path().join("no-key.pem");
    let file = dir.path().join("leafd.toml");
    std::fs::write(
        &file,
        format!(
            "[tls]\nbind = \"127.0.0.1:0\"\ncert_file = \"{}\"\nkey_file = \"{}\"\n",
            cert.display(),
            key.display()
        ),
    )
    .unwrap();
    let mut args = serve_args(dir.path());
    args.extend(["--config".to_string(), file.display().to_string()]);
    let (code, err) = leafd(&strs(&args));
    assert_eq!(code, 1);
    assert_eq!(
        err,
        format!(
            "leafd: cannot set up TLS: cannot read certificate file {}: I/O error: No such file or directory (os error 2)\n",
            cert.display()
        )
    );
}

#[test]
fn start_refuses_an_unsupported_storage_url() {
    let dir = tempfile::tempdir().unwrap();
    let mut args = serve_args(dir.path());
    args[5] = "redis://127.0.0.1:6379/0".into();
    let (code, err) = leafd(&strs(&args));
    assert_eq!(code, 1);
    assert_eq!(
        err,
        "leafd: cannot start leafd: storage: unsupported storage url 'redis://127.0.0.1:6379/0': expected sqlite://, mysql:// or postgres://\n"
    );
}

#[test]
fn start_refuses_unreadable_segment_marks() {
    let dir = tempfile::tempdir().unwrap();
    let slots = ["a", "b"].map(|s| dir.path().join(format!("segment-marks.json.{s}")));
    for slot in &slots {
        std::fs::write(slot, b"garbage").unwrap();
    }
    let (code, err) = leafd(&strs(&serve_args(dir.path())));
    assert_eq!(code, 1);
    assert_eq!(
        err,
        format!(
            "leafd: cannot start leafd: storage: segment marks unreadable ({}: expected value at line 1 column 1; {}: expected value at line 1 column 1): this node no longer knows the highest IDs it served. Restore the files, or move every tag past the database with LEAF.TAG SKIPALL <n> on another node and delete them, or set storage.discard_unreadable_marks = true to start without them\n",
            slots[0].display(),
            slots[1].display()
        )
    );
}

/// A view named `leaf_alloc`: the first migration's `CREATE TABLE IF NOT EXISTS` passes it by,
/// the third cannot add a column to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_refuses_a_database_whose_migration_fails() {
    use sqlx::ConnectOptions;
    let dir = tempfile::tempdir().unwrap();
    let mut db = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(dir.path().join("leafd.db"))
        .create_if_missing(true)
        .connect()
        .await
        .unwrap();
    sqlx::query("CREATE VIEW leaf_alloc AS SELECT 'x' AS biz_tag")
        .execute(&mut db)
        .await
        .unwrap();
    drop(db);
    let args = serve_args(dir.path());
    let (code, err) = tokio::task::spawn_blocking(move || leafd(&strs(&args)))
        .await
        .unwrap();
    assert_eq!(code, 1);
    assert_eq!(
        err,
        "leafd: cannot start leafd: storage: database migration failed: while executing migration 3: error returned from database: (code: 1) Cannot add a column to a view\n"
    );
}

/// The static coordinator's worker id held by a running node on the same state directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_refuses_a_static_worker_id_another_process_holds() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = sqlite_config(&dir);
    config.snowflake.coordinator = CoordinatorKind::Static;
    config.snowflake.worker_id = 7;
    let holder = TestServer::start(config).await;
    let file = dir.path().join("leafd.toml");
    std::fs::write(
        &file,
        "[snowflake]\ncoordinator = \"static\"\nworker_id = 7\n",
    )
    .unwrap();
    let mut args = serve_args(dir.path());
    args.extend(["--config".to_string(), file.display().to_string()]);
    let (code, err) = tokio::task::spawn_blocking(move || leafd(&strs(&args)))
        .await
        .unwrap();
    assert_eq!(code, 1);
    assert_eq!(
        err,
        format!(
            "leafd: cannot start leafd: snowflake worker id: no free worker id: worker id 7 is in use by another process with the same fence file or state directory ({} is locked): give each node its own snowflake.worker_id and state directory\n",
            dir.path().join("snowflake-fence-w7.json.lock").display()
        )
    );
    holder.stop().await;
}
