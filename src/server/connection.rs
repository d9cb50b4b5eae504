//! One client connection: read what arrived, run every complete command in order, write all
//! their replies with one socket write, repeat. A frame that cannot be parsed ends it.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use crate::app::App;
use crate::cmd::{self, Session};
use crate::protocol::{Reply, RequestDecoder};

/// Bytes reserved for each read from the socket.
const READ_CHUNK: usize = 4096;

/// Replies are flushed early once this much is buffered, so a long pipeline cannot grow the
/// output buffer without bound.
const FLUSH_THRESHOLD: usize = 64 * 1024;

pub async fn serve(
    mut stream: TcpStream,
    peer: SocketAddr,
    app: &Arc<App>,
    stop: CancellationToken,
) {
    let server = &app.config.server;
    let decoder = RequestDecoder::new(server.request_limits());
    let idle_timeout =
        (server.idle_timeout_secs > 0).then(|| Duration::from_secs(server.idle_timeout_secs));
    let mut session = Session::new(
        app.next_client_id(),
        peer.to_string(),
        server.requirepass.is_some(),
    );
    // Buffers are allocated when data arrives and released whenever they are empty, so an idle
    // connection holds no buffer memory (10,000 idle clients would otherwise pin 80 MB).
    let mut input = BytesMut::new();
    let mut output = BytesMut::new();
    loop {
        // Run every complete command already received; replies keep their order.
        let mut started = Instant::now();
        let mut executed = 0u64;
        loop {
            match decoder.decode(&mut input) {
                Ok(Some(args)) => {
                    executed += 1;
                    let (reply, finished) = cmd::execute(app, &mut session, args, started).await;
                    started = finished;
                    reply.encode(session.protocol, &mut output);
                    if session.closing {
                        app.stats
                            .total_commands
                            .fetch_add(executed, Ordering::Relaxed);
                        let _ = stream.write_all(&output).await;
                        return;
                    }
                    if output.len() >= FLUSH_THRESHOLD {
                        if stream.write_all(&output).await.is_err() {
                            return;
                        }
                        output.clear();
                    }
                }
                Ok(None) => {
                    // One shared-counter update per batch, not per command.
                    app.stats
                        .total_commands
                        .fetch_add(executed, Ordering::Relaxed);
                    break;
                }
                Err(e) => {
                    app.stats
                        .total_commands
                        .fetch_add(executed, Ordering::Relaxed);
                    Reply::error(format!("ERR {e}")).encode(session.protocol, &mut output);
                    let _ = stream.write_all(&output).await;
                    tracing::debug!(client = session.id, error = %e, "closing connection after protocol error");
                    return;
                }
            }
        }
        if !output.is_empty() && stream.write_all(&output).await.is_err() {
            return;
        }
        output = BytesMut::new();
        if input.is_empty() {
            input = BytesMut::new();
        }
        let read = async {
            let wait = async {
                stream.readable().await?;
                input.reserve(READ_CHUNK);
                match stream.try_read_buf(&mut input) {
                    // Readiness can be spurious: report "no progress" and wait again.
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(None),
                    Ok(n) => Ok(Some(n)),
                    Err(e) => Err(e),
                }
            };
            match idle_timeout {
                Some(limit) => tokio::time::timeout(limit, wait)
                    .await
                    .unwrap_or(Ok(Some(0))),
                None => wait.await,
            }
        };
        tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            read = read => match read {
                Ok(Some(0)) | Err(_) => return,
                Ok(_) => {}
            },
        }
    }
}
