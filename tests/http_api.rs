//! The HTTP listener through a real HTTP client: Leaf's API, /cache, /decode, /health, /ready
//! and a /metrics page that lists what DESIGN.md §3 asks for.

mod common;

use std::sync::Arc;

use common::{resp, TestServer};
use leafd::config::Config;
use leafd::storage::MemoryStore;

async fn server() -> TestServer {
    let mut config = Config::default();
    config.snowflake.coordinator = leafd::config::CoordinatorKind::Static;
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
    let client = common::http_client();
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
    assert!(tag["split"].is_null() && tag["opaque"].is_null(), "{tag}");
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
    for _ in 0..2 {
        let _ = redis::cmd("NOSUCHCOMMAND")
            .query_async::<i64>(&mut con)
            .await;
    }
    let (status, page) = get(&server, "/metrics", None).await;
    assert_eq!(status, 200);
    for expected in [
        "leafd_commands_total{command=\"incr\",result=\"ok\"} 20",
        "leafd_commands_total{command=\"incr\",result=\"error\"} 1",
        "leafd_command_duration_seconds_bucket{command=\"incr\",le=\"0.0001\"}",
        "leafd_connections_open ",
        "leafd_segment_ids_total{tag=\"web\"} 20",
        "leafd_segment_tag_info{tag=\"web\",order=\"trend\",period=\"none\"} 1",
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
        // No strict tag here: both results exported, at 0.
        "leafd_segment_strict_gathers_total{result=\"paid\"} 0",
        "leafd_segment_strict_gathers_total{result=\"missed\"} 0",
        "leafd_commands_total{command=\"unknown\",result=\"error\"} 2",
        "leafd_snowflake_worker_info{worker_id=\"9\",coordinator=\"static\"} 1",
        &format!(
            "leafd_build_info{{version=\"{}\",commit=\"",
            env!("CARGO_PKG_VERSION")
        ),
        "process_resident_memory_bytes ",
        "process_cpu_seconds_total ",
        "process_open_fds ",
    ] {
        assert!(page.contains(expected), "missing {expected:?} in\n{page}");
    }
    server.stop().await;
}

