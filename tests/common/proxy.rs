//! A TCP proxy on 127.0.0.1 in front of a real database, that a test can cut (closing every
//! open connection and refusing new ones) and restore: a database outage without stopping it.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub struct TcpProxy {
    pub addr: SocketAddr,
    up: Arc<AtomicBool>,
    cut: watch::Sender<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl TcpProxy {
    /// Starts a proxy to `target` (host:port); it forwards only after [`TcpProxy::restore`]
    /// when `start_up` is false.
    pub async fn start(target: String, start_up: bool) -> TcpProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let up = Arc::new(AtomicBool::new(start_up));
        let (cut, _) = watch::channel(0u64);
        let task = {
            let up = up.clone();
            let cut = cut.clone();
            tokio::spawn(async move {
                loop {
                    let Ok((mut client, _)) = listener.accept().await else {
                        return;
                    };
                    if !up.load(Ordering::SeqCst) {
                        continue; // dropped at once: the client sees the connection closed
                    }
                    let target = target.clone();
                    let mut cut_rx = cut.subscribe();
                    tokio::spawn(async move {
                        let Ok(mut server) = TcpStream::connect(&target).await else {
                            return;
                        };
                        tokio::select! {
                            _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                            _ = cut_rx.changed() => {}
                        }
                    });
                }
            })
        };
        TcpProxy {
            addr,
            up,
            cut,
            task,
        }
    }

    /// Closes every forwarded connection and refuses new ones.
    pub fn cut(&self) {
        self.up.store(false, Ordering::SeqCst);
        self.cut.send_modify(|g| *g += 1);
    }

    pub fn restore(&self) {
        self.up.store(true, Ordering::SeqCst);
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.task.abort();
        self.cut.send_modify(|g| *g += 1);
    }
}

/// Splits `scheme://[user[:pass]@]host:port` into (`scheme://[user[:pass]@]`, `host:port`).
pub fn split_server_url(url: &str) -> (String, String) {
    let scheme_end = url.find("://").expect("url has a scheme") + 3;
    let rest = &url[scheme_end..];
    let host_start = rest.rfind('@').map(|i| i + 1).unwrap_or(0);
    let host_end = rest[host_start..]
        .find('/')
        .map(|i| host_start + i)
        .unwrap_or(rest.len());
    (
        url[..scheme_end + host_start].to_string(),
        rest[host_start..host_end].to_string(),
    )
}
