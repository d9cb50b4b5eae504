//! The segment client scenarios on MariaDB/MySQL and PostgreSQL, several nodes on one
//! database, and bad database configuration. Needs LEAFD_TEST_MYSQL_URL / LEAFD_TEST_POSTGRES_URL.

mod common;

use std::collections::HashSet;

use common::backends::Backend;
use common::scenarios::{self, create_tag, unique_tag};
use common::TestServer;
use leafd::app::App;
use leafd::config::Config;

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

/// A wrong password and an unreachable server are clear errors at start, not panics.
async fn bad_configuration_is_a_clear_error(backend: Backend, server_url: &str) {
    let (wrong_password, unreachable) = match backend {
        Backend::MySql => (
            server_url.replacen("mysql://root@", "mysql://root:wrong-password@", 1) + "/test",
            "mysql://root@127.0.0.1:1/test".to_string(),
        ),
        Backend::Postgres => (
            server_url.to_string() + "/no_such_database_leafd",
            "postgres://postgres@127.0.0.1:1/test".to_string(),
        ),
    };
    for url in [wrong_password, unreachable] {
        let mut config = config_for(&url);
        config.storage.acquire_timeout_ms = 2000;
        let err = match App::open(config).await {
            Ok(_) => panic!("{url} must not start"),
            Err(e) => e.to_string(),
        };
        assert!(err.starts_with("storage: database error:"), "{url}: {err}");
    }
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
            async fn bad_configuration_is_a_clear_error() {
                let Some(server) = $backend.server_url(concat!(
                    stringify!($module),
                    "::bad_configuration_is_a_clear_error"
                )) else {
                    return;
                };
                super::bad_configuration_is_a_clear_error($backend, &server).await;
            }
        }
    };
}

backend_tests!(mysql, Backend::MySql);
backend_tests!(postgres, Backend::Postgres);
