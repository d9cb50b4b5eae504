//! Client scenarios run against every storage backend (SQLite here; MariaDB and PostgreSQL
//! in their own test files), so each backend is held to the same behaviour.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};

use redis::AsyncCommands;

use super::TestServer;

/// A tag name no other test (or earlier run against a shared database) uses.
pub fn unique_tag(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!(
        "{prefix}-{}-{nanos}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

pub async fn create_tag(server: &TestServer, tag: &str, step: i64, start: Option<i64>) {
    let mut con = server.client().await;
    let mut cmd = redis::cmd("LEAF.TAG");
    cmd.arg("CREATE").arg(tag).arg(step);
    if let Some(start) = start {
        cmd.arg(start);
    }
    let reply: String = cmd.query_async(&mut con).await.expect("LEAF.TAG CREATE");
    assert_eq!(reply, "OK");
}

/// INCR on a fresh tag returns 1, 2, 3; a tag created with a start begins there.
pub async fn fresh_tag_counts_from_one(server: &TestServer) {
    let tag = unique_tag("fresh");
    create_tag(server, &tag, 10, None).await;
    let mut con = server.client().await;
    let key = format!("segment:{tag}");
    let ids: Vec<i64> = vec![
        con.incr(&key, 1).await.unwrap(),
        redis::cmd("INCR")
            .arg(&key)
            .query_async(&mut con)
            .await
            .unwrap(),
        redis::cmd("INCR")
            .arg(&key)
            .query_async(&mut con)
            .await
            .unwrap(),
    ];
    assert_eq!(ids, vec![1, 2, 3]);

    let started = unique_tag("started");
    create_tag(server, &started, 5, Some(1000)).await;
    let first: i64 = redis::cmd("INCR")
        .arg(format!("segment:{started}"))
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(first, 1000);
}

/// `total` INCRs from `connections` concurrent connections, every other one pipelined: all IDs
/// distinct, and each connection sees its IDs increase.
pub async fn concurrent_incrs_are_unique(server: &TestServer, total: usize, connections: usize) {
    let tag = unique_tag("concurrent");
    create_tag(server, &tag, 1000, None).await;
    let key = format!("segment:{tag}");
    let per_connection = total / connections;
    let mut tasks = Vec::new();
    for c in 0..connections {
        let mut con = server.client().await;
        let key = key.clone();
        tasks.push(tokio::spawn(async move {
            let mut ids = Vec::with_capacity(per_connection);
            if c % 2 == 0 {
                for _ in 0..per_connection {
                    let id: i64 = redis::cmd("INCR")
                        .arg(&key)
                        .query_async(&mut con)
                        .await
                        .unwrap();
                    ids.push(id);
                }
            } else {
                let mut left = per_connection;
                while left > 0 {
                    let batch = left.min(250);
                    let mut pipe = redis::pipe();
                    for _ in 0..batch {
                        pipe.cmd("INCR").arg(&key);
                    }
                    let got: Vec<i64> = pipe.query_async(&mut con).await.unwrap();
                    assert_eq!(got.len(), batch);
                    ids.extend(got);
                    left -= batch;
                }
            }
            ids
        }));
    }
    let mut seen = HashSet::with_capacity(total);
    for task in tasks {
        let ids = task.await.unwrap();
        assert_eq!(ids.len(), per_connection);
        assert!(
            ids.windows(2).all(|w| w[0] < w[1]),
            "a connection's IDs must increase"
        );
        for id in ids {
            assert!(id > 0);
            assert!(seen.insert(id), "duplicate ID {id}");
        }
    }
    assert_eq!(seen.len(), per_connection * connections);
}

/// Concurrent INCRBY blocks (including blocks larger than the step) and INCRs never overlap.
pub async fn incrby_blocks_never_overlap(server: &TestServer) {
    let tag = unique_tag("blocks");
    create_tag(server, &tag, 100, None).await;
    let key = format!("segment:{tag}");
    let mut tasks = Vec::new();
    for worker in 0..8i64 {
        let mut con = server.client().await;
        let key = key.clone();
        tasks.push(tokio::spawn(async move {
            let mut ranges = Vec::new();
            for i in 0..200i64 {
                let n = match (worker + i) % 5 {
                    0 => 1,
                    1 => 7,
                    2 => 64,
                    3 => 250, // larger than the table step: a dedicated block
                    _ => 3,
                };
                let last: i64 = if n == 1 && worker % 2 == 0 {
                    redis::cmd("INCR")
                        .arg(&key)
                        .query_async(&mut con)
                        .await
                        .unwrap()
                } else {
                    redis::cmd("INCRBY")
                        .arg(&key)
                        .arg(n)
                        .query_async(&mut con)
                        .await
                        .unwrap()
                };
                ranges.push((last - n + 1, last));
            }
            ranges
        }));
    }
    let mut ranges = Vec::new();
    for task in tasks {
        ranges.extend(task.await.unwrap());
    }
    ranges.sort();
    assert!(ranges[0].0 >= 1);
    for pair in ranges.windows(2) {
        assert!(
            pair[0].1 < pair[1].0,
            "blocks {:?} and {:?} overlap",
            pair[0],
            pair[1]
        );
    }
}

/// A tag whose first ID is 149 below 2^63 − 1, step 100: one segment is served to its last ID,
/// then the rest of the space (a segment smaller than the step) to the last ID the statement
/// allows, then INCR and INCRBY answer `ERR tag '<tag>' has exhausted its ID space`, and the
/// row is never changed again (no overflow stored, no "database unreachable").
pub async fn the_end_of_the_id_space_is_refused_and_the_row_kept(server: &TestServer) {
    let tag = unique_tag("end");
    let store = server.app.segments.store();
    store
        .create_tag(&leafd::storage::NewTag {
            tag: tag.clone(),
            step: 100,
            start: i64::MAX - 149,
            description: None,
            split: None,
            max_tags: 1000,
        })
        .await
        .unwrap();
    server.app.segments.refresh_tags().await.unwrap();
    let mut con = server.client().await;
    let key = format!("segment:{tag}");
    let first: i64 = con.incr(&key, 1).await.unwrap();
    assert_eq!(first, i64::MAX - 149);
    let last: i64 = redis::cmd("INCRBY")
        .arg(&key)
        .arg(99)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(last, i64::MAX - 50, "the whole last full segment is served");
    let expected = format!("tag '{tag}' has exhausted its ID space");
    // The rest of the space, one by one, to the end.
    let mut last = last;
    loop {
        match con.incr::<_, _, i64>(&key, 1).await {
            Ok(id) => {
                assert_eq!(id, last + 1, "the rest is served in order");
                last = id;
            }
            Err(err) => {
                assert!(err.to_string().contains(&expected), "{err}");
                break;
            }
        }
    }
    // 2^63 − 1 is never handed out; SQLite's statement keeps one more back.
    assert!(
        [i64::MAX - 1, i64::MAX - 2].contains(&last),
        "the last ID: {last}"
    );
    for args in [vec!["INCR"], vec!["INCRBY", "1"], vec!["INCRBY", "500"]] {
        let mut cmd = redis::cmd(args[0]);
        cmd.arg(&key);
        for arg in &args[1..] {
            cmd.arg(*arg);
        }
        let err = cmd.query_async::<i64>(&mut con).await.unwrap_err();
        assert_eq!(err.code(), Some("ERR"), "{err}");
        assert!(err.to_string().contains(&expected), "{err}");
    }
    let row = store
        .list()
        .await
        .unwrap()
        .into_iter()
        .find(|row| row.tag == tag)
        .unwrap();
    assert_eq!(
        row.max_id,
        last + 1,
        "the row is never pushed past the end (Leaf's reading: max_id is the next ID)"
    );
}

/// `nodes` applications opened at the same instant on one fresh database, as a Deployment's
/// replicas start on a new cluster: every one comes up (the schema is migrated once, the others
/// wait for it), each serves a configured tag, and no ID repeats.
pub async fn nodes_started_at_once_all_come_up(url: &str, nodes: usize) {
    let tag = unique_tag("atonce");
    let mut starts = tokio::task::JoinSet::new();
    for _ in 0..nodes {
        let mut config = leafd::config::Config::default();
        config.storage.url = url.to_string();
        config.segment.tags = vec![leafd::config::TagSeed::new(tag.clone(), 10)];
        starts.spawn(leafd::app::App::open(super::test_config(config)));
    }
    let mut apps = Vec::new();
    while let Some(started) = starts.join_next().await {
        match started.unwrap() {
            Ok(app) => apps.push(app),
            Err(e) => panic!("a node started at the same instant failed: {e}"),
        }
    }
    let mut seen = HashSet::new();
    for app in &apps {
        for _ in 0..25 {
            let id = app.segments.next_ids(&tag, 1).await.unwrap();
            assert!(seen.insert(id), "repeated {id}");
        }
    }
    assert_eq!(seen.len(), 25 * nodes);
    for app in apps {
        app.close().await;
    }
}

/// `segment.auto_create` on two nodes sharing `url`: both race to create `auto-a` by using it
/// and serve distinct IDs of its one row; a name outside the pattern stays unknown; created
/// tags count against `segment.max_tags`; HTTP creates as RESP does.
pub async fn tags_created_on_first_use(url: &str) {
    let config = || {
        let mut config = leafd::config::Config::default();
        config.storage.url = url.to_string();
        config.segment.auto_create = true;
        config.segment.auto_create_pattern = "auto-*".into();
        config.segment.auto_create_step = 10;
        config.segment.max_tags = 3;
        config.segment.adaptive_step = false;
        config
    };
    let nodes = [
        TestServer::start(config()).await,
        TestServer::start(config()).await,
    ];
    let mut tasks = Vec::new();
    for node in &nodes {
        for _ in 0..4 {
            let mut con = node.client().await;
            tasks.push(tokio::spawn(async move {
                let mut ids = Vec::new();
                for _ in 0..100 {
                    let id: i64 = con.incr("segment:auto-a", 1).await.unwrap();
                    ids.push(id);
                }
                ids
            }));
        }
    }
    let mut seen = HashSet::new();
    for task in tasks {
        for id in task.await.unwrap() {
            assert!(seen.insert(id), "repeated {id}");
        }
    }
    assert_eq!(seen.len(), 800);
    let mut con = nodes[1].client().await;
    let unknown: redis::RedisResult<i64> = con.incr("segment:other", 1).await;
    assert_eq!(
        unknown.unwrap_err().to_string(),
        "ResponseError: unknown tag 'other'",
        "outside the pattern"
    );
    let over_http = super::http_get(nodes[0].http_url("/api/segment/get/auto-b"))
        .await
        .unwrap();
    assert_eq!(over_http.status().as_u16(), 200);
    assert_eq!(over_http.text().await.unwrap(), "1");
    let third: i64 = con.incr("segment:auto-c", 1).await.unwrap();
    assert_eq!(third, 1);
    let refused: redis::RedisResult<i64> = con.incr("segment:auto-d", 1).await;
    assert!(
        refused
            .unwrap_err()
            .to_string()
            .contains("tag limit reached: the table has 3 tags (segment.max_tags = 3)"),
        "counted by max_tags"
    );
    for node in nodes {
        node.stop().await;
    }
}

/// Opaque IDs (`[[segment.opaque]]`) from two nodes: every ID has exactly the configured
/// digits, all are distinct, `LEAF.TAG REVEAL` maps them back onto distinct sequential IDs,
/// their order is not the sequence's; INCRBY is refused; HTTP serves them too; a 4-digit tag
/// hands out 8,999 distinct four-digit IDs and then refuses; and the database's record
/// refuses a node with another key, a node serving the tag's plain IDs, and opaque IDs for a
/// tag whose plain IDs reached their range.
pub async fn opaque_ids(url: &str) {
    let (orders, small, late) = (
        unique_tag("opaque"),
        unique_tag("opaque-small"),
        unique_tag("opaque-late"),
    );
    let config = |key: &str, opaque: bool| {
        let mut config = leafd::config::Config::default();
        config.storage.url = url.to_string();
        config.segment.adaptive_step = false;
        config.segment.opaque_key = key.into();
        if opaque {
            for (tag, digits) in [(&orders, 10), (&small, 4), (&late, 10)] {
                config.segment.opaque.push(leafd::config::OpaqueTag {
                    tag: tag.clone(),
                    digits,
                });
            }
        }
        config
    };
    let key = "a key of at least sixteen characters";
    let nodes = [
        TestServer::start(config(key, true)).await,
        TestServer::start(config(key, true)).await,
    ];
    create_tag(&nodes[0], &orders, 50, None).await;
    create_tag(&nodes[0], &small, 1000, None).await;
    create_tag(&nodes[0], &late, 5, Some(1_000_000_005)).await;
    let mut tasks = Vec::new();
    for node in &nodes {
        for _ in 0..2 {
            let mut con = node.client().await;
            let tag = format!("segment:{orders}");
            tasks.push(tokio::spawn(async move {
                let mut ids = Vec::new();
                for _ in 0..150 {
                    let id: i64 = con.incr(&tag, 1).await.unwrap();
                    ids.push(id);
                }
                ids
            }));
        }
    }
    let mut ids = Vec::new();
    for task in tasks {
        ids.extend(task.await.unwrap());
    }
    ids.push(nodes[1].http_id(&orders).await);
    let mut admin = nodes[0].client().await;
    let mut positions = HashSet::new();
    for &id in &ids {
        assert!((1_000_000_000..10_000_000_000).contains(&id), "{id}");
        let position: i64 = redis::cmd("LEAF.TAG")
            .arg("REVEAL")
            .arg(&orders)
            .arg(id)
            .query_async(&mut admin)
            .await
            .unwrap();
        assert!(position >= 1, "{id} -> {position}");
        assert!(positions.insert(position), "{id} reveals {position} twice");
    }
    let distinct: HashSet<i64> = ids.iter().copied().collect();
    assert_eq!(distinct.len(), ids.len(), "opaque IDs repeat");
    let rising = ids.windows(2).filter(|w| w[1] > w[0]).count();
    assert!(
        rising > ids.len() / 4 && rising < ids.len() * 3 / 4,
        "the order shows: {rising} of {} rise",
        ids.len()
    );
    let refused: redis::RedisResult<i64> = admin.incr(format!("segment:{orders}"), 2).await;
    let message = refused.unwrap_err().to_string();
    assert!(message.contains("hands out opaque IDs"), "{message}");
    let revealed: redis::RedisResult<i64> = redis::cmd("LEAF.TAG")
        .arg("REVEAL")
        .arg(&orders)
        .arg(42)
        .query_async(&mut admin)
        .await;
    let message = revealed.unwrap_err().to_string();
    assert!(message.contains("is not an opaque ID"), "{message}");

    // 4 digits: sequential IDs 1 to 8999, every one a distinct four-digit number, then the end.
    let mut pipe = redis::pipe();
    for _ in 0..8999 {
        pipe.incr(format!("segment:{small}"), 1);
    }
    let small_ids: Vec<i64> = pipe
        .query_async(&mut admin)
        .await
        .unwrap_or_else(|e| panic!("8,999 four-digit opaque IDs: {e}"));
    let distinct: HashSet<i64> = small_ids.iter().copied().collect();
    assert_eq!(distinct.len(), 8999);
    assert!(small_ids.iter().all(|id| (1000..=9999).contains(id)));
    let past: redis::RedisResult<i64> = admin.incr(format!("segment:{small}"), 1).await;
    let message = past.unwrap_err().to_string();
    assert!(message.contains("exhausted its ID space"), "{message}");

    // Plain IDs that reached the opaque range: the tag cannot turn opaque.
    let late_reply: redis::RedisResult<i64> = admin.incr(format!("segment:{late}"), 1).await;
    let message = late_reply.unwrap_err().to_string();
    assert!(
        message.contains("at or past its first opaque ID"),
        "{message}"
    );

    // Another key, and a node serving the tag's plain IDs: both refused by the table's record.
    for (other, expected) in [
        (
            config("another key, also sixteen+", true),
            "under another key",
        ),
        (config(key, false), "plain IDs refused"),
    ] {
        let node = TestServer::start(other).await;
        let mut con = node.client().await;
        let reply: redis::RedisResult<i64> = con.incr(format!("segment:{orders}"), 1).await;
        let message = reply.unwrap_err().to_string();
        assert!(message.contains(expected), "{message}");
        node.stop().await;
    }
    for node in nodes {
        node.stop().await;
    }
}

/// The tag list read page by page (`rules_after`, the periodic sweep's read) on the store the
/// URL names: every row exactly once with its record, whatever the page size, for names that
/// sort differently by bytes and by a case-insensitive collation.
pub async fn the_tag_list_is_read_page_by_page(url: &str) {
    use leafd::storage::NewTag;
    let config = leafd::config::StorageConfig {
        url: url.to_string(),
        ..leafd::config::StorageConfig::default()
    };
    let store = leafd::storage::open(&config, true).await.unwrap();
    let mut expected = std::collections::BTreeMap::new();
    let tags = [
        "B", "a", "ab", "C_", "c", "Z9", "z8", "0", "_x", "m-1", "m.2", "p-last", "d\u{1e}e",
    ];
    for (i, tag) in tags.iter().map(|tag| tag.to_string()).enumerate() {
        let split = (i % 4 == 0).then(|| "2:1".to_string());
        let new = NewTag {
            tag: tag.clone(),
            step: 10,
            start: 1,
            description: None,
            split: split.clone(),
            max_tags: 1000,
        };
        store.create_tag(&new).await.unwrap();
        expected.insert(tag, split);
    }
    for limit in [1, 2, 5, 12, 13, 14] {
        let mut read = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let page = store.rules_after(after.as_deref(), limit).await.unwrap();
            assert!(page.len() <= limit);
            let full = page.len() == limit;
            after = page.last().map(|(tag, _)| tag.clone());
            read.extend(page);
            if !full {
                break;
            }
        }
        let names: HashSet<&String> = read.iter().map(|(tag, _)| tag).collect();
        assert_eq!(names.len(), read.len(), "each row once at limit {limit}");
        let read: std::collections::BTreeMap<String, Option<String>> = read.into_iter().collect();
        assert_eq!(read, expected, "every row with its record at limit {limit}");
    }
    store.close().await;
}
