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
            // `cargo test` shows what it did not run.
            let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {var} is not set");
            None
        }
    }
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

    /// Creates an empty database for one test and returns its URL.
    pub async fn fresh_database(self, test: &str) -> Option<String> {
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
        Some(format!("{server}/{name}"))
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

    /// The backend a test database URL names.
    pub fn of(url: &str) -> Backend {
        if url.starts_with("mysql") {
            Backend::MySql
        } else {
            Backend::Postgres
        }
    }
}
