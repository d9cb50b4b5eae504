//! Period tags (`period = "daily"`): two nodes on one database whose clocks differ by a second
//! cross a midnight in Asia/Shanghai; a period's digits run out; LEAF.CODE and the HTTP form.
//! SQLite always; MariaDB and PostgreSQL with LEAFD_TEST_MYSQL_URL / _POSTGRES_URL.

mod common;

use std::collections::HashSet;
use std::sync::Arc;

use common::backends::Backend;
use common::{test_config, TestServer};
use leafd::app::App;
use leafd::clock::{Clock, ManualClock, OffsetClock};
use leafd::config::{Config, Period, TagSeed};

/// 2026-12-04T23:59:58.000+08:00: two seconds before midnight in Shanghai.
const BEFORE_MIDNIGHT_MS: u64 = 1_796_399_998_000;

fn period_config(url: &str) -> Config {
    let mut config = Config::default();
    config.storage.url = url.to_string();
    config.segment.tags = vec![TagSeed {
        period: Some(Period::Daily),
        time_zone: "Asia/Shanghai".into(),
        sequence_digits: 4,
        prefix: "ORD".into(),
        ..TagSeed::new("ord", 10)
    }];
    config
}

async fn node(url: &str, clock: Arc<dyn Clock>) -> TestServer {
    let app = App::open_with_clock(test_config(period_config(url)), clock)
        .await
        .expect("leafd starts");
    TestServer::serve_app(app).await
}

async fn incrby(con: &mut redis::aio::MultiplexedConnection, n: i64) -> redis::RedisResult<i64> {
    redis::cmd("INCRBY")
        .arg("segment:ord")
        .arg(n)
        .query_async(con)
        .await
}

