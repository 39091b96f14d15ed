//! Redis Sentinel: the `redis+sentinel://` URL, and finding the primary through the sentinels.
//!
//! The resolver follows the Sentinel client guidelines: ask the sentinels one after another
//! (`SENTINEL MASTER`, for the address and its configuration epoch, or `SENTINEL
//! get-master-addr-by-name` where an ACL allows only that), each within its share of the request
//! timeout; connect to the address the first one names; keep the connection only if `ROLE` on it
//! says `master` (a sentinel's view lags a failover); pass over answers older than the newest
//! configuration seen; and ask the one that answered first next time. Every
//! new connection, of requests and of the subscription alike, is found this way, so a
//! connection that broke, timed out, or reached a server that is now a replica (`READONLY`) is
//! replaced by one to the primary the sentinels name now. An authority also asks the sentinels
//! once a second whether the primary moved ([`Resolver::watch_sentinels`]), since an old
//! primary can keep answering for seconds after the sentinels switched.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_core::backend::{ConnectionUrl, Secret};
use leasehold_core::Result;
use redis::aio::MultiplexedConnection;
use redis::{
    AsyncConnectionConfig, Client, ConnectionAddr, ErrorKind, IntoConnectionInfo, ProtocolVersion,
    RedisConnectionInfo, RedisError, RedisResult, Value,
};
use tokio::sync::watch;

/// How often an authority asks the sentinels whether the primary moved (see
/// [`Resolver::watch_sentinels`]).
pub(crate) const CHECK_EVERY: Duration = Duration::from_secs(1);

/// The port a sentinel listens on when the URL names none.
pub(crate) const DEFAULT_SENTINEL_PORT: u16 = 26379;

/// A server address, `host:port`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct NodeAddr {
    pub(crate) host: String,
    pub(crate) port: u16,
}

impl fmt::Display for NodeAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// What a `redis+sentinel://` URL names: the sentinels, the primary's name, and the credentials
/// for each (kept only in the client library's settings, which never print them).
#[derive(Clone)]
pub(crate) struct SentinelTarget {
    pub(crate) sentinels: Vec<NodeAddr>,
    pub(crate) master_name: String,
    /// User and password for the sentinels (`sentinel_user`, `sentinel_password`).
    pub(crate) sentinel_auth: RedisConnectionInfo,
    /// Database, user and password for the primary (the URL's user info and `/db`).
    pub(crate) node: RedisConnectionInfo,
}

impl fmt::Debug for SentinelTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sentinels: Vec<String> = self.sentinels.iter().map(|s| s.to_string()).collect();
        f.debug_struct("SentinelTarget")
            .field("sentinels", &sentinels)
            .field("master_name", &self.master_name)
            .field("db", &self.node.db())
            .finish_non_exhaustive()
    }
}

/// What a `redis+sentinel://` URL names: `[user][:password@]host[:port][,host[:port]...]/<master
/// name>[/db]`, with the sentinels' own user and password from `sentinel_user` and
/// `sentinel_password` (already percent-decoded).
pub(crate) fn parse_target(
    url: &ConnectionUrl,
    sentinel_user: Option<String>,
    sentinel_password: Option<Secret>,
) -> Result<SentinelTarget> {
    let mut node = node_settings(url);
    let sentinels = node_addrs(url, DEFAULT_SENTINEL_PORT, "sentinel")?;
    if sentinels.is_empty() {
        return Err(url.invalid(
            "no sentinel: expected redis+sentinel://host:port[,host:port...]/<master name>",
        ));
    }
    let path = url.path().strip_prefix('/').unwrap_or("");
    let mut segments = path.split('/');
    // Decoded on its own, so a master name may hold an encoded `/`.
    let master_name = url.decode("master name", segments.next().unwrap_or(""))?;
    if master_name.is_empty() {
        return Err(url.invalid(
            "no master name: expected redis+sentinel://host:port[,host:port...]/<master name>[/db]",
        ));
    }
    if !master_name.chars().all(|c| c.is_ascii_graphic()) {
        return Err(url.invalid("the master name must be printable ASCII without spaces"));
    }
    match (segments.next(), segments.next()) {
        (None, _) => {}
        (Some(db), None) => {
            let db: i64 = match db.parse::<u32>() {
                Ok(db) => i64::from(db),
                Err(_) => {
                    return Err(url.invalid(format!(
                        "the database must be a number (redis+sentinel://.../<master name>/<db>), \
                         not `{db}`"
                    )))
                }
            };
            node = node.set_db(db);
        }
        (Some(_), Some(_)) => {
            return Err(url.invalid("the path is /<master name> or /<master name>/<db>"))
        }
    }
    let mut sentinel_auth = RedisConnectionInfo::default();
    if let Some(user) = sentinel_user.filter(|u| !u.is_empty()) {
        sentinel_auth = sentinel_auth.set_username(user);
    }
    if let Some(password) = sentinel_password {
        if password.expose().is_empty() {
            return Err(url.invalid("sentinel_password is empty"));
        }
        sentinel_auth = sentinel_auth.set_password(password.expose());
    } else if sentinel_auth.username().is_some() {
        return Err(url.invalid("sentinel_user needs sentinel_password"));
    }
    Ok(SentinelTarget {
        sentinels,
        master_name,
        sentinel_auth,
        node,
    })
}

