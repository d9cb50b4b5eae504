//! The whole server behind one library entry point: bind the configured listeners (RESP, RESP
//! over TLS, HTTP or HTTPS), open the application, serve until told to stop, drain, close.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::{TcpListener, TcpSocket};
use tokio_util::sync::CancellationToken;

use crate::app::{App, AppError};
use crate::config::Config;
use crate::server::Listeners;
use crate::tls::{HttpsListener, TlsError, TlsSettings};

/// Why the server could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("cannot listen on {addr} ({key}): {source}")]
    Listen {
        /// The config key that names the address.
        key: &'static str,
        addr: String,
        source: std::io::Error,
    },
    #[error("cannot set up TLS: {0}")]
    Tls(#[from] TlsError),
    #[error("cannot start leafd: {0}")]
    App(#[from] AppError),
    #[error("RESP listener failed: {0}")]
    Serve(#[from] std::io::Error),
}

/// The addresses a started server listens on (port 0 in the config resolved).
#[derive(Debug, Clone, Copy, Default)]
pub struct BoundAddrs {
    pub resp: Option<SocketAddr>,
    pub resp_tls: Option<SocketAddr>,
    pub http: Option<SocketAddr>,
}

/// A server whose listeners are bound and whose application is open, not serving yet.
pub struct Server {
    app: Arc<App>,
    resp: Listeners,
    http: Option<TcpListener>,
    https: Option<Arc<TlsSettings>>,
    addrs: BoundAddrs,
}

async fn listen(key: &'static str, addr: &str) -> Result<TcpListener, RunError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| RunError::Listen {
            key,
            addr: addr.to_string(),
            source,
        })
}

/// A RESP address bound but not listening yet: until the application is open a client is
/// refused at once (and tries another node) instead of waiting unanswered in the kernel's queue.
struct Reserved {
    key: &'static str,
    addr: String,
    socket: TcpSocket,
}

impl Reserved {
    async fn bind(key: &'static str, addr: &str) -> Result<Reserved, RunError> {
        let failed = |source| RunError::Listen {
            key,
            addr: addr.to_string(),
            source,
        };
        let resolved = tokio::net::lookup_host(addr)
            .await
            .map_err(failed)?
            .next()
            .ok_or_else(|| failed(std::io::ErrorKind::AddrNotAvailable.into()))?;
        let socket = if resolved.is_ipv4() {
            TcpSocket::new_v4()
        } else {
            TcpSocket::new_v6()
        }
        .map_err(failed)?;
        // As TcpListener::bind: a restart need not wait for the old connections' TIME_WAIT.
        socket.set_reuseaddr(true).map_err(failed)?;
        socket.bind(resolved).map_err(failed)?;
        Ok(Reserved {
            key,
            addr: addr.to_string(),
            socket,
        })
    }

    fn local_addr(&self) -> Option<SocketAddr> {
        self.socket.local_addr().ok()
    }

    fn listen(self) -> Result<TcpListener, RunError> {
        let Reserved { key, addr, socket } = self;
        socket
            .listen(1024)
            .map_err(|source| RunError::Listen { key, addr, source })
    }
}

/// The listeners of `config`, bound; TLS settings loaded. Bound before the application opens,
/// so a port in use or a bad certificate fails at once; RESP listens only once it is open.
struct Bound {
    plain: Option<Reserved>,
    tls: Option<(Reserved, Arc<TlsSettings>, std::time::Duration)>,
    http: Option<TcpListener>,
    https: Option<Arc<TlsSettings>>,
}

impl Bound {
    async fn bind(config: &Config) -> Result<Bound, RunError> {
        let plain = match config.server.bind.as_str() {
            "" => None,
            bind => Some(Reserved::bind("server.bind", bind).await?),
        };
        let tls = match &config.tls.bind {
            Some(bind) => {
                let settings = TlsSettings::load(&config.tls, &[])?;
                let reserved = Reserved::bind("tls.bind", bind).await?;
                Some((reserved, settings, config.tls.handshake_timeout()))
            }
            None => None,
        };
        let https = if config.tls.http {
            Some(TlsSettings::load(&config.tls, &[b"http/1.1"])?)
        } else {
            None
        };
        let http = if config.http.enabled {
            Some(listen("http.bind", &config.http.bind).await?)
        } else {
            None
        };
        Ok(Bound {
            plain,
            tls,
            http,
            https,
        })
    }

    /// Answers HTTP while the application opens: `/health` 200, `/ready` 503 saying it is
    /// starting. Stopped (and the listener handed to the real routes) by [`Starting::stop`].
    fn serve_starting(&self, config: &Config) -> Result<Option<Starting>, RunError> {
        let Some(http) = &self.http else {
            return Ok(None);
        };
        let failed = |source| RunError::Listen {
            key: "http.bind",
            addr: config.http.bind.clone(),
            source,
        };
        let listener = same_socket(http).map_err(failed)?;
        let stop = CancellationToken::new();
        let stopped = stop.clone().cancelled_owned();
        let task = match &self.https {
            Some(settings) => tokio::spawn(crate::http::run_starting(
                HttpsListener::new(listener, settings.clone(), config.tls.handshake_timeout()),
                stopped,
            )),
            None => tokio::spawn(crate::http::run_starting(listener, stopped)),
        };
        Ok(Some(Starting { stop, task }))
    }
}

