//! `[storage]`: the segment database's URL and pool, and this node's state directory.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Where segments are stored: `sqlite://path`, `mysql://…` or `postgres://…`.
#[derive(Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct StorageConfig {
    pub url: String,
    pub max_connections: u32,
    /// How long a database call may wait for a pooled connection, in milliseconds.
    pub acquire_timeout_ms: u64,
    /// Create or upgrade the schema at start; turn off where schemas are managed by hand
    /// (`leafd migrate`), and leafd then refuses to start if `leaf_alloc` is missing.
    pub migrate: bool,
    /// Directory of this node's own durable state (the snowflake time fence, the segment
    /// high-water marks). Empty: the SQLite database's directory, else `data`.
    pub state_dir: String,
    /// Start even though both slots of the segment marks exist and neither can be read. The
    /// node then no longer refuses a range a restored or failed-over database hands out again
    /// that this node already served: set it only after moving every tag past what was served
    /// (`LEAF.TAG SKIPALL`), or when the marks are known to hold nothing that matters.
    pub discard_unreadable_marks: bool,
}

impl Default for StorageConfig {
    fn default() -> Self {
        Self {
            url: "sqlite://data/leafd.db".into(),
            max_connections: 8,
            acquire_timeout_ms: 1000,
            migrate: true,
            state_dir: String::new(),
            discard_unreadable_marks: false,
        }
    }
}

impl StorageConfig {
    /// `state_dir`, else the directory of the SQLite database, else `data`.
    pub fn state_dir(&self) -> std::path::PathBuf {
        if !self.state_dir.is_empty() {
            return self.state_dir.clone().into();
        }
        // `sqlite:/abs/x.db` names the same file as `sqlite:///abs/x.db`, as the store reads it.
        self.url
            .strip_prefix("sqlite://")
            .or_else(|| self.url.strip_prefix("sqlite:"))
            .map(|rest| rest.split('?').next().unwrap_or(rest))
            .filter(|path| !path.is_empty() && !path.starts_with(':'))
            .map(|path| {
                std::path::Path::new(path)
                    .parent()
                    .map(|p| p.to_path_buf())
                    .unwrap_or_default()
            })
            .unwrap_or_else(|| "data".into())
    }

    /// Where the segment high-water marks are kept.
    pub fn marks_path(&self) -> std::path::PathBuf {
        self.state_dir().join("segment-marks.json")
    }

    pub fn acquire_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.acquire_timeout_ms)
    }

    /// The URL with any password replaced, for logs.
    pub fn redacted_url(&self) -> String {
        redact_url_password(&self.url)
    }
}

impl fmt::Debug for StorageConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StorageConfig")
            .field("url", &self.redacted_url())
            .field("max_connections", &self.max_connections)
            .field("acquire_timeout_ms", &self.acquire_timeout_ms)
            .field("migrate", &self.migrate)
            .field("state_dir", &self.state_dir)
            .field("discard_unreadable_marks", &self.discard_unreadable_marks)
            .finish()
    }
}

/// The URL with every secret in it shown as `<redacted>`: the password of `user:password@`, and
/// the value of every query parameter whose name says it is one (`password`, `sslpassword`,
/// `passwd`, `pwd`, a `…secret…` or `…token…` key), wherever the URL is printed.
fn redact_url_password(url: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let base = redact_userinfo(base);
    let Some(query) = query else {
        return base;
    };
    let query: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((key, _)) if secret_key(key) => format!("{key}=<redacted>"),
            _ => pair.to_string(),
        })
        .collect();
    format!("{base}?{}", query.join("&"))
}

/// Whether a URL query parameter carries a secret.
fn secret_key(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    ["password", "passwd", "secret", "token"]
        .iter()
        .any(|word| key.contains(word))
        || key == "pwd"
}

