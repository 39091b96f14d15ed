//! One multiplexed connection to the server, opened on demand and replaced when it breaks.

use std::fmt;
use std::sync::{Arc, Mutex};

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo, SingleNodeRoutingInfo};
use redis::{
    AsyncConnectionConfig, Client, Cmd, ErrorKind, Pipeline, ProtocolVersion, RedisError,
    RedisFuture, RedisResult, Value,
};
use tokio::sync::watch;

use crate::sentinel::{NodeAddr, Resolver};

/// Opens a connection in a task of its own, so that a panic inside the client library turns
/// into an error instead of unwinding through the caller.
///
/// The one such panic known: `rediss://` in a build where rustls has no process-wide crypto
/// provider (neither its `ring` nor its `aws-lc-rs` feature is enabled by any crate in the
/// build, and the application did not install one). The client library then panics while
/// building its TLS configuration; here that becomes a configuration error.
pub(crate) async fn connect(
    client: Client,
    config: AsyncConnectionConfig,
) -> RedisResult<MultiplexedConnection> {
    ensure_crypto_provider();
    let task = tokio::spawn(async move {
        client
            .get_multiplexed_async_connection_with_config(&config)
            .await
    });
    match task.await {
        Ok(result) => result,
        Err(join) => {
            let detail = match join.try_into_panic() {
                Ok(payload) => payload
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| payload.downcast_ref::<String>().cloned())
                    .unwrap_or_default(),
                Err(join) => join.to_string(),
            };
            let detail = detail.trim().lines().next().unwrap_or_default().to_string();
            Err(RedisError::from((
                ErrorKind::InvalidClientConfig,
                "the Redis client failed while connecting (for rediss://: rustls needs a crypto \
                 provider, see docs/redis.md)",
                detail,
            )))
        }
    }
}

/// Installs rustls's `ring` provider as the process default unless the application installed one
/// (or another crate did): `rediss://` needs one, and ring is already part of the build.
fn ensure_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Err means another thread installed one first: exactly what we wanted.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// A connection to one server, or to a whole Redis Cluster (which routes each request to the
/// primary of its first key's slot, following `MOVED` and `ASK`). Both are multiplexed and cheap
/// to clone; the scripts and requests run on either unchanged.
#[derive(Clone)]
pub(crate) enum Connection {
    /// One server (`redis://`, `rediss://`, the primary behind Sentinel).
    Single(MultiplexedConnection),
    /// A Redis Cluster (`redis+cluster://`).
    Cluster(ClusterConnection),
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Connection::Single(con) => con.req_packed_command(cmd),
            Connection::Cluster(con) => con.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Connection::Single(con) => con.req_packed_commands(pipeline, offset, count),
            Connection::Cluster(con) => con.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Single(con) => con.get_db(),
            Connection::Cluster(con) => con.get_db(),
        }
    }
}

/// Where new connections go: one address, the primary that Redis Sentinel names, or a Redis
/// Cluster.
#[derive(Clone)]
pub(crate) enum Source {
    /// One address (`redis://`, `rediss://`).
    Direct(Box<Client>),
    /// Asks the sentinels, connects to the server they name, checks `ROLE` (`redis+sentinel://`).
    Sentinel {
        resolver: Arc<Resolver>,
        protocol: ProtocolVersion,
    },
    /// Reads the slot map from the seed nodes and connects to every primary
    /// (`redis+cluster://`); the client library keeps the map current.
    Cluster(Box<ClusterClient>),
}

impl Source {
    /// Opens a connection (unbounded by itself: callers bound the wait), with the primary's
    /// address for a Sentinel source.
    pub(crate) async fn open(
        &self,
        config: AsyncConnectionConfig,
    ) -> RedisResult<(Option<NodeAddr>, Connection)> {
        match self {
            Source::Direct(client) => Ok((
                None,
                Connection::Single(connect((**client).clone(), config).await?),
            )),
            Source::Sentinel { resolver, protocol } => {
                let (addr, con) = resolver.connect(*protocol, config).await?;
                Ok((Some(addr), Connection::Single(con)))
            }
            // The client was built with the request timeout for each node's connection and
            // response; the caller bounds the whole.
            Source::Cluster(client) => Ok((
                None,
                Connection::Cluster(client.get_async_connection().await?),
            )),
        }
    }

    /// The primary last confirmed through Sentinel (`None` for one address).
    pub(crate) fn primary(&self) -> Option<NodeAddr> {
        match self {
            Source::Direct(_) | Source::Cluster(_) => None,
            Source::Sentinel { resolver, .. } => resolver.primary(),
        }
    }

    /// Follows the confirmed primary (`None` for one address, which never moves).
    pub(crate) fn watch(&self) -> Option<watch::Receiver<Option<NodeAddr>>> {
        match self {
            Source::Direct(_) | Source::Cluster(_) => None,
            Source::Sentinel { resolver, .. } => Some(resolver.watch()),
        }
    }
}

/// A connection with an identity, so that a failure on it only discards *that* connection and
/// not the one another task opened meanwhile.
#[derive(Clone)]
pub(crate) struct Conn {
    pub(crate) id: u64,
    pub(crate) con: Connection,
    /// The server it reaches, for a Sentinel source.
    pub(crate) addr: Option<NodeAddr>,
}