/// The URL's user and password for the servers (an empty one is none), kept only in the client
/// library's settings (which never print them).
pub(crate) fn node_settings(url: &ConnectionUrl) -> RedisConnectionInfo {
    let mut node = RedisConnectionInfo::default();
    if let Some(user) = url.user().filter(|u| !u.is_empty()) {
        node = node.set_username(user);
    }
    if let Some(password) = url.password().filter(|p| !p.expose().is_empty()) {
        node = node.set_password(password.expose());
    }
    node
}

/// The URL's hosts as server addresses, `default_port` where none is given, each once, in
/// the URL's order; `what` names the kind of server in messages. A host must be a name Redis
/// reports back in its replies: letters, digits, `.`, `-`, `_`, or an IPv6 address.
pub(crate) fn node_addrs(
    url: &ConnectionUrl,
    default_port: u16,
    what: &str,
) -> Result<Vec<NodeAddr>> {
    let mut addrs = Vec::with_capacity(url.hosts().len());
    for host in url.hosts() {
        let plain = host
            .name()
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'));
        if !plain && !host.is_ipv6() {
            return Err(url.invalid(format!("`{host}` is not a valid {what} host")));
        }
        let addr = NodeAddr {
            host: host.name().to_string(),
            port: host.port().unwrap_or(default_port),
        };
        if !addrs.contains(&addr) {
            addrs.push(addr);
        }
    }
    Ok(addrs)
}

/// What a sentinel says about the primary: its address, and the configuration epoch of that
/// answer (`None` when the sentinel only allowed `get-master-addr-by-name`).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Named {
    addr: NodeAddr,
    epoch: Option<u64>,
}

/// The primary in use, and the newest configuration epoch any sentinel reported for it.
#[derive(Clone, Debug, Default)]
struct Confirmed {
    addr: Option<NodeAddr>,
    epoch: Option<u64>,
}

/// Finds the primary through the sentinels, and remembers the last one confirmed.
///
/// Sentinel numbers its configurations: every failover takes a new, greater configuration
/// epoch (`config-epoch` in `SENTINEL MASTER`). A sentinel that has not heard of the last
/// failover yet names the previous primary with an older epoch, and that primary may still be
/// up and still say it is the master (a forced failover, a partition). So an answer older than
/// the newest one seen is never followed: the authority does not go back to a primary that the
/// sentinels already replaced. Sentinels that were re-provisioned number from 0 again; a
/// majority of them agreeing on one primary, with none naming the newest configuration, is
/// followed and restarts the count ([`Resolver::renumbered`]).
pub(crate) struct Resolver {
    target: SentinelTarget,
    /// The request timeout: one whole round over the sentinels fits in it.
    timeout: Duration,
    /// Indexes into `target.sentinels`, the one that answered last first.
    order: Mutex<Vec<usize>>,
    /// The newest configuration epoch seen, with the primary it named when it was confirmed.
    confirmed: Mutex<Confirmed>,
    /// The primary last confirmed (by `ROLE`), so that connections to another server are
    /// replaced and the subscription moves with the requests.
    primary: watch::Sender<Option<NodeAddr>>,
}

