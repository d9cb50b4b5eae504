//! One client connection (plain TCP or TLS): read what arrived, run every complete command in
//! order, write all their replies with one socket write, repeat. A bad frame ends it.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;

use crate::cmd::{self, Session};
use crate::config::ServerConfig;
use crate::context::Context;
use crate::metrics::BatchMetrics;
use crate::protocol::{Args, Reply, RequestDecoder, RequestLimits};

use super::spare;

/// Replies are flushed early once this much is buffered, so a long pipeline cannot grow the
/// output buffer without bound.
const FLUSH_THRESHOLD: usize = 64 * 1024;

/// A client socket the connection loop can serve.
pub(crate) trait ClientStream: AsyncRead + AsyncWrite + Unpin + Send {
    /// Waits for input and appends it to `input`; `Ok(0)` at end of stream.
    fn read_into(
        &mut self,
        input: &mut BytesMut,
    ) -> impl Future<Output = std::io::Result<usize>> + Send;

    /// Writes what the socket takes without waiting; how many bytes that was.
    fn write_now(&mut self, _buf: &[u8]) -> usize {
        0
    }
}

impl ClientStream for TcpStream {
    /// Reserves buffer space only once data is readable, so an idle plain connection holds no
    /// input buffer. The read goes through `AsyncRead`, not `try_read_buf`: a read that leaves
    /// room in the buffer shows the socket drained, so the next wait goes straight to epoll
    /// instead of first paying a read that fails with EAGAIN (one system call per request
    /// less at pipeline depth 1).
    async fn read_into(&mut self, input: &mut BytesMut) -> std::io::Result<usize> {
        self.readable().await?;
        if input.capacity() == 0 {
            *input = spare::take();
        }
        input.reserve(spare::BUFFER_SIZE);
        self.read_buf(input).await
    }

    fn write_now(&mut self, buf: &[u8]) -> usize {
        let mut written = 0;
        while written < buf.len() {
            match self.try_write(&buf[written..]) {
                Ok(n) if n > 0 => written += n,
                _ => break,
            }
        }
        written
    }
}

impl ClientStream for TlsStream<TcpStream> {
    /// A TLS stream has no readiness to wait on without reading, so it keeps a read buffer
    /// while idle (rustls holds its own record buffers anyway).
    async fn read_into(&mut self, input: &mut BytesMut) -> std::io::Result<usize> {
        if input.capacity() == 0 {
            *input = spare::take();
        }
        input.reserve(spare::BUFFER_SIZE);
        self.read_buf(input).await
    }
}

/// Tells connections to stop: a flag each reads between batches (an atomic load; the token's
/// own state sits behind a lock every connection would share) and a token that wakes those
/// waiting for input.
#[derive(Clone, Default)]
pub(crate) struct Stop {
    flag: Arc<AtomicBool>,
    token: CancellationToken,
}

impl Stop {
    pub(crate) fn stop(&self) {
        self.flag.store(true, Ordering::Release);
        self.token.cancel();
    }

    pub(crate) fn is_stopped(&self) -> bool {
        self.flag.load(Ordering::Acquire)
    }

    /// Completes once [`Stop::stop`] was called.
    pub(crate) fn wait(&self) -> tokio_util::sync::WaitForCancellationFuture<'_> {
        self.token.cancelled()
    }
}

/// Writes `buf` out, giving up (and so closing the connection) when the client has not read
/// its replies within `limit`: a client that pipelines without reading cannot hold the server.
async fn write_out(stream: &mut impl ClientStream, buf: &[u8], limit: Option<Duration>) -> bool {
    // Nearly always the socket takes it all at once: then there is no time limit to start
    // (and no clock to read for it).
    let buf = &buf[stream.write_now(buf)..];
    if buf.is_empty() {
        return true;
    }
    match limit {
        Some(limit) => matches!(
            tokio::time::timeout(limit, stream.write_all(buf)).await,
            Ok(Ok(()))
        ),
        None => stream.write_all(buf).await.is_ok(),
    }
}

