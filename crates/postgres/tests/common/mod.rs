//! What the PostgreSQL test binaries share: a managed server and its URL, clients and keys whose
//! failures say what they were for, and `or_fail`, the way a test says what failed. Each binary
//! uses its part.
#![allow(dead_code)]

use std::sync::Arc;

use leasehold_core::LockKey;
use leasehold_postgres::PostgresAuthority;
use leasehold_servers::PostgresServer;

/// The server's URL with requests giving up after one second, so an unresponsive server is
/// noticed within a TTL.
pub fn url(server: &PostgresServer) -> String {
    format!("{}?timeout_ms=1000", server.url())
}

/// A fresh managed server; a server that cannot start is the test's failure.
pub async fn start_server() -> Result<Arc<PostgresServer>> {
    let server = tokio::task::spawn_blocking(PostgresServer::start)
        .await
        .or_fail("the harness task")?
        .or_fail("PostgreSQL must start for these tests")?;
    Ok(Arc::new(server))
}

/// A client of `url` (named in the failure without its password).
pub async fn connect(url: &str) -> Result<PostgresAuthority> {
    PostgresAuthority::connect(url).await.or_fail(format!(
        "connect {}",
        leasehold_core::backend::redact_url(url)
    ))
}

pub fn key(name: &str) -> Result<LockKey> {
    LockKey::new(name).or_fail(format!("the key {name:?}"))
}

/// Runs `sql` (no rows wanted) on `a`'s pool.
pub async fn exec(a: &PostgresAuthority, sql: &str) -> Result {
    sqlx::query(sqlx::AssertSqlSafe(sql.to_string()))
        .execute(a.pool())
        .await
        .or_fail(sql)?;
    Ok(())
}

// ---- Saying what failed ---------------------------------------------------------------------

/// What a test was doing when it failed, and why; printed as is when a test returns it.
pub struct Failure(String);

impl std::fmt::Debug for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<String> for Failure {
    fn from(message: String) -> Self {
        Failure(message)
    }
}

impl From<&str> for Failure {
    fn from(message: &str) -> Self {
        Failure(message.to_string())
    }
}

/// A test's outcome, and what its helpers return: the value, or the [`Failure`] that ends it.
pub type Result<T = (), E = Failure> = std::result::Result<T, E>;

/// `.or_fail("what was being done")?` instead of `unwrap()`: an error, or an `Option` that holds
/// nothing, becomes a [`Failure`] that names the step.
pub trait OrFail<T> {
    /// The value, or a failure naming `what` and the error (or `None`).
    fn or_fail(self, what: impl std::fmt::Display) -> Result<T>;
}

impl<T, E: std::fmt::Debug> OrFail<T> for std::result::Result<T, E> {
    fn or_fail(self, what: impl std::fmt::Display) -> Result<T> {
        self.map_err(|e| Failure(format!("{what}: {e:?}")))
    }
}

impl<T> OrFail<T> for Option<T> {
    fn or_fail(self, what: impl std::fmt::Display) -> Result<T> {
        self.ok_or_else(|| Failure(format!("{what}: None")))
    }
}
