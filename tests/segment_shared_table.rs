//! Several writers on one `leaf_alloc` table: Leaf's and an older leafd's allocations between
//! leafd's, nodes creating tags at once against `segment.max_tags`, and the recorded data-centre
//! split. SQLite always; MariaDB and PostgreSQL with LEAFD_TEST_MYSQL_URL / _POSTGRES_URL.

mod common;

use std::collections::HashSet;

use common::backends::{raw, Backend};
use common::scenarios::unique_tag;
use common::TestServer;
use leafd::config::{Config, StorageConfig};
use leafd::storage::NewTag;

/// Leaf's allocation (`SegmentIDGenImpl`: `UPDATE … SET max_id = max_id + step`, then read the
/// row) with the row's step or Leaf's adaptive `custom` step; returns the new `max_id`.
async fn foreign_allocation(url: &str, tag: &str, custom: Option<i64>) -> i64 {
    let add = custom.map_or("step".to_string(), |n| n.to_string());
    raw(
        url,
        &format!("UPDATE leaf_alloc SET max_id = max_id + {add} WHERE biz_tag = '{tag}'"),
    )
    .await;
    raw(
        url,
        &format!("SELECT max_id FROM leaf_alloc WHERE biz_tag = '{tag}'"),
    )
    .await
    .unwrap()
}

/// Who else allocates on the row beside this leafd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Other {
    /// Meituan's Leaf: serves `[max_id − step, max_id)`.
    Leaf,
    /// A leafd before this release: served `(max_id − step, max_id]`. (It and Leaf on one row
    /// repeat each other's boundary IDs: the upgrade comes before a Leaf migration.)
    OlderLeafd,
}

/// 400 allocations of one row by leafd and by `other`, in a seeded random order with random
/// steps: no ID is granted twice; leafd after leafd loses nothing, after the other reader
/// exactly one ID.
async fn a_row_shared_with(url: &str, other: Other) {
    let config = StorageConfig {
        url: url.to_string(),
        ..StorageConfig::default()
    };
    let store = leafd::storage::open(&config, true).await.unwrap();
    let tag = unique_tag("mixed");
    store
        .create_tag(&NewTag {
            tag: tag.clone(),
            step: 10,
            start: 1,
            description: None,
            split: None,
            max_tags: usize::MAX,
        })
        .await
        .unwrap();
    let mut rng = fastrand::Rng::with_seed(20261204);
    let mut granted = HashSet::new();
    let mut last_max = 1;
    let mut last_was_leafd = true;
    let (mut boundaries, mut skipped) = (0, 0);
    for _ in 0..400 {
        let step = rng.bool().then(|| rng.i64(1..40));
        let range = if rng.bool() {
            let alloc = store
                .allocate(&tag, leafd::storage::Grant::step(step, 0))
                .await
                .unwrap();
            let gap = alloc.first - last_max;
            assert_eq!(
                gap,
                i64::from(!last_was_leafd),
                "leafd starts at the max_id it left, one above another reader's"
            );
            skipped += gap;
            last_was_leafd = true;
            last_max = alloc.max_id;
            alloc.first..alloc.max_id
        } else {
            let before = last_max;
            last_max = foreign_allocation(url, &tag, step).await;
            if last_was_leafd {
                boundaries += 1;
            }
            last_was_leafd = false;
            match other {
                Other::Leaf => before..last_max,
                Other::OlderLeafd => before + 1..last_max + 1,
            }
        };
        for id in range {
            assert!(granted.insert(id), "ID {id} granted twice ({other:?})");
        }
    }
    assert!(granted.len() > 2_000, "{}", granted.len());
    assert!(boundaries > 50, "{boundaries}");
    eprintln!(
        "{} beside {other:?}: {} IDs over 400 allocations, {boundaries} hand-overs leafd -> other, 0 repeated, {skipped} skipped by leafd",
        store.backend(),
        granted.len()
    );
    store.close().await;
}

async fn leaf_and_older_leafd_share_a_row(url: &str) {
    a_row_shared_with(url, Other::Leaf).await;
    a_row_shared_with(url, Other::OlderLeafd).await;
}