/// Closes without losing replies: FIN after the last reply, then unread input is drained for a
/// moment. Dropping a socket with unread input would send a reset, which can make the client's
/// kernel discard replies it has received but the client has not read yet.
pub(crate) async fn close_gracefully(mut stream: impl ClientStream) {
    let _ = stream.shutdown().await;
    // On the heap: a buffer here would be part of every connection's future, idle or not.
    let mut scratch = vec![0u8; 4096];
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        loop {
            match stream.read(&mut scratch).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
}

/// The decoder's limits, from the `[server]` section.
pub(crate) fn request_limits(server: &ServerConfig) -> RequestLimits {
    RequestLimits {
        max_inline_len: server.max_inline_len,
        max_bulk_len: server.max_bulk_len,
        max_array_len: server.max_array_len,
        max_request_len: server.max_request_len,
    }
}

pub(crate) async fn serve(
    mut stream: impl ClientStream,
    peer: SocketAddr,
    ctx: &Arc<Context>,
    stop: Stop,
) {
    let server = &ctx.config.server;
    let decoder = RequestDecoder::new(request_limits(server));
    let secs = |s: u64| (s > 0).then(|| Duration::from_secs(s));
    let idle_timeout = secs(server.idle_timeout_secs);
    let write_timeout = secs(server.write_timeout_secs);
    let mut session = Session::new(
        ctx.next_client_id(),
        peer.to_string(),
        server.auth_required(),
    )
    .with_admin_without_auth(crate::access::unauthenticated_admin(&ctx.config, peer));
    ctx.clients.set(crate::cmd::client_line(&session));
    // Gone from CLIENT LIST however this function returns.
    let _listed = Listed(ctx, session.id);
    // Buffers are taken when data arrives and given back whenever they are empty, so an idle
    // connection holds no buffer memory (10,000 idle clients would otherwise pin 80 MB).
    let mut input = BytesMut::new();
    let mut output = BytesMut::new();
    // The idle timeout counts from the last complete command, not the last byte, so a client
    // trickling a partial frame (slowloris) is closed like a silent one.
    let mut last_command = tokio::time::Instant::now();
    let mut batch = BatchMetrics::default();
    let timed = ctx.metrics.enabled();
    // Made once: a new wait per read would join and leave the token's waiter list each time.
    let stopped = stop.wait();
    tokio::pin!(stopped);
    loop {
        // Run every complete command already received; replies keep their order.
        if timed {
            batch.start();
        }
        let mut executed = 0u64;
        let mut close = false;
        // Bytes of `input` already run; dropped once per batch, not per command.
        let mut consumed = 0;
        // Input before this offset holds copies of an INCR already found not to form a block.
        let mut plain_until = 0;
        loop {
            let mut args = Args::default();
            let used = match decoder.decode(&input[consumed..], &mut args) {
                Ok(used) => used,
                Err(e) => {
                    Reply::error(format!("ERR {e}")).encode(session.protocol, &mut output);
                    tracing::debug!(client = session.id, error = %e, "closing connection after protocol error");
                    close = true;
                    break;
                }
            };
            consumed += used;
            if args.is_empty() {
                break;
            }
            if output.capacity() == 0 {
                output = spare::take();
            }
            let mut ahead = Ahead {
                input: &input,
                frame: consumed - used..consumed,
                consumed: &mut consumed,
                plain_until: &mut plain_until,
            };
            if let Some(block) = cmd::block_at(ctx, &args, &mut ahead) {
                // Boxed, as cmd::execute boxes a command that may wait: held inline it would
                // grow every connection's future.
                let served = Box::pin(cmd::serve_block(
                    ctx, &session, block, &mut ahead, &mut batch,
                ))
                .await;
                if let Some(replies) = served {
                    for reply in &replies {
                        reply.encode(session.protocol, &mut output);
                    }
                    executed += replies.len() as u64;
                    continue;
                }
            }
            executed += 1;
            let reply = cmd::execute(ctx, &mut session, &args, &mut batch).await;
            if !session.silent {
                reply.encode(session.protocol, &mut output);
            }
            if session.closing {
                close = true;
                break;
            }
            if output.len() >= FLUSH_THRESHOLD {
                if !write_out(&mut stream, &output, write_timeout).await {
                    return;
                }
                output.clear();
            }
        }
        input.advance(consumed);
        // Shared counters are updated once per batch, not per command.
        batch.flush(&ctx.metrics);
        if executed > 0 {
            ctx.stats
                .total_commands
                .fetch_add(executed, Ordering::Relaxed);
            if idle_timeout.is_some() {
                last_command = tokio::time::Instant::now();
            }
        }
        if !output.is_empty() && !write_out(&mut stream, &output, write_timeout).await {
            return;
        }
        if close {
            close_gracefully(stream).await;
            return;
        }
        spare::give_back(&mut output);
        if input.is_empty() {
            spare::give_back(&mut input);
        }
        if stop.is_stopped() {
            close_gracefully(stream).await;
            return;
        }
        let read = async {
            let wait = stream.read_into(&mut input);
            match idle_timeout {
                Some(limit) => tokio::time::timeout_at(last_command + limit, wait)
                    .await
                    .unwrap_or(Ok(0)),
                None => wait.await,
            }
        };
        // The read first: while input keeps arriving the stop wait is not polled at all (each
        // poll of it takes a lock all connections share); the flag above sees a stop between
        // batches.
        tokio::select! {
            biased;
            read = read => match read {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            },
            _ = &mut stopped => {
                close_gracefully(stream).await;
                return;
            }
        }
    }
}

/// Removes a client from the registry when its connection ends.
struct Listed<'a>(&'a Context, u64);

impl Drop for Listed<'_> {
    fn drop(&mut self) {
        self.0.clients.remove(self.1);
    }
}

/// The requests after the current one in a connection's input, as [`cmd::Pipeline`] shows
/// them: a repeat is a copy of the current request's frame, byte for byte.
struct Ahead<'a> {
    input: &'a [u8],
    /// The current request's frame in `input`.
    frame: std::ops::Range<usize>,
    /// Where the requests not yet run start.
    consumed: &'a mut usize,
    /// Input before this offset holds repeats already found to run alone.
    plain_until: &'a mut usize,
}

impl cmd::Pipeline for Ahead<'_> {
    fn repeats(&mut self, limit: usize) -> usize {
        if *self.consumed <= *self.plain_until {
            return 0;
        }
        let frame = &self.input[self.frame.clone()];
        let (mut at, mut count) = (*self.consumed, 0);
        while count < limit && self.input[at..].starts_with(frame) {
            at += frame.len();
            count += 1;
        }
        count
    }

    fn answered(&mut self, n: usize) {
        *self.consumed += n * self.frame.len();
    }

    fn run_alone(&mut self, n: usize) {
        *self.plain_until = *self.consumed + n * self.frame.len();
    }
}