impl fmt::Debug for Resolver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Resolver")
            .field("target", &self.target)
            .field("primary", &*self.primary.borrow())
            .finish_non_exhaustive()
    }
}

impl Resolver {
    pub(crate) fn new(target: SentinelTarget, timeout: Duration) -> Self {
        let order = (0..target.sentinels.len()).collect();
        Resolver {
            target,
            timeout,
            order: Mutex::new(order),
            confirmed: Mutex::default(),
            primary: watch::channel(None).0,
        }
    }

    /// The primary last confirmed, if any.
    pub(crate) fn primary(&self) -> Option<NodeAddr> {
        self.primary.borrow().clone()
    }

    /// Follows changes of the confirmed primary.
    pub(crate) fn watch(&self) -> watch::Receiver<Option<NodeAddr>> {
        self.primary.subscribe()
    }

    /// How long one sentinel may take to answer: a share of the request timeout, so that an
    /// unresponsive sentinel leaves time to ask the others.
    fn per_sentinel(&self) -> Duration {
        let n = u32::try_from(self.target.sentinels.len())
            .unwrap_or(u32::MAX)
            .max(1);
        (self.timeout / n).max(Duration::from_millis(1))
    }

    /// A connection to one sentinel.
    async fn sentinel_connection(&self, sentinel: &NodeAddr) -> RedisResult<MultiplexedConnection> {
        let info = ConnectionAddr::Tcp(sentinel.host.clone(), sentinel.port)
            .into_connection_info()?
            .set_redis_settings(
                self.target
                    .sentinel_auth
                    .clone()
                    .set_protocol(ProtocolVersion::RESP2),
            );
        let client = Client::open(info)?;
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.per_sentinel()))
            .set_response_timeout(None);
        crate::link::connect(client, config).await
    }

    /// Asks one sentinel for the primary, on a new connection.
    async fn ask(&self, sentinel: &NodeAddr) -> RedisResult<Option<Named>> {
        let mut con = self.sentinel_connection(sentinel).await?;
        self.ask_on(&mut con).await
    }

    /// The primary a sentinel names: `SENTINEL MASTER <name>` for the address and the
    /// configuration epoch; where that is not allowed (an ACL user limited to the client
    /// commands), `SENTINEL get-master-addr-by-name`, without an epoch.
    async fn ask_on(&self, con: &mut MultiplexedConnection) -> RedisResult<Option<Named>> {
        let name = &self.target.master_name;
        let master: RedisResult<Vec<String>> = redis::cmd("SENTINEL")
            .arg("MASTER")
            .arg(name)
            .query_async(con)
            .await;
        let fields = match master {
            Ok(fields) => fields,
            Err(e) if e.to_string().contains("No such master") => return Ok(None),
            Err(e) if crate::errors::breaks_connection(&e) => return Err(e),
            Err(_) => return self.ask_address_on(con).await,
        };
        let field = |key: &str| {
            fields
                .chunks(2)
                .find(|pair| pair.first().map(String::as_str) == Some(key))
                .and_then(|pair| pair.get(1))
        };
        let (Some(host), Some(port)) = (field("ip"), field("port")) else {
            return Err(unexpected("SENTINEL MASTER without ip and port".into()));
        };
        let port = port
            .parse::<u16>()
            .map_err(|_| unexpected(format!("a port `{port}`")))?;
        let epoch = field("config-epoch").and_then(|e| e.parse::<u64>().ok());
        Ok(Some(Named {
            addr: NodeAddr {
                host: host.clone(),
                port,
            },
            epoch,
        }))
    }

    /// `SENTINEL get-master-addr-by-name` on a sentinel connection.
    async fn ask_address_on(&self, con: &mut MultiplexedConnection) -> RedisResult<Option<Named>> {
        let reply: Option<Vec<String>> = redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(&self.target.master_name)
            .query_async(con)
            .await?;
        let Some(reply) = reply else {
            return Ok(None);
        };
        match reply.as_slice() {
            [host, port] => match port.parse::<u16>() {
                Ok(port) => Ok(Some(Named {
                    addr: NodeAddr {
                        host: host.clone(),
                        port,
                    },
                    epoch: None,
                })),
                Err(_) => Err(unexpected(format!("a port `{port}`"))),
            },
            other => Err(unexpected(format!("{} fields", other.len()))),
        }
    }

    /// The newest configuration epoch seen, if `named` is older than it: a sentinel that has
    /// not heard of the last failover.
    fn outdated(&self, named: &Named) -> Option<u64> {
        let confirmed = self.confirmed.lock().unwrap_or_else(|e| e.into_inner());
        match (named.epoch, confirmed.epoch) {
            (Some(epoch), Some(newest)) if epoch < newest => Some(newest),
            _ => None,
        }
    }

    /// Asks the sentinels, every [`CHECK_EVERY`], which server is the primary, one sentinel a
    /// tick in turn (a sentinel cut off with an old primary cannot hide a failover from us), on
    /// connections kept for it. When one names a newer configuration than the primary in use,
    /// and `ROLE` confirms it, the authority moves: the requests' and the subscription's
    /// connections to the old primary are replaced at their next use. Without this, a
    /// connection to an old primary that is still up (a forced failover, or a partition that
    /// hides it from the sentinels but not from us) would keep working until Sentinel demotes
    /// it, seconds later, and what it granted meanwhile would be thrown away. Runs until
    /// aborted (the authority is dropped).
    pub(crate) async fn watch_sentinels(self: Arc<Self>) {
        let mut kept: Vec<Option<MultiplexedConnection>> = vec![None; self.target.sentinels.len()];
        let mut next = 0;
        loop {
            tokio::time::sleep(CHECK_EVERY).await;
            let Some(current) = self.primary() else {
                continue;
            };
            let index = next % self.target.sentinels.len().max(1);
            next = index + 1;
            let Some(named) = self.ask_kept(index, &mut kept).await else {
                continue;
            };
            if named.addr == current {
                self.learn(&named);
                continue;
            }
            if self.outdated(&named).is_some() {
                continue;
            }
            let config = AsyncConnectionConfig::new()
                .set_connection_timeout(Some(self.timeout))
                .set_response_timeout(None);
            let check = self.open_primary(&named.addr, ProtocolVersion::RESP2, config);
            if let Ok(Ok(_)) = tokio::time::timeout(self.timeout, check).await {
                if self.confirmed(&named) {
                    // Requests that resolve now ask this sentinel first: it knows of the switch.
                    self.prefer(index);
                }
            }
        }
    }

    /// The primary sentinel `index` names, on its kept connection (opened if needed), within
    /// its share of the request timeout.
    async fn ask_kept(
        &self,
        index: usize,
        kept: &mut [Option<MultiplexedConnection>],
    ) -> Option<Named> {
        let sentinel = self.target.sentinels.get(index)?;
        let slot = kept.get_mut(index)?;
        let asked = tokio::time::timeout(self.per_sentinel(), async {
            if slot.is_none() {
                *slot = Some(self.sentinel_connection(sentinel).await?);
            }
            match slot.as_mut() {
                Some(con) => self.ask_on(con).await,
                None => Ok(None),
            }
        })
        .await;
        match asked {
            Ok(Ok(named)) => named,
            _ => {
                *slot = None;
                None
            }
        }
    }

    /// Asks the sentinels in turn for the primary, connects to it with `protocol` and `config`,
    /// and returns the connection once `ROLE` on it says `master`. A sentinel whose answer is
    /// older than the newest configuration seen is passed over. Unbounded by itself: the
    /// caller bounds it by its deadline; each sentinel gets its share of the request timeout,
    /// each candidate the whole request timeout.
    pub(crate) async fn connect(
        &self,
        protocol: ProtocolVersion,
        config: AsyncConnectionConfig,
    ) -> RedisResult<(NodeAddr, MultiplexedConnection)> {
        let order = self.order.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let mut failures: Vec<String> = Vec::new();
        let mut refused: Option<RedisError> = None;
        let mut tried: Vec<NodeAddr> = Vec::new();
        // Answers passed over as older than the newest configuration seen, and whether any
        // sentinel named a configuration at least that new: together they tell a sentinel
        // that missed a failover from sentinels that were re-provisioned.
        let mut older: Vec<(usize, Named, u64)> = Vec::new();
        let mut current_named = false;
        for index in order {
            let Some(sentinel) = self.target.sentinels.get(index) else {
                continue;
            };
            let named = match tokio::time::timeout(self.per_sentinel(), self.ask(sentinel)).await {
                Err(_) => {
                    failures.push(format!(
                        "sentinel {sentinel}: no answer within {:?}",
                        self.per_sentinel()
                    ));
                    continue;
                }
                Ok(Err(e)) => {
                    failures.push(format!("sentinel {sentinel}: {e}"));
                    if crate::errors::is_refused(&e) {
                        refused.get_or_insert(refusal(
                            format!("sentinel {sentinel} (sentinel_user, sentinel_password)"),
                            &e,
                        ));
                    }
                    continue;
                }
                Ok(Ok(None)) => {
                    failures.push(format!(
                        "sentinel {sentinel} knows no primary named `{}`",
                        self.target.master_name
                    ));
                    continue;
                }
                Ok(Ok(Some(named))) => named,
            };
            if let Some(newest) = self.outdated(&named) {
                failures.push(format!(
                    "sentinel {sentinel} names {} from configuration epoch {}, older than {newest} \
                     (it has not heard of the last failover yet)",
                    named.addr,
                    named.epoch.unwrap_or_default()
                ));
                older.push((index, named, newest));
                continue;
            }
            current_named = true;
            if tried.contains(&named.addr) {
                continue;
            }
            tried.push(named.addr.clone());
            let checked = tokio::time::timeout(
                self.timeout,
                self.open_primary(&named.addr, protocol, config.clone()),
            )
            .await;
            match checked {
                Ok(Ok(con)) => {
                    // Another connection may have confirmed a newer primary meanwhile.
                    if !self.confirmed(&named) {
                        failures.push(format!(
                            "sentinel {sentinel} named {}, an older primary than the one in use",
                            named.addr
                        ));
                        continue;
                    }
                    self.prefer(index);
                    return Ok((named.addr, con));
                }
                Ok(Err(e)) => {
                    failures.push(format!("sentinel {sentinel} named {}: {e}", named.addr));
                    if crate::errors::is_refused(&e) {
                        // Wrong credentials for the primary: no other sentinel can fix that.
                        return Err(refusal(
                            format!("the primary {} (the URL's user and password)", named.addr),
                            &e,
                        ));
                    }
                }
                Err(_) => failures.push(format!(
                    "sentinel {sentinel} named {}, which did not answer within {:?}",
                    named.addr, self.timeout
                )),
            }
        }
        if let Some(refused) = refused {
            return Err(refused);
        }
        if !current_named {
            if let Some((index, named, passed_over)) = self.renumbered(&older) {
                let checked = tokio::time::timeout(
                    self.timeout,
                    self.open_primary(&named.addr, protocol, config),
                )
                .await;
                match checked {
                    Ok(Ok(con)) if self.confirmed_renumbered(&named, passed_over) => {
                        self.prefer(index);
                        return Ok((named.addr, con));
                    }
                    Ok(Ok(_)) => failures.push(format!(
                        "the sentinels' configuration epochs went back to {}, naming {}, but a \
                         newer primary was confirmed meanwhile",
                        named.epoch.unwrap_or_default(),
                        named.addr
                    )),
                    Ok(Err(e)) => {
                        failures.push(format!("the sentinels agree on {}: {e}", named.addr))
                    }
                    Err(_) => failures.push(format!(
                        "the sentinels agree on {}, which did not answer within {:?}",
                        named.addr, self.timeout
                    )),
                }
            }
        }
        Err(RedisError::from((
            ErrorKind::Io,
            "no primary found through Redis Sentinel",
            failures.join("; "),
        )))
    }

    /// Connects to the server a sentinel named and checks with `ROLE` that it is a primary.
    async fn open_primary(
        &self,
        addr: &NodeAddr,
        protocol: ProtocolVersion,
        config: AsyncConnectionConfig,
    ) -> RedisResult<MultiplexedConnection> {
        let info = ConnectionAddr::Tcp(addr.host.clone(), addr.port)
            .into_connection_info()?
            .set_redis_settings(self.target.node.clone().set_protocol(protocol));
        let client = Client::open(info)?;
        let mut con = crate::link::connect(client, config).await?;
        let role: Value = redis::cmd("ROLE").query_async(&mut con).await?;
        match role_of(&role).as_deref() {
            Some("master") => Ok(con),
            Some(other) => Err(RedisError::from((
                ErrorKind::Io,
                "the server a sentinel named is not a primary (a failover in progress?)",
                format!("ROLE says {other}"),
            ))),
            None => Err(unexpected("a ROLE reply without a role".into())),
        }
    }

    fn prefer(&self, index: usize) {
        let mut order = self.order.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(at) = order.iter().position(|i| *i == index) {
            let first = order.remove(at);
            order.insert(0, first);
        }
    }

    /// A sentinel named the primary in use again: remember its epoch, if newer.
    fn learn(&self, named: &Named) {
        let mut confirmed = self.confirmed.lock().unwrap_or_else(|e| e.into_inner());
        if confirmed.addr.as_ref() == Some(&named.addr) {
            confirmed.epoch = confirmed.epoch.max(named.epoch);
        }
    }

    /// Whether the answers a round passed over as older (sentinel index, answer, the newest
    /// epoch it was older than) say that the sentinels were re-provisioned: `SENTINEL REMOVE`
    /// and `MONITOR`, or a redeploy without sentinel.conf, number the primary's configurations
    /// from 0 again, and then every sentinel is "older" than what this authority saw. Believed
    /// only when a majority of the URL's sentinels answered and all of them name one primary
    /// (with no sentinel naming the newest configuration, which the caller checks): a
    /// failover needs a majority of the sentinels to elect its leader, so a lone sentinel
    /// that missed one is still passed over. Returns the answer to follow, with the greatest
    /// of the agreeing epochs, and the epoch it was passed over against.
    fn renumbered(&self, older: &[(usize, Named, u64)]) -> Option<(usize, Named, u64)> {
        let (index, first, passed_over) = older.first()?;
        if older.len().saturating_mul(2) <= self.target.sentinels.len() {
            return None;
        }
        if older.iter().any(|(_, named, _)| named.addr != first.addr) {
            return None;
        }
        let epoch = older.iter().filter_map(|(_, named, _)| named.epoch).max();
        let passed_over = older
            .iter()
            .map(|(_, _, newest)| *newest)
            .max()
            .unwrap_or(*passed_over);
        Some((
            *index,
            Named {
                addr: first.addr.clone(),
                epoch,
            },
            passed_over,
        ))
    }

    /// Makes `named` (checked by `ROLE`, agreed on by a majority of re-provisioned sentinels)
    /// the primary in use and restarts the epoch memory at its epoch, unless a configuration
    /// newer than `passed_over` was confirmed meanwhile; `false` then. This is what a freshly
    /// started authority would follow: the epoch memory exists to keep one authority from
    /// going back, not to outlive the numbering it came from.
    fn confirmed_renumbered(&self, named: &Named, passed_over: u64) -> bool {
        let mut confirmed = self.confirmed.lock().unwrap_or_else(|e| e.into_inner());
        if confirmed.epoch.is_some_and(|newest| newest > passed_over) {
            return false;
        }
        tracing::warn!(
            master = %self.target.master_name,
            primary = %named.addr,
            from = passed_over,
            to = ?named.epoch,
            "the Redis sentinels' configuration epoch went back (re-provisioned sentinels); \
             following the primary a majority of them agree on"
        );
        confirmed.epoch = named.epoch;
        self.adopt(&mut confirmed, named);
        true
    }

    /// Makes `named` (checked by `ROLE`) the primary in use, unless a newer configuration was
    /// confirmed meanwhile; `false` then.
    fn confirmed(&self, named: &Named) -> bool {
        // Held until the primary is published, so two confirmations cannot cross.
        let mut confirmed = self.confirmed.lock().unwrap_or_else(|e| e.into_inner());
        if let (Some(epoch), Some(newest)) = (named.epoch, confirmed.epoch) {
            if epoch < newest {
                return false;
            }
        }
        confirmed.epoch = confirmed.epoch.max(named.epoch);
        self.adopt(&mut confirmed, named);
        true
    }

    /// Publishes `named` as the primary in use; the caller holds `confirmed` until it is
    /// published, so two confirmations cannot cross.
    fn adopt(&self, confirmed: &mut Confirmed, named: &Named) {
        confirmed.addr = Some(named.addr.clone());
        let name = &self.target.master_name;
        let addr = &named.addr;
        self.primary.send_if_modified(|current| {
            if current.as_ref() == Some(addr) {
                return false;
            }
            match current {
                Some(old) => tracing::warn!(
                    master = %name,
                    old = %old,
                    new = %addr,
                    epoch = ?named.epoch,
                    "Redis Sentinel names a new primary; requests and the subscription move to it"
                ),
                None => tracing::debug!(master = %name, primary = %addr, "Redis Sentinel primary"),
            }
            *current = Some(addr.clone());
            true
        });
    }
}

