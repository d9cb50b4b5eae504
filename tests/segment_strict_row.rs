//! A strict tag's allocations follow its row as other writers leave it, while its nodes run:
//! once a node has allocated, the next allocation is one statement that moves the row only as
//! the node last saw it, so a row moved by Leaf (no `exclusive_max`), by a failover (another
//! writer) or by an admin (another step) must give exactly what the locked transaction gives.
//! MariaDB and PostgreSQL with LEAFD_TEST_MYSQL_URL / _POSTGRES_URL (SQLite has no such path).

mod common;

use std::collections::HashMap;

use common::backends::Backend;
use common::scenarios::unique_tag;
use common::{test_config, TestServer};
use leafd::config::{Config, TagOrder, TagSeed};

const MARGIN: i64 = 100_000;

async fn node(url: &str, tag: &str) -> TestServer {
    let mut config = Config::default();
    config.storage.url = url.to_string();
    config.segment.failover_margin = MARGIN;
    config.segment.tags = vec![TagSeed {
        order: TagOrder::Strict,
        ..TagSeed::new(tag, 100)
    }];
    TestServer::start(test_config(config)).await
}

async fn incr(con: &mut redis::aio::MultiplexedConnection, tag: &str) -> i64 {
    redis::cmd("INCR")
        .arg(format!("segment:{tag}"))
        .query_async(con)
        .await
        .unwrap_or_else(|e| panic!("INCR segment:{tag}: {e}"))
}

/// `n` requests on `con`, each answered with the ID after the one before (`after`).
async fn consecutive(
    con: &mut redis::aio::MultiplexedConnection,
    tag: &str,
    after: i64,
    n: i64,
) -> i64 {
    for i in 1..=n {
        assert_eq!(incr(con, tag).await, after + i, "request {i} after {after}");
    }
    after + n
}

/// The step LEAF.TAGS shows for `tag` (a strict tag's: its row's, as the last allocation
/// found it).
async fn shown_step(con: &mut redis::aio::MultiplexedConnection, tag: &str) -> i64 {
    let tags: Vec<HashMap<String, redis::Value>> =
        redis::cmd("LEAF.TAGS").query_async(con).await.unwrap();
    let row = tags
        .iter()
        .find(|t| t["tag"] == redis::Value::BulkString(tag.as_bytes().to_vec()))
        .unwrap_or_else(|| panic!("{tag} not listed"));
    redis::from_redis_value(row["step"].clone()).unwrap()
}

async fn a_strict_row_moved_by_others(url: &str) {
    let tag = unique_tag("strict_row");
    let backend = Backend::of(url);
    let update = |set: String| {
        let tag = tag.clone();
        async move {
            backend
                .execute(
                    url,
                    &format!("UPDATE leaf_alloc SET {set} WHERE biz_tag = '{tag}'"),
                )
                .await
        }
    };
    let (a, b) = (node(url, &tag).await, node(url, &tag).await);
    let (mut ca, mut cb) = (a.client().await, b.client().await);
    // Both nodes have allocated (the second allocation of each is the single statement).
    let last = consecutive(&mut ca, &tag, 0, 5).await;
    let last = consecutive(&mut cb, &tag, last, 5).await;
    let last = consecutive(&mut ca, &tag, last, 3).await;

    // Leaf allocated beside them: `max_id` moved, `exclusive_max` not. Leaf may have served
    // up to the new max_id, so the next ID is the one above it.
    update("max_id = max_id + 1000".into()).await;
    let after_leaf = last + 1 + 1000;
    let last = consecutive(&mut ca, &tag, after_leaf, 2).await;

    // A lossy failover: the row as it was before a's last allocations, written by another
    // instance. b (whose own IDs are far below) must skip the margin, not reuse them.
    let lost = last - 3;
    update(format!(
        "max_id = {lost}, exclusive_max = {lost}, writer = 'the old primary'"
    ))
    .await;
    let last = consecutive(&mut cb, &tag, lost + MARGIN - 1, 3).await;
    let last = consecutive(&mut ca, &tag, last, 2).await;

    // An admin changed the step: IDs stay consecutive and LEAF.TAGS shows the row's new step.
    assert_eq!(shown_step(&mut ca, &tag).await, 100);
    update("step = 7".into()).await;
    let last = consecutive(&mut ca, &tag, last, 2).await;
    assert_eq!(shown_step(&mut ca, &tag).await, 7);
    consecutive(&mut cb, &tag, last, 2).await;
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_a_strict_row_moved_by_others() {
    let test = "mysql_a_strict_row_moved_by_others";
    let Some(url) = Backend::MySql.fresh_database(test).await else {
        return;
    };
    a_strict_row_moved_by_others(&url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_strict_row_moved_by_others() {
    let test = "postgres_a_strict_row_moved_by_others";
    let Some(url) = Backend::Postgres.fresh_database(test).await else {
        return;
    };
    a_strict_row_moved_by_others(&url).await;
}
