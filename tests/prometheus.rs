//! A real Prometheus (LEAFD_TEST_PROMETHEUS=path of the binary) scrapes a leafd with a
//! ZooKeeper worker id (LEAFD_TEST_ZOOKEEPER): the target is up, every PromQL expression of
//! the Grafana dashboard returns at least one series, and promtool accepts /metrics.

mod common;

use std::io::Write;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::backends::required_env;
use common::binary::free_port;
use common::scenarios::{create_tag, unique_tag};
use common::TestServer;
use leafd::config::CoordinatorKind;

/// Kills the child process when the test ends, however it ends.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

async fn traffic(server: &TestServer, tag: &str, rounds: usize) {
    let mut con = server.client().await;
    for _ in 0..rounds {
        for _ in 0..15 {
            let _: i64 = redis::cmd("INCR")
                .arg(format!("segment:{tag}"))
                .query_async(&mut con)
                .await
                .unwrap();
        }
        let _: Vec<i64> = redis::cmd("SNOWFLAKE")
            .arg(10)
            .query_async(&mut con)
            .await
            .unwrap();
        let _ = redis::cmd("INCR")
            .arg("segment:no-such-tag")
            .query_async::<i64>(&mut con)
            .await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scrapes_leafd_and_every_dashboard_query_has_data() {
    let test = "prometheus_scrapes_leafd_and_every_dashboard_query_has_data";
    let Some(prometheus) = required_env("LEAFD_TEST_PROMETHEUS", test) else {
        return;
    };
    let Some(zookeeper) = required_env("LEAFD_TEST_ZOOKEEPER", test) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut config = common::sqlite_config(&dir);
    config.segment.adaptive_step = false;
    config.snowflake.coordinator = CoordinatorKind::Zookeeper;
    config.snowflake.zookeeper.connect = zookeeper;
    config.snowflake.zookeeper.cluster = unique_tag("prom");
    config.snowflake.zookeeper.report_interval_ms = 500;
    config.snowflake.zookeeper.cache_file = dir.path().join("worker.json").display().to_string();
    let server = TestServer::start(config).await;
    let tag = unique_tag("prom");
    create_tag(&server, &tag, 10, None).await;
    traffic(&server, &tag, 5).await;

    // promtool lints the exposition format.
    let page = common::http_get(server.http_url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let promtool = std::path::Path::new(&prometheus).with_file_name("promtool");
    let mut check = Command::new(&promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e}", promtool.display()));
    check
        .stdin
        .take()
        .unwrap()
        .write_all(page.as_bytes())
        .unwrap();
    let checked = check.wait_with_output().unwrap();
    assert!(
        checked.status.success(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr)
    );

    // The shipped alerting rules are valid.
    let checked = Command::new(&promtool)
        .args(["check", "rules", "docker/alerts.yml"])
        .output()
        .unwrap();
    assert!(
        checked.status.success(),
        "promtool check rules: {}{}",
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr)
    );

    let port = free_port();
    std::fs::write(
        dir.path().join("prometheus.yml"),
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: leafd\n    static_configs:\n      - targets: [\"{}\"]\n",
            server.http_addr
        ),
    )
    .unwrap();
    let _prometheus = KillOnDrop(
        Command::new(&prometheus)
            .arg(format!(
                "--config.file={}",
                dir.path().join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--log.level=warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{prometheus}: {e}")),
    );
    let api = format!("http://127.0.0.1:{port}/api/v1");
    let client = common::http_client();

    // Keep traffic flowing while Prometheus takes a few scrapes.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        traffic(&server, &tag, 3).await;
        let targets = match client.get(format!("{api}/targets")).send().await {
            Ok(response) => response.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        };
        if targets.contains("\"health\":\"up\"") {
            break;
        }
        assert!(Instant::now() < deadline, "target never up: {targets}");
    }
    traffic(&server, &tag, 30).await;

    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string("grafana/dashboards/leafd.json").unwrap())
            .unwrap();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap();
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let body = client
                    .get(format!("{api}/query?query={}", percent_encode(expr)))
                    .send()
                    .await
                    .unwrap()
                    .text()
                    .await
                    .unwrap();
                let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
                assert_eq!(answer["status"], "success", "{expr}: {body}");
                let series = answer["data"]["result"].as_array().map_or(0, |r| r.len());
                if series > 0 {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "panel '{}': {expr} returned no series: {body}",
                    panel["title"]
                );
                traffic(&server, &tag, 5).await;
            }
        }
    }
    server.stop().await;
}
