//! What the ZooKeeper test binaries share: starting servers (one shared per binary for the
//! tests that do not fault it), clients, raw clients to look behind the authority, faults, and
//! polling. Each binary uses its part.

#![allow(dead_code)]

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use leasehold_conformance::kit::{self, OrFail, ServerFaults, TestResult, UrlConnector};
use leasehold_conformance::{Failure, Residue};
use leasehold_core::{Instant, LockKey};
use leasehold_servers::ZK_CONTAINER_CHECK_INTERVAL;
use leasehold_servers::{ZkEnsemble, ZkServer};
use leasehold_zookeeper::{names, ZkAuthority, ZkConfig};
use zookeeper_client::{Acls, CreateMode};

use leasehold_conformance::harness_error;

/// Requests give up after one second, so an unresponsive server is noticed within a TTL.
pub const PARAMS: &str = "timeout_ms=1000";

pub fn url(hosts: &str, chroot: &str) -> String {
    format!("zk://{hosts}{chroot}?{PARAMS}")
}

pub fn key(name: &str) -> TestResult<LockKey> {
    LockKey::new(name).or_fail(format!("key {name}"))
}

/// A standalone server of the test's own, for a test that faults it.
pub async fn standalone() -> TestResult<Arc<ZkServer>> {
    kit::start("ZooKeeper", ZkServer::start).await
}

pub async fn ensemble() -> TestResult<Arc<ZkEnsemble>> {
    kit::start("a 3-node ZooKeeper ensemble", || ZkEnsemble::start(3)).await
}

/// One server for the tests of a binary that cannot disturb each other (each uses its own
/// chroot); tests that fault a server start their own.
pub fn shared() -> TestResult<&'static ZkServer> {
    static SERVER: OnceLock<Result<ZkServer, String>> = OnceLock::new();
    SERVER
        .get_or_init(|| ZkServer::start().map_err(|e| e.to_string()))
        .as_ref()
        .map_err(|e| Failure::new(format!("ZooKeeper must start for these tests: {e}")))
}

/// The shared server's hosts, started off the runtime's workers if it is not running yet.
pub async fn shared_hosts() -> TestResult<String> {
    tokio::task::spawn_blocking(|| shared().map(|s| s.connect_string()))
        .await
        .or_fail("start the shared server")?
}

/// Clients of the authority at `url`, for the suite.
pub fn clients(url: &str) -> UrlConnector {
    UrlConnector::new(url, |url| async move { ZkAuthority::connect(&url).await })
}

/// A raw client (no chroot) for looking at and tampering with the nodes behind the authority.
pub async fn raw(hosts: &str) -> TestResult<zookeeper_client::Client> {
    zookeeper_client::Client::connector()
        .with_session_timeout(Duration::from_secs(10))
        .connect(hosts)
        .await
        .or_fail("a raw ZooKeeper client connects")
}

/// The children of `key`'s parent that queue for the lock.
pub async fn contenders(raw: &zookeeper_client::Client, parent: &str) -> TestResult<Vec<String>> {
    let children = match raw.list_children(parent).await {
        Ok(children) => children,
        Err(zookeeper_client::Error::NoNode) => Vec::new(),
        Err(e) => return Err(Failure::new(format!("list {parent}: {e}"))),
    };
    Ok(names::queue(&children))
}

pub fn ephemeral_sequential() -> zookeeper_client::CreateOptions<'static> {
    CreateMode::EphemeralSequential.with_acls(Acls::anyone_all())
}

/// Polls `probe` every 10 ms until it returns true, for at most `within`; whether it did.
pub async fn eventually(
    within: Duration,
    mut probe: impl AsyncFnMut() -> TestResult<bool>,
) -> TestResult<bool> {
    let start = Instant::now();
    loop {
        if probe().await? {
            return Ok(true);
        }
        if start.elapsed() > within {
            return Ok(false);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// How long a key must sit idle before the harness server has certainly reaped its empty
/// container parent: three of the server's container checks.
pub const IDLE_CLEANUP: Duration =
    Duration::from_millis(ZK_CONTAINER_CHECK_INTERVAL.as_millis() as u64 * 3);

/// Contender nodes of ours left under a key's parent (the parent itself may stay, or be reaped).
pub struct ZkResidue {
    /// The servers, for a raw client.
    pub hosts: String,
    /// The authority's URL, for its chroot.
    pub url: String,
}

#[async_trait]
impl Residue for ZkResidue {
    async fn leftovers(&self, key: &LockKey) -> leasehold_core::Result<Vec<String>> {
        let config = ZkConfig::from_url(&self.url)?;
        let name = names::node_name_for_key(key);
        let parent = match config.chroot() {
            "/" => format!("/{name}"),
            chroot => format!("{chroot}/{name}"),
        };
        let raw = raw(&self.hosts).await.map_err(harness_error)?;
        let left = contenders(&raw, &parent).await.map_err(harness_error)?;
        Ok(left.into_iter().map(|n| format!("{parent}/{n}")).collect())
    }
}

/// Deletes the holder's node of `key`, as an operator (or a session expiry) would.
pub async fn revoke(
    hosts: &str,
    authority: &ZkAuthority,
    key: &LockKey,
) -> leasehold_core::Result<()> {
    let raw = raw(hosts).await.map_err(harness_error)?;
    let parent = authority.lock_path(key);
    let first = contenders(&raw, &parent)
        .await
        .map_err(harness_error)?
        .into_iter()
        .next()
        .ok_or_else(|| harness_error(format!("nobody holds {key}")))?;
    raw.delete(&format!("{parent}/{first}"), None)
        .await
        .map_err(harness_error)
}

/// Crash, freeze and operator faults on a standalone server whose clients connect with `url`.
pub fn standalone_faults(server: Arc<ZkServer>, url: String) -> ServerFaults<ZkServer> {
    let hosts = server.connect_string();
    ServerFaults::new(server).with_revoke(move |key| {
        let (hosts, url) = (hosts.clone(), url.clone());
        async move {
            let admin = ZkAuthority::connect(&url).await?;
            revoke(&hosts, &admin, &key).await
        }
    })
}
