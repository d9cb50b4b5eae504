//! The segment client scenarios on MariaDB/MySQL and PostgreSQL, several nodes on one
//! database, and bad database configuration. Needs LEAFD_TEST_MYSQL_URL / LEAFD_TEST_POSTGRES_URL.

mod common;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use common::backends::Backend;
use common::proxy::{split_server_url, TcpProxy};
use common::scenarios::{self, create_tag, unique_tag};
use common::{resp, TestServer};
use leafd::app::App;
use leafd::config::Config;
use sqlx::Connection;

fn config_for(url: &str) -> Config {
    let mut config = Config::default();
    config.storage.url = url.to_string();
    config
}

/// Three nodes on one database, 32 clients spread over them, 300,000 IDs of one tag with step
/// 100: no duplicate, and each connection's IDs increase.
async fn three_nodes_share_one_database(url: &str) {
    let nodes = vec![
        TestServer::start(config_for(url)).await,
        TestServer::start(config_for(url)).await,
        TestServer::start(config_for(url)).await,
    ];
    let tag = unique_tag("multi");
    create_tag(&nodes[0], &tag, 100, None).await;
    let key = format!("segment:{tag}");
    let per_client = 300_000 / 32;
    let mut tasks = Vec::new();
    for c in 0..32 {
        let mut con = nodes[c % 3].client().await;
        let key = key.clone();
        tasks.push(tokio::spawn(async move {
            let mut ids = Vec::with_capacity(per_client);
            let mut left = per_client;
            while left > 0 {
                let batch = left.min(100);
                let mut pipe = redis::pipe();
                for _ in 0..batch {
                    pipe.cmd("INCR").arg(&key);
                }
                let got: Vec<i64> = pipe.query_async(&mut con).await.unwrap();
                ids.extend(got);
                left -= batch;
            }
            ids
        }));
    }
    let mut seen = HashSet::new();
    for task in tasks {
        let ids = task.await.unwrap();
        assert!(
            ids.windows(2).all(|w| w[0] < w[1]),
            "IDs of a connection increase"
        );
        for id in ids {
            assert!(seen.insert(id), "duplicate ID {id} across nodes");
        }
    }
    assert_eq!(seen.len(), per_client * 32);
    for node in nodes {
        node.stop().await;
    }
}