/// A request with optional credentials and JSON body; returns status, WWW-Authenticate, body.
async fn call(
    server: &TestServer,
    method: reqwest::Method,
    path: &str,
    auth: Option<&str>,
    body: Option<&str>,
) -> (u16, Option<String>, String) {
    let mut request = common::http_client().request(method, server.http_url(path));
    if let Some(auth) = auth {
        request = request.header("authorization", auth);
    }
    if let Some(body) = body {
        request = request
            .header("content-type", "application/json")
            .body(body.to_string());
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let challenge = response
        .headers()
        .get("www-authenticate")
        .map(|v| v.to_str().unwrap().to_string());
    (status, challenge, response.text().await.unwrap())
}

fn basic(user: &str, password: &str) -> String {
    use base64::Engine as _;
    let pair = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    format!("Basic {pair}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_follows_the_resp_users_and_roles() {
    use reqwest::Method;
    let config = Config::from_toml(
        "[server]\nrequirepass = \"rootpw\"\n\
         [[server.users]]\nname = \"orders\"\npassword = \"o-pw\"\n\
         [[server.users]]\nname = \"ops\"\npassword = \"ops-pw\"\nadmin = true\n",
    )
    .unwrap();
    let server = TestServer::start_with_store(config, Arc::new(MemoryStore::new())).await;
    server
        .app
        .segments
        .create_tag("web", 100, 1, None)
        .await
        .unwrap();
    // Probes and scraping stay open.
    for path in ["/health", "/ready", "/metrics"] {
        assert_eq!(call(&server, Method::GET, path, None, None).await.0, 200);
    }
    // Everything else wants credentials.
    for path in [
        "/api/segment/get/web",
        "/api/snowflake/get/x",
        "/decode/1",
        "/cache",
    ] {
        let (status, challenge, body) = call(&server, Method::GET, path, None, None).await;
        assert_eq!(
            (status, body.as_str()),
            (401, "NOAUTH Authentication required.\n"),
            "{path}"
        );
        assert!(challenge.unwrap().starts_with("Basic realm=\"leafd\""));
    }
    let wrong = call(
        &server,
        Method::GET,
        "/api/segment/get/web",
        Some(&basic("orders", "ops-pw")),
        None,
    )
    .await;
    assert_eq!(
        (wrong.0, wrong.2.as_str()),
        (
            401,
            "WRONGPASS invalid username-password pair or user is disabled.\n"
        )
    );
    // Basic for any user, Bearer for the default user's requirepass only.
    let get_id = |auth: String| {
        let server = &server;
        async move {
            call(
                server,
                Method::GET,
                "/api/segment/get/web",
                Some(&auth),
                None,
            )
            .await
        }
    };
    assert_eq!(get_id(basic("orders", "o-pw")).await.2, "1");
    assert_eq!(get_id(basic("default", "rootpw")).await.2, "2");
    assert_eq!(get_id("Bearer rootpw".into()).await.2, "3");
    assert_eq!(get_id("Bearer o-pw".into()).await.0, 401);
    assert_eq!(get_id("Digest abc".into()).await.0, 401);
    assert_eq!(get_id("Basic !!notbase64".into()).await.0, 401);

    // Tag administration: admins only.
    let new_tag = r#"{"tag": "invoices", "step": 50, "start": 500}"#;
    let (status, _, body) = call(
        &server,
        Method::POST,
        "/api/segment/tags",
        Some(&basic("orders", "o-pw")),
        Some(new_tag),
    )
    .await;
    assert_eq!(
        (status, body.as_str()),
        (403, "NOPERM this user has no permissions to manage tags\n")
    );
    let ops = basic("ops", "ops-pw");
    let (status, _, body) = call(
        &server,
        Method::POST,
        "/api/segment/tags",
        Some(&ops),
        Some(new_tag),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let created: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        created,
        serde_json::json!({"tag": "invoices", "step": 50, "start": 500})
    );
    assert_eq!(
        call(
            &server,
            Method::POST,
            "/api/segment/tags",
            Some(&ops),
            Some(new_tag)
        )
        .await,
        (409, None, "tag 'invoices' already exists\n".to_string())
    );
    let (status, _, body) = call(
        &server,
        Method::POST,
        "/api/segment/tags",
        Some(&ops),
        Some(r#"{"tag": "bad tag", "step": 5}"#),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("printable ASCII"), "{body}");
    let (status, _, _) = call(
        &server,
        Method::POST,
        "/api/segment/tags",
        Some(&ops),
        Some(r#"{"tag": "x", "step": "many"}"#),
    )
    .await;
    assert_eq!(status, 422);
    assert_eq!(
        call(
            &server,
            Method::GET,
            "/api/segment/get/invoices",
            Some(&ops),
            None
        )
        .await
        .2,
        "500"
    );
    // Step changes: admins only, unknown tags are 404.
    let step = Some(r#"{"step": 7}"#);
    assert_eq!(
        call(
            &server,
            Method::PATCH,
            "/api/segment/tags/invoices",
            None,
            step
        )
        .await
        .0,
        401
    );
    assert_eq!(
        call(
            &server,
            Method::PATCH,
            "/api/segment/tags/invoices",
            Some(&ops),
            step
        )
        .await,
        (200, None, r#"{"step":7,"tag":"invoices"}"#.to_string())
    );
    assert_eq!(
        call(
            &server,
            Method::PATCH,
            "/api/segment/tags/nope",
            Some(&ops),
            step
        )
        .await,
        (404, None, "unknown tag 'nope'\n".to_string())
    );
    // The new step is in the table; the engine applies it from the tag's next load.
    let rows = server.app.segments.store().list().await.unwrap();
    let invoices = rows.iter().find(|r| r.tag == "invoices").unwrap();
    assert_eq!(invoices.step, 7);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_users_the_admin_endpoints_are_open_like_leaf_tag() {
    let server = server().await;
    let (status, _, body) = call(
        &server,
        reqwest::Method::POST,
        "/api/segment/tags",
        None,
        Some(r#"{"tag": "open", "step": 10}"#),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(
        get(&server, "/api/segment/get/open", None).await,
        (200, "1".into())
    );
    server.stop().await;
}

/// What a newcomer poking at the API meets: HEAD never consumes an ID, a PATCH with one bad
/// value changes nothing, 0 is no snowflake ID, an absurd tag is not echoed in full, and a
/// wrong path or method says so in its body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_edges_answer_clearly_and_change_nothing() {
    let server = server().await;
    let client = common::http_client();
    assert_eq!(
        get(&server, "/api/segment/get/web", None).await,
        (200, "1".into())
    );
    for _ in 0..3 {
        let head = client
            .head(server.http_url("/api/segment/get/web"))
            .send()
            .await
            .unwrap();
        assert_eq!(head.status().as_u16(), 405);
        assert_eq!(head.headers()["allow"], "GET");
    }
    assert_eq!(
        get(&server, "/api/segment/get/web", None).await,
        (200, "2".into()),
        "HEAD consumed no ID"
    );

    let patch = |body: &'static str| {
        client
            .patch(server.http_url("/api/segment/tags/web"))
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    let refused = patch(r#"{"step":7777,"skip":-5}"#).await.unwrap();
    assert_eq!(refused.status().as_u16(), 400);
    assert_eq!(
        refused.text().await.unwrap(),
        "skip must be a positive number of IDs\n"
    );
    let rows = server.app.segments.store().list().await.unwrap();
    let web = rows.iter().find(|r| r.tag == "web").unwrap();
    assert_eq!(web.step, 100, "the step did not change");

    assert_eq!(
        get(&server, "/decode/0", None).await,
        (
            400,
            "'0' is not a snowflake ID (a positive 64-bit integer)\n".into()
        )
    );
    let mut raw = server.raw().await;
    assert_eq!(
        raw.send(&resp(&[b"LEAF.DECODE", b"0"]), 1).await,
        "-ERR a snowflake ID is a positive integer\r\n"
    );

    let long = "t".repeat(5000);
    let (status, body) = get(&server, &format!("/api/segment/get/{long}"), None).await;
    assert_eq!(status, 404);
    assert!(body.len() < 200, "{} bytes", body.len());
    assert!(
        body.starts_with(&format!("unknown tag '{}…'", "t".repeat(128))),
        "{body}"
    );

    assert_eq!(
        get(&server, "/nope", None).await,
        (
            404,
            "no such path: /nope (the paths: docs/reference/http.md)\n".into()
        )
    );
    let wrong = client
        .delete(server.http_url("/api/segment/get/web"))
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status().as_u16(), 405);
    assert_eq!(
        wrong.text().await.unwrap(),
        "method DELETE is not allowed on this path\n"
    );
    server.stop().await;
}

/// INFO memory and INFO commandstats say what Redis dashboards read from them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn info_memory_and_commandstats() {
    let server = server().await;
    let mut con = server.client().await;
    for _ in 0..5 {
        let _: i64 = redis::cmd("INCR")
            .arg("segment:web")
            .query_async(&mut con)
            .await
            .unwrap();
    }
    let _ = redis::cmd("INCR")
        .arg("segment:missing")
        .query_async::<i64>(&mut con)
        .await;
    let memory: String = redis::cmd("INFO")
        .arg("memory")
        .query_async(&mut con)
        .await
        .unwrap();
    let used: u64 = memory
        .lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .expect("used_memory")
        .trim()
        .parse()
        .unwrap();
    assert!(used > 1_000_000, "{memory}");
    assert!(memory.contains("maxmemory_policy:noeviction"), "{memory}");
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut con)
        .await
        .unwrap();
    let incr = stats
        .lines()
        .find(|l| l.starts_with("cmdstat_incr:"))
        .unwrap_or_else(|| panic!("{stats}"));
    assert!(incr.starts_with("cmdstat_incr:calls=6,usec="), "{incr}");
    assert!(incr.ends_with(",rejected_calls=0,failed_calls=1"), "{incr}");
    server.stop().await;
}

/// Leaf's `/db` lists the table's rows (escaped), and `/decodeSnowflakeId` decodes as Leaf's
/// page does, with Leaf's error shape.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leafs_db_and_decode_pages() {
    let dir = tempfile::tempdir().unwrap();
    let server = common::TestServer::start(common::sqlite_config(&dir)).await;
    common::scenarios::create_tag(&server, "a<b", 10, Some(5)).await;
    let page = common::http_get(server.http_url("/db"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        page.contains("<tr><td>a&lt;b</td><td>5</td><td>10</td><td>"),
        "{page}"
    );
    let mut con = server.client().await;
    let id: i64 = redis::cmd("SNOWFLAKE").query_async(&mut con).await.unwrap();
    let decoded =
        common::http_get(server.http_url(&format!("/decodeSnowflakeId?snowflakeId={id}")))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
    let layout = server.app.context.snowflake_layout;
    let fields = layout.decode(id).unwrap();
    assert!(
        decoded.contains(&format!("\"workerId\":\"{}\"", fields.worker_id)),
        "{decoded}"
    );
    assert!(
        decoded.contains(&format!("\"timestamp\":\"{}(", fields.timestamp_ms)),
        "{decoded}"
    );
    let bad = common::http_get(server.http_url("/decodeSnowflakeId?snowflakeId=x"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(bad.contains("errorMsg"), "{bad}");
    server.stop().await;
}
