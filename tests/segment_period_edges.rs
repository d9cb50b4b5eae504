//! Period tags at the ends of their space and under every admin command: a block larger than
//! what is left, 150 concurrent INCRs on three nodes with one sequence digit seconds before
//! midnight, SKIP / SKIPALL / STEP / SPLIT, and the failover margin. Every ID is checked for
//! its date, its place in the day's sequence and repeats. SQLite always; MariaDB and
//! PostgreSQL with LEAFD_TEST_MYSQL_URL / _POSTGRES_URL.

mod common;

use std::collections::HashSet;
use std::sync::Arc;

use common::backends::Backend;
use common::{test_config, TestServer};
use leafd::app::App;
use leafd::clock::{Clock, ManualClock};
use leafd::config::{Config, Period, TagSeed};

/// 2026-12-05T23:59:41+08:00: nineteen seconds before midnight in Shanghai.
const BEFORE_MIDNIGHT_MS: u64 = 1_796_399_998_000 + 86_400_000 - 17_000;
const DAY_MS: u64 = 86_400_000;

fn seed(tag: &str, period: Period, digits: u32) -> TagSeed {
    TagSeed {
        period: Some(period),
        time_zone: "Asia/Shanghai".into(),
        sequence_digits: digits,
        prefix: "ORD".into(),
        ..TagSeed::new(tag, 10)
    }
}

fn config(url: &str, margin: i64) -> Config {
    let mut config = Config::default();
    config.storage.url = url.to_string();
    config.segment.failover_margin = margin;
    config.segment.tags = vec![
        seed("ord", Period::Daily, 4),
        seed("one", Period::Daily, 1),
        seed("month", Period::Monthly, 4),
        seed("year", Period::Yearly, 4),
        TagSeed::new("plain", 10),
    ];
    config
}

async fn node(url: &str, margin: i64, clock: Arc<dyn Clock>) -> TestServer {
    let app = App::open_with_clock(test_config(config(url, margin)), clock)
        .await
        .expect("leafd starts");
    TestServer::serve_app(app).await
}

async fn incrby(
    con: &mut redis::aio::MultiplexedConnection,
    tag: &str,
    n: i64,
) -> Result<i64, String> {
    redis::cmd("INCRBY")
        .arg(format!("segment:{tag}"))
        .arg(n)
        .query_async(con)
        .await
        .map_err(|e| e.to_string())
}

async fn admin<T: redis::FromRedisValue>(
    con: &mut redis::aio::MultiplexedConnection,
    args: &[&str],
) -> Result<T, String> {
    let mut cmd = redis::cmd("LEAF.TAG");
    for arg in args {
        cmd.arg(*arg);
    }
    cmd.query_async(con).await.map_err(|e| e.to_string())
}

/// 50 concurrent INCRs of `tag` on each node's connection: the IDs served, and the errors.
async fn burst(
    clients: &[redis::aio::MultiplexedConnection],
    tag: &str,
) -> (Vec<i64>, Vec<String>) {
    let mut tasks = Vec::new();
    for client in clients {
        for _ in 0..50 {
            let mut con = client.clone();
            let tag = tag.to_string();
            tasks.push(tokio::spawn(async move { incrby(&mut con, &tag, 1).await }));
        }
    }
    let (mut ids, mut errors) = (Vec::new(), Vec::new());
    for task in tasks {
        match task.await.unwrap() {
            Ok(id) => ids.push(id),
            Err(e) => errors.push(e),
        }
    }
    ids.sort_unstable();
    (ids, errors)
}

