//! What the PostgreSQL test binaries share: a managed server and its URL.

use std::sync::Arc;

use leasehold_servers::PostgresServer;

/// The server's URL with requests giving up after one second, so an unresponsive server is
/// noticed within a TTL.
pub fn url(server: &PostgresServer) -> String {
    format!("{}?timeout_ms=1000", server.url())
}

/// A fresh managed server; a server that cannot start fails the test.
pub async fn start() -> Arc<PostgresServer> {
    let server = tokio::task::spawn_blocking(PostgresServer::start)
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("PostgreSQL must start for these tests: {e}"));
    Arc::new(server)
}
