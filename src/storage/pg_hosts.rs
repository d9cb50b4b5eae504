//! Multi-host PostgreSQL URLs (`postgres://u@h1:5432,h2:5432/db?target_session_attrs=read-write`)
//! as libpq reads them: the pool uses the first host whose session fits, and moves on when it
//! stops fitting or answering (a failover, a switchover), each host with the URL's TLS options.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, Postgres};
use sqlx::{ConnectOptions, Connection};
use tokio::sync::Notify;

use super::committed::pool_options;
use crate::config::StorageConfig;

/// How often the pool's host is checked while it fits, and how soon hosts are tried again
/// when none does. The check is one query on a pooled connection: no new connection.
const CHECK_EVERY: Duration = Duration::from_secs(1);
const RETRY_EVERY: Duration = Duration::from_millis(200);
/// Longest one host may take to accept a connection before the next is tried.
const HOST_TIMEOUT: Duration = Duration::from_secs(2);

/// Which sessions leafd may use (`target_session_attrs`): it writes, so a standby never fits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SessionAttrs {
    /// Any host that accepts the connection.
    Any,
    /// A session that may write (`transaction_read_only` off): the default with several hosts.
    ReadWrite,
    /// A server that is not in recovery.
    Primary,
}

impl FromStr for SessionAttrs {
    type Err = String;

    fn from_str(value: &str) -> Result<Self, String> {
        match value {
            "any" => Ok(SessionAttrs::Any),
            "read-write" => Ok(SessionAttrs::ReadWrite),
            "primary" => Ok(SessionAttrs::Primary),
            other => Err(format!(
                "target_session_attrs '{other}' does not suit leafd, which writes: use read-write (the default with several hosts), primary or any"
            )),
        }
    }
}

/// The hosts of a URL, in order, each with the URL's other options.
pub(crate) struct Hosts {
    options: Vec<PgConnectOptions>,
    names: Vec<String>,
    attrs: SessionAttrs,
    /// The URL set `target_session_attrs` (else read-write, the default with several hosts).
    explicit_attrs: bool,
}

/// Query parameters that name hosts or ports: libpq merges them with the URL's, sqlx lets them
/// replace the URL's host list silently (two closed hosts listed, the migration went elsewhere),
/// and sqlx reads a port list as one number. Refused, with where to put them instead.
const HOST_KEYS: [&str; 3] = ["host", "hostaddr", "port"];

/// The hosts a URL names; `None` for one host without `target_session_attrs` (read as it is).
pub(crate) fn parse(url: &str) -> Result<Option<Hosts>, sqlx::Error> {
    let config = |why: String| sqlx::Error::Configuration(why.into());
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return Ok(None);
    };
    let rest = &url[scheme_end..];
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (user, host_list) = match rest[..authority_end].rsplit_once('@') {
        Some((user, hosts)) => (format!("{user}@"), hosts),
        None => (String::new(), &rest[..authority_end]),
    };
    let (path, query) = match rest[authority_end..].split_once('?') {
        Some((path, query)) => (path, query),
        None => (&rest[authority_end..], ""),
    };
    let mut attrs = None;
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("target_session_attrs", value)) => {
                attrs = Some(value.parse::<SessionAttrs>().map_err(config)?)
            }
            // With no host before the path (`postgres:///db?host=/run/postgresql`, a Unix
            // socket) one host and one port are sqlx's to read.
            Some((key, value))
                if HOST_KEYS.contains(&key.to_ascii_lowercase().as_str())
                    && (!host_list.is_empty() || value.contains(',')) =>
            {
                return Err(config(format!(
                    "storage.url: the query parameter '{key}' is not supported here: it would replace or split the URL's hosts; give every host with its port in the URL itself (postgres://user@host1:5432,host2:5433/db)"
                )));
            }
            _ => kept.push(pair),
        }
    }
    let names: Vec<String> = host_list.split(',').map(str::to_string).collect();
    if names.len() == 1 && attrs.is_none() {
        return Ok(None);
    }
    if names.iter().any(String::is_empty) {
        return Err(config(format!(
            "storage.url: an empty host in '{host_list}'"
        )));
    }
    let query = if kept.is_empty() {
        String::new()
    } else {
        format!("?{}", kept.join("&"))
    };
    let options = names
        .iter()
        .map(|host| {
            PgConnectOptions::from_str(&format!("{}{user}{host}{path}{query}", &url[..scheme_end]))
                .map(super::session::postgres)
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Some(Hosts {
        options,
        names,
        explicit_attrs: attrs.is_some(),
        attrs: attrs.unwrap_or(SessionAttrs::ReadWrite),
    }))
}

impl Hosts {
    /// Whether a session is one leafd may use.
    async fn fits(&self, conn: &mut PgConnection) -> Result<bool, sqlx::Error> {
        let (in_recovery, read_only): (bool, String) =
            sqlx::query_as("SELECT pg_is_in_recovery(), current_setting('transaction_read_only')")
                .fetch_one(conn)
                .await?;
        Ok(match self.attrs {
            SessionAttrs::Any => true,
            SessionAttrs::ReadWrite => read_only == "off",
            SessionAttrs::Primary => !in_recovery,
        })
    }

