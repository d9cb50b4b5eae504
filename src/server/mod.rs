//! The RESP listeners (plain and TLS): accept connections up to `max_clients`, one task each;
//! on shutdown stop accepting, let in-flight commands finish, then return.

mod connection;
mod io_threads;
mod spare;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::task::TaskTracker;

use crate::context::Context;
use crate::tls;
use connection::{ClientStream, Stop};
use io_threads::IoThreads;

/// The sockets leafd serves RESP on: plain TCP, TLS, or both. They share `max_clients`.
#[derive(Default)]
pub struct Listeners {
    pub plain: Option<TcpListener>,
    /// A listener whose clients speak TLS, with its settings and handshake timeout.
    pub tls: Option<(TcpListener, Arc<tls::TlsSettings>, Duration)>,
}

async fn accept_on(listener: Option<&TcpListener>) -> std::io::Result<(TcpStream, SocketAddr)> {
    match listener {
        Some(listener) => listener.accept().await,
        None => std::future::pending().await,
    }
}

/// Serves RESP on every listener in `listeners` until `shutdown` completes (or a client sends
/// SHUTDOWN), then waits for open connections to finish the commands they already received.
pub async fn run(
    listeners: Listeners,
    ctx: Arc<Context>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    if let Some(addr) = listeners.plain.as_ref().and_then(|l| l.local_addr().ok()) {
        ctx.set_local_port(addr.port());
    }
    if let Some(addr) = listeners
        .tls
        .as_ref()
        .and_then(|(l, ..)| l.local_addr().ok())
    {
        ctx.set_tls_port(addr.port());
    }
    let limit = Arc::new(Semaphore::new(ctx.config.server.max_clients));
    let stop = Stop::default();
    let connections = TaskTracker::new();
    let io_threads = IoThreads::start(ctx.config.server.effective_io_threads())?;
    let tls_listener = listeners.tls.as_ref().map(|(l, ..)| l);
    tokio::pin!(shutdown);
    loop {
        let (accepted, tls) = tokio::select! {
            _ = &mut shutdown => break,
            _ = ctx.shutdown_requested() => break,
            accepted = accept_on(listeners.plain.as_ref()) => (accepted, None),
            accepted = accept_on(tls_listener) => {
                (accepted, listeners.tls.as_ref().map(|(_, a, t)| (a.clone(), *t)))
            }
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                // Typically EMFILE: back off briefly instead of spinning.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        ctx.stats.total_connections.fetch_add(1, Ordering::Relaxed);
        let _ = stream.set_nodelay(true);
        let permit = limit.clone().try_acquire_owned().ok();
        if permit.is_none() {
            ctx.stats
                .rejected_connections
                .fetch_add(1, Ordering::Relaxed);
        }
        let std_stream = match stream.into_std() {
            Ok(stream) => stream,
            Err(e) => {
                tracing::debug!(%peer, error = %e, "accepted connection could not be handed over");
                continue;
            }
        };
        let ctx = ctx.clone();
        let stop = stop.clone();
        // Counted from now, so shutdown waits for a connection still on its way to its thread.
        let tracked = connections.token();
        io_threads.spawn(move || async move {
            let _tracked = tracked;
            // Registered with the event loop of the thread this runs on.
            let stream = match TcpStream::from_std(std_stream) {
                Ok(stream) => stream,
                Err(e) => {
                    tracing::warn!(%peer, error = %e, "cannot register connection");
                    return;
                }
            };
            match tls {
                None => serve_or_reject(stream, peer, &ctx, stop, permit).await,
                Some((settings, limit)) => {
                    Box::pin(serve_tls(
                        stream, peer, &ctx, stop, permit, &settings, limit,
                    ))
                    .await
                }
            }
        });
    }
    // Refused from here on, and /ready says so, while connections in flight finish.
    drop(listeners);
    ctx.set_draining();
    stop.stop();
    connections.close();
    // Commands in flight get a bounded time to finish: a stuck one must not keep the
    // process from stopping.
    let grace = Duration::from_secs(ctx.config.server.shutdown_timeout_secs);
    if tokio::time::timeout(grace, connections.wait())
        .await
        .is_err()
    {
        tracing::warn!(
            connections = connections.len(),
            "connections still busy after server.shutdown_timeout_secs; stopping without them"
        );
    }
    io_threads.stop().await;
    Ok(())
}

/// A TLS client: the handshake, then [`serve_or_reject`]. Boxed by the caller: a task's memory
/// is sized for its largest state, and a plain connection must not carry room for a TLS
/// session (10,000 idle plain clients took 148 MB instead of 28 MB that way).
async fn serve_tls(
    stream: TcpStream,
    peer: SocketAddr,
    ctx: &Arc<Context>,
    stop: Stop,
    permit: Option<OwnedSemaphorePermit>,
    settings: &tls::TlsSettings,
    limit: Duration,
) {
    // Shutdown does not wait for handshakes: those clients sent no command yet.
    let handshake = tokio::select! {
        _ = stop.wait() => return,
        handshake = tls::handshake(settings, stream, limit) => handshake,
    };
    match handshake {
        Ok(stream) => serve_or_reject(stream, peer, ctx, stop, permit).await,
        Err(e) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
    }
}

/// Serves a client that got a connection slot; one that did not is told so (over TLS too,
/// after the handshake, so it can read the error) and closed.
async fn serve_or_reject(
    mut stream: impl ClientStream,
    peer: SocketAddr,
    ctx: &Arc<Context>,
    stop: Stop,
    permit: Option<OwnedSemaphorePermit>,
) {
    if crate::access::protected_mode_refuses(&ctx.config, peer) {
        let reply = format!("-{}\r\n", crate::access::PROTECTED_MODE_DENIED);
        let _ = stream.write_all(reply.as_bytes()).await;
        connection::close_gracefully(stream).await;
        return;
    }
    let Some(permit) = permit else {
        let _ = stream
            .write_all(b"-ERR max number of clients reached\r\n")
            .await;
        connection::close_gracefully(stream).await;
        return;
    };
    ctx.stats.connected_clients.fetch_add(1, Ordering::Relaxed);
    connection::serve(stream, peer, ctx, stop).await;
    ctx.stats.connected_clients.fetch_sub(1, Ordering::Relaxed);
    drop(permit);
}

#[cfg(test)]
mod tests {
    /// The `[server]` defaults are the decoder's own defaults (two places, one set of numbers).
    #[test]
    fn request_limit_defaults_match_the_decoder() {
        let limits = super::connection::request_limits(&crate::config::ServerConfig::default());
        assert_eq!(limits, crate::protocol::RequestLimits::default());
    }

    use std::sync::Arc;

    fn future_size<F: std::future::Future>(_: &F) -> usize {
        std::mem::size_of::<F>()
    }

    /// Every connection's task holds its `serve` future, idle or not, so its size is memory per
    /// client: a 4 KB buffer kept in it once made 10,000 idle clients cost 40 MB more.
    #[tokio::test]
    async fn a_connection_task_stays_small() {
        let app = crate::app::App::with_store(
            crate::config::Config::default(),
            Arc::new(crate::storage::MemoryStore::new()),
            Arc::new(crate::clock::SystemClock),
        )
        .await
        .unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let stream = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let peer = stream.local_addr().unwrap();
        let serve = super::connection::serve(stream, peer, &app.context, Default::default());
        let bytes = future_size(&serve);
        // 1,400 bytes when written: the command future of anything that may wait is boxed.
        assert!(
            bytes <= 1536,
            "a plain connection's future takes {bytes} bytes"
        );
    }
}
