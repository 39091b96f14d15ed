//! Redis as the protected resource: a gate that writes fields of a hash only under a fence that
//! is not older than the newest one the hash has seen.
//!
//! The fence lives in the hash itself, in one field ([`FENCE_FIELD`] unless told otherwise),
//! so the compare and the write are one script on one key: atomic on a single server, and on a
//! Redis Cluster too (one key is one slot; no hash tags needed). The script compares fences as
//! decimal strings, never as Lua numbers, which are doubles and would round fences above 2^53.
//!
//! * [`RedisGate::claim`] raises the hash's fence without writing: a new holder's first call,
//!   which from then on refuses every older holder's late write.
//! * [`RedisGate::hset`] writes fields under a fence.
//!
//! ```no_run
//! # async fn demo(fence: leasehold_core::Fence) -> leasehold_core::Result<()> {
//! use leasehold_core::Guarded;
//! use leasehold_redis::gate::RedisGate;
//!
//! let gate = RedisGate::connect("redis://127.0.0.1:6379").await?;
//! match gate.hset("account:42", fence, &[("balance", "120")]).await? {
//!     Guarded::Accepted => { /* written, with the fence */ }
//!     Guarded::Stale { newest } => { /* a newer holder (fence {newest}) wrote: abandon */ }
//!     _ => {}
//! }
//! # Ok(()) }
//! ```
//!
//! A gate's durability is the server's: without persistence (`appendonly`), a restarted Redis
//! has forgotten every fence and accepts any again. Its consistency is the server's too: a
//! failover to a replica that missed the last writes (asynchronous replication) loses the
//! fences with them. Put the gate where the data is, so they are lost together.
//!
//! The stored fence must be written only through the gate: the script compares canonical
//! decimal strings, and a hand-written `0005` would compare wrongly.

use async_trait::async_trait;
use leasehold_core::{telemetry, Error, Fence, FencedResource, Guarded, Result};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::Value;

use crate::errors;
use crate::scripts::LuaScript;

/// The hash field that keeps the newest fence, unless [`RedisGate::with_fence_field`] names
/// another.
pub const FENCE_FIELD: &str = "leasehold_fence";

/// How long a connection or a request may take.
const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// The `resource` label of the fence rejections a gate counts.
const REJECTED_BY: &str = "redis_hash";

/// KEYS[1]: the hash. ARGV[1]: the fence (decimal), ARGV[2]: the fence field, ARGV[3..]: field
/// and value pairs to write (none for a claim). Answers `{1}` when accepted, `{0, newest}` when
/// the hash has seen a greater fence.
const GUARDED_HSET: &str = r"
local newest = redis.call('HGET', KEYS[1], ARGV[2])
local fence = ARGV[1]
if newest and (#newest > #fence or (#newest == #fence and newest > fence)) then
  return {0, newest}
end
redis.call('HSET', KEYS[1], ARGV[2], fence, unpack(ARGV, 3))
return {1}
";

#[derive(Clone)]
enum Connection {
    Server(ConnectionManager),
    Cluster(ClusterConnection),
}

/// A fencing gate on Redis hashes (one server, or a Redis Cluster). Cloning it shares the
/// connection.
#[derive(Clone)]
pub struct RedisGate {
    connection: Connection,
    /// Errors are read as a cluster's (`MOVED`, `CLUSTERDOWN` are passing trouble there).
    cluster: bool,
    fence_field: String,
    script: LuaScript,
}

impl std::fmt::Debug for RedisGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisGate")
            .field("fence_field", &self.fence_field)
            .finish_non_exhaustive()
    }
}

impl RedisGate {
    /// Connects to one Redis server (`redis://[user:password@]host:port[/db]`, `rediss://`).
    /// The connection reconnects by itself after it breaks.
    pub async fn connect(url: &str) -> Result<RedisGate> {
        let client = redis::Client::open(url).map_err(|e| errors::map(e, "the gate's URL"))?;
        let config = ConnectionManagerConfig::new()
            .set_number_of_retries(1)
            .set_connection_timeout(Some(REQUEST_TIMEOUT))
            .set_response_timeout(Some(REQUEST_TIMEOUT));
        let manager = ConnectionManager::new_with_config(client, config)
            .await
            .map_err(|e| errors::map(e, "connect the gate"))?;
        Ok(RedisGate::over(Connection::Server(manager)))
    }

    /// Connects to a Redis Cluster through any of its nodes (`redis://host:port` each).
    ///
    /// Requests are bounded by a timeout and never sent twice: a reply lost with its
    /// connection, or a slot moved meanwhile (`MOVED`, `ASK`), is `Unavailable` (the outcome
    /// unknown); the caller claims or writes again, which a fence makes safe to repeat.
    pub async fn connect_cluster(nodes: &[&str]) -> Result<RedisGate> {
        let client = ClusterClientBuilder::new(nodes.to_vec())
            .connection_timeout(REQUEST_TIMEOUT)
            .response_timeout(REQUEST_TIMEOUT)
            .retries(0)
            .build()
            .map_err(|e| errors::map(e, "the gate's nodes"))?;
        let connection = client
            .get_async_connection()
            .await
            .map_err(|e| errors::map(e, "connect the gate to the cluster"))?;
        let mut gate = RedisGate::over(Connection::Cluster(connection));
        gate.cluster = true;
        Ok(gate)
    }