fn redact_userinfo(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_string();
    };
    let rest = &url[scheme_end + 3..];
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    match (authority.rfind('@'), authority.find(':')) {
        (Some(at), Some(colon)) if colon < at => format!(
            "{}{}:<redacted>{}",
            &url[..scheme_end + 3],
            &authority[..colon],
            &rest[at..]
        ),
        _ => url.to_string(),
    }
}

impl StorageConfig {
    /// The `[storage]` section's own rules; the message names the key.
    pub(crate) fn validate(&self) -> Result<(), String> {
        if self.max_connections == 0 {
            return Err("storage.max_connections must be at least 1".into());
        }
        self.check_url_options()
    }

    /// The driver ignores a URL option it does not know, so a misspelt TLS option (`sslMode`,
    /// JDBC's `sslCa`) would connect without verifying the server: refused instead.
    fn check_url_options(&self) -> Result<(), String> {
        let (dialect, known): (&str, &[&str]) = if self.url.starts_with("postgres") {
            (
                "PostgreSQL",
                &[
                    "sslmode",
                    "ssl-mode",
                    "sslrootcert",
                    "ssl-root-cert",
                    "ssl-ca",
                    "sslcert",
                    "ssl-cert",
                    "sslkey",
                    "ssl-key",
                    "statement-cache-capacity",
                    "host",
                    "hostaddr",
                    "port",
                    "dbname",
                    "user",
                    "password",
                    "application_name",
                    "options",
                    "target_session_attrs",
                ],
            )
        } else if self.url.starts_with("mysql") || self.url.starts_with("mariadb") {
            (
                "MySQL/MariaDB",
                &[
                    "sslmode",
                    "ssl-mode",
                    "sslca",
                    "ssl-ca",
                    "sslcert",
                    "ssl-cert",
                    "sslkey",
                    "ssl-key",
                    "charset",
                    "collation",
                    "statement-cache-capacity",
                    "socket",
                    "timezone",
                    "time-zone",
                ],
            )
        } else {
            return Ok(());
        };
        let Some((_, query)) = self.url.split_once('?') else {
            return Ok(());
        };
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let key = pair.split_once('=').map_or(pair, |(k, _)| k);
            if !known.contains(&key) {
                return Err(format!(
                    "storage.url: unknown option '{key}' for {dialect} (it takes {}); the driver would ignore it, and a misspelt TLS option would connect without verifying the server",
                    known.join(", ")
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_state_directory_is_the_sqlite_files_however_the_url_is_written() {
        let state = |url: &str| {
            StorageConfig {
                url: url.into(),
                ..StorageConfig::default()
            }
            .state_dir()
        };
        assert_eq!(state("sqlite:///abs/x.db"), std::path::Path::new("/abs"));
        assert_eq!(state("sqlite:/abs/x.db"), std::path::Path::new("/abs"));
        assert_eq!(state("sqlite://rel/x.db"), std::path::Path::new("rel"));
        assert_eq!(state("mysql://h/db"), std::path::Path::new("data"));
    }

    #[test]
    fn unknown_url_options_are_refused() {
        let with = |url: &str| StorageConfig {
            url: url.into(),
            ..StorageConfig::default()
        };
        assert!(
            with("postgres://u@h/db?sslmode=verify-full&sslrootcert=/ca.pem")
                .validate()
                .is_ok()
        );
        assert!(
            with("mysql://u@h/db?ssl-mode=VERIFY_IDENTITY&ssl-ca=/ca.pem")
                .validate()
                .is_ok()
        );
        let err = with("postgres://u@h/db?sslMode=verify-full")
            .validate()
            .unwrap_err();
        assert!(
            err.starts_with("storage.url: unknown option 'sslMode' for PostgreSQL"),
            "{err}"
        );
        let err = with("mysql://u@h/db?sslCa=/ca.pem").validate().unwrap_err();
        assert!(err.contains("'sslCa' for MySQL/MariaDB"), "{err}");
        assert!(with("sqlite://data/x.db").validate().is_ok());
    }
}
