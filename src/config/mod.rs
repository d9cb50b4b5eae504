//! Configuration: a TOML file with serde defaults for every key, overridden by `LEAFD_*`
//! environment variables and CLI flags in `main`, validated once before anything starts.

mod http;
mod segment;
mod server;
mod snowflake;
mod storage;
mod tls;

use std::net::SocketAddr;
use std::path::Path;

use serde::{Deserialize, Serialize};

pub use http::HttpConfig;
pub use segment::{
    zone_names_a_place, OpaqueTag, Period, SegmentConfig, TagOrder, TagSeed, MAX_ID_DELTA,
};
pub use server::{ServerConfig, UserConfig};
pub use snowflake::{CoordinatorKind, EtcdConfig, SnowflakeConfig, ZookeeperConfig};
pub use storage::StorageConfig;
pub use tls::TlsConfig;

/// `ip:port`, `[ipv6]:port` or `name:port` (resolved when the listener binds, e.g. `localhost`).
pub(crate) fn is_bind_address(bind: &str) -> bool {
    if bind.parse::<SocketAddr>().is_ok() {
        return true;
    }
    match bind.rsplit_once(':') {
        Some((host, port)) => {
            port.parse::<u16>().is_ok()
                && !host.is_empty()
                && host
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-')
        }
        None => false,
    }
}

/// Whole-server configuration. Every field has a default, so an empty file is valid.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub server: ServerConfig,
    pub storage: StorageConfig,
    pub segment: SegmentConfig,
    pub snowflake: SnowflakeConfig,
    pub http: HttpConfig,
    pub tls: TlsConfig,
    pub admin: AdminConfig,
}

/// Who may run admin commands (LEAF.TAG, CONFIG, SHUTDOWN, the HTTP tag endpoints) when no
/// password or user is configured.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdminConfig {
    /// Without a password, admin commands are refused from other hosts unless this is true
    /// (named so that nobody sets it by accident).
    pub allow_unauthenticated: bool,
}

/// Why a configuration was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    /// One line: where, and what is wrong (toml's message, which lists the allowed keys).
    #[error("invalid config file {path}{at}: {message}")]
    Parse {
        path: String,
        /// `, line L, column C` when known.
        at: String,
        message: String,
    },
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

impl Config {
    /// The address of this node's RESP service, as other nodes would name it: the plaintext
    /// listener's, or the TLS listener's when there is no plaintext one.
    pub fn resp_bind(&self) -> &str {
        match (&self.server.bind, &self.tls.bind) {
            (plain, Some(tls)) if plain.is_empty() => tls,
            (plain, _) => plain,
        }
    }
}

impl Config {
    /// Reads a TOML file; keys it leaves out keep their defaults.
    pub fn from_file(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Config::from_toml(&text).map_err(|e| match e {
            ConfigError::Parse { at, message, .. } => ConfigError::Parse {
                path: path.display().to_string(),
                at,
                message,
            },
            other => other,
        })
    }

    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        toml::from_str(text).map_err(|e| {
            let start = e.span().map(|span| span.start.min(text.len()));
            let at = start.map_or_else(String::new, |start| {
                let before = &text[..start];
                let line = before.matches('\n').count() + 1;
                let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
                format!(", line {line}, column {column}")
            });
            let message = e.message().trim().replace('\n', " ");
            // serde names the type, not the key: the key is read off the line the error
            // points at, with the table it sits in.
            let message = match start.and_then(|start| key_at(text, start)) {
                Some(key)
                    if !message
                        .contains(&format!("`{}`", key.rsplit('.').next().unwrap_or(&key))) =>
                {
                    format!("{key}: {message}")
                }
                _ => message,
            };
            ConfigError::Parse {
                path: "<inline>".into(),
                at,
                message,
            }
        })
    }

    /// The effective configuration as TOML that leafd reads back: every key with its value,
    /// defaults included, secrets (passwords, the storage URL's password) shown as `<redacted>`.
    pub fn to_toml_redacted(&self) -> String {
        let mut shown = self.clone();
        if shown.server.requirepass.is_some() {
            shown.server.requirepass = Some("<redacted>".into());
        }
        for user in &mut shown.server.users {
            user.password = "<redacted>".into();
        }
        shown.storage.url = shown.storage.redacted_url();
        if shown.snowflake.etcd.password.is_some() {
            shown.snowflake.etcd.password = Some("<redacted>".into());
        }
        if !shown.segment.opaque_key.is_empty() {
            shown.segment.opaque_key = "<redacted>".into();
        }
        toml::to_string(&shown).unwrap_or_else(|e| format!("# cannot be shown as TOML: {e}\n"))
    }

    /// Refuses values that would make the server misbehave rather than fail at start: each
    /// section's own rules, then the rules that span sections.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.server
            .validate()
            .and_then(|()| self.tls.validate())
            .and_then(|()| self.http.validate())
            .and_then(|()| self.storage.validate())
            .and_then(|()| self.segment.validate())
            .and_then(|()| self.snowflake.validate())
            .map_err(ConfigError::Invalid)?;
        let invalid = |msg: String| Err(ConfigError::Invalid(msg));
        if self.server.bind.is_empty() {
            if self.tls.bind.is_none() {
                return invalid(
                    "server.bind may only be empty (no plaintext listener) when tls.bind is set"
                        .into(),
                );
            }
        } else if !is_bind_address(&self.server.bind) {
            return invalid(format!(
                "server.bind '{}' is not a host:port address",
                self.server.bind
            ));
        }
        if self.tls.http && !self.http.enabled {
            return invalid("tls.http = true needs http.enabled = true".into());
        }
        Ok(())
    }
}