async fn the_end_of_a_period(url: &str) {
    let clock = Arc::new(ManualClock::new(BEFORE_MIDNIGHT_MS));
    let nodes = [
        node(url, 0, clock.clone()).await,
        node(url, 0, clock.clone()).await,
        node(url, 0, clock.clone()).await,
    ];
    let mut clients = Vec::new();
    for n in &nodes {
        clients.push(n.client().await);
    }
    let mut ca = clients[0].clone();

    // A block larger than what is left of the day is refused whole: nothing is taken, no
    // number of tomorrow is dated today, none of today's is served twice.
    assert_eq!(incrby(&mut ca, "ord", 1).await, Ok(202612050001));
    let refused = incrby(&mut ca, "ord", 100_000).await.unwrap_err();
    assert!(
        refused.contains(
            "tag 'ord': period 20261205 has 9998 sequence numbers left, fewer than the 100000 asked; nothing was taken"
        ),
        "{refused}"
    );
    assert_eq!(incrby(&mut ca, "ord", 1).await, Ok(202612050002));
    let code: String = redis::cmd("LEAF.CODE")
        .arg("ord")
        .query_async(&mut ca)
        .await
        .unwrap();
    assert_eq!(code, "ORD202612050003");
    assert_eq!(
        incrby(&mut ca, "ord", 9_996).await,
        Ok(202612059999),
        "exactly what is left fits"
    );

    // 150 concurrent INCRs from three nodes on a tag with one sequence digit, seconds before
    // midnight: today's nine numbers, each once, and refusals; nothing of tomorrow.
    let mut every_id = HashSet::new();
    let (ids, errors) = burst(&clients, "one").await;
    assert_eq!(ids, (1..=9).map(|s| 202612050 + s).collect::<Vec<_>>());
    assert_eq!(errors.len(), 141);
    for e in &errors {
        assert!(
            e.contains("tag 'one': period 20261205 has used all its 9 sequence numbers"),
            "{e}"
        );
    }
    every_id.extend(ids);

    // After midnight the new day has all its nine numbers, from 1.
    clock.set(BEFORE_MIDNIGHT_MS + 20_000);
    let (ids, errors) = burst(&clients, "one").await;
    assert_eq!(ids, (1..=9).map(|s| 202612060 + s).collect::<Vec<_>>());
    assert_eq!(errors.len(), 141);
    assert!(
        ids.iter().all(|id| every_id.insert(*id)),
        "repeated: {ids:?}"
    );
    for n in nodes {
        n.stop().await;
    }
}

/// SKIP and SKIPALL move a period tag within its period, never into a later one (no month 13,
/// no date in the future); SPLIT is refused; STEP is taken and shown.
async fn admin_commands_on_a_period_tag(url: &str) {
    let clock = Arc::new(ManualClock::new(BEFORE_MIDNIGHT_MS - 3_600_000));
    let a = node(url, 0, clock.clone()).await;
    let b = node(url, 0, clock.clone()).await;
    let (mut ca, mut cb) = (a.client().await, b.client().await);
    assert_eq!(incrby(&mut ca, "ord", 1).await, Ok(202612050001));
    assert_eq!(incrby(&mut ca, "month", 1).await, Ok(2026120001));
    assert_eq!(incrby(&mut ca, "year", 1).await, Ok(20260001));
    assert_eq!(incrby(&mut ca, "plain", 1).await, Ok(1));

    // SKIP: numbers of this period, on every node.
    admin::<i64>(&mut ca, &["SKIP", "ord", "10"]).await.unwrap();
    assert_eq!(incrby(&mut cb, "ord", 1).await, Ok(202612050012));
    // More than is left: the rest of the day, not tomorrow's numbers.
    admin::<i64>(&mut cb, &["SKIP", "ord", "50000"])
        .await
        .unwrap();
    // Any amount, up to the last i64: the rest of the period on every database.
    admin::<i64>(&mut ca, &["SKIP", "ord", "9223372036854775807"])
        .await
        .unwrap();
    let refused = incrby(&mut ca, "ord", 1).await.unwrap_err();
    assert!(
        refused.contains("period 20261205 has used all its 9999"),
        "{refused}"
    );

    // STEP is recorded and shown (a strict tag's allocation is its batch, whatever the step).
    assert_eq!(
        admin::<String>(&mut ca, &["STEP", "month", "50"]).await,
        Ok("OK".into())
    );
    assert_eq!(incrby(&mut ca, "month", 1).await, Ok(2026120002));
    let tags: Vec<std::collections::HashMap<String, redis::Value>> =
        redis::cmd("LEAF.TAGS").query_async(&mut ca).await.unwrap();
    let month = tags
        .iter()
        .find(|t| t["tag"] == redis::Value::BulkString(b"month".to_vec()))
        .unwrap();
    assert_eq!(month["table_step"], redis::Value::Int(50));
    assert_eq!(month["step"], redis::Value::Int(50));

    // SPLIT would erase the period the row records: refused, the tag unchanged.
    let refused = admin::<i64>(&mut ca, &["SPLIT", "month", "2", "0", "100"])
        .await
        .unwrap_err();
    assert!(
        refused.contains("tag 'month' records period:monthly:4")
            && refused.contains("cannot be split"),
        "{refused}"
    );
    assert_eq!(incrby(&mut cb, "month", 1).await, Ok(2026120003));

    // SKIPALL, the runbook's step after a restore: trend tags move by the amount, period tags
    // use up their period; no month 13, no year 2126.
    redis::cmd("LEAF.TAG")
        .arg("SKIPALL")
        .arg(1_000_000_000)
        .query_async::<redis::Value>(&mut cb)
        .await
        .unwrap();
    for (tag, period) in [("month", "202612"), ("year", "2026"), ("one", "20261205")] {
        let refused = incrby(&mut ca, tag, 1).await.unwrap_err();
        assert!(
            refused.contains(&format!("period {period} has used all")),
            "{tag}: {refused}"
        );
    }
    // (Node a still serves the segment of `plain` it holds: allocated before, never repeated.)
    let plain = incrby(&mut cb, "plain", 1).await.unwrap();
    assert!(plain > 1_000_000_000, "{plain}");

    // The next period starts at 1, with all its numbers.
    clock.set(BEFORE_MIDNIGHT_MS + DAY_MS);
    assert_eq!(incrby(&mut ca, "ord", 1).await, Ok(202612060001));
    assert_eq!(incrby(&mut cb, "one", 1).await, Ok(202612061));
    clock.set(1_798_732_800_000); // 2027-01-01T00:00:00+08:00
    assert_eq!(incrby(&mut cb, "month", 1).await, Ok(2027010001));
    assert_eq!(incrby(&mut ca, "year", 1).await, Ok(20270001));
    a.stop().await;
    b.stop().await;
}

