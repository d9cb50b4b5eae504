//! The segment engine on the embedded SQLite store, through a real Redis client.

mod common;

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use redis::AsyncCommands;

use common::scenarios::{self, create_tag, unique_tag};
use common::{sqlite_config, FlakyStore, TestServer};
use leafd::config::{Config, TagSeed};
use leafd::storage::MemoryStore;

async fn sqlite_server() -> (TestServer, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(sqlite_config(&dir)).await;
    (server, dir)
}

/// Rows whose `biz_tag` a client stored as bytes (a BLOB, which no tag name equals and SQLite
/// orders after every text), more than a page of them: the sweep still reads to the end, drops
/// a deleted tag and adds a new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweep_reads_past_rows_stored_as_bytes() {
    use sqlx::Connection;
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(sqlite_config(&dir)).await;
    create_tag(&server, "keep", 10, None).await;
    create_tag(&server, "gone", 10, None).await;
    let url = format!("sqlite://{}", dir.path().join("leafd.db").display());
    let mut db = sqlx::SqliteConnection::connect(&url).await.unwrap();
    sqlx::query(
        "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < 10999) \
         INSERT INTO leaf_alloc (biz_tag, max_id, step) SELECT CAST('b' || i AS BLOB), 0, 10 FROM n",
    )
    .execute(&mut db)
    .await
    .unwrap();
    sqlx::query("DELETE FROM leaf_alloc WHERE biz_tag = 'gone'")
        .execute(&mut db)
        .await
        .unwrap();
    sqlx::query("INSERT INTO leaf_alloc (biz_tag, max_id, step) VALUES ('later', 0, 10)")
        .execute(&mut db)
        .await
        .unwrap();
    db.close().await.unwrap();
    let segments = &server.app.segments;
    let swept = tokio::time::timeout(std::time::Duration::from_secs(20), segments.sweep_tags())
        .await
        .expect("the sweep ended");
    assert_eq!(swept.unwrap(), 2, "keep and later; no BLOB row is a tag");
    let mut con = server.client().await;
    let gone: redis::RedisResult<i64> = con.incr("segment:gone", 1).await;
    assert_eq!(
        gone.unwrap_err().to_string(),
        "ResponseError: unknown tag 'gone'"
    );
    assert_eq!(con.incr::<_, _, i64>("segment:later", 1).await.unwrap(), 1);
    server.stop().await;
}

