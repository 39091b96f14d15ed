//! Redis Cluster: the `redis+cluster://` URL, the cluster client, and the shard channel each
//! lock's announcements go to.
//!
//! Every key of one lock shares a hash tag (`{<prefix><key>}`, see [`crate::KeyLayout`]), so
//! each script touches one slot, and the cluster client sends it to the primary that serves
//! that slot (following `MOVED` and `ASK`). Announcements use sharded pub/sub (`SPUBLISH` in the
//! scripts, `SSUBSCRIBE` by waiters, Redis 7): the channel of a lock is its lock key followed by
//! `:` and the configured channel name, so it hashes to the lock's own slot, and a release is
//! delivered by the shard that owns the key to the clients subscribed there, not broadcast over
//! the whole cluster bus as `PUBLISH` would be.

use std::fmt;
use std::time::Duration;

use leasehold_core::backend::ConnectionUrl;
use leasehold_core::Result;
use redis::aio::AsyncPushSender;
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::{
    ConnectionAddr, IntoConnectionInfo, ProtocolVersion, RedisConnectionInfo, RedisResult,
};

use crate::sentinel::{node_addrs, node_settings, NodeAddr};

/// The port of a Redis server (a cluster node, or the server of a `redis://` URL) when the URL
/// names none.
pub(crate) const DEFAULT_PORT: u16 = 6379;

/// How many times the cluster client retries a request itself (after `MOVED`, `ASK`,
/// `TRYAGAIN`, `CLUSTERDOWN`, or a connection it had to repair). Each retry waits 10 ms doubling
/// to a quarter of the request timeout; the request timeout bounds the whole request anyway.
const RETRIES: u32 = 6;

/// What a `redis+cluster://` URL names: seed nodes (any nodes of the cluster: the client reads
/// the slot map from them) and the credentials, which every node shares.
#[derive(Clone)]
pub(crate) struct ClusterTarget {
    pub(crate) seeds: Vec<NodeAddr>,
    /// User and password (kept only in the client library's settings, never printed).
    pub(crate) node: RedisConnectionInfo,
}

impl fmt::Debug for ClusterTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let seeds: Vec<String> = self.seeds.iter().map(|s| s.to_string()).collect();
        f.debug_struct("ClusterTarget")
            .field("seeds", &seeds)
            .finish_non_exhaustive()
    }
}

/// What a `redis+cluster://` URL names: `[user][:password@]host[:port][,host[:port]...][/0]`.
pub(crate) fn parse_target(url: &ConnectionUrl) -> Result<ClusterTarget> {
    let node = node_settings(url);
    let seeds = node_addrs(url, DEFAULT_PORT, "cluster node")?;
    if seeds.is_empty() {
        return Err(url.invalid("no node: expected redis+cluster://host:port[,host:port...]"));
    }
    match url.path().strip_prefix('/').unwrap_or("") {
        "" | "0" => {}
        other => {
            return Err(url.invalid(format!(
                "Redis Cluster serves database 0 only; the path must be empty or /0, not `/{other}`"
            )))
        }
    }
    Ok(ClusterTarget { seeds, node })
}

impl ClusterTarget {
    /// A cluster client speaking `protocol`, whose node connections and responses are bounded by
    /// `timeout`, with `push` receiving a RESP3 connection's pushes (pub/sub messages).
    pub(crate) fn client(
        &self,
        protocol: ProtocolVersion,
        timeout: Duration,
        push: Option<impl AsyncPushSender>,
    ) -> RedisResult<ClusterClient> {
        let mut seeds = Vec::with_capacity(self.seeds.len());
        for seed in &self.seeds {
            let info = ConnectionAddr::Tcp(seed.host.clone(), seed.port)
                .into_connection_info()?
                .set_redis_settings(self.node.clone().set_protocol(protocol));
            seeds.push(info);
        }
        let longest_retry_wait = u64::try_from((timeout / 4).as_millis())
            .unwrap_or(u64::MAX)
            .max(20);
        let mut builder = ClusterClientBuilder::new(seeds)
            .use_protocol(protocol)
            .connection_timeout(timeout)
            .response_timeout(timeout)
            .retries(RETRIES)
            .min_retry_wait(10)
            .max_retry_wait(longest_retry_wait)
            .retry_wait_formula(10, 2);
        if let Some(push) = push {
            builder = builder.push_sender(push);
        }
        builder.build()
    }
}

/// The shard channel announcements of `lock_key` go to: `<lock key>:<channel>`. It starts with
/// the lock key's hash tag, so it lives in the lock's slot (which `SPUBLISH` inside the lock's
/// scripts requires), and the configured channel name keeps deployments that share keys apart.
pub(crate) fn shard_channel(lock_key: &str, channel: &str) -> String {
    let mut name = String::with_capacity(lock_key.len() + 1 + channel.len());
    name.push_str(lock_key);
    name.push(':');
    name.push_str(channel);
    name
}

/// The lock key a shard channel made by [`shard_channel`] belongs to.
pub(crate) fn lock_key_of<'a>(shard_channel: &'a str, channel: &str) -> Option<&'a str> {
    shard_channel
        .strip_suffix(channel)?
        .strip_suffix(':')
        .filter(|k| k.starts_with('{') && k.ends_with('}'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold_conformance::kit::{OrFail, TestResult};

    /// The target of `redis+cluster://<rest>`.
    fn target(rest: &str) -> Result<ClusterTarget> {
        parse_target(&ConnectionUrl::parse(&format!("redis+cluster://{rest}"))?)
    }

    #[test]
    fn parses_seeds_and_credentials() -> TestResult {
        let t = target("app:hunter2@10.0.0.1:7000,10.0.0.2,[::1]:7002")
            .or_fail("the cluster target")?;
        let seeds: Vec<String> = t.seeds.iter().map(|s| s.to_string()).collect();
        assert_eq!(seeds, ["10.0.0.1:7000", "10.0.0.2:6379", "[::1]:7002"]);
        assert_eq!(t.node.username(), Some("app"));
        assert_eq!(t.node.password(), Some("hunter2"));
        assert!(!format!("{t:?}").contains("hunter2"));
        assert!(target("h:7000/0").is_ok());
        for bad in ["", "h:7000/1", "h:0", "h:7000,", "h:x", "h/0/1"] {
            assert!(target(bad).is_err(), "{bad}");
        }
        Ok(())
    }

    #[test]
    fn a_shard_channel_maps_back_to_its_lock_key() {
        let ch = shard_channel("{leasehold:invoice:72}", "leasehold:released");
        assert_eq!(ch, "{leasehold:invoice:72}:leasehold:released");
        assert_eq!(
            lock_key_of(&ch, "leasehold:released"),
            Some("{leasehold:invoice:72}")
        );
        assert_eq!(lock_key_of(&ch, "other"), None);
        assert_eq!(
            lock_key_of("x:leasehold:released", "leasehold:released"),
            None
        );
    }
}