/// The failover margin on a period tag skips numbers within the period; one larger than what
/// is left uses the period up, and the next period starts at 1 (the new instance recorded).
async fn the_failover_margin_on_a_period_tag(backend: Backend, url: &str) {
    let clock = Arc::new(ManualClock::new(BEFORE_MIDNIGHT_MS - 3_600_000));
    let a = node(url, 1000, clock.clone()).await;
    let mut ca = a.client().await;
    assert_eq!(incrby(&mut ca, "ord", 3).await, Ok(202612050003));
    assert_eq!(incrby(&mut ca, "one", 1).await, Ok(202612051));
    // As a lossy failover leaves the rows: last written by another instance.
    backend
        .execute(url, "UPDATE leaf_alloc SET writer = 'a-lost-primary'")
        .await;
    assert_eq!(incrby(&mut ca, "ord", 1).await, Ok(202612051004));
    let refused = incrby(&mut ca, "one", 1).await.unwrap_err();
    assert!(
        refused.contains("period 20261205 has used all its 9"),
        "{refused}"
    );
    clock.set(BEFORE_MIDNIGHT_MS + 20_000);
    assert_eq!(incrby(&mut ca, "one", 1).await, Ok(202612061));
    assert_eq!(incrby(&mut ca, "one", 1).await, Ok(202612062));
    assert_eq!(incrby(&mut ca, "ord", 1).await, Ok(202612060001));
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_the_end_of_a_period() {
    let dir = tempfile::tempdir().unwrap();
    the_end_of_a_period(&format!("sqlite://{}", dir.path().join("l.db").display())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_the_end_of_a_period() {
    let Some(url) = Backend::MySql
        .fresh_database("mysql_the_end_of_a_period")
        .await
    else {
        return;
    };
    the_end_of_a_period(&url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_the_end_of_a_period() {
    let test = "postgres_the_end_of_a_period";
    let Some(url) = Backend::Postgres.fresh_database(test).await else {
        return;
    };
    the_end_of_a_period(&url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_admin_commands_on_a_period_tag() {
    let dir = tempfile::tempdir().unwrap();
    admin_commands_on_a_period_tag(&format!("sqlite://{}", dir.path().join("l.db").display()))
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_admin_commands_on_a_period_tag() {
    let test = "mysql_admin_commands_on_a_period_tag";
    let Some(url) = Backend::MySql.fresh_database(test).await else {
        return;
    };
    admin_commands_on_a_period_tag(&url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_admin_commands_on_a_period_tag() {
    let test = "postgres_admin_commands_on_a_period_tag";
    let Some(url) = Backend::Postgres.fresh_database(test).await else {
        return;
    };
    admin_commands_on_a_period_tag(&url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_the_failover_margin_on_a_period_tag() {
    let test = "mysql_the_failover_margin_on_a_period_tag";
    let Some(url) = Backend::MySql.fresh_database(test).await else {
        return;
    };
    the_failover_margin_on_a_period_tag(Backend::MySql, &url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_the_failover_margin_on_a_period_tag() {
    let test = "postgres_the_failover_margin_on_a_period_tag";
    let Some(url) = Backend::Postgres.fresh_database(test).await else {
        return;
    };
    the_failover_margin_on_a_period_tag(Backend::Postgres, &url).await;
}