#[tokio::test]
async fn the_tag_list_is_read_page_by_page() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("paged.db").display());
    scenarios::the_tag_list_is_read_page_by_page(&url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fresh_tag_counts_from_one() {
    let (server, _dir) = sqlite_server().await;
    scenarios::fresh_tag_counts_from_one(&server).await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_thousand_concurrent_incrs_are_unique() {
    let (server, _dir) = sqlite_server().await;
    scenarios::concurrent_incrs_are_unique(&server, 100_000, 16).await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_end_of_the_id_space() {
    let (server, _dir) = sqlite_server().await;
    scenarios::the_end_of_the_id_space_is_refused_and_the_row_kept(&server).await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn incrby_blocks_never_overlap() {
    let (server, _dir) = sqlite_server().await;
    scenarios::incrby_blocks_never_overlap(&server).await;
    server.stop().await;
}

// Step 1000: the 900 IDs left after the preload starts cover a load. A load includes the
// fdatasync of this node's high-water mark (the rollback guard), which on a busy disk took
// longer than 900 requests once the connection ran on its own thread: the state directory is
// in memory, so the assertion on waits checks the engine's logic, not the disk.
#[tokio::test(flavor = "current_thread")]
async fn segments_switch_without_gaps_and_preload_before_exhaustion() {
    let store = FlakyStore::new(Arc::new(MemoryStore::new()));
    let mut config = Config::default();
    config.segment.adaptive_step = false;
    config.storage.state_dir = common::memory_state_dir();
    let server = TestServer::start_with_store(config, store.clone()).await;
    create_tag(&server, "switch", 1000, None).await;
    let mut con = server.client().await;
    let mut ids = Vec::new();
    for _ in 0..10_000 {
        let id: i64 = redis::cmd("INCR")
            .arg("segment:switch")
            .query_async(&mut con)
            .await
            .unwrap();
        ids.push(id);
    }
    // One node on a fresh tag: consecutive segments, so exactly 1..=10000, no gap, no repeat.
    assert_eq!(ids, (1..=10_000).collect::<Vec<i64>>());
    let loads = store.allocations();
    assert!(
        (10..=11).contains(&loads),
        "step 1000 over 10,000 IDs takes 10 loads (+1 preloaded), got {loads}"
    );
    // Only the very first request found both buffers empty; every later segment was ready.
    let waits = server
        .app
        .segments
        .stats()
        .request_waits
        .load(Ordering::SeqCst);
    assert_eq!(waits, 1, "requests waited for storage {waits} times");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_on_the_same_file_continues_above_every_handed_out_id() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = sqlite_config(&dir);
    config.segment.tags.push(TagSeed {
        description: Some("seeded".into()),
        ..TagSeed::new("orders", 50)
    });
    let mut handed_out = HashSet::new();
    let mut highest = 0;
    for round in 0..3 {
        let server = TestServer::start(config.clone()).await;
        let mut con = server.client().await;
        let mut first = None;
        for _ in 0..120 {
            let id: i64 = redis::cmd("INCR")
                .arg("segment:orders")
                .query_async(&mut con)
                .await
                .unwrap();
            first.get_or_insert(id);
            assert!(handed_out.insert(id), "round {round}: duplicate {id}");
        }
        let first = first.unwrap();
        assert!(
            first > highest,
            "round {round}: first ID {first} not above {highest}"
        );
        highest = *handed_out.iter().max().unwrap();
        drop(con);
        server.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tags_created_in_the_table_by_another_node_are_found() {
    let dir = tempfile::tempdir().unwrap();
    let a = TestServer::start(sqlite_config(&dir)).await;
    let b = TestServer::start(sqlite_config(&dir)).await;
    let tag = unique_tag("shared");
    create_tag(&a, &tag, 10, None).await;
    // b has not refreshed yet: the miss triggers a re-read of the tag list.
    let mut con = b.client().await;
    let id: i64 = redis::cmd("INCR")
        .arg(format!("segment:{tag}"))
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(id, 1);
    a.stop().await;
    b.stop().await;
}

/// Three rounds of six nodes started at once on one new SQLite file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_started_at_once_on_a_new_file_all_come_up() {
    for _ in 0..3 {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}/leafd.db", dir.path().display());
        scenarios::nodes_started_at_once_all_come_up(&url, 6).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tags_created_on_first_use() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/leafd.db", dir.path().display());
    scenarios::tags_created_on_first_use(&url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opaque_ids() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/leafd.db", dir.path().display());
    scenarios::opaque_ids(&url).await;
}

/// Two clusters on two databases serve one tag name with `id_delta = 2` and remainders 0 and
/// 1 (Tinyid's two data centres): INCR, INCRBY within a segment and INCRBY larger than the step,
/// over RESP and HTTP; every ID of both is distinct, has its cluster's residue, and each
/// connection's IDs increase. An opaque tag (4 digits, one key) under the same split: 2,000
/// opaque IDs from each cluster, all distinct, each revealing a sequential ID of its residue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_clusters_with_delta_and_remainder_never_collide() {
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let mut servers = Vec::new();
    for (remainder, dir) in dirs.iter().enumerate() {
        let mut config = sqlite_config(dir);
        config.segment.id_delta = 2;
        config.segment.id_remainder = remainder as i64;
        config.segment.adaptive_step = false;
        config.segment.opaque_key = "one key for both data centres".into();
        config.segment.opaque.push(leafd::config::OpaqueTag {
            tag: "receipts".into(),
            digits: 4,
        });
        let server = TestServer::start(config).await;
        create_tag(&server, "orders", 100, None).await;
        create_tag(&server, "receipts", 100, None).await;
        servers.push(server);
    }
    let mut seen = HashSet::new();
    let mut seen_opaque = HashSet::new();
    for (remainder, server) in servers.iter().enumerate() {
        let mut con = server.client().await;
        let mut last = 0i64;
        for round in 0..300i64 {
            let (id, block): (i64, i64) = match round % 10 {
                // A block of 7 within a segment, and one larger than the step.
                3 => (con.incr("segment:orders", 7).await.unwrap(), 7),
                7 => (con.incr("segment:orders", 120).await.unwrap(), 120),
                _ => (con.incr("segment:orders", 1).await.unwrap(), 1),
            };
            let ids: Vec<i64> = (0..block).map(|k| id - 2 * k).collect();
            for &id in &ids {
                assert_eq!(id.rem_euclid(2), remainder as i64, "{id}");
                assert!(seen.insert(id), "repeated {id}");
            }
            assert!(*ids.last().unwrap() > last, "increasing: {id} after {last}");
            last = id;
        }
        let over_http = server.http_id("orders").await;
        assert_eq!(over_http.rem_euclid(2), remainder as i64);
        assert!(seen.insert(over_http) && over_http > last);

        let mut pipe = redis::pipe();
        for _ in 0..2_000 {
            pipe.cmd("INCR").arg("segment:receipts");
        }
        let opaque: Vec<i64> = pipe.query_async(&mut con).await.unwrap();
        let mut reveal = redis::pipe();
        for &id in &opaque {
            assert!((1_000..=9_999).contains(&id), "{id} is not 4 digits");
            assert!(seen_opaque.insert(id), "opaque {id} repeated");
            reveal.cmd("LEAF.TAG").arg("REVEAL").arg("receipts").arg(id);
        }
        let sequential: Vec<i64> = reveal.query_async(&mut con).await.unwrap();
        for position in sequential {
            assert_eq!(position.rem_euclid(2), remainder as i64, "{position}");
        }
    }
    assert_eq!(seen_opaque.len(), 4_000);
    // What an operator compares between clusters (each table knows only its own): the split
    // differs, the opaque fingerprint is the same.
    let mut fingerprints = HashSet::new();
    for (remainder, server) in servers.iter().enumerate() {
        let mut con = server.client().await;
        let tags: Vec<std::collections::HashMap<String, redis::Value>> =
            redis::cmd("LEAF.TAGS").query_async(&mut con).await.unwrap();
        let field = |tag: &str, key: &str| {
            let row = tags
                .iter()
                .find(|t| t["tag"] == redis::Value::BulkString(tag.into()));
            redis::from_redis_value::<Option<String>>(row.unwrap()[key].clone()).unwrap()
        };
        assert_eq!(field("orders", "split"), Some(format!("2:{remainder}")));
        assert_eq!(field("orders", "opaque"), None);
        let fingerprint = field("receipts", "opaque").expect("an opaque tag's fingerprint");
        assert!(fingerprint.starts_with("d4:"), "{fingerprint}");
        fingerprints.insert(fingerprint);
    }
    assert_eq!(fingerprints.len(), 1, "one key in both clusters");
    for server in servers {
        server.stop().await;
    }
}

/// Identical INCRs pipelined on a strict tag are served as one block: one allocation, the
/// replies consecutive and in order; anything else in the pipeline keeps its own reply, and
/// a transaction's INCRs, a trend tag's and an unauthenticated client's are not batched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_incrs_on_a_strict_tag_take_one_allocation() {
    use leafd::config::TagOrder;
    let store = FlakyStore::new(Arc::new(MemoryStore::new()));
    let mut config = Config::default();
    config.storage.state_dir = common::memory_state_dir();
    config.segment.tags = vec![
        TagSeed {
            order: TagOrder::Strict,
            ..TagSeed::new("blk", 1000)
        },
        TagSeed::new("trd", 1000),
    ];
    config.server.requirepass = Some("pw".into());
    let server = TestServer::start_with_store(config, store.clone()).await;
    let mut raw = server.raw().await;
    assert_eq!(
        raw.send(&common::resp(&[b"AUTH", b"pw"]), 1).await,
        "+OK\r\n"
    );
    // Warm: the tag is known to the node.
    assert_eq!(
        raw.send(&common::resp(&[b"INCR", b"segment:blk"]), 1).await,
        ":1\r\n"
    );
    let before = store.allocations();
    let incr = common::resp(&[b"INCR", b"segment:blk"]);
    let pipeline: Vec<u8> = incr.repeat(300);
    let replies = raw.send(&pipeline, 300).await;
    let expected: String = (2..=301).map(|id| format!(":{id}\r\n")).collect();
    assert_eq!(replies, expected);
    let used = store.allocations() - before;
    assert!(
        (1..=3).contains(&used),
        "300 pipelined INCRs took {used} allocations"
    );

    // Mixed: the INCRBY and the other tag keep their place and their own IDs.
    let mut mixed = incr.repeat(2);
    mixed.extend(common::resp(&[b"INCRBY", b"segment:blk", b"5"]));
    mixed.extend(common::resp(&[b"INCR", b"segment:trd"]).repeat(3));
    mixed.extend(incr.clone());
    assert_eq!(
        raw.send(&mixed, 7).await,
        ":302\r\n:303\r\n:308\r\n:1\r\n:2\r\n:3\r\n:309\r\n"
    );

    // In a transaction each INCR is queued and run on its own.
    let mut multi = common::resp(&[b"MULTI"]);
    multi.extend(incr.repeat(3));
    multi.extend(common::resp(&[b"EXEC"]));
    assert_eq!(
        raw.send(&multi, 8).await,
        "+OK\r\n+QUEUED\r\n+QUEUED\r\n+QUEUED\r\n*3\r\n:310\r\n:311\r\n:312\r\n"
    );

    // Before AUTH each copy is refused on its own, and no ID is taken.
    let mut stranger = server.raw().await;
    assert_eq!(
        stranger.send(&incr.repeat(3), 3).await,
        "-NOAUTH Authentication required.\r\n".repeat(3)
    );
    assert_eq!(raw.send(&incr, 1).await, ":313\r\n");
    server.stop().await;
}

/// A period tag's pipelined INCRs are served one by one: a pipeline that reaches the end of the
/// period gets every number left, in order, then the error (as INCRs sent one at a time).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipeline_reaching_the_end_of_a_period_gets_every_number_left() {
    use leafd::config::Period;
    let mut config = Config::default();
    config.storage.state_dir = common::memory_state_dir();
    config.segment.tags = vec![TagSeed {
        period: Some(Period::Yearly),
        sequence_digits: 1,
        ..TagSeed::new("yr", 10)
    }];
    let server = TestServer::start_with_store(config, Arc::new(MemoryStore::new()) as Arc<_>).await;
    let mut raw = server.raw().await;
    let incr = common::resp(&[b"INCR", b"segment:yr"]);
    let replies = raw.send(&incr.repeat(12), 12).await;
    let lines: Vec<&str> = replies.split("\r\n").filter(|l| !l.is_empty()).collect();
    assert_eq!(lines.len(), 12, "{replies}");
    let first: i64 = lines[0][1..].parse().expect(lines[0]);
    let ids: Vec<i64> = (0..9).map(|i| first + i).collect();
    let served: Vec<i64> = lines[..9].iter().map(|l| l[1..].parse().unwrap()).collect();
    assert_eq!(served, ids, "the year's nine numbers, in order");
    assert_eq!(first % 10, 1, "a year's sequence starts at 1");
    for line in &lines[9..] {
        assert!(
            line.starts_with("-ERR tag 'yr': period ")
                && line.contains("has used all its 9 sequence numbers"),
            "{line}"
        );
    }
    server.stop().await;
}

/// LEAF.TAGS and /cache page through the tags after a cursor, as SCAN does: every tag once, in
/// order, whatever the page size; a bad cursor or COUNT answers an error naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tags_are_listed_page_by_page_after_a_cursor() {
    let (server, _dir) = sqlite_server().await;
    let mut con = server.client().await;
    let names: Vec<String> = (0..23).map(|i| format!("page{i:02}")).collect();
    for name in &names {
        create_tag(&server, name, 10, None).await;
    }
    let _: i64 = con.incr("segment:page07", 1).await.unwrap();
    let (mut cursor, mut listed) = ("0".to_string(), Vec::new());
    loop {
        let (next, page): (String, Vec<std::collections::HashMap<String, redis::Value>>) =
            redis::cmd("LEAF.TAGS")
                .arg(&cursor)
                .arg("COUNT")
                .arg(5)
                .query_async(&mut con)
                .await
                .unwrap();
        assert!(page.len() <= 5);
        for t in page {
            listed.push(redis::from_redis_value::<String>(t["tag"].clone()).unwrap());
        }
        if next == "0" {
            break;
        }
        cursor = next;
    }
    assert_eq!(listed, names, "every tag once, in order");
    let whole: Vec<std::collections::HashMap<String, redis::Value>> =
        redis::cmd("LEAF.TAGS").query_async(&mut con).await.unwrap();
    assert_eq!(whole.len(), names.len(), "without a cursor: every tag");
    let bad: redis::RedisResult<redis::Value> = redis::cmd("LEAF.TAGS")
        .arg("zz")
        .query_async(&mut con)
        .await;
    assert!(bad.unwrap_err().to_string().contains("invalid cursor"));
    let bad: redis::RedisResult<redis::Value> = redis::cmd("LEAF.TAGS")
        .arg("0")
        .arg("COUNT")
        .arg(0)
        .query_async(&mut con)
        .await;
    assert!(bad
        .unwrap_err()
        .to_string()
        .contains("COUNT must be 1 to 10000"));
    let cache_page = |cursor: String| {
        let url = server.http_url(&format!("/cache?cursor={cursor}&count=20"));
        async move {
            let body = common::http_client()
                .get(url)
                .header("Accept", "application/json")
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap();
            serde_json::from_str::<serde_json::Value>(&body).unwrap()
        }
    };
    let page = cache_page("0".into()).await;
    assert_eq!(page["tags"].as_array().unwrap().len(), 20);
    let rest = cache_page(page["cursor"].as_str().unwrap().to_string()).await;
    assert_eq!(rest["cursor"], "0");
    assert_eq!(rest["tags"][2]["tag"], "page22");
    server.stop().await;
}
