//! The HTTP listener through a real HTTP client: Leaf's API, /cache, /decode, /health, /ready
//! and a /metrics page that lists what DESIGN.md §3 asks for.

mod common;

use std::sync::Arc;

use common::{resp, TestServer};
use leafd::config::Config;
use leafd::storage::MemoryStore;

async fn server() -> TestServer {
    let mut config = Config::default();
    config.snowflake.worker_id = 9;
    config.segment.adaptive_step = false;
    let server = TestServer::start_with_store(config, Arc::new(MemoryStore::new())).await;
    let mut raw = server.raw().await;
    assert_eq!(
        raw.send(&resp(&[b"LEAF.TAG", b"CREATE", b"web", b"100"]), 1)
            .await,
        "+OK\r\n"
    );
    server
}

async fn get(server: &TestServer, path: &str, accept: Option<&str>) -> (u16, String) {
    let client = reqwest::Client::new();
    let mut request = client.get(server.http_url(path));
    if let Some(accept) = accept {
        request = request.header("accept", accept);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaf_api_serves_increasing_ids_and_clear_errors() {
    let server = server().await;
    let mut ids = Vec::new();
    for _ in 0..5 {
        let (status, body) = get(&server, "/api/segment/get/web", None).await;
        assert_eq!(status, 200);
        ids.push(body.parse::<i64>().unwrap());
    }
    assert_eq!(ids, vec![1, 2, 3, 4, 5]);
    assert_eq!(
        get(&server, "/api/segment/get/nope", None).await,
        (404, "unknown tag 'nope'\n".to_string())
    );
    let (status, body) = get(&server, "/api/snowflake/get/anything", None).await;
    assert_eq!(status, 200);
    let snowflake: i64 = body.parse().unwrap();
    let (status, decoded) = get(&server, &format!("/decode/{snowflake}"), None).await;
    assert_eq!(status, 200);
    let decoded: serde_json::Value = serde_json::from_str(&decoded).unwrap();
    assert_eq!(decoded["worker_id"], 9);
    assert_eq!(decoded["id"], snowflake);
    assert_eq!(get(&server, "/decode/-1", None).await.0, 400);
    assert_eq!(
        get(&server, "/health", None).await,
        (200, "ok\n".to_string())
    );
    assert_eq!(
        get(&server, "/ready", None).await,
        (200, "ready\n".to_string())
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_page_lists_tags_with_their_buffers() {
    let server = server().await;
    for _ in 0..12 {
        get(&server, "/api/segment/get/web", None).await;
    }
    let (status, json) = get(&server, "/cache", Some("application/json")).await;
    assert_eq!(status, 200);
    let json: serde_json::Value = serde_json::from_str(&json).unwrap();
    let tag = &json["tags"][0];
    assert_eq!(tag["tag"], "web");
    assert_eq!(tag["served"], 12);
    assert_eq!(tag["current"]["next"], 13);
    assert_eq!(tag["current"]["end"], 100);
    let (status, html) = get(&server, "/cache", None).await;
    assert_eq!(status, 200);
    assert!(html.contains("<td>web</td>"), "{html}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_page_has_the_design_metrics() {
    let server = server().await;
    let mut con = server.client().await;
    for _ in 0..20 {
        let _: i64 = redis::cmd("INCR")
            .arg("segment:web")
            .query_async(&mut con)
            .await
            .unwrap();
        let _: i64 = redis::cmd("SNOWFLAKE").query_async(&mut con).await.unwrap();
    }
    let _ = redis::cmd("INCR")
        .arg("segment:missing")
        .query_async::<i64>(&mut con)
        .await;
    let (status, page) = get(&server, "/metrics", None).await;
    assert_eq!(status, 200);
    for expected in [
        "leafd_commands_total{command=\"incr\",result=\"ok\"} 20",
        "leafd_commands_total{command=\"incr\",result=\"error\"} 1",
        "leafd_command_duration_seconds_bucket{command=\"incr\",le=\"0.0001\"}",
        "leafd_connections_open ",
        "leafd_segment_ids_total{tag=\"web\"} 20",
        "leafd_segment_loads_total{tag=\"web\",result=\"ok\"} 2",
        "leafd_segment_load_duration_seconds_bucket{tag=\"web\"",
        "leafd_segment_remaining_ids{tag=\"web\",buffer=\"current\"} 80",
        "leafd_segment_remaining_ids{tag=\"web\",buffer=\"next\"} 100",
        "leafd_segment_preload_threshold_ids{tag=\"web\"} 90",
        "leafd_segment_step{tag=\"web\"} 100",
        "leafd_snowflake_ids_total 20",
        "leafd_snowflake_worker_id 9",
        "leafd_snowflake_clock_backward_total 0",
        "leafd_storage_ready 1",
    ] {
        assert!(page.contains(expected), "missing {expected:?} in\n{page}");
    }
    server.stop().await;
}