/// The connection every request of an authority shares (Redis pipelines them).
///
/// Why not the library's `ConnectionManager`: it retries a failed reconnect several times with
/// backoff whatever the error, so a wrong password shows up as a timeout instead of
/// `Unauthorized`; it keeps a connection whose server stopped answering; and it answers the
/// first request after an outage with the stale failure. Here each request either uses the
/// current connection or opens one (one attempt, bounded by the request timeout), and a
/// connection is dropped as soon as it fails below the protocol, a request on it times out, or
/// its server answers as a replica (`READONLY`). Behind Sentinel, a new connection goes to the
/// primary the sentinels name, and one to another server than the primary last confirmed is
/// dropped before its next use.
pub(crate) struct Link {
    source: Source,
    config: AsyncConnectionConfig,
    current: Mutex<Option<Conn>>,
    /// Serialises connecting, so a crowd of requests after an outage opens one connection.
    connecting: tokio::sync::Mutex<u64>,
}

impl fmt::Debug for Link {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The client's connection info holds the password: never print it.
        f.debug_struct("Link").finish_non_exhaustive()
    }
}

impl Link {
    pub(crate) fn new(source: Source, config: AsyncConnectionConfig) -> Self {
        Link {
            source,
            config,
            current: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(0),
        }
    }

    /// The current connection, unless Sentinel has since named another primary (found by the
    /// subscription, say): then it is discarded, and the next connection goes to the new one.
    fn cached(&self) -> Option<Conn> {
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        let conn = current.clone()?;
        let primary = self.source.primary();
        if conn.addr.is_some() && primary.is_some() && conn.addr != primary {
            *current = None;
            return None;
        }
        Some(conn)
    }

    /// The current connection, or a new one. The caller bounds the wait.
    pub(crate) async fn get(&self) -> RedisResult<Conn> {
        if let Some(conn) = self.cached() {
            return Ok(conn);
        }
        let mut next_id = self.connecting.lock().await;
        if let Some(conn) = self.cached() {
            return Ok(conn);
        }
        let (addr, con) = self.source.open(self.config.clone()).await?;
        *next_id += 1;
        let conn = Conn {
            id: *next_id,
            con,
            addr,
        };
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = Some(conn.clone());
        Ok(conn)
    }

    /// Stops using connection `id` for new requests (requests already sent on it keep their
    /// place in its pipeline).
    pub(crate) fn discard(&self, id: u64) {
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        if current.as_ref().is_some_and(|c| c.id == id) {
            *current = None;
        }
    }
}

impl Connection {
    /// `SUBSCRIBE` to `channel` (RESP3: messages arrive as pushes).
    pub(crate) async fn subscribe(&mut self, channel: &str) -> RedisResult<()> {
        match self {
            Connection::Single(con) => con.subscribe(channel).await,
            Connection::Cluster(con) => con.subscribe(channel).await,
        }
    }

    /// The primaries of a cluster now (`host:port`, from the client's slot map, each asked with
    /// a `PING`); `[None]` for one server, which is its own only primary.
    pub(crate) async fn primaries(&mut self) -> RedisResult<Vec<Option<(String, u16)>>> {
        match self {
            Connection::Single(_) => Ok(vec![None]),
            Connection::Cluster(con) => {
                let routing = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
                let reply = con.route_command(redis::cmd("PING"), routing).await?;
                let Value::Map(answers) = reply else {
                    return Err(RedisError::from((
                        ErrorKind::Client,
                        "the cluster client answered a PING to every primary with no map",
                    )));
                };
                let mut primaries = Vec::with_capacity(answers.len());
                for (addr, answer) in answers {
                    if let Value::ServerError(error) = answer {
                        return Err(error.into());
                    }
                    let addr = match addr {
                        Value::BulkString(b) => String::from_utf8_lossy(&b).into_owned(),
                        Value::SimpleString(s) => s,
                        _ => continue,
                    };
                    let parsed = addr
                        .rsplit_once(':')
                        .and_then(|(host, port)| Some((host.to_string(), port.parse().ok()?)));
                    match parsed {
                        Some(node) => primaries.push(Some(node)),
                        None => {
                            return Err(RedisError::from((
                                ErrorKind::Client,
                                "the cluster client named a primary without a port",
                                addr,
                            )))
                        }
                    }
                }
                primaries.sort();
                Ok(primaries)
            }
        }
    }

    /// Sends `cmd` to `node` (a primary named by [`Connection::primaries`]), or on this one
    /// server's connection for `None`.
    pub(crate) async fn query_on<T: redis::FromRedisValue>(
        &mut self,
        node: &Option<(String, u16)>,
        cmd: Cmd,
    ) -> RedisResult<T> {
        match (self, node) {
            (Connection::Cluster(con), Some((host, port))) => {
                let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                    host: host.clone(),
                    port: *port,
                });
                let value = con.route_command(cmd, routing).await?;
                Ok(redis::from_redis_value(value)?)
            }
            (con, _) => cmd.query_async(con).await,
        }
    }

    /// Sends `pipe` to `node` as [`Connection::query_on`] sends one command (one round trip).
    pub(crate) async fn query_pipeline_on<T: redis::FromRedisValue>(
        &mut self,
        node: &Option<(String, u16)>,
        pipe: Pipeline,
    ) -> RedisResult<T> {
        match (self, node) {
            (Connection::Cluster(con), Some((host, port))) => {
                let route = SingleNodeRoutingInfo::ByAddress {
                    host: host.clone(),
                    port: *port,
                };
                let count = pipe.len();
                let values = con.route_pipeline(pipe, 0, count, route).await?;
                Ok(redis::from_redis_value(Value::Array(values))?)
            }
            (con, _) => pipe.query_async(con).await,
        }
    }
}
