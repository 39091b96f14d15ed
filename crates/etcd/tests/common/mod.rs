//! What the etcd test binaries share: a managed single-node server (and, in [`cluster`], a
//! 3-member cluster), a URL to it and the suite's clients of it, ways to look at the server
//! directly, and `or_fail`, the way a test says what failed. Each binary uses its part.
#![allow(dead_code)]

pub mod cluster;

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, GetOptions};
use leasehold_conformance::kit::UrlConnector;
use leasehold_core::{Instant, LockKey};
use leasehold_etcd::EtcdAuthority;
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

/// A fresh managed server; a server that cannot start is the test's failure.
pub async fn start() -> Result<Arc<EtcdServer>> {
    let server = tokio::task::spawn_blocking(EtcdServer::start)
        .await
        .or_fail("the harness task")?
        .or_fail("etcd must start for these tests")?;
    Ok(Arc::new(server))
}

/// Clients of the authority at `url`, for the suite.
pub fn clients(url: &str) -> UrlConnector {
    UrlConnector::new(url, |url| async move { EtcdAuthority::connect(&url).await })
}

/// A client of `url`.
pub async fn connect(url: &str) -> Result<EtcdAuthority> {
    EtcdAuthority::connect(url).await.or_fail(format!(
        "connect {}",
        leasehold_core::backend::redact_url(url)
    ))
}

pub fn key(name: &str) -> Result<LockKey> {
    LockKey::new(name).or_fail(format!("the key {name:?}"))
}

pub async fn raw_client(server: &EtcdServer) -> Result<Client> {
    Client::connect([server.endpoint()], None)
        .await
        .or_fail("a raw etcd client")
}

/// Every key under `prefix`, oldest first, with its lease.
pub async fn keys_under(client: &Client, prefix: &str) -> Result<Vec<(String, i64)>> {
    let options = GetOptions::new().with_prefix().with_sort(
        etcd_client::SortTarget::Create,
        etcd_client::SortOrder::Ascend,
    );
    let found = client
        .kv_client()
        .get(prefix, Some(options))
        .await
        .or_fail(format!("list the prefix {prefix}"))?;
    found
        .kvs()
        .iter()
        .map(|kv| {
            Ok((
                kv.key_str().or_fail("a key's name")?.to_string(),
                kv.lease(),
            ))
        })
        .collect()
}

/// Whether the server still has `lease` (TTL -1 means gone; 0 is a lease in its last second).
pub async fn lease_alive(client: &Client, lease: i64) -> Result<bool> {
    let ttl = client
        .lease_client()
        .time_to_live(lease, None)
        .await
        .or_fail(format!("the time to live of lease {lease:x}"))?
        .ttl();
    Ok(ttl >= 0)
}

/// Polls `probe` every 20 ms until it is true or `within` passes; returns whether it became
/// true, or the first failure of the probe itself.
pub async fn eventually<F, Fut>(within: Duration, mut probe: F) -> Result<bool>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<bool>>,
{
    let start = Instant::now();
    loop {
        if probe().await? {
            return Ok(true);
        }
        if start.elapsed() > within {
            return Ok(false);
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
pub async fn metric(server: &EtcdServer, name: &str, label: &str) -> Result<u64> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(format!("127.0.0.1:{}", server.client_port()))
        .await
        .or_fail("connect to the metrics")?;
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\n\r\n")
        .await
        .or_fail("ask for the metrics")?;
    let mut body = String::new();
    stream
        .read_to_string(&mut body)
        .await
        .or_fail("read the metrics")?;
    Ok(body
        .lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(['{', ' ']) && rest.contains(label))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64)
}

/// What a test fails with, and `.or_fail("what was being done")?` instead of `unwrap()`: the
/// conformance kit's, shared by every backend's tests.
pub use leasehold_conformance::kit::OrFail;
pub use leasehold_conformance::Failure;

/// A test's outcome, and what its helpers return: the value, or the [`Failure`] that ends it.
pub type Result<T = (), E = Failure> = std::result::Result<T, E>;