/// Three nodes on one table, `max_tags = 130`, 100 tags present: every node creates tags from
/// four clients at once, by `LEAF.TAG CREATE` and by first use (`auto_create`). The table ends
/// at exactly 130 rows, and every refusal says the limit was reached. Three rounds.
async fn racing_creators_stop_at_the_limit(url: &str) {
    for round in 0..3 {
        let mut config = Config::default();
        config.storage.url = url.to_string();
        config.segment.max_tags = 130;
        config.segment.auto_create = true;
        let prefix = unique_tag(&format!("race{round}"));
        config.segment.auto_create_pattern = format!("{prefix}*");
        let nodes = vec![
            TestServer::start(config.clone()).await,
            TestServer::start(config.clone()).await,
            TestServer::start(config.clone()).await,
        ];
        let store = nodes[0].app.segments.store();
        let present = store.list().await.unwrap().len();
        for i in present..100 {
            store
                .create_tag(&NewTag {
                    tag: format!("{prefix}-seed-{i}"),
                    step: 10,
                    start: 1,
                    description: None,
                    split: None,
                    max_tags: usize::MAX,
                })
                .await
                .unwrap();
        }
        let mut tasks = Vec::new();
        for (n, node) in nodes.iter().enumerate() {
            for c in 0..4 {
                let mut con = node.client().await;
                let prefix = prefix.clone();
                tasks.push(tokio::spawn(async move {
                    let mut refused = 0;
                    for i in 0..20 {
                        let name = format!("{prefix}-{n}-{c}-{i}");
                        let reply: redis::RedisResult<redis::Value> = if i % 2 == 0 {
                            redis::cmd("LEAF.TAG")
                                .arg("CREATE")
                                .arg(&name)
                                .arg(10)
                                .query_async(&mut con)
                                .await
                        } else {
                            redis::cmd("INCR")
                                .arg(format!("segment:{name}"))
                                .query_async(&mut con)
                                .await
                        };
                        if let Err(e) = reply {
                            assert!(e.to_string().contains("tag limit reached"), "{e}");
                            refused += 1;
                        }
                    }
                    refused
                }));
            }
        }
        let mut refused = 0;
        for task in tasks {
            refused += task.await.unwrap();
        }
        let rows = raw(url, "SELECT COUNT(*) FROM leaf_alloc").await.unwrap();
        assert_eq!(rows, 130, "round {round}: the table passed max_tags");
        assert_eq!(refused, 12 * 20 - 30, "round {round}");
        eprintln!(
            "round {round}: 240 creations on 3 nodes, 30 made, {refused} refused, {rows} rows"
        );
        for node in nodes {
            node.stop().await;
        }
        raw(url, "DELETE FROM leaf_alloc").await;
    }
}

