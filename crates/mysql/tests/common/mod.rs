//! What the MySQL test binaries share: a managed MariaDB and its URL, clients and keys whose
//! failures say what they were for, and `or_fail`, the way a test says what failed. Each binary
//! uses its part.
#![allow(dead_code)]

use std::sync::Arc;

use leasehold_core::LockKey;
use leasehold_mysql::MysqlAuthority;
use leasehold_servers::MariaDbServer;

/// The server's URL with requests giving up after one second, so an unresponsive server is
/// noticed within a TTL.
pub fn url(server: &MariaDbServer) -> String {
    format!("{}?timeout_ms=1000", server.url())
}

/// A fresh managed server; a server that cannot start is the test's failure.
pub async fn start_server() -> Result<Arc<MariaDbServer>> {
    let server = tokio::task::spawn_blocking(MariaDbServer::start)
        .await
        .or_fail("the harness task")?
        .or_fail("MariaDB must start for these tests")?;
    Ok(Arc::new(server))
}

/// A client of `url` (named in the failure without its password).
pub async fn connect(url: &str) -> Result<MysqlAuthority> {
    MysqlAuthority::connect(url).await.or_fail(format!(
        "connect {}",
        leasehold_core::backend::redact_url(url)
    ))
}

pub fn key(name: &str) -> Result<LockKey> {
    LockKey::new(name).or_fail(format!("the key {name:?}"))
}

/// What a test fails with, and `.or_fail("what was being done")?` instead of `unwrap()`: the
/// conformance kit's, shared by every backend's tests.
pub use leasehold_conformance::kit::OrFail;
pub use leasehold_conformance::Failure;

/// A test's outcome, and what its helpers return: the value, or the [`Failure`] that ends it.
pub type Result<T = (), E = Failure> = std::result::Result<T, E>;
