//! What the etcd test binaries share: a managed single-node server, a URL to it, and ways to
//! look at the server directly. Each binary uses its part.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, GetOptions};
use leasehold_core::Instant;
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

pub async fn raw_client(server: &EtcdServer) -> Client {
    Client::connect([server.endpoint()], None)
        .await
        .expect("a raw etcd client")
}

/// Every key under `prefix`, oldest first, with its lease.
pub async fn keys_under(client: &Client, prefix: &str) -> Vec<(String, i64)> {
    let options = GetOptions::new().with_prefix().with_sort(
        etcd_client::SortTarget::Create,
        etcd_client::SortOrder::Ascend,
    );
    let found = client
        .kv_client()
        .get(prefix, Some(options))
        .await
        .expect("list the prefix");
    found
        .kvs()
        .iter()
        .map(|kv| (kv.key_str().unwrap().to_string(), kv.lease()))
        .collect()
}

/// Whether the server still has `lease` (TTL -1 means gone; 0 is a lease in its last second).
pub async fn lease_alive(client: &Client, lease: i64) -> bool {
    client
        .lease_client()
        .time_to_live(lease, None)
        .await
        .expect("lease time to live")
        .ttl()
        >= 0
}

/// Polls `probe` every 20 ms until it is true or `within` passes; returns whether it became true.
pub async fn eventually<F, Fut>(within: Duration, mut probe: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if probe().await {
            return true;
        }
        if start.elapsed() > within {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Cancellation points spread over 0 to 2 round trips, deterministic but irregular.
pub fn cuts(round_trip: Duration, n: u32) -> impl Iterator<Item = Duration> {
    let mut x: u32 = 0x9e37_79b9;
    (0..n).map(move |_| {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        round_trip * 2 * (x % 1000) / 1000
    })
}

/// The sum of the server's Prometheus counter or gauge `name` over the series whose labels
/// contain `label` (an empty `label` matches every series).
pub async fn metric(server: &EtcdServer, name: &str, label: &str) -> u64 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(format!("127.0.0.1:{}", server.client_port()))
        .await
        .unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\n\r\n")
        .await
        .unwrap();
    let mut body = String::new();
    stream.read_to_string(&mut body).await.unwrap();
    body.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(['{', ' ']) && rest.contains(label))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}
