//! Database outages: IDs keep flowing from both buffers, then an immediate `UNAVAILABLE`
//! (never a hang beyond the load timeout), then recovery without a restart.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{resp, FlakyStore, TestServer, STORE_FAILS, STORE_HANGS, STORE_OK};
use leafd::config::Config;
use leafd::storage::MemoryStore;

async fn outage_server() -> (TestServer, Arc<FlakyStore>) {
    let store = FlakyStore::new(Arc::new(MemoryStore::new()));
    let mut config = Config::default();
    config.segment.adaptive_step = false;
    config.segment.load_timeout_ms = 300;
    let server = TestServer::start_with_store(config, store.clone()).await;
    let mut raw = server.raw().await;
    assert_eq!(
        raw.send(&resp(&[b"LEAF.TAG", b"CREATE", b"pay", b"100"]), 1)
            .await,
        "+OK\r\n"
    );
    (server, store)
}

/// Takes IDs 1..=10 (10% of the segment) and waits until the next segment is preloaded.
async fn fill_both_buffers(raw: &mut common::RawClient, server: &TestServer) {
    for expected in 1..=10 {
        assert_eq!(
            raw.send(&resp(&[b"INCR", b"segment:pay"]), 1).await,
            format!(":{expected}\r\n")
        );
    }
    for _ in 0..100 {
        if server.app.segments.snapshot()[0].next.is_some() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("next segment was not preloaded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_database_serves_buffers_then_unavailable_then_recovers() {
    let (server, store) = outage_server().await;
    let mut raw = server.raw().await;
    fill_both_buffers(&mut raw, &server).await;
    store.set(STORE_FAILS);
    for expected in 11..=200 {
        assert_eq!(
            raw.send(&resp(&[b"INCR", b"segment:pay"]), 1).await,
            format!(":{expected}\r\n")
        );
    }
    let started = Instant::now();
    let reply = raw.send(&resp(&[b"INCR", b"segment:pay"]), 1).await;
    assert!(
        reply.starts_with("-UNAVAILABLE segment for 'pay' exhausted and database unreachable: "),
        "{reply}"
    );
    assert!(
        started.elapsed() < Duration::from_millis(300),
        "answered at once"
    );
    assert_eq!(raw.send(b"PING\r\n", 1).await, "+PONG\r\n");

    store.set(STORE_OK);
    let mut recovered = None;
    for _ in 0..100 {
        let reply = raw.send(&resp(&[b"INCR", b"segment:pay"]), 1).await;
        if reply.starts_with(':') {
            recovered = Some(reply);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let first: i64 = recovered
        .expect("service resumes after the database returns")
        .trim()[1..]
        .parse()
        .unwrap();
    assert!(
        first > 200,
        "IDs after recovery continue above the old ones: {first}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hanging_database_never_holds_a_request_past_the_load_timeout() {
    let (server, store) = outage_server().await;
    let mut raw = server.raw().await;
    fill_both_buffers(&mut raw, &server).await;
    store.set(STORE_HANGS);
    let mut batch = Vec::new();
    for _ in 11..=200 {
        batch.extend(resp(&[b"INCR", b"segment:pay"]));
    }
    let replies = raw.send(&batch, 190).await;
    assert!(
        replies.ends_with(":200\r\n"),
        "both buffers served while the database hangs"
    );
    let started = Instant::now();
    let reply = raw.send(&resp(&[b"INCR", b"segment:pay"]), 1).await;
    let waited = started.elapsed();
    // It says what is known: nothing came back in time, from the database or to this node.
    assert!(
        reply.starts_with("-UNAVAILABLE segment for 'pay' exhausted and no segment loaded within 300 ms (segment.load_timeout_ms): the database did not answer in time, or this node was too busy to take the answer"),
        "{reply}"
    );
    assert!(
        waited >= Duration::from_millis(250) && waited < Duration::from_millis(1500),
        "gave up after the 300 ms load timeout, took {waited:?}"
    );
    server.stop().await;
}