    /// The first host, in order, that accepts a connection whose session fits.
    async fn select(&self) -> Result<usize, sqlx::Error> {
        let mut why = Vec::new();
        for (i, options) in self.options.iter().enumerate() {
            let attempt = async {
                let mut conn = options.connect().await?;
                let fits = self.fits(&mut conn).await;
                let _ = conn.close().await;
                fits
            };
            match tokio::time::timeout(HOST_TIMEOUT, attempt).await {
                Ok(Ok(true)) => return Ok(i),
                Ok(Ok(false)) => {
                    why.push(format!("{}: session not {:?}", self.names[i], self.attrs))
                }
                Ok(Err(e)) => why.push(format!("{}: {e}", self.names[i])),
                Err(_) => why.push(format!(
                    "{}: no answer within {HOST_TIMEOUT:?}",
                    self.names[i]
                )),
            }
        }
        let what = if self.explicit_attrs {
            "no host fits target_session_attrs"
        } else {
            "no host accepted a session leafd can write in"
        };
        Err(sqlx::Error::Configuration(
            format!("{what} ({})", why.join("; ")).into(),
        ))
    }
}

/// Opens the pool on the first host that fits and keeps it on one: a new connection whose
/// session does not fit is refused (and the hosts are tried again at once), and the pool's host
/// is checked every second through a pooled connection, so a host that died or was demoted is
/// left within about a second of another one fitting. sqlx reads the pool's connect options
/// again on every attempt, so waiting requests move to the new host as soon as it is chosen.
pub(crate) async fn connect(config: &StorageConfig, hosts: Hosts) -> Result<PgPool, sqlx::Error> {
    let hosts = Arc::new(hosts);
    let first = hosts.select().await?;
    let wake = Arc::new(Notify::new());
    let checked = hosts.clone();
    let woken = wake.clone();
    let pool = pool_options::<Postgres>(config)
        .after_connect(move |conn, _| {
            let (hosts, wake) = (checked.clone(), woken.clone());
            Box::pin(async move {
                if hosts.fits(conn).await? {
                    return Ok(());
                }
                wake.notify_one();
                Err(sqlx::Error::Configuration(
                    "the host's session no longer fits target_session_attrs".into(),
                ))
            })
        })
        .connect_with(hosts.options[first].clone())
        .await?;
    tracing::info!(host = %hosts.names[first], "PostgreSQL host chosen");
    tokio::spawn(keep_on_a_fitting_host(hosts, pool.clone(), wake, first));
    Ok(pool)
}

async fn keep_on_a_fitting_host(
    hosts: Arc<Hosts>,
    pool: PgPool,
    wake: Arc<Notify>,
    mut current: usize,
) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(CHECK_EVERY) => {}
            _ = wake.notified() => {}
        }
        if pool.is_closed() {
            return;
        }
        let check = async {
            let mut conn = pool.acquire().await?;
            hosts.fits(&mut conn).await
        };
        if let Ok(Ok(true)) = tokio::time::timeout(CHECK_EVERY, check).await {
            continue;
        }
        loop {
            match hosts.select().await {
                Ok(chosen) => {
                    if chosen != current {
                        tracing::warn!(from = %hosts.names[current], to = %hosts.names[chosen], "PostgreSQL host changed");
                        pool.set_connect_options(hosts.options[chosen].clone());
                        current = chosen;
                    }
                    break;
                }
                Err(e) => {
                    tracing::debug!(error = %e, "no PostgreSQL host fits yet");
                    if pool.is_closed() {
                        return;
                    }
                    tokio::time::sleep(RETRY_EVERY).await;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_and_port_query_parameters_are_refused_naming_the_key() {
        for url in [
            "postgres://u@a:5432,b:5433/leaf?host=c&port=5432",
            "postgres://u@a/leaf?sslmode=disable&PORT=5433",
            "postgres:///leaf?port=5432,5433",
            "postgres://u@a/leaf?hostaddr=10.0.0.1",
        ] {
            let error = parse(url).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(
                error.contains("storage.url: the query parameter '"),
                "{url}: {error}"
            );
        }
        assert!(parse("postgres:///leaf?host=/run/postgresql").is_ok());
    }

    #[test]
    fn a_url_of_several_hosts_gives_one_set_of_options_per_host() {
        let hosts = parse(
            "postgres://u:p%40ss@db1:5432,db2,[::1]:6432/leaf?sslmode=require&target_session_attrs=primary&application_name=x",
        )
        .unwrap()
        .unwrap();
        assert_eq!(hosts.names, ["db1:5432", "db2", "[::1]:6432"]);
        assert_eq!(hosts.attrs, SessionAttrs::Primary);
        let ports: Vec<u16> = hosts.options.iter().map(|o| o.get_port()).collect();
        assert_eq!(ports, [5432, 5432, 6432]);
        for options in &hosts.options {
            assert_eq!(options.get_database(), Some("leaf"));
            assert_eq!(options.get_username(), "u");
            assert!(matches!(
                options.get_ssl_mode(),
                sqlx::postgres::PgSslMode::Require
            ));
        }
        // Several hosts without the option: read-write, as leafd writes.
        let hosts = parse("postgres://u@a,b/db").unwrap().unwrap();
        assert_eq!(hosts.attrs, SessionAttrs::ReadWrite);
        // One host without the option: read as it is.
        assert!(parse("postgres://u@a:5432/db?sslmode=disable")
            .unwrap()
            .is_none());
        assert!(parse("postgres://u@a/db?target_session_attrs=any")
            .unwrap()
            .is_some());
        let refused = parse("postgres://a,b/db?target_session_attrs=standby")
            .err()
            .unwrap()
            .to_string();
        assert!(
            refused.contains("does not suit leafd, which writes"),
            "{refused}"
        );
        assert!(parse("postgres://a,,b/db").is_err());
    }
}
