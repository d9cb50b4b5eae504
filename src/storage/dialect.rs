//! What differs between the SQL dialects in the statements they share: the backend's name,
//! placeholders, the database's clock and the instance a connection reaches.

use std::future::Future;

use sqlx::Database;

/// A database sqlx speaks, as leafd's shared statements need to know it. Implemented on
/// sqlx's own database types, each in its store's file.
pub(crate) trait Dialect: Database {
    /// The short backend name (`INFO`, metrics, `storage::backend_of`).
    const BACKEND: &'static str;
    /// The database's clock in UNIX milliseconds, as an SQL expression: lease expiry is
    /// judged by it, never by a node's clock.
    const NOW_MS: &'static str;
    /// The `n`th placeholder of a statement (1-based): `?` or `$n`.
    fn placeholder(n: usize) -> String;
    /// The database instance a connection reaches (see `storage::failover`): a failover or a
    /// restore changes it.
    fn instance(
        conn: &mut Self::Connection,
    ) -> impl Future<Output = Result<String, sqlx::Error>> + Send;
}