/// The split recorded in the row: a node with the recorded class serves; a narrower class is
/// taken at once and becomes the record (the wider node is refused from its next load); a class
/// outside the record is refused with the line that says what to do; `LEAF.TAG SPLIT` moves the
/// record and the tag's start, after which the new class serves above the start.
async fn a_split_only_narrows_until_an_operator_moves_it(url: &str) {
    let node = |delta, remainder| {
        let mut config = Config::default();
        config.storage.url = url.to_string();
        config.segment.id_delta = delta;
        config.segment.id_remainder = remainder;
        config.segment.adaptive_step = false;
        TestServer::start(config)
    };
    let tag = unique_tag("split");
    let key = format!("segment:{tag}");
    let wide = node(2, 0).await;
    common::scenarios::create_tag(&wide, &tag, 10, None).await;
    let mut con = wide.client().await;
    let first: i64 = redis::cmd("INCR")
        .arg(&key)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(first, 2);
    let recorded = raw(
        url,
        &format!("SELECT COUNT(*) FROM leaf_alloc WHERE split = '2:0' AND biz_tag = '{tag}'"),
    )
    .await;
    assert_eq!(recorded, Some(1), "the creating node's class is recorded");

    // 4:2 lies inside 2:0: accepted, and recorded.
    let narrow = node(4, 2).await;
    let mut narrow_con = narrow.client().await;
    let id: i64 = redis::cmd("INCR")
        .arg(&key)
        .query_async(&mut narrow_con)
        .await
        .unwrap();
    assert_eq!(id % 4, 2);
    let recorded = raw(
        url,
        &format!("SELECT COUNT(*) FROM leaf_alloc WHERE split = '4:2' AND biz_tag = '{tag}'"),
    )
    .await;
    assert_eq!(recorded, Some(1));

    // 3:1 overlaps another cluster's IDs (2:1 holds 7, 13, …): refused, with what to do.
    let other = node(3, 1).await;
    let mut other_con = other.client().await;
    let refused = redis::cmd("INCR")
        .arg(&key)
        .query_async::<i64>(&mut other_con)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("IDs refused: the tag's split is recorded as id_delta:id_remainder 4:2 and this node's 3:1 is not inside it")
            && refused.contains(&format!("LEAF.TAG SPLIT {tag} 3 1 <start>")),
        "{refused}"
    );
    // The wider node is refused once its buffers need the database.
    let mut wide_refused = None;
    for _ in 0..200 {
        match redis::cmd("INCR")
            .arg(&key)
            .query_async::<i64>(&mut con)
            .await
        {
            Ok(id) => assert_eq!(id % 2, 0),
            Err(e) => {
                wide_refused = Some(e.to_string());
                break;
            }
        }
    }
    let wide_refused = wide_refused.expect("the 2:0 node kept serving past the narrowed record");
    assert!(
        wide_refused.contains("this node's 2:0 is not inside it"),
        "{wide_refused}"
    );

    // The operator re-splits above everything served: the 3:1 node serves from there.
    let moved: i64 = redis::cmd("LEAF.TAG")
        .arg("SPLIT")
        .arg(&tag)
        .arg(3)
        .arg(1)
        .arg(100_000)
        .query_async(&mut other_con)
        .await
        .unwrap();
    assert_eq!(moved, 100_000);
    let mut id = 0;
    for _ in 0..100 {
        match redis::cmd("INCR")
            .arg(&key)
            .query_async::<i64>(&mut other_con)
            .await
        {
            Ok(got) => {
                id = got;
                break;
            }
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(100)).await,
        }
    }
    assert!(id >= 100_000 && id % 3 == 1, "{id}");
    let bad = redis::cmd("LEAF.TAG")
        .arg("SPLIT")
        .arg(&tag)
        .arg(3)
        .arg(3)
        .arg(1)
        .query_async::<i64>(&mut other_con)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        bad.contains("split needs a delta between 1 and 1000000 (as segment.id_delta) and 0 <= remainder < delta"),
        "{bad}"
    );
    for server in [wide, narrow, other] {
        server.stop().await;
    }
}

fn sqlite_url(dir: &tempfile::TempDir) -> String {
    format!("sqlite://{}", dir.path().join("leafd.db").display())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_leaf_and_older_leafd_share_a_row() {
    let dir = tempfile::tempdir().unwrap();
    leaf_and_older_leafd_share_a_row(&sqlite_url(&dir)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_racing_creators_stop_at_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    racing_creators_stop_at_the_limit(&sqlite_url(&dir)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_split_only_narrows_until_an_operator_moves_it() {
    let dir = tempfile::tempdir().unwrap();
    a_split_only_narrows_until_an_operator_moves_it(&sqlite_url(&dir)).await;
}

macro_rules! backend_tests {
    ($module:ident, $backend:expr) => {
        mod $module {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn leaf_and_older_leafd_share_a_row() {
                let test = concat!(stringify!($module), "::leaf_and_older_leafd_share_a_row");
                let Some(url) = $backend.fresh_database(test).await else {
                    return;
                };
                super::leaf_and_older_leafd_share_a_row(&url).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn racing_creators_stop_at_the_limit() {
                let test = concat!(stringify!($module), "::racing_creators_stop_at_the_limit");
                let Some(url) = $backend.fresh_database(test).await else {
                    return;
                };
                super::racing_creators_stop_at_the_limit(&url).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_split_only_narrows_until_an_operator_moves_it() {
                let test = concat!(
                    stringify!($module),
                    "::a_split_only_narrows_until_an_operator_moves_it"
                );
                let Some(url) = $backend.fresh_database(test).await else {
                    return;
                };
                super::a_split_only_narrows_until_an_operator_moves_it(&url).await;
            }
        }
    };
}

backend_tests!(mysql, Backend::MySql);
backend_tests!(postgres, Backend::Postgres);