/// The dotted key whose value starts at byte `offset` of a TOML text (`server.max_clients`):
/// the bare key left of `=` on that line, under the last `[table]` or `[[array]]` header above
/// it; `None` when the line holds no `key =`.
fn key_at(text: &str, offset: usize) -> Option<String> {
    let line_start = text[..offset].rfind('\n').map_or(0, |i| i + 1);
    let line = text[line_start..].lines().next()?;
    let (key, _) = line.split_once('=')?;
    let key = key.trim().trim_matches('"');
    if key.is_empty() || key.starts_with('#') {
        return None;
    }
    let table = text[..line_start]
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| l.starts_with('['))
        .map(|header| {
            header
                .trim_matches(|c| c == '[' || c == ']')
                .trim()
                .to_string()
        });
    Some(match table {
        Some(table) => format!("{table}.{key}"),
        None => key.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_file_gives_defaults() {
        let cfg = Config::from_toml("").unwrap();
        assert_eq!(cfg.server.bind, "127.0.0.1:6380");
        assert_eq!(cfg.storage.url, "sqlite://data/leafd.db");
        assert_eq!(cfg.segment.refresh_interval_secs, 60);
        cfg.validate().unwrap();
    }

    #[test]
    fn example_file_is_valid_and_shows_the_defaults() {
        let example = Config::from_toml(include_str!("../../leafd.example.toml")).unwrap();
        example.validate().unwrap();
        assert_eq!(
            format!("{example:?}"),
            format!("{:?}", Config::default()),
            "leafd.example.toml must list the defaults"
        );
    }

    #[test]
    fn unknown_keys_and_bad_values_are_refused() {
        assert!(matches!(
            Config::from_toml("[server]\nbindd = \"x\""),
            Err(ConfigError::Parse { .. })
        ));
        let err = Config::from_toml("[server]\nbind = \"x:1\"\nmax_clients = \"lots\"")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(", line 3, column 15: server.max_clients: invalid type: string \"lots\""),
            "{err}"
        );
        let err = Config::from_toml("[[segment.tags]]\ntag = \"a\"\nstep = \"ten\"")
            .unwrap_err()
            .to_string();
        assert!(err.contains(": segment.tags.step: invalid type"), "{err}");
        let err = Config::from_toml("[server]\nbindd = \"x\"")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("line 2, column 1: unknown field `bindd`"),
            "{err}"
        );
        let cfg = Config::from_toml("[[segment.tags]]\ntag = \"a\"\nstep = 0").unwrap();
        let err = cfg.validate().unwrap_err().to_string();
        assert!(err.contains("step must be between 1 and"), "{err}");
    }

    #[test]
    fn io_threads_default_to_half_the_cores_and_are_bounded() {
        let mut cfg = Config::from_toml("[server]\nio_threads = 3").unwrap();
        cfg.validate().unwrap();
        assert_eq!(cfg.server.effective_io_threads(), 3);
        cfg.server.io_threads = 0;
        let cores = std::thread::available_parallelism().unwrap().get();
        assert_eq!(cfg.server.effective_io_threads(), (cores / 2).max(1));
        cfg.server.io_threads = 5000;
        let err = cfg.validate().unwrap_err().to_string();
        assert!(
            err.contains("server.io_threads must be at most 1024"),
            "{err}"
        );
    }

    #[test]
    fn plaintext_listener_may_be_off_only_with_a_tls_listener() {
        let mut cfg = Config::from_toml("[server]\nbind = \"\"").unwrap();
        let err = cfg.validate().unwrap_err().to_string();
        assert!(err.contains("only be empty"), "{err}");
        cfg.tls = TlsConfig {
            bind: Some("10.0.0.5:6390".into()),
            cert_file: Some("c.pem".into()),
            key_file: Some("k.pem".into()),
            ..TlsConfig::default()
        };
        cfg.validate().unwrap();
        assert_eq!(cfg.resp_bind(), "10.0.0.5:6390");
        cfg.server.bind = "10.0.0.5:6380".into();
        assert_eq!(cfg.resp_bind(), "10.0.0.5:6380");
    }

    #[test]
    fn secrets_in_a_url_query_are_redacted() {
        let shown = |url: &str| {
            let mut cfg = Config::default();
            cfg.storage.url = url.into();
            cfg.storage.redacted_url()
        };
        assert_eq!(
            shown("postgres://u@db/leaf?password=s3cret&sslmode=require"),
            "postgres://u@db/leaf?password=<redacted>&sslmode=require"
        );
        assert_eq!(
            shown("postgres://u:pw@a,b/leaf?sslpassword=k&PASSWORD=x"),
            "postgres://u:<redacted>@a,b/leaf?sslpassword=<redacted>&PASSWORD=<redacted>"
        );
        assert_eq!(
            shown("mysql://root@db:3306/leaf?ssl-mode=disabled"),
            "mysql://root@db:3306/leaf?ssl-mode=disabled"
        );
        assert_eq!(shown("sqlite://data/leafd.db"), "sqlite://data/leafd.db");
    }

    #[test]
    fn debug_output_hides_secrets() {
        let cfg = Config::from_toml(
            "[server]\nrequirepass = \"hunter2\"\n[storage]\nurl = \"mysql://root:s3cret@db:3306/leaf\"",
        )
        .unwrap();
        let shown = format!("{:?} {:?}", cfg.server, cfg.storage);
        assert!(
            !shown.contains("hunter2") && !shown.contains("s3cret"),
            "{shown}"
        );
        assert!(
            shown.contains("mysql://root:<redacted>@db:3306/leaf"),
            "{shown}"
        );
    }
}
