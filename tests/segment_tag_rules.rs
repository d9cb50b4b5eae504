//! A tag's order and period are the row's, not a node's: a node configured for trend order
//! beside strict nodes hands out nothing of a strict tag; strict and period tags created at
//! run time (LEAF.TAG CREATE … ORDER / PERIOD, POST /api/segment/tags) are served as recorded
//! by nodes that do not configure them. SQLite always; MariaDB and PostgreSQL with
//! LEAFD_TEST_MYSQL_URL / _POSTGRES_URL.

mod common;

use std::collections::HashMap;
use std::sync::Arc;

use common::backends::Backend;
use common::{test_config, TestServer};
use leafd::app::App;
use leafd::clock::{Clock, ManualClock};
use leafd::config::{Config, TagOrder, TagSeed};

/// 2026-12-05T12:00:00+08:00.
const NOON_MS: u64 = 1_796_443_200_000;

async fn node(url: &str, tags: Vec<TagSeed>, clock: Arc<dyn Clock>) -> TestServer {
    let mut config = Config::default();
    config.storage.url = url.to_string();
    config.segment.tags = tags;
    let app = App::open_with_clock(test_config(config), clock)
        .await
        .expect("leafd starts");
    TestServer::serve_app(app).await
}

async fn incr(con: &mut redis::aio::MultiplexedConnection, tag: &str) -> Result<i64, String> {
    redis::cmd("INCR")
        .arg(format!("segment:{tag}"))
        .query_async(con)
        .await
        .map_err(|e| e.to_string())
}

async fn create(con: &mut redis::aio::MultiplexedConnection, args: &str) -> Result<String, String> {
    let mut cmd = redis::cmd("LEAF.TAG");
    cmd.arg("CREATE");
    for arg in args.split_whitespace() {
        cmd.arg(arg);
    }
    cmd.query_async(con).await.map_err(|e| e.to_string())
}

fn strict(tag: &str) -> TagSeed {
    TagSeed {
        order: TagOrder::Strict,
        ..TagSeed::new(tag, 100)
    }
}

/// Two strict nodes and one configured for trend order: the trend node is refused with both
/// rules named, every time, and the strict nodes' IDs, alternating, strictly increase.
async fn a_trend_node_beside_strict_nodes(url: &str) {
    let clock: Arc<dyn Clock> = Arc::new(ManualClock::new(NOON_MS));
    let a = node(url, vec![strict("s")], clock.clone()).await;
    let b = node(url, vec![strict("s")], clock.clone()).await;
    let c = node(url, vec![TagSeed::new("s", 100)], clock.clone()).await;
    let (mut ca, mut cb, mut cc) = (a.client().await, b.client().await, c.client().await);
    let mut ids = Vec::new();
    for i in 0..200 {
        let con = if i % 2 == 0 { &mut ca } else { &mut cb };
        ids.push(incr(con, "s").await.unwrap());
        if i % 10 == 0 {
            let refused = incr(&mut cc, "s").await.unwrap_err();
            assert!(
                refused.contains("IDs refused: tag 's' records strict order (order:strict) and this node serves it in trend order"),
                "{refused}"
            );
        }
    }
    // Each refused allocation of the trend node skipped its range (nothing of it is served).
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "out of order: {ids:?}");
    for n in [a, b, c] {
        n.stop().await;
    }
}