    fn over(connection: Connection) -> RedisGate {
        RedisGate {
            connection,
            cluster: false,
            fence_field: FENCE_FIELD.to_string(),
            script: LuaScript::new(GUARDED_HSET),
        }
    }

    /// Keeps the fence in hash field `field` instead of [`FENCE_FIELD`].
    pub fn with_fence_field(mut self, field: &str) -> RedisGate {
        self.fence_field = field.to_string();
        self
    }

    /// Raises the fence of hash `key` to `fence` unless the hash has seen a greater one; writes
    /// nothing else.
    pub async fn claim(&self, key: &str, fence: Fence) -> Result<Guarded> {
        self.guarded(key, fence, &[]).await
    }

    /// Writes `fields` into hash `key`, and the fence beside them, unless the hash has seen a
    /// greater fence. A field named like the fence field is refused.
    pub async fn hset(&self, key: &str, fence: Fence, fields: &[(&str, &str)]) -> Result<Guarded> {
        if fields.iter().any(|(name, _)| *name == self.fence_field) {
            return Err(Error::InvalidConfig {
                reason: format!(
                    "field {:?} keeps the gate's fence; write it only through the gate",
                    self.fence_field
                ),
            });
        }
        self.guarded(key, fence, fields).await
    }

    async fn guarded(&self, key: &str, fence: Fence, fields: &[(&str, &str)]) -> Result<Guarded> {
        let mut args = vec![fence.value().to_string(), self.fence_field.clone()];
        for (name, value) in fields {
            args.push((*name).to_string());
            args.push((*value).to_string());
        }
        let reply: Value = match &self.connection {
            Connection::Server(manager) => {
                let mut con = manager.clone();
                self.script.run(&mut con, &[key], &args).await
            }
            Connection::Cluster(cluster) => {
                let mut con = cluster.clone();
                self.script.run(&mut con, &[key], &args).await
            }
        }
        .map_err(|e| errors::map_on(e, "the guarded write", self.cluster))?;
        let outcome = outcome(&reply)?;
        if let Guarded::Stale { newest } = outcome {
            telemetry::fence_rejected(REJECTED_BY, fence.value(), newest);
        }
        Ok(outcome)
    }

    /// Field `field` of hash `key`, as the store holds it now.
    pub async fn hget(&self, key: &str, field: &str) -> Result<Option<String>> {
        let mut cmd = redis::cmd("HGET");
        cmd.arg(key).arg(field);
        let value: Option<String> = match &self.connection {
            Connection::Server(manager) => cmd.query_async(&mut manager.clone()).await,
            Connection::Cluster(cluster) => cmd.query_async(&mut cluster.clone()).await,
        }
        .map_err(|e| errors::map_on(e, "read a field", self.cluster))?;
        Ok(value)
    }

    /// The gate on one hash, as a [`FencedResource`] whose writes set one field.
    pub fn hash(&self, key: &str, field: &str) -> RedisFencedHash {
        RedisFencedHash {
            gate: self.clone(),
            key: key.to_string(),
            field: field.to_string(),
        }
    }
}

fn outcome(reply: &Value) -> Result<Guarded> {
    let unexpected = || Error::Backend {
        backend: errors::BACKEND,
        message: format!("the guarded write answered {reply:?}"),
        retryable: false,
        source: None,
    };
    let Value::Array(items) = reply else {
        return Err(unexpected());
    };
    match items.as_slice() {
        [Value::Int(1)] => Ok(Guarded::Accepted),
        [Value::Int(0), Value::BulkString(newest)] => std::str::from_utf8(newest)
            .ok()
            .and_then(|n| n.parse().ok())
            .map(|newest| Guarded::Stale { newest })
            .ok_or_else(unexpected),
        _ => Err(unexpected()),
    }
}

/// One hash behind a [`RedisGate`]: claims raise its fence, writes set one field.
#[derive(Debug, Clone)]
pub struct RedisFencedHash {
    gate: RedisGate,
    key: String,
    field: String,
}

impl RedisFencedHash {
    /// The value its field holds now (`None` before any write).
    pub async fn value(&self) -> Result<Option<String>> {
        self.gate.hget(&self.key, &self.field).await
    }
}

#[async_trait]
impl FencedResource for RedisFencedHash {
    async fn claim(&self, fence: Fence) -> Result<Guarded> {
        self.gate.claim(&self.key, fence).await
    }

    async fn write(&self, fence: Fence, value: &str) -> Result<Guarded> {
        self.gate
            .hset(&self.key, fence, &[(&self.field, value)])
            .await
    }
}
