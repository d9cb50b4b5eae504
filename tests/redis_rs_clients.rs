//! redis-rs beyond the basic connection: the async multiplexed connection shared by many
//! tasks, and ConnectionManager (which reconnects by itself), over RESP2 and RESP3.

mod common;

use std::collections::HashSet;
use std::sync::Arc;

use common::TestServer;
use leafd::config::Config;
use leafd::storage::MemoryStore;
use redis::AsyncCommands;

async fn server() -> TestServer {
    let server =
        TestServer::start_with_store(Config::default(), Arc::new(MemoryStore::new())).await;
    let mut con = server.client().await;
    let _: String = redis::cmd("LEAF.TAG")
        .arg("CREATE")
        .arg("rs")
        .arg(100)
        .query_async(&mut con)
        .await
        .unwrap();
    server
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_multiplexed_connection_shared_by_many_tasks() {
    let server = server().await;
    for url in [server.url(), format!("{}?protocol=resp3", server.url())] {
        let client = redis::Client::open(url).unwrap();
        let con = client.get_multiplexed_async_connection().await.unwrap();
        let tasks: Vec<_> = (0..16)
            .map(|_| {
                let mut con = con.clone();
                tokio::spawn(async move {
                    let mut ids = Vec::new();
                    for _ in 0..200 {
                        let id: i64 = con.incr("segment:rs", 1).await.unwrap();
                        ids.push(id);
                        let snow: i64 =
                            redis::cmd("SNOWFLAKE").query_async(&mut con).await.unwrap();
                        ids.push(snow);
                    }
                    ids
                })
            })
            .collect();
        let mut seen = HashSet::new();
        for task in tasks {
            for id in task.await.unwrap() {
                assert!(seen.insert(id), "duplicate {id}");
            }
        }
        assert_eq!(seen.len(), 16 * 400);
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_manager_fetches_ids() {
    let server = server().await;
    let client = redis::Client::open(server.url()).unwrap();
    let mut manager = redis::aio::ConnectionManager::new(client).await.unwrap();
    let mut last = 0;
    for _ in 0..500 {
        let id: i64 = manager.incr("segment:rs", 1).await.unwrap();
        assert!(id > last);
        last = id;
    }
    let ids: Vec<i64> = redis::cmd("SNOWFLAKE")
        .arg(100)
        .query_async(&mut manager)
        .await
        .unwrap();
    assert!(ids.windows(2).all(|w| w[0] < w[1]));
    let as_string: String = manager.get("snowflake").await.unwrap();
    assert!(as_string.parse::<i64>().unwrap() > *ids.last().unwrap());
    server.stop().await;
}

/// Connections dealt over several connection threads share one engine: every ID unique, each
/// connection's IDs increasing, while small segments make the threads load new ones all the time
/// (the loads run on the application's runtime, which here is the test's own).
#[tokio::test]
async fn connections_on_several_io_threads_share_the_engines() {
    let mut config = Config::default();
    config.server.io_threads = 3;
    let server = TestServer::start_with_store(config, Arc::new(MemoryStore::new())).await;
    let mut admin = server.client().await;
    let _: String = redis::cmd("LEAF.TAG")
        .arg("CREATE")
        .arg("threads")
        .arg(7)
        .query_async(&mut admin)
        .await
        .unwrap();
    let client = redis::Client::open(server.url()).unwrap();
    let mut tasks = Vec::new();
    for _ in 0..9 {
        // A connection each (not one multiplexed): nine connections land on three threads.
        let mut con = client.get_multiplexed_async_connection().await.unwrap();
        tasks.push(tokio::spawn(async move {
            let (mut segment, mut snowflake) = (Vec::new(), Vec::new());
            for i in 0..300 {
                let id: i64 = if i % 10 == 0 {
                    con.incr("segment:threads", 3).await.unwrap()
                } else {
                    con.incr("segment:threads", 1).await.unwrap()
                };
                segment.push(id);
                let id: i64 = redis::cmd("SNOWFLAKE").query_async(&mut con).await.unwrap();
                snowflake.push(id);
            }
            (segment, snowflake)
        }));
    }
    let mut seen = HashSet::new();
    for task in tasks {
        let (segment, snowflake) = task.await.unwrap();
        for ids in [&segment, &snowflake] {
            assert!(
                ids.windows(2).all(|w| w[0] < w[1]),
                "one connection's IDs increase"
            );
            for &id in ids {
                assert!(seen.insert(id), "duplicate {id}");
            }
        }
    }
    assert_eq!(seen.len(), 9 * 600);
    server.stop().await;
}
