//! The whole server behind one library entry point: bind the configured listeners (RESP, RESP
//! over TLS, HTTP or HTTPS), open the application, serve until told to stop, drain, close.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
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

/// The listeners of `config`, bound; TLS settings loaded. Bound before the application opens,
/// so a port in use or a bad certificate fails at once.
struct Bound {
    resp: Listeners,
    http: Option<TcpListener>,
    https: Option<Arc<TlsSettings>>,
}

impl Bound {
    async fn bind(config: &Config) -> Result<Bound, RunError> {
        let mut resp = Listeners::default();
        if !config.server.bind.is_empty() {
            resp.plain = Some(listen("server.bind", &config.server.bind).await?);
        }
        if let Some(bind) = &config.tls.bind {
            let settings = TlsSettings::load(&config.tls, &[])?;
            let listener = listen("tls.bind", bind).await?;
            resp.tls = Some((listener, settings, config.tls.handshake_timeout()));
        }
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
        Ok(Bound { resp, http, https })
    }
}

impl Server {
    /// Binds the listeners `config` names, then opens the application (storage, engines,
    /// snowflake worker id) on them.
    pub async fn open(config: Config) -> Result<Server, RunError> {
        let bound = Bound::bind(&config).await?;
        let app = App::open(config).await?;
        Ok(Server::assemble(app, bound))
    }

    /// Binds the listeners of an application opened by the caller (tests with their own store
    /// or clock); `app.config` names them.
    pub async fn with_app(app: Arc<App>) -> Result<Server, RunError> {
        let bound = Bound::bind(&app.config).await?;
        Ok(Server::assemble(app, bound))
    }

    fn assemble(app: Arc<App>, bound: Bound) -> Server {
        let addr = |l: Option<&TcpListener>| l.and_then(|l| l.local_addr().ok());
        let addrs = BoundAddrs {
            resp: addr(bound.resp.plain.as_ref()),
            resp_tls: addr(bound.resp.tls.as_ref().map(|(l, ..)| l)),
            http: addr(bound.http.as_ref()),
        };
        Server {
            app,
            resp: bound.resp,
            http: bound.http,
            https: bound.https,
            addrs,
        }
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
            snowflake_worker_id = ?app.snowflake.as_ref().map(|s| s.worker_id()),
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
