//! The RESP listener: accepts connections up to `max_clients`, runs one task per connection,
//! and on shutdown stops accepting, lets in-flight commands finish, then returns.

mod connection;

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::app::App;

/// Serves RESP on `listener` until `shutdown` completes, then waits for open connections to
/// finish the commands they already received.
pub async fn run(
    listener: TcpListener,
    app: Arc<App>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    if let Ok(addr) = listener.local_addr() {
        app.set_local_port(addr.port());
    }
    let limit = Arc::new(Semaphore::new(app.config.server.max_clients));
    let stop = CancellationToken::new();
    let connections = TaskTracker::new();
    tokio::pin!(shutdown);
    loop {
        let (mut stream, peer) = tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Typically EMFILE: back off briefly instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        app.stats.total_connections.fetch_add(1, Ordering::Relaxed);
        let Ok(permit) = limit.clone().try_acquire_owned() else {
            app.stats
                .rejected_connections
                .fetch_add(1, Ordering::Relaxed);
            connections.spawn(async move {
                let _ = stream
                    .write_all(b"-ERR max number of clients reached\r\n")
                    .await;
            });
            continue;
        };
        let _ = stream.set_nodelay(true);
        let app = app.clone();
        let stop = stop.clone();
        connections.spawn(async move {
            app.stats.connected_clients.fetch_add(1, Ordering::Relaxed);
            connection::serve(stream, peer, &app, stop).await;
            app.stats.connected_clients.fetch_sub(1, Ordering::Relaxed);
            drop(permit);
        });
    }
    drop(listener);
    stop.cancel();
    connections.close();
    connections.wait().await;
    Ok(())
}
