//! Readiness a load balancer can trust: while a node starts (here held back by a time fence
//! 2 s ahead) `/health` is 200, `/ready` 503 saying it is starting, and a RESP client is refused
//! at once; then both serve; from the moment it drains, `/ready` is 503 and RESP refused.

mod common;

use std::time::{Duration, Instant};

use common::binary::free_port;
use leafd::config::Config;

async fn get(url: &str) -> (u16, String) {
    let response = common::http_get(url).await.unwrap();
    let status = response.status().as_u16();
    (status, response.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_starting_or_draining_node_is_not_ready_and_refuses_resp() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::default();
    config.storage.url = format!("sqlite://{}/leafd.db", dir.path().display());
    let (resp_port, http_port) = (free_port(), free_port());
    config.server.bind = format!("127.0.0.1:{resp_port}");
    config.http.bind = format!("127.0.0.1:{http_port}");
    // A fence 2 s ahead of the clock, as a restarted node with a stepped-back clock finds it.
    let fence_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
        + 2000;
    std::fs::write(
        dir.path().join("snowflake-fence.json"),
        format!("{{\"fence_ms\":{fence_ms}}}"),
    )
    .unwrap();

    let started = Instant::now();
    let opening = tokio::spawn(leafd::run::Server::open(config));
    let http = |path: &str| format!("http://127.0.0.1:{http_port}{path}");
    // While it waits out the fence.
    let mut seen_starting = false;
    while started.elapsed() < Duration::from_millis(1500) {
        if let Ok(response) = common::http_get(http("/ready")).await {
            assert_eq!(response.status().as_u16(), 503);
            let body = response.text().await.unwrap();
            assert!(body.starts_with("not ready: starting"), "{body}");
            assert_eq!(get(&http("/health")).await, (200, "ok\n".to_string()));
            assert_eq!(get(&http("/metrics")).await.0, 503);
            let refused = std::net::TcpStream::connect(("127.0.0.1", resp_port));
            assert!(
                refused.is_err(),
                "a RESP client is refused while the node starts, not left waiting"
            );
            seen_starting = true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(seen_starting, "HTTP answered while starting");
    let server = opening.await.unwrap().expect("starts");
    assert!(started.elapsed() >= Duration::from_millis(1900));
    let shutdown = tokio_util::sync::CancellationToken::new();
    let serving = tokio::spawn(server.serve(shutdown.clone().cancelled_owned()));
    assert_eq!(get(&http("/ready")).await, (200, "ready\n".to_string()));
    assert_eq!(
        common::binary::call(resp_port, &[b"PING"]).as_deref(),
        Some("+PONG")
    );

    // Draining: a connected client keeps being answered, new ones are refused, not ready.
    use std::io::{Read, Write};
    let mut connected = std::net::TcpStream::connect(("127.0.0.1", resp_port)).unwrap();
    let mut reply = [0u8; 7];
    connected.write_all(b"PING\r\n").unwrap();
    connected.read_exact(&mut reply).unwrap();
    shutdown.cancel();
    // Until HTTP stops with the last connection, /ready says the node is draining.
    let deadline = Instant::now() + Duration::from_secs(2);
    while let Ok(response) = common::http_get(http("/ready")).await {
        assert_eq!(response.status().as_u16(), 503);
        let body = response.text().await.unwrap();
        assert!(body.starts_with("not ready: draining"), "{body}");
        assert!(Instant::now() < deadline, "HTTP outlived the drain");
    }
    assert!(std::net::TcpStream::connect(("127.0.0.1", resp_port)).is_err());
    // The idle client was closed by the drain.
    assert_eq!(connected.read(&mut reply).unwrap_or(0), 0);
    serving.await.unwrap().unwrap();
}
