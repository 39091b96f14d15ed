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

/// What a test fails with, and `.or_fail("what was being done")?` instead of `unwrap()`: the
/// conformance kit's, shared by every backend's tests.
pub use leasehold_conformance::kit::OrFail;
pub use leasehold_conformance::Failure;

/// A test's outcome, and what its helpers return: the value, or the [`Failure`] that ends it.
pub type Result<T = (), E = Failure> = std::result::Result<T, E>;