/// A wrong password, a missing database or a missing table (with migrations off) are clear
/// errors at start, not panics; an unreachable server is not fatal (see database_down_at_start).
async fn bad_configuration_is_a_clear_error(backend: Backend, server_url: &str, fresh_db: &str) {
    let refused = match backend {
        Backend::MySql => {
            server_url.replacen("mysql://root@", "mysql://root:wrong-password@", 1) + "/test"
        }
        Backend::Postgres => server_url.to_string() + "/no_such_database_leafd",
    };
    let mut config = config_for(&refused);
    config.storage.acquire_timeout_ms = 2000;
    let err = match App::open(config).await {
        Ok(_) => panic!("{refused} must not start"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.starts_with("storage: database error:"),
        "{refused}: {err}"
    );

    let mut config = config_for(fresh_db);
    config.storage.migrate = false;
    let err = match App::open(config).await {
        Ok(_) => panic!("a database without leaf_alloc must not start when migrate = false"),
        Err(e) => e.to_string(),
    };
    // leaf_worker (the worker-id leases) is looked up first, then leaf_alloc.
    assert!(
        err.contains("leaf_alloc") || err.contains("leaf_worker"),
        "names the missing table: {err}"
    );
}

/// The database URL `url` (`scheme://user@host:port/db`) routed through a new proxy.
async fn through_proxy(url: &str, start_up: bool) -> (TcpProxy, String) {
    let (prefix, target) = split_server_url(url);
    let proxy = TcpProxy::start(target.clone(), start_up).await;
    let routed = url.replacen(
        &format!("{prefix}{target}"),
        &format!("{prefix}{}", proxy.addr),
        1,
    );
    (proxy, routed)
}

async fn incr(raw: &mut common::RawClient, tag: &str) -> String {
    raw.send(&resp(&[b"INCR", format!("segment:{tag}").as_bytes()]), 1)
        .await
}

/// Started while the database is unreachable, with the default (database) coordinator: the
/// process stays up and not ready, PING works, segment and snowflake commands are UNAVAILABLE
/// with the cause, and once the database answers it becomes ready and serves both kinds of ID
/// without a restart.
async fn database_down_at_start(url: &str) {
    let (proxy, routed) = through_proxy(url, false).await;
    let mut config = config_for(&routed);
    assert_eq!(
        config.snowflake.coordinator,
        leafd::config::CoordinatorKind::Database
    );
    config.storage.acquire_timeout_ms = 500;
    let server = TestServer::start(config).await;
    assert!(!server.app.storage_ready());
    assert_eq!(server.app.readiness(), Err("segment storage not connected"));
    let mut raw = server.raw().await;
    assert_eq!(raw.send(b"PING\r\n", 1).await, "+PONG\r\n");
    let reply = incr(&mut raw, "early").await;
    assert!(
        reply.starts_with("-UNAVAILABLE segment for 'early' exhausted and database unreachable: "),
        "{reply}"
    );
    let reply = raw.send(b"SNOWFLAKE\r\n", 1).await;
    assert!(
        reply.starts_with("-UNAVAILABLE snowflake: no worker id held yet"),
        "{reply}"
    );
    proxy.restore();
    let deadline = Instant::now() + Duration::from_secs(20);
    while server.app.readiness().is_err() {
        assert!(Instant::now() < deadline, "never became ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let reply = raw.send(b"SNOWFLAKE\r\n", 1).await;
    assert!(reply.starts_with(':'), "{reply}");
    let tag = unique_tag("late");
    create_tag(&server, &tag, 10, None).await;
    assert_eq!(incr(&mut raw, &tag).await, ":1\r\n");
    server.stop().await;
}

/// Started while the database is unreachable, with a snowflake layout other than the one a
/// live node holds a lease in: once the database answers, the worker id is refused, and
/// SNOWFLAKE says why (the layout) instead of "has not answered since the start"; no ID.
async fn database_down_at_start_then_layout_refused(url: &str) {
    let holder = TestServer::start(config_for(url)).await;
    let (proxy, routed) = through_proxy(url, false).await;
    let mut config = config_for(&routed);
    config.storage.acquire_timeout_ms = 500;
    config.snowflake.time_unit_ms = 10;
    let server = TestServer::start(config).await;
    let mut raw = server.raw().await;
    let reply = raw.send(b"SNOWFLAKE\r\n", 1).await;
    assert!(
        reply.contains("has not answered since the start"),
        "{reply}"
    );
    proxy.restore();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let reply = raw.send(b"SNOWFLAKE\r\n", 1).await;
        if reply.contains("the worker id was refused") {
            assert!(
                reply.starts_with("-UNAVAILABLE snowflake: no worker id held yet: the database answered but the worker id was refused: ")
                    && reply.contains("layout change refused"),
                "{reply}"
            );
            break;
        }
        assert!(
            reply.starts_with("-UNAVAILABLE snowflake: no worker id held yet"),
            "{reply}"
        );
        assert!(Instant::now() < deadline, "still: {reply}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let body = common::http_get(server.http_url("/api/snowflake/get/any"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(body.contains("layout change refused"), "{body}");
    server.stop().await;
    holder.stop().await;
}

/// The connection to the database is cut at run time: both buffers are served, then
/// UNAVAILABLE within the load timeout, then recovery once the connection is restored.
async fn outage_at_run_time(url: &str) {
    let (proxy, routed) = through_proxy(url, true).await;
    let mut config = config_for(&routed);
    config.storage.acquire_timeout_ms = 500;
    config.segment.adaptive_step = false;
    config.segment.load_timeout_ms = 500;
    let server = TestServer::start(config).await;
    let tag = unique_tag("outage");
    create_tag(&server, &tag, 100, None).await;
    let mut raw = server.raw().await;
    for expected in 1..=10 {
        assert_eq!(incr(&mut raw, &tag).await, format!(":{expected}\r\n"));
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while server
        .app
        .segments
        .snapshot()
        .iter()
        .all(|t| t.next.is_none())
    {
        assert!(Instant::now() < deadline, "next segment never preloaded");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    proxy.cut();
    for expected in 11..=200 {
        assert_eq!(incr(&mut raw, &tag).await, format!(":{expected}\r\n"));
    }
    let started = Instant::now();
    let reply = incr(&mut raw, &tag).await;
    assert!(reply.starts_with("-UNAVAILABLE segment for"), "{reply}");
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "took {:?}",
        started.elapsed()
    );
    proxy.restore();
    let deadline = Instant::now() + Duration::from_secs(20);
    let first = loop {
        let reply = incr(&mut raw, &tag).await;
        if let Some(id) = reply.strip_prefix(':') {
            break id.trim().parse::<i64>().unwrap();
        }
        assert!(Instant::now() < deadline, "no recovery: {reply}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        first > 200,
        "after recovery IDs continue above 200, got {first}"
    );
    server.stop().await;
}

/// The database goes back in time between two runs of a node (as when a backup taken after
/// the tag was created is restored): the node refuses the old range with ROLLBACK, and serves
/// again, above everything it served, once an operator moved the tag forward.
async fn a_database_gone_back_is_refused_until_skipped(url: &str) {
    let state = tempfile::tempdir().unwrap();
    let mut config = config_for(url);
    config.storage.state_dir = state.path().display().to_string();
    let server = TestServer::start(config.clone()).await;
    let tag = unique_tag("rollback");
    create_tag(&server, &tag, 100, None).await;
    let mut raw = server.raw().await;
    let mut highest = 0i64;
    for _ in 0..250 {
        highest = incr(&mut raw, &tag).await[1..].trim().parse().unwrap();
    }
    assert_eq!(highest, 250);
    server.stop().await;

    // "Restore the backup": the row as it was right after CREATE.
    let restore = format!("UPDATE leaf_alloc SET max_id = 0 WHERE biz_tag = '{tag}'");
    Backend::of(url).execute(url, &restore).await;

    let server = TestServer::start(config).await;
    let mut raw = server.raw().await;
    let refused = incr(&mut raw, &tag).await;
    assert!(
        refused.starts_with(&format!(
            "-ROLLBACK tag '{tag}': the database returned IDs from 1, at or below "
        )),
        "{refused}"
    );
    assert_eq!(
        incr(&mut raw, &tag).await,
        refused,
        "refused until moved on"
    );
    let metrics = common::http_get(server.http_url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains(&format!("leafd_segment_rollbacks_total{{tag=\"{tag}\"}} ")),
        "{metrics}"
    );
    let moved = raw
        .send(&resp(&[b"LEAF.TAG", b"SKIPALL", b"1000"]), 1)
        .await;
    assert!(moved.starts_with('*') || moved.starts_with('%'), "{moved}");
    let _ = raw.read_lines(0).await;
    let mut after = server.raw().await;
    // The back-off after the refused load may still run: retry for a little while.
    let deadline = Instant::now() + Duration::from_secs(10);
    let next = loop {
        let reply = incr(&mut after, &tag).await;
        if let Some(id) = reply.strip_prefix(':') {
            break id.trim().parse::<i64>().unwrap();
        }
        assert!(Instant::now() < deadline, "{reply}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        next > highest,
        "{next} must be above every ID served before ({highest})"
    );
    server.stop().await;
}

/// The writer a row records, whatever its dialect.
async fn writer_of(url: &str, tag: &str) -> String {
    let sql = format!("SELECT writer FROM leaf_alloc WHERE biz_tag = '{tag}'");
    if url.starts_with("mysql") {
        let mut db = sqlx::MySqlConnection::connect(url).await.unwrap();
        sqlx::query_scalar(&sql).fetch_one(&mut db).await.unwrap()
    } else {
        let mut db = sqlx::PgConnection::connect(url).await.unwrap();
        sqlx::query_scalar(&sql).fetch_one(&mut db).await.unwrap()
    }
}

/// A lossy failover, as the nodes see it: the database now answering lost the tag's last
/// allocations and is another instance than the one that made them. Two nodes served from the
/// lost ranges; after the "failover" each one's first allocation skips `failover_margin` IDs, so
/// neither repeats an ID nor refuses the range as a rollback; and the skip is counted. With the
/// margin at 0 the node that had loaded the lost range refuses it (ROLLBACK), the other one
/// would serve it again: the margin is what keeps the cluster unique.
async fn a_failover_skips_the_margin(url: &str) {
    let states = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let node_config = |state: &tempfile::TempDir, margin: i64| {
        let mut config = config_for(url);
        config.storage.state_dir = state.path().display().to_string();
        config.segment.adaptive_step = false;
        config.segment.failover_margin = margin;
        config
    };
    let tag = unique_tag("failover");
    let open_tag = unique_tag("nomargin");
    let mut served = HashSet::new();
    let instance = {
        let a = TestServer::start(node_config(&states[0], 100_000)).await;
        let b = TestServer::start(node_config(&states[1], 100_000)).await;
        create_tag(&a, &tag, 100, None).await;
        create_tag(&a, &open_tag, 100, None).await;
        let mut raw_a = a.raw().await;
        let mut raw_b = b.raw().await;
        for _ in 0..150 {
            for (raw, t) in [(0, &tag), (1, &tag), (0, &open_tag)] {
                let raw = if raw == 0 { &mut raw_a } else { &mut raw_b };
                let reply = incr(raw, t).await;
                let id: i64 = reply[1..].trim().parse().unwrap();
                assert!(served.insert((t.clone(), id)), "{t} {id}");
            }
        }
        let writer = writer_of(url, &tag).await;
        let expected = if url.starts_with("mysql") {
            "mysql:server_id:"
        } else {
            "postgres:"
        };
        assert!(
            writer.starts_with(expected),
            "the row names its writer: {writer}"
        );
        a.stop().await;
        b.stop().await;
        writer
    };
    // The "new primary": the rows as they were after the first allocation, marked by another
    // instance.
    Backend::of(url)
        .execute(
            url,
            &format!(
                "UPDATE leaf_alloc SET max_id = 100, writer = 'the old primary' \
             WHERE biz_tag IN ('{tag}', '{open_tag}')"
            ),
        )
        .await;

    let a = TestServer::start(node_config(&states[0], 100_000)).await;
    let b = TestServer::start(node_config(&states[1], 100_000)).await;
    let mut raw_a = a.raw().await;
    let mut raw_b = b.raw().await;
    let first_a = incr(&mut raw_a, &tag).await;
    let first_b = incr(&mut raw_b, &tag).await;
    // One of them skipped past 100 + 100,000; the other loaded the range after it.
    let mut firsts: Vec<i64> = [&first_a, &first_b]
        .iter()
        .map(|r| r[1..].trim().parse().unwrap_or_else(|_| panic!("{r}")))
        .collect();
    firsts.sort();
    assert_eq!(firsts, vec![100_101, 100_201], "{first_a} {first_b}");
    for _ in 0..300 {
        for raw in [&mut raw_a, &mut raw_b] {
            let reply = incr(raw, &tag).await;
            let id: i64 = reply[1..]
                .trim()
                .parse()
                .unwrap_or_else(|_| panic!("{reply}"));
            assert!(served.insert((tag.clone(), id)), "repeated {id}");
        }
    }
    assert_eq!(
        writer_of(url, &tag).await,
        instance,
        "the row names the instance answering now"
    );
    let metrics = common::http_get(a.http_url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let skips = format!("leafd_segment_failover_skips_total{{tag=\"{tag}\"}} ");
    assert!(metrics.contains(&skips), "{metrics}");
    a.stop().await;
    b.stop().await;

    // Without a margin: the node that served up to 300 refuses the range from 101.
    let a = TestServer::start(node_config(&states[0], 0)).await;
    let mut raw_a = a.raw().await;
    let refused = incr(&mut raw_a, &open_tag).await;
    assert!(
        refused.starts_with(&format!(
            "-ROLLBACK tag '{open_tag}': the database returned IDs from 101"
        )),
        "{refused}"
    );
    a.stop().await;
}

/// PostgreSQL: a deferred constraint trigger makes the COMMIT fail after `UPDATE … RETURNING`
/// returned its row (as a full disk does on SQLite). The node serves nothing of that range,
/// replies `UNAVAILABLE … database write failed: <cause>`, the row keeps its `max_id`, and once
/// commits pass again the node serves the very range that was refused: it was never handed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_failed_commit_hands_out_nothing() {
    let Some(url) = Backend::Postgres
        .fresh_database("postgres_a_failed_commit_hands_out_nothing")
        .await
    else {
        return;
    };
    let state = tempfile::tempdir().unwrap();
    let mut config = config_for(&url);
    config.storage.state_dir = state.path().display().to_string();
    config.segment.adaptive_step = false;
    let server = TestServer::start(config).await;
    let tag = unique_tag("commitfail");
    create_tag(&server, &tag, 100, None).await;
    let mut db = sqlx::PgConnection::connect(&url).await.unwrap();
    for statement in [
        "CREATE TABLE refuse_commit (biz_tag VARCHAR(128) PRIMARY KEY)",
        "CREATE FUNCTION refuse_commit() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
         IF EXISTS (SELECT 1 FROM refuse_commit WHERE biz_tag = NEW.biz_tag) THEN \
         RAISE EXCEPTION 'commit refused by the test'; END IF; RETURN NULL; END $$",
        "CREATE CONSTRAINT TRIGGER refuse_commit AFTER UPDATE ON leaf_alloc \
         DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION refuse_commit()",
    ] {
        sqlx::query(statement).execute(&mut db).await.unwrap();
    }
    sqlx::query("INSERT INTO refuse_commit VALUES ($1)")
        .bind(&tag)
        .execute(&mut db)
        .await
        .unwrap();
    let mut raw = server.raw().await;
    let refused = incr(&mut raw, &tag).await;
    assert!(
        refused.starts_with(&format!(
            "-UNAVAILABLE segment for '{tag}' exhausted and database write failed: "
        )) && refused.contains("commit refused by the test"),
        "{refused}"
    );
    let max_id: i64 = sqlx::query_scalar("SELECT max_id FROM leaf_alloc WHERE biz_tag = $1")
        .bind(&tag)
        .fetch_one(&mut db)
        .await
        .unwrap();
    assert_eq!(
        max_id, 1,
        "the failed commit left the row as it was (created at start 1)"
    );

    sqlx::query("DELETE FROM refuse_commit")
        .execute(&mut db)
        .await
        .unwrap();
    // The load backs off for up to a few hundred ms after the failure.
    let deadline = Instant::now() + Duration::from_secs(5);
    let first = loop {
        let reply = incr(&mut raw, &tag).await;
        if reply.starts_with(':') {
            break reply;
        }
        assert!(Instant::now() < deadline, "still refused: {reply}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(first.trim(), ":1", "the refused range was never served");
    server.stop().await;
}

macro_rules! backend_tests {
    ($module:ident, $backend:expr) => {
        mod $module {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn fresh_tag_counts_from_one() {
                let Some(url) = $backend
                    .fresh_database(concat!(stringify!($module), "::fresh_tag_counts_from_one"))
                    .await
                else {
                    return;
                };
                let server = TestServer::start(config_for(&url)).await;
                scenarios::fresh_tag_counts_from_one(&server).await;
                server.stop().await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn concurrent_incrs_are_unique() {
                let Some(url) = $backend
                    .fresh_database(concat!(
                        stringify!($module),
                        "::concurrent_incrs_are_unique"
                    ))
                    .await
                else {
                    return;
                };
                let server = TestServer::start(config_for(&url)).await;
                scenarios::concurrent_incrs_are_unique(&server, 100_000, 16).await;
                server.stop().await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn incrby_blocks_never_overlap() {
                let Some(url) = $backend
                    .fresh_database(concat!(
                        stringify!($module),
                        "::incrby_blocks_never_overlap"
                    ))
                    .await
                else {
                    return;
                };
                let server = TestServer::start(config_for(&url)).await;
                scenarios::incrby_blocks_never_overlap(&server).await;
                server.stop().await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn the_end_of_the_id_space() {
                let Some(url) = $backend
                    .fresh_database(concat!(stringify!($module), "::the_end_of_the_id_space"))
                    .await
                else {
                    return;
                };
                let server = TestServer::start(config_for(&url)).await;
                scenarios::the_end_of_the_id_space_is_refused_and_the_row_kept(&server).await;
                server.stop().await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn tags_created_on_first_use() {
                let Some(url) = $backend
                    .fresh_database(concat!(stringify!($module), "::auto_create"))
                    .await
                else {
                    return;
                };
                scenarios::tags_created_on_first_use(&url).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn opaque_ids() {
                let Some(url) = $backend
                    .fresh_database(concat!(stringify!($module), "::opaque_ids"))
                    .await
                else {
                    return;
                };
                scenarios::opaque_ids(&url).await;
            }

            /// Three rounds of six nodes started at once, each round on a fresh database.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn nodes_started_at_once_all_come_up() {
                for round in 0..3 {
                    let Some(url) = $backend
                        .fresh_database(&format!("{}::at_once_{round}", stringify!($module)))
                        .await
                    else {
                        return;
                    };
                    scenarios::nodes_started_at_once_all_come_up(&url, 6).await;
                }
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_failover_skips_the_margin() {
                let Some(url) = $backend
                    .fresh_database(concat!(stringify!($module), "::a_failover_skips"))
                    .await
                else {
                    return;
                };
                super::a_failover_skips_the_margin(&url).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_database_gone_back_is_refused_until_skipped() {
                let Some(url) = $backend
                    .fresh_database(concat!(stringify!($module), "::a_database_gone_back"))
                    .await
                else {
                    return;
                };
                super::a_database_gone_back_is_refused_until_skipped(&url).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn the_tag_list_is_read_page_by_page() {
                let Some(url) = $backend
                    .fresh_database(concat!(stringify!($module), "::the_tag_list_paged"))
                    .await
                else {
                    return;
                };
                scenarios::the_tag_list_is_read_page_by_page(&url).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn three_nodes_share_one_database() {
                let Some(url) = $backend
                    .fresh_database(concat!(
                        stringify!($module),
                        "::three_nodes_share_one_database"
                    ))
                    .await
                else {
                    return;
                };
                super::three_nodes_share_one_database(&url).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn database_down_at_start() {
                let Some(url) = $backend
                    .fresh_database(concat!(stringify!($module), "::database_down_at_start"))
                    .await
                else {
                    return;
                };
                super::database_down_at_start(&url).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn database_down_at_start_then_layout_refused() {
                let Some(url) = $backend
                    .fresh_database(concat!(
                        stringify!($module),
                        "::database_down_at_start_then_layout_refused"
                    ))
                    .await
                else {
                    return;
                };
                super::database_down_at_start_then_layout_refused(&url).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn outage_at_run_time() {
                let Some(url) = $backend
                    .fresh_database(concat!(stringify!($module), "::outage_at_run_time"))
                    .await
                else {
                    return;
                };
                super::outage_at_run_time(&url).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn bad_configuration_is_a_clear_error() {
                let name = concat!(stringify!($module), "::bad_configuration_is_a_clear_error");
                let Some(server) = $backend.server_url(name) else {
                    return;
                };
                let fresh = $backend.fresh_database(name).await.unwrap();
                super::bad_configuration_is_a_clear_error($backend, &server, &fresh).await;
            }
        }
    };
}

backend_tests!(mysql, Backend::MySql);
backend_tests!(postgres, Backend::Postgres);
