//! TLS for the RESP and HTTP listeners: rustls settings read from PEM files (optionally requiring
//! client certificates), reloadable without a restart, and an HTTPS listener for axum.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Semaphore};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

use crate::config::TlsConfig;

/// Why the TLS configuration could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {what} {path}: {source}")]
    Pem {
        what: &'static str,
        path: String,
        source: rustls::pki_types::pem::Error,
    },
    #[error("{what} {path} holds no certificate")]
    NoCertificate { what: &'static str, path: String },
    #[error("tls.cert_file and tls.key_file are required")]
    Missing,
    #[error("client CA file {path}: {reason}")]
    ClientCa { path: String, reason: String },
    #[error("CA file {path}: {reason}")]
    Ca { path: String, reason: String },
    #[error("certificate and key rejected: {0}")]
    Rustls(#[from] rustls::Error),
}

/// TLS handshakes in progress at once on the HTTPS listener; more wait to be accepted, so a
/// flood of slow handshakes cannot grow memory without bound.
const MAX_PENDING_HANDSHAKES: usize = 256;

fn read_certs(what: &'static str, path: &str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem_error = |source| TlsError::Pem {
        what,
        path: path.to_string(),
        source,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(pem_error)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(pem_error)?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            what,
            path: path.to_string(),
        });
    }
    Ok(certs)
}

fn read_key(path: &str) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|source| TlsError::Pem {
        what: "key file",
        path: path.to_string(),
        source,
    })
}

/// Builds a rustls server configuration from the files `cfg` names. `alpn` lists the
/// application protocols offered (`http/1.1` for HTTPS; none for RESP, whose clients send none).
fn server_config(cfg: &TlsConfig, alpn: &[Vec<u8>]) -> Result<ServerConfig, TlsError> {
    let (Some(cert_file), Some(key_file)) = (&cfg.cert_file, &cfg.key_file) else {
        return Err(TlsError::Missing);
    };
    let certs = read_certs("certificate file", cert_file)?;
    let key = read_key(key_file)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?;
    let builder = match &cfg.client_ca_file {
        None => builder.with_no_client_auth(),
        Some(path) => {
            let mut roots = RootCertStore::empty();
            for cert in read_certs("client CA file", path)? {
                roots.add(cert).map_err(|e| TlsError::ClientCa {
                    path: path.clone(),
                    reason: e.to_string(),
                })?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| TlsError::ClientCa {
                    path: path.clone(),
                    reason: e.to_string(),
                })?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_single_cert(certs, key)?;
    config.alpn_protocols = alpn.to_vec();
    Ok(config)
}

/// A rustls client configuration that trusts only the CA in `ca_file` (nothing without one)
/// and, given a certificate and key file, presents them (for servers that require client
/// certificates).
pub fn client_config(
    ca_file: Option<&str>,
    client: Option<(&str, &str)>,
) -> Result<rustls::ClientConfig, TlsError> {
    let mut roots = RootCertStore::empty();
    if let Some(ca_file) = ca_file {
        for cert in read_certs("CA file", ca_file)? {
            roots.add(cert).map_err(|e| TlsError::Ca {
                path: ca_file.to_string(),
                reason: e.to_string(),
            })?;
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots);
    Ok(match client {
        None => builder.with_no_client_auth(),
        Some((cert_file, key_file)) => {
            let certs = read_certs("certificate file", cert_file)?;
            let key = read_key(key_file)?;
            builder.with_client_auth_cert(certs, key)?
        }
    })
}

/// One listener's TLS settings. Every new connection uses the configuration loaded last, so
/// certificates, keys and the client CA can be rotated (SIGHUP) without dropping clients.
pub struct TlsSettings {
    files: TlsConfig,
    alpn: Vec<Vec<u8>>,
    current: ArcSwap<ServerConfig>,
}

impl TlsSettings {
    /// Reads the files `cfg` names; `alpn` as in [`server_config`].
    pub fn load(cfg: &TlsConfig, alpn: &[&[u8]]) -> Result<Arc<TlsSettings>, TlsError> {
        let alpn: Vec<Vec<u8>> = alpn.iter().map(|p| p.to_vec()).collect();
        let config = server_config(cfg, &alpn)?;
        Ok(Arc::new(TlsSettings {
            files: cfg.clone(),
            alpn,
            current: ArcSwap::from_pointee(config),
        }))
    }

    /// Reads the files again. On error the previous configuration stays in use.
    pub fn reload(&self) -> Result<(), TlsError> {
        let config = server_config(&self.files, &self.alpn)?;
        self.current.store(Arc::new(config));
        Ok(())
    }

    /// An acceptor with the current configuration (an `Arc` clone).
    pub fn acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(self.current.load_full())
    }
}

/// Completes a server-side handshake, or gives up after `limit` (a client that connects and
/// says nothing must not hold a connection slot).
pub async fn handshake(
    settings: &TlsSettings,
    stream: TcpStream,
    limit: Duration,
) -> std::io::Result<TlsStream<TcpStream>> {
    match tokio::time::timeout(limit, settings.acceptor().accept(stream)).await {
        Ok(result) => result,
        Err(_) => Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "TLS handshake timed out",
        )),
    }
}

/// An HTTPS listener for axum: a background task accepts TCP connections and runs each
/// handshake in its own task, so one slow client never delays the others; finished
/// handshakes are handed to axum in the order they complete.
pub struct HttpsListener {
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local_addr: SocketAddr,
    accept_task: tokio::task::JoinHandle<()>,
}

impl HttpsListener {
    pub fn new(listener: TcpListener, settings: Arc<TlsSettings>, limit: Duration) -> Self {
        let local_addr = listener
            .local_addr()
            .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
        let (tx, ready) = mpsc::channel(64);
        let pending = Arc::new(Semaphore::new(MAX_PENDING_HANDSHAKES));
        let accept_task = tokio::spawn(async move {
            loop {
                let Ok(permit) = pending.clone().acquire_owned().await else {
                    return;
                };
                let (stream, peer) = tokio::select! {
                    _ = tx.closed() => return,
                    accepted = listener.accept() => match accepted {
                        Ok(accepted) => accepted,
                        Err(e) => {
                            tracing::warn!(error = %e, "HTTPS accept failed");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    },
                };
                let settings = settings.clone();
                let tx = tx.clone();
                tokio::spawn(async move {
                    match handshake(&settings, stream, limit).await {
                        Ok(tls) => {
                            drop(permit);
                            let _ = tx.send((tls, peer)).await;
                        }
                        Err(e) => tracing::debug!(%peer, error = %e, "HTTPS handshake failed"),
                    }
                });
            }
        });
        Self {
            ready,
            local_addr,
            accept_task,
        }
    }
}

impl Drop for HttpsListener {
    fn drop(&mut self) {
        self.accept_task.abort();
    }
}

impl axum::serve::Listener for HttpsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(accepted) => accepted,
            // The accept task only ends when this listener is dropped.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local_addr)
    }
}
