//! What the 3-member cluster's test binaries share: the cluster, URLs to all or some of its
//! members, the time a hand-over may take, harness calls off the runtime, taking a key while an
//! election answers `Unavailable`, and a member restarted until it serves again.

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{Authority, Grant, Instant, LockKey};
use leasehold_etcd::EtcdAuthority;
use leasehold_servers::etcd::ETCD_ELECTION_TIMEOUT;
use leasehold_servers::{self as servers, EtcdCluster};

use super::{Failure, OrFail, Result, REQUEST_TIMEOUT};

/// A fresh 3-member cluster; a cluster that cannot start is the test's failure.
pub async fn start_cluster() -> Result<Arc<EtcdCluster>> {
    let cluster = tokio::task::spawn_blocking(|| EtcdCluster::start(3))
        .await
        .or_fail("the harness task")?
        .or_fail("the etcd cluster must start for these tests")?;
    Ok(Arc::new(cluster))
}

/// Every member's endpoint, with the request timeout of [`REQUEST_TIMEOUT`].
pub fn url(cluster: &EtcdCluster) -> String {
    url_of(&cluster.endpoints())
}

pub fn url_of(endpoints: &[String]) -> String {
    format!(
        "etcd://{}?timeout_ms={}",
        endpoints.join(","),
        REQUEST_TIMEOUT.as_millis()
    )
}

/// How long after a holder's lease stopped being kept alive another client can be holding the
/// key, derived from the TTL and the harness's settings, not guessed: the lease lasts its `ttl`
/// at etcd (counted from its last keep-alive, or from a new leader's promotion, which extends
/// every lease by one election timeout), etcd's lessor notices within its expiry slack, an
/// election may be under way (two election timeouts), and the taker's request lands within one
/// request timeout.
pub fn handover(ttl: Duration, authority: &EtcdAuthority) -> Duration {
    ttl + authority.capabilities().expiry_slack + ETCD_ELECTION_TIMEOUT * 3 + REQUEST_TIMEOUT
}

/// Runs `f` on the cluster off the runtime (the harness blocks); its error is the failure.
pub async fn blocking<T: Send + 'static>(
    cluster: &Arc<EtcdCluster>,
    f: impl FnOnce(&EtcdCluster) -> servers::Result<T> + Send + 'static,
) -> Result<T> {
    let cluster = cluster.clone();
    tokio::task::spawn_blocking(move || f(&cluster))
        .await
        .or_fail("the harness task")?
        .map_err(|e| Failure::from(e.to_string()))
}

/// Tries `client.try_acquire` every 50 ms until it succeeds or `within` passes, tolerating the
/// `Unavailable` answers of an election. Returns the grant and when it arrived.
pub async fn take_within(
    client: &dyn Authority,
    key: &LockKey,
    ttl: Duration,
    within: Duration,
) -> Option<(Grant, Instant)> {
    let start = Instant::now();
    while start.elapsed() < within {
        match client.try_acquire(key, ttl).await {
            Ok(Some(g)) => return Some((g, Instant::now())),
            Ok(None) => {}
            Err(e) => assert!(e.is_retryable(), "not a transient error: {e:?}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

/// Restarts member `i` on its data and waits until it serves writes again: it must have
/// rejoined and learnt the leader, or a client balanced onto it hears "no leader" for longer
/// than its request timeout (seen on a loaded machine). A lease grant through that member alone
/// proves it; bounded by ten election timeouts.
pub async fn rejoin(cluster: &Arc<EtcdCluster>, i: usize) -> Result {
    blocking(cluster, move |c| c.member(i).restart())
        .await
        .or_fail(format!("restart member {i}"))?;
    let alone = url_of(&[cluster.member(i).endpoint()]);
    let give_up = tokio::time::Instant::now() + ETCD_ELECTION_TIMEOUT * 10;
    loop {
        match EtcdAuthority::connect(&alone).await {
            Ok(probe) => {
                let _ = probe.close().await;
                return Ok(());
            }
            Err(e) if tokio::time::Instant::now() >= give_up => {
                return Err(format!("the restarted member {i} did not serve: {e}").into())
            }
            Err(_) => tokio::time::sleep(ETCD_ELECTION_TIMEOUT / 5).await,
        }
    }
}