/// The role in a `ROLE` reply: its first element.
fn role_of(reply: &Value) -> Option<String> {
    let Value::Array(items) = reply else {
        return None;
    };
    match items.first()? {
        Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

/// A refusal of our credentials, saying who refused which: it stays `Unauthorized`.
fn refusal(who: String, error: &RedisError) -> RedisError {
    RedisError::from((
        ErrorKind::AuthenticationFailed,
        "refused the credentials",
        format!("{who}: {error}"),
    ))
}

fn unexpected(what: String) -> RedisError {
    RedisError::from((
        ErrorKind::Parse,
        "unexpected reply from Redis Sentinel",
        what,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold_conformance::kit::{OrFail, TestResult};
    use leasehold_core::Error;

    /// The target of `redis+sentinel://<rest>`.
    fn target(rest: &str, user: Option<&str>, password: Option<&str>) -> Result<SentinelTarget> {
        let url = ConnectionUrl::parse(&format!("redis+sentinel://{rest}"))?;
        parse_target(&url, user.map(String::from), password.map(Secret::new))
    }

    #[test]
    fn parses_hosts_names_and_credentials() -> TestResult {
        let t = target(
            "app:p%40ss@s1:26380,s2,[::1]:26381/mymaster/3",
            Some("watch"),
            Some("sp"),
        )
        .or_fail("the sentinel target")?;
        let shown: Vec<String> = t.sentinels.iter().map(|s| s.to_string()).collect();
        assert_eq!(shown, ["s1:26380", "s2:26379", "[::1]:26381"]);
        assert_eq!(t.master_name, "mymaster");
        assert_eq!(t.node.db(), 3);
        assert_eq!(t.node.username(), Some("app"));
        assert_eq!(t.node.password(), Some("p@ss"));
        assert_eq!(t.sentinel_auth.username(), Some("watch"));
        assert_eq!(t.sentinel_auth.password(), Some("sp"));
        let debug = format!("{t:?}");
        assert!(
            !debug.contains("p@ss") && !debug.contains("sp\""),
            "{debug}"
        );

        let plain = target(":pw@h/m", None, None).or_fail("the sentinel target with a password")?;
        assert_eq!(plain.node.username(), None);
        assert_eq!(plain.node.password(), Some("pw"));
        assert_eq!(plain.node.db(), 0);
        assert_eq!(plain.sentinel_auth.password(), None);

        for bad in [
            "h",
            "h/",
            "/m",
            ",/m",
            "h:0/m",
            "h:99999/m",
            "h:x/m",
            "[::1/m",
            "[::1]x/m",
            "h h/m",
            "h/m/x",
            "h/m/1/2",
            "h/m%zz",
            "h/m n",
            "u:%zz@h/m",
        ] {
            assert!(
                matches!(target(bad, None, None), Err(Error::InvalidUrl { .. })),
                "{bad}"
            );
        }
        assert!(target("h/m", Some("u"), None).is_err());
        assert!(target("h/m", None, Some("")).is_err());
        // A host Redis would not name back, and an encoded `/` in the master name.
        assert!(target("h!/m", None, None).is_err());
        assert_eq!(
            target("h/a%2Fb/1", None, None)
                .or_fail("the sentinel target with an encoded master name")?
                .master_name,
            "a/b"
        );
        Ok(())
    }

    fn named(port: u16, epoch: Option<u64>) -> Named {
        Named {
            addr: NodeAddr {
                host: "127.0.0.1".into(),
                port,
            },
            epoch,
        }
    }

    /// A sentinel that has not heard of the last failover names the old primary with an older
    /// configuration epoch: never followed back, whatever `ROLE` said.
    #[test]
    fn older_configurations_are_never_followed_back() -> TestResult {
        let target = target("h/m", None, None).or_fail("the sentinel target")?;
        let resolver = Resolver::new(target, Duration::from_secs(1));
        assert!(resolver.confirmed(&named(1, Some(1))));
        assert!(resolver.confirmed(&named(2, Some(2))));
        assert_eq!(resolver.primary().map(|a| a.port), Some(2));
        assert_eq!(resolver.outdated(&named(1, Some(1))), Some(2));
        assert!(!resolver.confirmed(&named(1, Some(1))));
        assert_eq!(resolver.primary().map(|a| a.port), Some(2));
        // Without an epoch (get-master-addr-by-name only) the ROLE check alone decides.
        assert_eq!(resolver.outdated(&named(1, None)), None);
        assert!(resolver.confirmed(&named(3, Some(5))));
        resolver.learn(&named(3, Some(7)));
        assert_eq!(resolver.outdated(&named(4, Some(6))), Some(7));
        Ok(())
    }

    /// Re-provisioned sentinels number from 0 again: followed only when a majority of the
    /// URL's sentinels agree on one primary; a lone sentinel that missed a failover, or a
    /// majority naming different servers, is still passed over.
    #[test]
    fn a_renumbering_is_believed_only_from_an_agreeing_majority() -> TestResult {
        let target =
            target("h1,h2,h3/m", None, None).or_fail("the sentinel target with three hosts")?;
        let resolver = Resolver::new(target, Duration::from_secs(1));
        assert!(resolver.confirmed(&named(2, Some(4))));
        assert_eq!(resolver.renumbered(&[(0, named(1, Some(3)), 4)]), None);
        assert_eq!(
            resolver.renumbered(&[(0, named(1, Some(0)), 4), (2, named(2, Some(0)), 4)]),
            None
        );
        let agreed = resolver
            .renumbered(&[(1, named(2, Some(0))), (2, named(2, Some(1)))].map(|(i, n)| (i, n, 4)));
        assert_eq!(agreed, Some((1, named(2, Some(1)), 4)));
        assert!(resolver.confirmed_renumbered(&named(2, Some(1)), 4));
        // The next failover under the new numbering is followed; the old numbering is not.
        assert_eq!(resolver.outdated(&named(1, Some(2))), None);
        assert_eq!(resolver.outdated(&named(1, Some(0))), Some(1));
        // A newer configuration confirmed meanwhile wins over a renumbering judged before it.
        assert!(resolver.confirmed(&named(3, Some(9))));
        assert!(!resolver.confirmed_renumbered(&named(2, Some(0)), 4));
        assert_eq!(resolver.primary().map(|a| a.port), Some(3));
        Ok(())
    }

    #[test]
    fn roles() {
        let reply = Value::Array(vec![Value::BulkString(b"master".to_vec()), Value::Int(1)]);
        assert_eq!(role_of(&reply).as_deref(), Some("master"));
        assert_eq!(role_of(&Value::Nil), None);
    }
}