async fn a_day_boundary_with_clocks_a_second_apart(url: &str) {
    let clock = Arc::new(ManualClock::new(BEFORE_MIDNIGHT_MS));
    // B's clock is one second behind A's.
    let behind: Arc<dyn Clock> = Arc::new(OffsetClock::new(clock.clone(), -1000));
    let a = node(url, clock.clone()).await;
    let b = node(url, behind).await;
    let (mut ca, mut cb) = (a.client().await, b.client().await);
    let mut handed_out = Vec::new();

    // Both on 4 December: one sequence across the nodes, from 1.
    handed_out.push(incrby(&mut ca, 1).await.unwrap());
    handed_out.push(incrby(&mut cb, 1).await.unwrap());
    handed_out.push(incrby(&mut ca, 3).await.unwrap());
    assert_eq!(handed_out, vec![202612040001, 202612040002, 202612040005]);

    // A is past midnight, B still a second before: A starts the 5th at 1, and B, whose clock
    // says the 4th, follows the row into the 5th (never back to the 4th).
    clock.set(BEFORE_MIDNIGHT_MS + 2_300);
    handed_out.push(incrby(&mut cb, 1).await.unwrap());
    handed_out.push(incrby(&mut ca, 1).await.unwrap());
    handed_out.push(incrby(&mut cb, 2).await.unwrap());
    assert_eq!(
        &handed_out[3..],
        &[202612040006, 202612050001, 202612050003],
        "B served the 4th until A's first request of the 5th"
    );
    let code: String = redis::cmd("LEAF.CODE")
        .arg("ord")
        .query_async(&mut cb)
        .await
        .unwrap();
    assert_eq!(code, "ORD202612050004");
    let over_http = common::http_get(b.http_url("/api/segment/code/ord"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(over_http, "ORD202612050005");
    handed_out.push(202612050005);

    // The 5th's 9,999 numbers run out: a block that does not fit is refused whole, nothing
    // taken, never wrapped, never taken from the 6th; what is left is still served, and then
    // later requests of the 5th are refused too.
    handed_out.push(incrby(&mut ca, 9_990).await.unwrap());
    assert_eq!(handed_out.last(), Some(&202612059995));
    let refused = incrby(&mut ca, 5).await.unwrap_err().to_string();
    assert!(
        refused.contains("tag 'ord': period 20261205 has 4 sequence numbers left, fewer than the 5 asked; nothing was taken"),
        "{refused}"
    );
    handed_out.push(incrby(&mut cb, 4).await.unwrap());
    assert_eq!(handed_out.last(), Some(&202612059999));
    let refused = incrby(&mut ca, 1).await.unwrap_err().to_string();
    assert!(
        refused.contains("tag 'ord': period 20261205 has used all its 9999 sequence numbers"),
        "{refused}"
    );
    let refused = incrby(&mut ca, 1).await.unwrap_err().to_string();
    assert!(
        refused.contains("period 20261205 has used all"),
        "{refused}"
    );
    let not_period: redis::RedisResult<String> = redis::cmd("LEAF.CODE")
        .arg("missing")
        .query_async(&mut ca)
        .await;
    assert!(not_period.is_err());

    // The 6th starts at 1 again, on both nodes, and a new node continues it.
    clock.set(BEFORE_MIDNIGHT_MS + 2_000 + 86_400_000);
    handed_out.push(incrby(&mut ca, 1).await.unwrap());
    handed_out.push(incrby(&mut cb, 1).await.unwrap());
    assert_eq!(
        handed_out[handed_out.len() - 2..],
        [202612060001, 202612060002]
    );
    let c = node(url, clock.clone()).await;
    handed_out.push(incrby(&mut c.client().await, 1).await.unwrap());
    assert_eq!(handed_out.last(), Some(&202612060003));

    // LEAF.TAGS shows the rule and the strict order period tags are served in.
    let tags: Vec<std::collections::HashMap<String, redis::Value>> =
        redis::cmd("LEAF.TAGS").query_async(&mut ca).await.unwrap();
    let row = tags
        .iter()
        .find(|t| t["tag"] == redis::Value::BulkString(b"ord".to_vec()))
        .unwrap();
    let text = |key: &str| redis::from_redis_value::<String>(row[key].clone()).unwrap();
    assert_eq!(text("period"), "daily Asia/Shanghai 4");
    assert_eq!(text("order"), "strict");

    // Served one after another: every ID above the one before, none twice.
    assert!(handed_out.windows(2).all(|w| w[0] < w[1]), "{handed_out:?}");
    assert_eq!(
        handed_out.iter().collect::<HashSet<_>>().len(),
        handed_out.len()
    );
    for server in [a, b, c] {
        server.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_day_boundary_with_clocks_a_second_apart() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("leafd.db").display());
    a_day_boundary_with_clocks_a_second_apart(&url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_a_day_boundary_with_clocks_a_second_apart() {
    let test = "mysql_a_day_boundary_with_clocks_a_second_apart";
    let Some(url) = Backend::MySql.fresh_database(test).await else {
        return;
    };
    a_day_boundary_with_clocks_a_second_apart(&url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_day_boundary_with_clocks_a_second_apart() {
    let test = "postgres_a_day_boundary_with_clocks_a_second_apart";
    let Some(url) = Backend::Postgres.fresh_database(test).await else {
        return;
    };
    a_day_boundary_with_clocks_a_second_apart(&url).await;
}

/// The row records the first node's rule: a node configured with other digits, another
/// calendar, or no period at all reads the row's positions as other IDs (some already served),
/// one in another time zone would date them otherwise, so it hands out none; the first rule's
/// nodes go on above.
async fn a_changed_rule_hands_out_nothing(url: &str) {
    let clock = Arc::new(ManualClock::new(BEFORE_MIDNIGHT_MS));
    let with = |edit: fn(&mut TagSeed)| {
        let mut config = period_config(url);
        edit(&mut config.segment.tags[0]);
        let clock: Arc<dyn Clock> = clock.clone();
        async move {
            let app = App::open_with_clock(test_config(config), clock)
                .await
                .expect("leafd starts");
            TestServer::serve_app(app).await
        }
    };
    let a = with(|_| {}).await;
    let mut ca = a.client().await;
    assert_eq!(incrby(&mut ca, 2).await.unwrap(), 202612040002);
    let other_digits = with(|t| t.sequence_digits = 3).await;
    let monthly = with(|t| t.period = Some(Period::Monthly)).await;
    // Another zone would open the next period hours before the row's nodes (which would then
    // refuse the row until their own midnight): refused as well.
    let utc = with(|t| t.time_zone = "UTC".into()).await;
    let plain = with(|t| *t = TagSeed::new("ord", 10)).await;
    let strict = with(|t| {
        *t = TagSeed {
            order: leafd::config::TagOrder::Strict,
            ..TagSeed::new("ord", 10)
        }
    })
    .await;
    for (node, refusal) in [
        (
            &other_digits,
            "records the period rule period:daily:4:Asia/Shanghai:ORD and this node's is period:daily:3",
        ),
        (
            &monthly,
            "records the period rule period:daily:4:Asia/Shanghai:ORD and this node's is period:monthly:4",
        ),
        (
            &utc,
            "records the period rule period:daily:4:Asia/Shanghai:ORD and this node's is period:daily:4:UTC",
        ),
        (
            &plain,
            "hands out period IDs (period:daily:4:Asia/Shanghai:ORD) and this node has no period configured",
        ),
        (
            &strict,
            "hands out period IDs (period:daily:4:Asia/Shanghai:ORD) and this node has no period configured",
        ),
    ] {
        let mut con = node.client().await;
        for n in [1, 1000] {
            let error = incrby(&mut con, n).await.unwrap_err().to_string();
            assert!(error.contains(refusal), "{error}");
        }
    }
    // The refused nodes moved nothing (their allocations and raises are refused by the
    // database before the row moves): the first rule's node goes on with the next number.
    assert_eq!(incrby(&mut ca, 1).await.unwrap(), 202612040003);
    // The prefix only changes the string form: a node with another one serves the same row.
    let other_prefix = with(|t| t.prefix = "INV".into()).await;
    let mut cp = other_prefix.client().await;
    assert_eq!(incrby(&mut cp, 1).await.unwrap(), 202612040004);
    assert_eq!(incrby(&mut ca, 1).await.unwrap(), 202612040005);
    for server in [a, other_digits, monthly, utc, plain, strict, other_prefix] {
        server.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_changed_rule_hands_out_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("leafd.db").display());
    a_changed_rule_hands_out_nothing(&url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_a_changed_rule_hands_out_nothing() {
    let test = "mysql_a_changed_rule_hands_out_nothing";
    let Some(url) = Backend::MySql.fresh_database(test).await else {
        return;
    };
    a_changed_rule_hands_out_nothing(&url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_changed_rule_hands_out_nothing() {
    let test = "postgres_a_changed_rule_hands_out_nothing";
    let Some(url) = Backend::Postgres.fresh_database(test).await else {
        return;
    };
    a_changed_rule_hands_out_nothing(&url).await;
}

/// What a period cannot be combined with is refused on load, with the key named.
#[test]
fn period_rules_are_checked_on_load() {
    let with = |edit: fn(&mut TagSeed), extra: fn(&mut Config)| {
        let mut config = period_config("sqlite::memory:");
        edit(&mut config.segment.tags[0]);
        extra(&mut config);
        config
            .validate()
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    };
    let none = |_: &mut Config| {};
    assert!(with(|t| t.time_zone = "Mars/Olympus".into(), none)
        .contains("time_zone 'Mars/Olympus' is not an IANA time zone"));
    assert!(with(|t| t.sequence_digits = 10, none)
        .contains("sequence_digits must be between 1 and 9 for period = \"daily\""));
    assert!(with(|t| t.start = 5, none).contains("remove start"));
    assert!(with(|_| {}, |c| c.segment.id_delta = 2)
        .contains("a period cannot be combined with an id_delta split"));
    assert_eq!(with(|_| {}, none), "");
}
