//! Resource limits and graceful shutdown: the idle timeout (also against slowloris), a client
//! that pipelines without reading, and SIGTERM during load on the real binary.

mod common;

use std::io::{Read, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::binary::{free_port, LeafdProcess};
use common::{resp, TestServer};
use leafd::config::Config;
use leafd::storage::MemoryStore;
use tokio::io::AsyncWriteExt;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_slowloris_clients_are_closed_by_the_idle_timeout() {
    let mut config = Config::default();
    config.server.idle_timeout_secs = 1;
    let server = TestServer::start_with_store(config, Arc::new(MemoryStore::new())).await;

    let mut silent = server.raw().await;
    let mut slow = server.raw().await;
    let mut busy = server.raw().await;
    let started = Instant::now();
    // The slow client trickles one byte of a never-finished frame every 200 ms.
    let frame = b"*2\r\n$4\r\nPING\r\n$100\r\nxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx";
    let mut closed_slow = None;
    for (i, byte) in frame.iter().enumerate() {
        if slow.stream.write_all(&[*byte]).await.is_err() {
            closed_slow = Some(started.elapsed());
            break;
        }
        if i % 2 == 0 {
            assert_eq!(busy.send(b"PING\r\n", 1).await, "+PONG\r\n");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        if started.elapsed() > Duration::from_millis(2500) {
            break;
        }
    }
    assert!(silent.closed().await, "the silent client is closed");
    let _ = closed_slow;
    assert!(
        slow.closed().await,
        "the slow client is closed though it kept sending bytes"
    );
    assert!(started.elapsed() < Duration::from_secs(6));
    // The busy client, which completed a command every 200 ms, is still served.
    assert_eq!(busy.send(b"PING\r\n", 1).await, "+PONG\r\n");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_reads_is_disconnected_and_others_are_served() {
    let mut config = Config::default();
    config.server.write_timeout_secs = 1;
    let server = TestServer::start_with_store(config, Arc::new(MemoryStore::new())).await;
    let mut flooder = server.raw().await;
    // ECHO commands with 4 KB payloads, never reading a reply, until the server stops reading
    // (its replies are not being consumed) or 256 MB were sent.
    let payload = vec![b'x'; 4096];
    let command = resp(&[b"ECHO", &payload]).repeat(16);
    let mut sent = 0usize;
    let mut blocked = false;
    while sent < 256 * 1024 * 1024 {
        match tokio::time::timeout(
            Duration::from_millis(500),
            flooder.stream.write_all(&command),
        )
        .await
        {
            Ok(Ok(())) => sent += command.len(),
            Ok(Err(_)) | Err(_) => {
                blocked = true;
                break;
            }
        }
    }
    assert!(
        blocked,
        "the server stopped reading from a client that does not read ({sent} bytes sent)"
    );
    let mut other = server.raw().await;
    assert_eq!(other.send(b"PING\r\n", 1).await, "+PONG\r\n");
    // After the write timeout the server gives up on the flooder: draining what is buffered
    // then reaches the end of the stream instead of the replies to everything sent.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let mut drained = 0usize;
    let mut buf = vec![0u8; 1 << 16];
    let ended = loop {
        match tokio::time::timeout(
            Duration::from_secs(5),
            tokio::io::AsyncReadExt::read(&mut flooder.stream, &mut buf),
        )
        .await
        {
            Ok(Ok(0)) | Ok(Err(_)) => break true,
            Ok(Ok(n)) => drained += n,
            Err(_) => break false,
        }
    };
    assert!(ended, "the connection was closed (drained {drained} bytes)");
    assert!(
        drained < sent,
        "not every command was answered: {drained} of {sent}"
    );
    assert_eq!(other.send(b"PING\r\n", 1).await, "+PONG\r\n");
    server.stop().await;
}

/// SIGTERM while a client has a pipeline in flight: every received command is answered with a
/// complete reply, then the connection closes and the process exits with status 0.
#[test]
fn sigterm_answers_received_commands_then_exits_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let child = LeafdProcess::spawn(&[
        "--bind".to_string(),
        format!("127.0.0.1:{port}"),
        "--http-bind".to_string(),
        "127.0.0.1:0".to_string(),
        "--storage-url".to_string(),
        format!("sqlite://{}/leafd.db", dir.path().display()),
    ]);
    let mut stream = loop {
        match std::net::TcpStream::connect(("127.0.0.1", port)) {
            Ok(stream) => break stream,
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream
        .write_all(&resp(&[b"LEAF.TAG", b"CREATE", b"term", b"1000"]))
        .unwrap();
    let mut reply = [0u8; 5];
    stream.read_exact(&mut reply).unwrap();
    assert_eq!(&reply, b"+OK\r\n");
    let mut batch = Vec::new();
    for _ in 0..2000 {
        batch.extend(resp(&[b"INCR", b"segment:term"]));
    }
    stream.write_all(&batch).unwrap();
    // Wait for the first reply, so the server is working on the batch, then SIGTERM.
    let mut first = [0u8; 4];
    stream.read_exact(&mut first).unwrap();
    assert_eq!(&first, b":1\r\n");
    child.signal("-TERM");
    let mut rest = Vec::new();
    stream.read_to_end(&mut rest).unwrap();
    let text = String::from_utf8(rest).unwrap();
    assert!(
        text.is_empty() || text.ends_with("\r\n"),
        "replies are complete frames"
    );
    let ids: Vec<i64> = text
        .lines()
        .map(|l| l.trim_start_matches(':').parse().unwrap())
        .collect();
    assert_eq!(
        ids,
        (2..2 + ids.len() as i64).collect::<Vec<_>>(),
        "in order, no reply lost in the middle"
    );
    let exit = child.wait();
    assert_eq!(exit.code(), Some(0), "clean exit after SIGTERM");
}
