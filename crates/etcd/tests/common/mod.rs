//! What the etcd test binaries share: a managed single-node server and a URL to it.

use std::sync::Arc;
use std::time::Duration;

use leasehold_servers::EtcdServer;

/// The request timeout of every client in these tests (`timeout_ms` in [`url`]): requests give
/// up after one second, so an unresponsive server is noticed within a TTL.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(1);

pub fn url(server: &EtcdServer) -> String {
    format!(
        "etcd://{}?timeout_ms={}",
        server.endpoint(),
        REQUEST_TIMEOUT.as_millis()
    )
}

pub async fn start() -> Arc<EtcdServer> {
    let server = tokio::task::spawn_blocking(EtcdServer::start)
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("etcd must start for these tests: {e}"));
    Arc::new(server)
}
