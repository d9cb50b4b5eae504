//! `[http]`: the HTTP listener for `/metrics`, `/health`, `/ready` and Leaf's HTTP API.

use serde::{Deserialize, Serialize};

/// The HTTP listener: `/metrics`, `/health`, `/ready` and Leaf's HTTP API.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpConfig {
    pub enabled: bool,
    pub bind: String,
    /// How many tags get `/metrics` series of their own: the busiest by IDs served; the
    /// others are summed under `tag="_other"`, so the page stays small with many tags.
    pub metrics_tags: usize,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            bind: "127.0.0.1:9380".into(),
            metrics_tags: 100,
        }
    }
}

impl HttpConfig {
    /// The `[http]` section's own rules; the message names the key.
    pub(crate) fn validate(&self) -> Result<(), String> {
        if self.enabled && !super::is_bind_address(&self.bind) {
            return Err(format!(
                "http.bind '{}' is not a host:port address",
                self.bind
            ));
        }
        Ok(())
    }
}
