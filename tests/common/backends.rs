//! Fresh databases on the MariaDB / PostgreSQL servers named by `LEAFD_TEST_MYSQL_URL` and
//! `LEAFD_TEST_POSTGRES_URL`. Unset: the test is skipped and says so on stderr. Set but
//! unreachable: the test fails.

use std::io::Write;

use sqlx::Connection;

use super::scenarios::unique_tag;

/// The value of `var`, or `None` after printing that `test` is skipped because it is unset.
pub fn required_env(var: &str, test: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(value) if !value.is_empty() => Some(value),
        _ => {
            // Written to the real stderr, not the captured test output, so a plain
            // `cargo test` shows what it did not run; tests/zz_skipped.rs counts them.
            let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {var} is not set");
            record_skip(test, var);
            None
        }
    }
}

/// Where this `cargo test` run's skips are written: one file per run, named after the cargo
/// process that runs every test binary of it.
pub fn skip_log() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "leafd-skipped-{}.log",
        std::os::unix::process::parent_id()
    ))
}

fn record_skip(test: &str, var: &str) {
    let line = format!("{var}\t{test}\n");
    let _ = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(skip_log())
        .and_then(|mut log| log.write_all(line.as_bytes()));
}

#[derive(Debug, Clone, Copy)]
pub enum Backend {
    MySql,
    Postgres,
}

impl Backend {
    fn env_var(self) -> &'static str {
        match self {
            Backend::MySql => "LEAFD_TEST_MYSQL_URL",
            Backend::Postgres => "LEAFD_TEST_POSTGRES_URL",
        }
    }

    /// The server URL from the environment, or `None` (after printing the skip) when unset.
    pub fn server_url(self, test: &str) -> Option<String> {
        required_env(self.env_var(), test).map(|url| url.trim_end_matches('/').to_string())
    }

    /// Creates an empty database for one test; it is dropped when the returned guard is (at the
    /// end of the test, also when it fails).
    pub async fn fresh_database(self, test: &str) -> Option<FreshDatabase> {
        let server = self.server_url(test)?;
        let name = unique_tag("leafd_t").replace('-', "_");
        match self {
            Backend::MySql => {
                let mut admin = sqlx::MySqlConnection::connect(&server)
                    .await
                    .unwrap_or_else(|e| panic!("LEAFD_TEST_MYSQL_URL={server} unreachable: {e}"));
                sqlx::query(&format!("CREATE DATABASE {name}"))
                    .execute(&mut admin)
                    .await
                    .unwrap();
            }
            Backend::Postgres => {
                let mut admin = sqlx::PgConnection::connect(&format!("{server}/postgres"))
                    .await
                    .unwrap_or_else(|e| {
                        panic!("LEAFD_TEST_POSTGRES_URL={server} unreachable: {e}")
                    });
                sqlx::query(&format!("CREATE DATABASE {name}"))
                    .execute(&mut admin)
                    .await
                    .unwrap();
            }
        }
        Some(FreshDatabase {
            backend: self,
            url: format!("{server}/{name}"),
            server,
            name,
        })
    }

    /// Runs one statement on a test database.
    pub async fn execute(self, url: &str, sql: &str) {
        match self {
            Backend::MySql => {
                let mut db = sqlx::MySqlConnection::connect(url).await.unwrap();
                sqlx::query(sql).execute(&mut db).await.unwrap();
            }
            Backend::Postgres => {
                let mut db = sqlx::PgConnection::connect(url).await.unwrap();
                sqlx::query(sql).execute(&mut db).await.unwrap();
            }
        }
    }

    /// The one integer `sql` returns (a count) from a test database.
    #[allow(dead_code)]
    pub async fn query_i64(self, url: &str, sql: &str) -> i64 {
        match self {
            Backend::MySql => {
                let mut db = sqlx::MySqlConnection::connect(url).await.unwrap();
                sqlx::query_scalar(sql).fetch_one(&mut db).await.unwrap()
            }
            Backend::Postgres => {
                let mut db = sqlx::PgConnection::connect(url).await.unwrap();
                sqlx::query_scalar(sql).fetch_one(&mut db).await.unwrap()
            }
        }
    }

    /// The backend a test database URL names.
    pub fn of(url: &str) -> Backend {
        if url.starts_with("mysql") {
            Backend::MySql
        } else {
            Backend::Postgres
        }
    }
}

/// A database one test created: derefs to its URL, and is dropped with the guard.
pub struct FreshDatabase {
    backend: Backend,
    server: String,
    name: String,
    pub url: String,
}

impl std::ops::Deref for FreshDatabase {
    type Target = str;
    fn deref(&self) -> &str {
        &self.url
    }
}

impl std::fmt::Display for FreshDatabase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.url)
    }
}

impl Drop for FreshDatabase {
    /// Drops the database from a thread of its own (the test's runtime may be the one
    /// unwinding); connections a failed test left open are ended first (PostgreSQL's FORCE).
    fn drop(&mut self) {
        let (backend, server, name) = (self.backend, self.server.clone(), self.name.clone());
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            runtime.block_on(async {
                match backend {
                    Backend::MySql => {
                        let mut admin = sqlx::MySqlConnection::connect(&server).await.ok()?;
                        sqlx::query(&format!("DROP DATABASE IF EXISTS {name}"))
                            .execute(&mut admin)
                            .await
                            .ok()
                            .map(drop)
                    }
                    Backend::Postgres => {
                        let mut admin = sqlx::PgConnection::connect(&format!("{server}/postgres"))
                            .await
                            .ok()?;
                        sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                            .execute(&mut admin)
                            .await
                            .ok()
                            .map(drop)
                    }
                }
            })
        })
        .join();
        if !matches!(dropped, Ok(Some(_))) {
            eprintln!("could not drop the test database {}", self.name);
        }
    }
}

/// Runs `sql` on the database of `url` and returns the first column of its first row, if any.
#[allow(dead_code)]
pub async fn raw(url: &str, sql: &str) -> Option<i64> {
    if url.starts_with("sqlite:") {
        let mut db = sqlx::SqliteConnection::connect(url).await.unwrap();
        sqlx::query_scalar(sql)
            .fetch_optional(&mut db)
            .await
            .unwrap()
    } else if url.starts_with("mysql") {
        let mut db = sqlx::MySqlConnection::connect(url).await.unwrap();
        sqlx::query_scalar(sql)
            .fetch_optional(&mut db)
            .await
            .unwrap()
    } else {
        let mut db = sqlx::PgConnection::connect(url).await.unwrap();
        sqlx::query_scalar(sql)
            .fetch_optional(&mut db)
            .await
            .unwrap()
    }
}
