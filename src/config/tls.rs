//! `[tls]`: rustls for the RESP and HTTP listeners, from PEM files.

use serde::{Deserialize, Serialize};

/// TLS (rustls) for the RESP and HTTP listeners, from PEM files. Off unless `bind` or `http`
/// asks for it.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsConfig {
    /// Address of a RESP-over-TLS listener (Redis' `tls-port`), beside the plain one.
    pub bind: Option<String>,
    /// Serve the HTTP listener over TLS (HTTPS) with the same certificate.
    pub http: bool,
    /// The server's certificate chain, leaf first (PEM).
    pub cert_file: Option<String>,
    /// The server's private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key_file: Option<String>,
    /// When set, clients must present a certificate signed by one of these CAs (mutual TLS).
    pub client_ca_file: Option<String>,
    /// A client that has not finished its TLS handshake within this many ms is dropped.
    pub handshake_timeout_ms: u64,
}

impl Default for TlsConfig {
    fn default() -> Self {
        Self {
            bind: None,
            http: false,
            cert_file: None,
            key_file: None,
            client_ca_file: None,
            handshake_timeout_ms: 10_000,
        }
    }
}

impl TlsConfig {
    /// True when some listener serves TLS.
    pub fn enabled(&self) -> bool {
        self.bind.is_some() || self.http
    }

    pub fn handshake_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.handshake_timeout_ms)
    }
}

impl TlsConfig {
    /// The `[tls]` section's own rules; the message names the key.
    pub(crate) fn validate(&self) -> Result<(), String> {
        if let Some(bind) = &self.bind {
            if !super::is_bind_address(bind) {
                return Err(format!("tls.bind '{bind}' is not a host:port address"));
            }
        }
        if self.enabled() {
            if self.cert_file.is_none() || self.key_file.is_none() {
                return Err("tls: cert_file and key_file are required for TLS".into());
            }
            if self.handshake_timeout_ms == 0 {
                return Err("tls.handshake_timeout_ms must be > 0".into());
            }
        }
        Ok(())
    }
}