/// A second handle on a listening socket (the same socket, not another port).
fn same_socket(listener: &TcpListener) -> std::io::Result<TcpListener> {
    use std::os::fd::AsFd;
    let fd = listener.as_fd().try_clone_to_owned()?;
    let std_listener = std::net::TcpListener::from(fd);
    std_listener.set_nonblocking(true)?;
    TcpListener::from_std(std_listener)
}

/// The HTTP answers of a starting server.
struct Starting {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Starting {
    async fn stop(self) {
        self.stop.cancel();
        let abort = self.task.abort_handle();
        // Idle keep-alive connections close at once; a slow one must not hold the start.
        if tokio::time::timeout(std::time::Duration::from_secs(2), self.task)
            .await
            .is_err()
        {
            abort.abort();
        }
    }
}

impl Server {
    /// Binds the listeners `config` names, then opens the application (storage, engines,
    /// snowflake worker id) on them.
    pub async fn open(config: Config) -> Result<Server, RunError> {
        let bound = Bound::bind(&config).await?;
        let starting = bound.serve_starting(&config)?;
        let app = App::open(config).await;
        if let Some(starting) = starting {
            starting.stop().await;
        }
        Server::assemble(app?, bound)
    }

    /// Binds the listeners of an application opened by the caller (tests with their own store
    /// or clock); `app.config` names them.
    pub async fn with_app(app: Arc<App>) -> Result<Server, RunError> {
        let bound = Bound::bind(&app.config).await?;
        Server::assemble(app, bound)
    }

    /// Starts listening for RESP clients: the application is open.
    fn assemble(app: Arc<App>, bound: Bound) -> Result<Server, RunError> {
        let addrs = BoundAddrs {
            resp: bound.plain.as_ref().and_then(Reserved::local_addr),
            resp_tls: bound.tls.as_ref().and_then(|(r, ..)| r.local_addr()),
            http: bound.http.as_ref().and_then(|l| l.local_addr().ok()),
        };
        let resp = Listeners {
            plain: bound.plain.map(Reserved::listen).transpose()?,
            tls: match bound.tls {
                Some((reserved, settings, timeout)) => {
                    Some((reserved.listen()?, settings, timeout))
                }
                None => None,
            },
        };
        Ok(Server {
            app,
            resp,
            http: bound.http,
            https: bound.https,
            addrs,
        })
    }

    pub fn addrs(&self) -> BoundAddrs {
        self.addrs
    }

    pub fn app(&self) -> &Arc<App> {
        &self.app
    }

    /// Every TLS listener's settings, to re-read their files (SIGHUP in `main`): new
    /// connections use the new certificates, connected clients keep theirs.
    pub fn tls_settings(&self) -> Vec<Arc<TlsSettings>> {
        let resp = self
            .resp
            .tls
            .as_ref()
            .map(|(_, settings, _)| settings.clone());
        resp.into_iter().chain(self.https.clone()).collect()
    }

    /// Serves until `shutdown` completes or a client sends SHUTDOWN: stops accepting, lets
    /// in-flight commands finish, stops HTTP, closes the storage pool.
    pub async fn serve(self, shutdown: impl Future<Output = ()>) -> Result<(), RunError> {
        let Server {
            app,
            resp,
            http,
            https,
            addrs,
        } = self;
        let show = |a: Option<SocketAddr>| a.map_or("off".to_string(), |a| a.to_string());
        tracing::info!(
            resp = %show(addrs.resp),
            resp_tls = %show(addrs.resp_tls),
            http = %show(addrs.http),
            https = https.is_some(),
            storage = %app.config.storage.redacted_url(),
            backend = app.segments.store().backend(),
            tags = app.segments.tag_count(),
            snowflake_worker_id = ?app.snowflake().map(|s| s.worker_id()),
            coordinator = ?app.config.snowflake.coordinator,
            "leafd listening"
        );
        warn_if_exposed(&app.config);
        let stop = CancellationToken::new();
        let handshake_timeout = app.config.tls.handshake_timeout();
        let http = http.map(|listener| {
            let stopped = stop.clone().cancelled_owned();
            match https {
                Some(settings) => tokio::spawn(crate::http::run(
                    HttpsListener::new(listener, settings, handshake_timeout),
                    app.context.clone(),
                    stopped,
                )),
                None => tokio::spawn(crate::http::run(listener, app.context.clone(), stopped)),
            }
        });
        let served = crate::server::run(resp, app.context.clone(), shutdown).await;
        stop.cancel();
        if let Some(http) = http {
            let _ = http.await;
        }
        tracing::info!("shutting down: connections drained, closing storage");
        app.close().await;
        Ok(served?)
    }
}

/// The whole program: [`Server::open`] then [`Server::serve`] until `shutdown` completes.
pub async fn run(config: Config, shutdown: impl Future<Output = ()>) -> Result<(), RunError> {
    Server::open(config).await?.serve(shutdown).await
}

/// One warning at start when a listener is reachable from other hosts without a password.
fn warn_if_exposed(config: &Config) {
    let mut binds = vec![config.server.bind.as_str(), config.http.bind.as_str()];
    binds.extend(config.tls.bind.as_deref());
    if config.server.auth_required() || !crate::access::listens_beyond_loopback(&binds) {
        return;
    }
    if config.server.protected_mode {
        tracing::warn!("protected mode: listening beyond loopback with no password, so clients from other hosts are refused (DENIED); set server.requirepass or [[server.users]], or server.protected_mode = false");
    } else {
        tracing::warn!("listening beyond loopback with no password and protected mode off: any host that reaches leafd can fetch IDs; admin commands stay loopback-only unless admin.allow_unauthenticated = true");
    }
}
