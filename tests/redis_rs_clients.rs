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
