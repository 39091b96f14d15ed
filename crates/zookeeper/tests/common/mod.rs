//! What the ZooKeeper test binaries share: starting servers, clients, faults.

#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use leasehold_conformance::{Connector, Faults, Residue};
use leasehold_core::{Authority, LockKey};
use leasehold_servers::ZK_CONTAINER_CHECK_INTERVAL;
use leasehold_servers::{ZkEnsemble, ZkServer};
use leasehold_zookeeper::{names, ZkAuthority, ZkConfig};

/// Requests give up after one second, so an unresponsive server is noticed within a TTL.
pub const PARAMS: &str = "timeout_ms=1000";

pub fn url(hosts: &str, chroot: &str) -> String {
    format!("zk://{hosts}{chroot}?{PARAMS}")
}

pub async fn standalone() -> Arc<ZkServer> {
    let server = tokio::task::spawn_blocking(ZkServer::start)
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("ZooKeeper must start for these tests: {e}"));
    Arc::new(server)
}

pub async fn ensemble() -> Arc<ZkEnsemble> {
    let ensemble = tokio::task::spawn_blocking(|| ZkEnsemble::start(3))
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("a 3-node ZooKeeper ensemble must start for these tests: {e}"));
    Arc::new(ensemble)
}

/// A raw client (no chroot) for looking at and tampering with the nodes behind the authority.
pub async fn raw(hosts: &str) -> zookeeper_client::Client {
    zookeeper_client::Client::connector()
        .with_session_timeout(Duration::from_secs(10))
        .connect(hosts)
        .await
        .expect("a raw ZooKeeper client connects")
}

/// The children of `key`'s parent that queue for the lock.
pub async fn contenders(raw: &zookeeper_client::Client, parent: &str) -> Vec<String> {
    let children = match raw.list_children(parent).await {
        Ok(children) => children,
        Err(zookeeper_client::Error::NoNode) => Vec::new(),
        Err(e) => panic!("list {parent}: {e}"),
    };
    names::queue(&children)
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
        let raw = raw(&self.hosts).await;
        let left = contenders(&raw, &parent).await;
        Ok(left.into_iter().map(|n| format!("{parent}/{n}")).collect())
    }
}

pub struct Clients(pub String);

#[async_trait]
impl Connector for Clients {
    async fn connect(&self) -> leasehold_core::Result<Arc<dyn Authority>> {
        Ok(Arc::new(ZkAuthority::connect(&self.0).await?))
    }
}

pub use leasehold_conformance::harness_call as blocking;
pub use leasehold_conformance::harness_error;

/// Deletes the holder's node of `key`, as an operator (or a session expiry) would.
pub async fn revoke(
    hosts: &str,
    authority: &ZkAuthority,
    key: &LockKey,
) -> leasehold_core::Result<()> {
    let raw = raw(hosts).await;
    let parent = authority.lock_path(key);
    let first = contenders(&raw, &parent)
        .await
        .into_iter()
        .next()
        .ok_or_else(|| harness_error(format!("nobody holds {key}")))?;
    raw.delete(&format!("{parent}/{first}"), None)
        .await
        .map_err(harness_error)
}

/// Crash, freeze and operator faults on a standalone server.
pub struct StandaloneFaults {
    pub server: Arc<ZkServer>,
    pub url: String,
}

#[async_trait]
impl Faults for StandaloneFaults {
    async fn restart(&self) -> leasehold_core::Result<()> {
        let s = self.server.clone();
        blocking(move || s.restart()).await
    }

    async fn pause(&self) -> leasehold_core::Result<()> {
        let s = self.server.clone();
        blocking(move || s.pause()).await
    }

    async fn resume(&self) -> leasehold_core::Result<()> {
        let s = self.server.clone();
        blocking(move || s.resume()).await
    }

    async fn revoke(&self, key: &LockKey) -> leasehold_core::Result<()> {
        let admin = ZkAuthority::connect(&self.url).await?;
        revoke(&self.server.connect_string(), &admin, key).await
    }
}
