//! `[http]`: the HTTP listener for `/metrics`, `/health`, `/ready` and Leaf's HTTP API.

use std::net::SocketAddr;

use serde::Deserialize;

/// The HTTP listener: `/metrics`, `/health`, `/ready` and Leaf's HTTP API.
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpConfig {
    pub enabled: bool,
    pub bind: String,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            bind: "127.0.0.1:9380".into(),
        }
    }
}

impl HttpConfig {
    /// The `[http]` section's own rules; the message names the key.
    pub(crate) fn validate(&self) -> Result<(), String> {
        if self.enabled && self.bind.parse::<SocketAddr>().is_err() {
            return Err(format!(
                "http.bind '{}' is not an ip:port address",
                self.bind
            ));
        }
        Ok(())
    }
}