/// Strict and period tags created at run time are recorded in their rows: nodes that do not
/// configure them serve them as recorded; a node configured otherwise is refused; bad options
/// are refused with the option named.
async fn rules_created_at_run_time(url: &str) {
    let clock: Arc<dyn Clock> = Arc::new(ManualClock::new(NOON_MS));
    let a = node(url, vec![], clock.clone()).await;
    let b = node(url, vec![], clock.clone()).await;
    let (mut ca, mut cb) = (a.client().await, b.client().await);
    assert_eq!(
        create(&mut ca, "rs 100 ORDER strict").await,
        Ok("OK".into())
    );
    assert_eq!(
        create(
            &mut ca,
            "rd 100 PERIOD daily ZONE Asia/Shanghai DIGITS 4 PREFIX INV"
        )
        .await,
        Ok("OK".into())
    );
    let mut ids = Vec::new();
    for i in 0..100 {
        let con = if i % 2 == 0 { &mut ca } else { &mut cb };
        ids.push(incr(con, "rs").await.unwrap());
    }
    assert_eq!(ids, (1..=100).collect::<Vec<_>>());
    assert_eq!(incr(&mut cb, "rd").await, Ok(202612050001));
    let code: String = redis::cmd("LEAF.CODE")
        .arg("rd")
        .query_async(&mut ca)
        .await
        .unwrap();
    assert_eq!(code, "INV202612050002");
    let tags: Vec<HashMap<String, redis::Value>> =
        redis::cmd("LEAF.TAGS").query_async(&mut cb).await.unwrap();
    let row = |tag: &str| {
        tags.iter()
            .find(|t| t["tag"] == redis::Value::BulkString(tag.as_bytes().to_vec()))
            .cloned()
            .unwrap()
    };
    let text = |row: &HashMap<String, redis::Value>, key: &str| {
        redis::from_redis_value::<String>(row[key].clone()).unwrap()
    };
    assert_eq!(text(&row("rs"), "order"), "strict");
    assert_eq!(text(&row("rd"), "period"), "daily Asia/Shanghai 4");
    assert_eq!(row("rd")["table_step"], redis::Value::Int(100));

    // Over HTTP, with the configuration's key names.
    let response = common::http_client()
        .post(b.http_url("/api/segment/tags"))
        .header("content-type", "application/json")
        .body(
            serde_json::json!({
                "tag": "hm", "step": 10, "period": "monthly", "time_zone": "UTC",
                "sequence_digits": 5, "prefix": "M-"
            })
            .to_string(),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    let code: String = redis::cmd("LEAF.CODE")
        .arg("hm")
        .query_async(&mut ca)
        .await
        .unwrap();
    assert_eq!(code, "M-20261200001");
    let response = common::http_client()
        .post(b.http_url("/api/segment/tags"))
        .header("content-type", "application/json")
        .body(serde_json::json!({ "tag": "hx", "step": 10, "order": "sideways" }).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    assert_eq!(
        response.text().await.unwrap(),
        "ORDER must be strict or trend, not 'sideways'\n"
    );

    // A node configured otherwise for a run-time tag is refused, naming both rules.
    let c = node(url, vec![TagSeed::new("rs", 100)], clock.clone()).await;
    let refused = incr(&mut c.client().await, "rs").await.unwrap_err();
    assert!(
        refused.contains("records strict order (order:strict)"),
        "{refused}"
    );
    let next = incr(&mut ca, "rs").await.unwrap();
    assert!(next > 100, "{next}");

    for (args, error) in [
        (
            "x 10 PERIOD weekly",
            "PERIOD must be daily, monthly or yearly, not 'weekly'",
        ),
        (
            "x 10 ORDER sideways",
            "ORDER must be strict or trend, not 'sideways'",
        ),
        (
            "x 10 5 PERIOD daily",
            "a period tag's sequence starts at 1 each period: give no start",
        ),
        (
            "x 10 DIGITS 4",
            "ZONE, DIGITS and PREFIX belong to a PERIOD",
        ),
        (
            "x 10 PERIOD daily DIGITS 10",
            "DIGITS must be between 1 and 9 for a daily period",
        ),
        (
            "x 10 PERIOD daily ZONE Mars/Base",
            "ZONE 'Mars/Base' is not an IANA time zone",
        ),
        (
            "x 10 PERIOD daily ORDER trend",
            "a period tag is served in strict order",
        ),
        ("x 10 FOO bar", "unknown option 'FOO' of LEAF.TAG CREATE"),
        ("x 10 ORDER strict ORDER strict", "ORDER is given twice"),
        ("x 10 ORDER", "ORDER needs a value"),
        ("rs 10 ORDER strict", "tag 'rs' already exists"),
    ] {
        let refused = create(&mut ca, args).await.unwrap_err();
        assert!(refused.contains(error), "{args}: {refused}");
    }
    assert!(incr(&mut ca, "x")
        .await
        .unwrap_err()
        .contains("unknown tag 'x'"));
    for n in [a, b, c] {
        n.stop().await;
    }
}

/// A rolling change of a trend tag to a period tag: a node that lists the tag with the period
/// restarts first; a node that does not list it serves what its buffer holds, then its next
/// load is refused by the database before the row moves (a trend load once moved the row two
/// days ahead) and it follows the row's period record. No date other than today's appears.
async fn a_rolling_change_to_a_period(url: &str) {
    let clock: Arc<dyn Clock> = Arc::new(ManualClock::new(NOON_MS));
    let a = node(url, vec![TagSeed::new("r", 1000)], clock.clone()).await;
    let b = node(url, vec![], clock.clone()).await;
    let mut cb = b.client().await;
    assert_eq!(incr(&mut a.client().await, "r").await, Ok(1));
    assert!(incr(&mut cb, "r").await.unwrap() > 1);
    a.stop().await;
    let daily = TagSeed {
        period: Some(leafd::config::Period::Daily),
        time_zone: "Asia/Shanghai".into(),
        sequence_digits: 2,
        ..TagSeed::new("r", 1000)
    };
    let a = node(url, vec![daily], clock.clone()).await;
    let mut ca = a.client().await;
    assert_eq!(incr(&mut ca, "r").await, Ok(2026120501));
    let mut period_ids = vec![2026120501];
    let mut refusals = 0;
    for _ in 0..3000 {
        match incr(&mut cb, "r").await {
            Ok(id) if id >= 2026120500 => {
                period_ids.push(id);
                break;
            }
            Ok(id) => assert!(id < 1_000_000, "b's buffered trend ID {id}"),
            Err(e) => {
                assert!(
                    e.contains("IDs refused: tag 'r' hands out period IDs"),
                    "{e}"
                );
                refusals += 1;
            }
        }
    }
    assert!(refusals <= 1, "{refusals} refusals");
    period_ids.push(incr(&mut ca, "r").await.unwrap());
    assert_eq!(period_ids, vec![2026120501, 2026120502, 2026120503]);
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_rolling_change_to_a_period() {
    let dir = tempfile::tempdir().unwrap();
    a_rolling_change_to_a_period(&format!("sqlite://{}", dir.path().join("l.db").display())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_a_rolling_change_to_a_period() {
    let test = "mysql_a_rolling_change_to_a_period";
    let Some(url) = Backend::MySql.fresh_database(test).await else {
        return;
    };
    a_rolling_change_to_a_period(&url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_rolling_change_to_a_period() {
    let test = "postgres_a_rolling_change_to_a_period";
    let Some(url) = Backend::Postgres.fresh_database(test).await else {
        return;
    };
    a_rolling_change_to_a_period(&url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_trend_node_beside_strict_nodes() {
    let dir = tempfile::tempdir().unwrap();
    a_trend_node_beside_strict_nodes(&format!("sqlite://{}", dir.path().join("l.db").display()))
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_a_trend_node_beside_strict_nodes() {
    let test = "mysql_a_trend_node_beside_strict_nodes";
    let Some(url) = Backend::MySql.fresh_database(test).await else {
        return;
    };
    a_trend_node_beside_strict_nodes(&url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_trend_node_beside_strict_nodes() {
    let test = "postgres_a_trend_node_beside_strict_nodes";
    let Some(url) = Backend::Postgres.fresh_database(test).await else {
        return;
    };
    a_trend_node_beside_strict_nodes(&url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_rules_created_at_run_time() {
    let dir = tempfile::tempdir().unwrap();
    rules_created_at_run_time(&format!("sqlite://{}", dir.path().join("l.db").display())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_rules_created_at_run_time() {
    let test = "mysql_rules_created_at_run_time";
    let Some(url) = Backend::MySql.fresh_database(test).await else {
        return;
    };
    rules_created_at_run_time(&url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_rules_created_at_run_time() {
    let test = "postgres_rules_created_at_run_time";
    let Some(url) = Backend::Postgres.fresh_database(test).await else {
        return;
    };
    rules_created_at_run_time(&url).await;
}
