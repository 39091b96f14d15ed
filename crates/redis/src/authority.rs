//! The Redis authority: `SET NX PX` with an `INCR` fence, compare-and-delete, pub/sub hand-off.

use std::fmt;
use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use leasehold_core::backend::{Backoff, SmallestKeys};
use leasehold_core::time::{deadline_in, saturating_add};
use leasehold_core::{
    Authority, Capabilities, Error, FenceSafety, FencingToken, Grant, Inspection, Instant,
    KeyPrefix, LockKey, LostReason, OwnerId, OwnerToken, Released, Result, Revoked, TtlRange,
};
use redis::{AsyncConnectionConfig, Client, ProtocolVersion, RedisResult, TlsCertificates};

use crate::cluster::shard_channel;
use crate::config::{RedisConfig, Target};
use crate::errors::{
    self, breaks_connection, is_redirect, not_the_primary, replace_connection, BACKEND,
};
use crate::keys::KeyLayout;
use crate::link::{Conn, Connection, Link, Source};
use crate::scripts::{released, Int, Ints, LuaScript, Scripts};
use crate::sentinel::Resolver;
use crate::server::ServerSettings;
use crate::subscription::{Notifications, Subscription};
use crate::token::RedisFence;
use crate::waiters::{Turn, Waiters};

mod acquire_all;
#[cfg(test)]
mod resent_set;

/// TTLs in whole milliseconds (`PX`), from 1 ms to 30 days: a lease longer than a month is a
/// configuration mistake, not a lock.
const TTL: TtlRange = TtlRange::new(
    Duration::from_millis(1),
    Duration::from_secs(30 * 24 * 3600),
    Duration::from_millis(1),
);

/// A waiter's first retry between announcements comes after 10-20 ms ...
const RETRY_FIRST: Duration = Duration::from_millis(20);
/// ... and the delay doubles up to 150-300 ms (equal jitter: half fixed, half random).
const RETRY_CAP: Duration = Duration::from_millis(300);
/// A waiter whose holder's lease ends before its next retry tries again 5-10 ms after the end.
const EXPIRY_JITTER: Duration = Duration::from_millis(10);
/// How long a waiter's place in a key's waiter queue lasts unless it tries again: above
/// [`RETRY_CAP`] (plus the expiry jitter), the longest a waiting authority goes between tries,
/// so a live waiter keeps its place, and short enough that a waiter that left (or died) is
/// named by releases for at most this long.
const QUEUE_PLACE: Duration = Duration::from_millis(1000);

/// The most leases one renewal script renews. The script runs two commands per lease, during
/// which the server answers nobody else: 10,000 leases in one call kept it busy for 13 ms on a
/// quiet machine and 28 ms on a loaded one, 1,000 for 1.3 ms (measured with `SLOWLOG`). A
/// larger batch is several calls, one after another, and other clients' commands run between
/// them.
const RENEW_CHUNK: usize = 1_000;

struct Inner {
    config: RedisConfig,
    link: Link,
    scripts: Scripts,
    subscription: Subscription,
    capabilities: Capabilities,
    /// The server's eviction and persistence settings, read at connect where allowed.
    server: Option<ServerSettings>,
    /// Set once the server refused to announce a release (an ACL without channel rights), so
    /// that this is logged once, not at every release.
    announcement_refused: AtomicBool,
    /// Behind Sentinel: asks the sentinels every second whether the primary moved.
    _sentinel_watch: Option<AbortOnDrop>,
}

impl Inner {
    /// The channel announcements of `lock_key` go to: the release channel, or on a Redis
    /// Cluster the key's shard channel (in the key's slot, for `SPUBLISH` in its scripts).
    fn channel_of(&self, lock_key: &str) -> String {
        if self.config.is_cluster() {
            shard_channel(lock_key, &self.config.channel)
        } else {
            self.config.channel.clone()
        }
    }
}

/// A Redis server as an [`Authority`].
///
/// * Acquire is one script, one round trip: `SET <lock key> <owner token> NX PX <ttl>` and, if
///   that took the key, `INCR` of its fence counter, whose new value is the fence. When the key
///   is held, the same script returns the holder's remaining TTL.
/// * A set of keys is one script that checks every lock key before taking any (one slot on a
///   Redis Cluster; see `acquire_all.rs`).
/// * Renew (`PEXPIRE`) and release (`DEL` + `PUBLISH`) are scripts that first compare the lock
///   key's value with the owner token.
/// * Scripts are called by SHA (`EVALSHA`), and sent in full once when the server does not know
///   them (after a restart or a failover).
/// * Waiting: one subscription connection per authority (started by the first waiter) wakes
///   one waiter of a key when a release names this authority on its own channel (the key's
///   turn, passed on if that waiter leaves without an answer; see `waiters.rs`), so a process
///   reads only the hand-offs meant for it; between announcements each waiter
///   tries again with jittered backoff (10-20 ms, doubling to 150-300 ms, never much past the
///   holder's remaining TTL), which finds holders that release without announcing.
/// * Proclaim (for elections) is a script that compares the owner token like renew, stores the
///   value with the grant's fence in a sibling key, and announces it on the release channel;
///   `wait_for_change` waits on the same subscription, which subscribes to the release channel
///   from the authority's first observer on, for a key's release or proclaim.
/// * Optional `WAIT` for replicas after each acquisition (`?wait_replicas=N`).
///
/// Fences are [`FenceSafety::FailoverUnsafe`] and not durable across a restart without
/// persistence; see [`RedisFence`] and docs/redis.md. At connect the authority reads the
/// server's eviction policy and persistence ([`ServerSettings`]): it warns when lock keys or
/// fence counters may be evicted, declares that leases can end early
/// ([`ExclusionSafety::EarlyRevocation`](leasehold_core::ExclusionSafety)) unless the policy is
/// `noeviction`, and declares durable fences only where every write is fsynced before it is
/// acknowledged and no counter can be evicted. The key layout is in
/// [`crate::KeyLayout`].
///
/// Clones share the connection and the subscription.
#[derive(Clone)]
pub struct RedisAuthority {
    inner: Arc<Inner>,
}

impl fmt::Debug for RedisAuthority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisAuthority")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

/// Where the requests (RESP2) and the subscription (RESP3) connect: one address; behind
/// Sentinel, the primary the sentinels name, found by one resolver that both share (returned
/// too, for its watcher); or a Redis Cluster, whose subscription uses sharded pub/sub.
fn sources(config: &RedisConfig) -> Result<(Source, Notifications, Option<Arc<Resolver>>)> {
    match &config.target {
        Target::Direct(info) => Ok((
            Source::Direct(Box::new(client(config, info, ProtocolVersion::RESP2)?)),
            Notifications::PubSub(Source::Direct(Box::new(client(
                config,
                info,
                ProtocolVersion::RESP3,
            )?))),
            None,
        )),
        Target::Cluster(target) => {
            let requests = target
                .client(
                    ProtocolVersion::RESP2,
                    config.client.request_timeout,
                    None::<fn(redis::PushInfo) -> std::result::Result<(), ()>>,
                )
                .map_err(|e| errors::map(e, "configure the cluster client"))?;
            Ok((
                Source::Cluster(Box::new(requests)),
                Notifications::Sharded(target.clone()),
                None,
            ))
        }
        Target::Sentinel(target) => {
            let resolver = Arc::new(Resolver::new(target.clone(), config.client.request_timeout));
            Ok((
                Source::Sentinel {
                    resolver: resolver.clone(),
                    protocol: ProtocolVersion::RESP2,
                },
                Notifications::PubSub(Source::Sentinel {
                    resolver: resolver.clone(),
                    protocol: ProtocolVersion::RESP3,
                }),
                Some(resolver),
            ))
        }
    }
}

/// A background task that ends with its owner.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn client(
    config: &RedisConfig,
    info: &redis::ConnectionInfo,
    protocol: ProtocolVersion,
) -> Result<Client> {
    let settings = info.redis_settings().clone().set_protocol(protocol);
    let info = info.clone().set_redis_settings(settings);
    let built = match &config.tls_ca_file {
        Some(path) => {
            let pem = std::fs::read(path).map_err(|e| Error::InvalidConfig {
                reason: format!("cannot read tls_ca_file {}: {e}", path.display()),
            })?;
            Client::build_with_tls(
                info,
                TlsCertificates {
                    client_tls: None,
                    root_cert: Some(pem),
                },
            )
        }
        None => Client::open(info),
    };
    built.map_err(|e| errors::map(e, "configure the client"))
}

impl RedisAuthority {
    /// Connects with a `redis://`, `rediss://` or `redis+sentinel://` URL (see
    /// [`RedisConfig::from_url`]). Fails with `Unauthorized` on bad credentials and
    /// `Unavailable` when the server (behind Sentinel: a primary the sentinels name, confirmed by
    /// `ROLE`) cannot be reached within the request timeout.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::with_config(RedisConfig::from_url(url)?).await
    }

    /// Connects with a parsed configuration.
    pub async fn with_config(config: RedisConfig) -> Result<Self> {
        let timeout = config.client.request_timeout;
        let (requests, notifications, resolver) = sources(&config)?;
        let link = Link::new(
            requests,
            AsyncConnectionConfig::new()
                .set_connection_timeout(Some(timeout))
                .set_response_timeout(None),
        );
        // The id this authority's waiters queue under: random, so that two processes never
        // share one; nothing is granted by it.
        let waiter_id = hex(&OwnerToken::generate()?);
        let subscription = Subscription::new(
            notifications,
            config.channel.clone(),
            timeout,
            Waiters::new(waiter_id),
        );
        // Fail now, with the right error, on a wrong password or an unreachable server.
        let _: String = request_on(&link, timeout, "connect", |mut con| async move {
            redis::cmd("PING").query_async(&mut con).await
        })
        .await?;
        let server = read_server_settings(&link, &config).await?;
        let durable = server.as_ref().is_some_and(ServerSettings::durable_fences);
        // On a cluster the keys of a batch live in different slots, which one script cannot
        // touch (CROSSSLOT): each lease renews on its own there.
        let capabilities = Capabilities::new(BACKEND, FenceSafety::FailoverUnsafe, durable, TTL)
            .with_exclusion(crate::server::exclusion(server.as_ref()))
            .with_batch_renewal(!config.is_cluster())
            // On a cluster only a set whose keys share one slot fits in one script, and the
            // keys of most sets do not: there the recipe takes them one by one without asking.
            .with_atomic_acquire_all(!config.is_cluster());
        // Behind Sentinel, started only once connected, so a failed connect leaves no task.
        let sentinel_watch =
            resolver.map(|resolver| AbortOnDrop(tokio::spawn(resolver.watch_sentinels())));
        Ok(RedisAuthority {
            inner: Arc::new(Inner {
                scripts: Scripts::new(config.is_cluster()),
                config,
                link,
                subscription,
                capabilities,
                server,
                announcement_refused: AtomicBool::new(false),
                _sentinel_watch: sentinel_watch,
            }),
        })
    }

    /// The server's eviction and persistence settings as read at connect, or `None` when the
    /// server did not allow `CONFIG GET` (then fences are not declared durable, and eviction is
    /// not checked).
    pub fn server_settings(&self) -> Option<&ServerSettings> {
        self.inner.server.as_ref()
    }

    /// The configuration.
    pub fn config(&self) -> &RedisConfig {
        &self.inner.config
    }

    fn timeout(&self) -> Duration {
        self.inner.config.client.request_timeout
    }

    /// The shared connection, opened if needed, by `give_up`.
    async fn connection(&self, what: &str, give_up: Instant) -> Result<Conn> {
        connection_on(&self.inner.link, self.timeout(), what, give_up).await
    }

    /// Sends one request, bounded by the request timeout. A connection that times out or breaks
    /// is replaced for the next request.
    async fn request<T, F, Fut>(&self, what: &str, send: F) -> Result<T>
    where
        F: FnOnce(Connection) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        request_on(&self.inner.link, self.timeout(), what, send).await
    }

    async fn script<T: redis::FromRedisValue, A: redis::ToRedisArgs + Sync>(
        &self,
        what: &str,
        script: &LuaScript,
        keys: &[&str],
        args: &[A],
    ) -> Result<T> {
        self.request(what, |mut con| async move {
            script.run(&mut con, keys, args).await
        })
        .await
    }

    /// The server deleted our key (or stored our value) but refused to announce it: waiters
    /// elsewhere find it by retrying, observers by their timer. Logged once per authority.
    fn announcement_refused(&self) {
        if !self
            .inner
            .announcement_refused
            .swap(true, Ordering::Relaxed)
        {
            tracing::warn!(
                channel = %self.inner.config.channel,
                "Redis refused to announce a release or a proclaimed value on the channel (an \
                 ACL user without rights on it?); both still happen, and waiters in other \
                 processes find them by retrying instead of at once"
            );
        }
    }

    /// One acquisition attempt: the acquire script, then `WAIT` for replicas if configured.
    /// One acquisition attempt; a `queued` one (a waiter in `acquire`) that finds the key held
    /// takes or keeps this authority's place in the key's waiter queue (see
    /// [`crate::scripts::ACQUIRE`]).
    async fn attempt(&self, key: &LockKey, ttl: Duration, queued: bool) -> Result<Attempt> {
        let lock_key = self.inner.config.layout.lock_key(key);
        let fence_key = KeyLayout::fence_key_of(&lock_key);
        let waiters_key = KeyLayout::waiters_key_of(&lock_key);
        let place_ms = QUEUE_PLACE.as_millis().to_string();
        let owner = OwnerToken::generate()?;
        let token = hex(&owner);
        let ttl_ms = ttl.as_millis().to_string();
        let sent = Instant::now();
        let give_up = saturating_add(sent, self.timeout());
        let Conn { id, con, .. } = self.connection("acquire", give_up).await?;
        // From here until the outcome is known, a timeout or a cancellation may leave a lease
        // at the server that nobody was told about: the guard then releases it.
        let mut pending = Pending {
            inner: &self.inner,
            con,
            lock_key: &lock_key,
            token: &token,
            ttl,
            armed: true,
        };
        let (keys, args) = if queued {
            let me = self.inner.subscription.waiters().me();
            (
                &[lock_key.as_str(), &fence_key, &waiters_key][..],
                &[token.as_str(), &ttl_ms, me, &place_ms][..],
            )
        } else {
            (
                &[lock_key.as_str(), &fence_key][..],
                &[token.as_str(), &ttl_ms][..],
            )
        };
        let cluster = matches!(pending.con, Connection::Cluster(_));
        let run = self
            .inner
            .scripts
            .acquire
            .run::<Int, _, _>(&mut pending.con, keys, args);
        let reply = match tokio::time::timeout_at(give_up, run).await {
            Err(_) => {
                self.inner.link.discard(id);
                return Err(errors::timed_out("acquire", self.timeout()));
            }
            Ok(Err(e)) => {
                if breaks_connection(&e) {
                    self.inner.link.discard(id);
                } else {
                    // The server answered with an error: the script took nothing (see ACQUIRE).
                    pending.armed = false;
                    if not_the_primary(&e) || (cluster && is_redirect(&e)) {
                        // A replica now (READONLY), or a slot that moved: the next request
                        // finds the primary again.
                        self.inner.link.discard(id);
                    }
                }
                return Err(errors::map_on(e, "acquire", cluster));
            }
            Ok(Ok(Int(reply))) => reply,
        };
        if reply <= 0 {
            pending.armed = false;
            // `-1 - pttl`, or 0 for a key without expiry.
            let pttl = (reply < 0).then(|| Duration::from_millis(reply.unsigned_abs() - 1));
            return Ok(Attempt::Held { pttl });
        }
        // From here an early return (a fence out of range, a failed WAIT) drops the armed guard,
        // which releases the lease.
        let fence =
            RedisFence::from_reply(reply)?.to_fence(BACKEND, self.inner.config.client.epoch)?;
        // Dropping the armed guard on an error releases the lease.
        self.wait_for_replicas(&mut pending.con, id, give_up)
            .await?;
        pending.armed = false;
        let deadline = self.inner.config.client.safety_margin.deadline(sent, ttl);
        Ok(Attempt::Won(leasehold_core::backend::grant(
            key.clone(),
            owner,
            fence,
            ttl,
            deadline,
        )))
    }
}

impl RedisAuthority {
    /// `WAIT` for the configured replicas (if any) after an acquisition on `con`, by
    /// `give_up`: an error when fewer acknowledged it, so that the caller releases what it took.
    async fn wait_for_replicas(
        &self,
        con: &mut Connection,
        id: u64,
        give_up: Instant,
    ) -> Result<()> {
        let Some(wait) = self.inner.config.wait else {
            return Ok(());
        };
        let mut cmd = redis::cmd("WAIT");
        cmd.arg(wait.replicas)
            .arg(u64::try_from(wait.timeout.as_millis()).unwrap_or(u64::MAX));
        let ask = cmd.query_async::<i64>(con);
        let acked = match tokio::time::timeout_at(give_up, ask).await {
            Err(_) => {
                self.inner.link.discard(id);
                return Err(errors::timed_out("acquire (WAIT)", self.timeout()));
            }
            Ok(Err(e)) => return Err(errors::map(e, "acquire (WAIT)")),
            Ok(Ok(n)) => n,
        };
        if acked < i64::from(wait.replicas) {
            return Err(Error::Backend {
                backend: BACKEND,
                message: format!(
                    "only {acked} of {} replicas acknowledged the acquisition within {:?}; \
                     it was released",
                    wait.replicas, wait.timeout
                ),
                retryable: true,
                source: None,
            });
        }
        Ok(())
    }
}

/// The shared connection of `link`, opened if needed, by `give_up`.
async fn connection_on(
    link: &Link,
    timeout: Duration,
    what: &str,
    give_up: Instant,
) -> Result<Conn> {
    match tokio::time::timeout_at(give_up, link.get()).await {
        Err(_) => Err(errors::timed_out(what, timeout)),
        Ok(Err(e)) => Err(errors::map(e, what)),
        Ok(Ok(conn)) => Ok(conn),
    }
}

impl RedisAuthority {
    /// One `RENEW_MANY` script call for `grants` (at most [`RENEW_CHUNK`] of them).
    async fn renew_chunk(&self, grants: &[Grant]) -> Vec<Result<Instant>> {
        let keys: Vec<String> = grants
            .iter()
            .map(|g| self.inner.config.layout.lock_key(g.key()))
            .collect();
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let args: Vec<String> = grants
            .iter()
            .flat_map(|g| [hex(&g.owner()), g.ttl().as_millis().to_string()])
            .collect();
        let sent = Instant::now();
        let answered: Result<Ints> = self
            .script("renew", &self.inner.scripts.renew_many, &keys, &args)
            .await;
        match answered {
            Err(e) => leasehold_core::backend::batch_failed(e, grants.len()),
            // One answer per grant, or nobody knows which were renewed: a protocol error for
            // the whole batch (retryable, as any unknown outcome).
            Ok(Ints(renewed)) if renewed.len() != grants.len() => {
                leasehold_core::backend::batch_failed(
                    Error::Backend {
                        backend: BACKEND,
                        message: format!(
                            "renew: the script answered {} results for {} leases",
                            renewed.len(),
                            grants.len()
                        ),
                        retryable: true,
                        source: None,
                    },
                    grants.len(),
                )
            }
            Ok(Ints(renewed)) => leasehold_core::backend::batch_answers(
                grants,
                sent,
                &self.inner.config.client.safety_margin,
                |i, _| renewed.get(i) == Some(&1),
            ),
        }
    }
}

/// Sends one request on `link`, bounded by `timeout`. A connection that times out, breaks, or
/// reaches a server that is not the primary (any more) is replaced for the next request.
async fn request_on<T, F, Fut>(link: &Link, timeout: Duration, what: &str, send: F) -> Result<T>
where
    F: FnOnce(Connection) -> Fut,
    Fut: Future<Output = RedisResult<T>>,
{
    let give_up = deadline_in(timeout);
    let Conn { id, con, .. } = connection_on(link, timeout, what, give_up).await?;
    let cluster = matches!(con, Connection::Cluster(_));
    match tokio::time::timeout_at(give_up, send(con)).await {
        Err(_) => {
            link.discard(id);
            Err(errors::timed_out(what, timeout))
        }
        Ok(Err(e)) => {
            if replace_connection(&e) || (cluster && is_redirect(&e)) {
                link.discard(id);
            }
            Err(errors::map_on(e, what, cluster))
        }
        Ok(Ok(v)) => Ok(v),
    }
}

/// Reads the eviction policy and persistence settings (one round trip, `CONFIG GET` each; on a
/// Redis Cluster one per primary) and warns when the server may evict lock keys or fence
/// counters. `None` when the server refuses (an ACL user without `CONFIG`, a renamed command):
/// that is no reason to refuse to lock. An unreachable server is still an error. On a cluster
/// the settings kept are the least safe primary's: fences count as durable only if every
/// primary fsyncs every write and evicts no counter.
async fn read_server_settings(link: &Link, config: &RedisConfig) -> Result<Option<ServerSettings>> {
    let timeout = config.client.request_timeout;
    let read = request_on(
        link,
        timeout,
        "read the server's configuration",
        |mut con| async move {
            let nodes = con.primaries().await?;
            let mut per_node = Vec::with_capacity(nodes.len());
            for node in &nodes {
                let mut pipe = redis::pipe();
                for parameter in ServerSettings::PARAMETERS {
                    pipe.cmd("CONFIG").arg("GET").arg(parameter);
                }
                per_node.push(
                    con.query_pipeline_on::<Vec<Vec<String>>>(node, pipe)
                        .await?,
                );
            }
            Ok(per_node)
        },
    )
    .await;
    let per_node = match read {
        Ok(values) => values,
        Err(e @ Error::Unavailable { .. }) => return Err(e),
        Err(error) => {
            tracing::debug!(
                %error,
                "cannot read the Redis server's configuration; eviction is not checked and \
                 fences are not declared durable"
            );
            return Ok(None);
        }
    };
    let mut least_safe: Option<ServerSettings> = None;
    for values in &per_node {
        let value = |i: usize| {
            values
                .get(i)
                .and_then(|pair| pair.get(1))
                .map(String::as_str)
        };
        let (Some(policy), Some(appendonly), Some(appendfsync)) = (value(0), value(1), value(2))
        else {
            tracing::debug!(
                ?values,
                "the Redis server did not report its eviction and persistence settings"
            );
            return Ok(None);
        };
        let settings = ServerSettings::from_values(policy, appendonly, appendfsync);
        let risk = |s: &ServerSettings| {
            (
                s.may_evict_fence_counters(),
                s.may_evict_lock_keys(),
                !s.durable_fences(),
            )
        };
        if least_safe
            .as_ref()
            .is_none_or(|l| risk(&settings) > risk(l))
        {
            least_safe = Some(settings);
        }
    }
    let Some(settings) = least_safe else {
        return Ok(None);
    };
    let policy = settings.maxmemory_policy().to_string();
    let url = config.redacted_url();
    if settings.may_evict_fence_counters() {
        tracing::warn!(
            %url,
            "Redis maxmemory-policy is {policy}: under memory pressure the server may evict \
             fence counters (a key's fences start at 1 again) and lock keys (a lock ends \
             early); fences are declared not durable. Run lock servers with \
             maxmemory-policy noeviction"
        );
    } else if settings.may_evict_lock_keys() {
        tracing::warn!(
            %url,
            "Redis maxmemory-policy is {policy}: under memory pressure the server may evict \
             lock keys (a lock ends early, and another client can take it). Run lock servers \
             with maxmemory-policy noeviction"
        );
    }
    Ok(Some(settings))
}

/// The owner token as the 32 lowercase hex digits stored in Redis (what
/// [`OwnerToken::to_hex`] gives, without its formatting machinery: this is on every request).
fn hex(owner: &OwnerToken) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(32);
    for b in owner.as_bytes() {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
    out
}

/// What one acquisition attempt found.
enum Attempt {
    Won(Grant),
    /// Held by someone else for `pttl` more (`None`: a key without expiry, set by another
    /// client).
    Held {
        pttl: Option<Duration>,
    },
}

/// An acquisition whose outcome is not known yet. Dropped while armed (the request timed out,
/// or the caller's future was cancelled), it sends a compare-and-delete for its owner token on
/// the *same* connection, so that Redis runs it right after the acquisition if that ever runs
/// (for example when a paused server resumes). Bounded by the TTL: after it, the lease is gone
/// anyway.
struct Pending<'a> {
    inner: &'a Inner,
    con: Connection,
    lock_key: &'a str,
    token: &'a str,
    ttl: Duration,
    armed: bool,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (script, channel) = (
            self.inner.scripts.release.clone(),
            self.inner.channel_of(self.lock_key),
        );
        let (mut con, lock_key, token, ttl) = (
            self.con.clone(),
            self.lock_key.to_string(),
            self.token.to_string(),
            self.ttl,
        );
        let waiters = self.inner.subscription.waiters().clone();
        runtime.spawn(async move {
            let value_key = KeyLayout::value_key_of(&lock_key);
            let waiters_key = KeyLayout::waiters_key_of(&lock_key);
            let (keys, args) = (
                [lock_key.as_str(), &value_key, &waiters_key],
                [token.as_str(), &channel, waiters.me()],
            );
            let release = script.run::<i64, _, _>(&mut con, &keys, &args);
            match tokio::time::timeout(ttl, release).await {
                Ok(Ok(released::ANNOUNCED | released::UNANNOUNCED)) => {
                    tracing::debug!(%lock_key, "released a lease whose acquisition had no answer");
                    // As after any release: the waiters of this authority need not wait for
                    // the announcement, which does not come where publishing is refused. A
                    // waiter handed the turn by the attempt that failed here may have found
                    // this lease still held.
                    waiters.wake(&lock_key);
                }
                _ => {
                    tracing::trace!(%lock_key, "nothing to release after an unanswered acquisition")
                }
            }
        });
    }
}

#[async_trait]
impl Authority for RedisAuthority {
    fn capabilities(&self) -> &Capabilities {
        &self.inner.capabilities
    }

    async fn try_acquire(&self, key: &LockKey, ttl: Duration) -> Result<Option<Grant>> {
        TTL.check(ttl)?;
        match self.attempt(key, ttl, false).await? {
            Attempt::Won(grant) => Ok(Some(grant)),
            Attempt::Held { .. } => Ok(None),
        }
    }

    async fn try_acquire_all(&self, keys: &[LockKey], ttl: Duration) -> Result<Option<Vec<Grant>>> {
        self.try_acquire_set(keys, ttl).await
    }

    async fn acquire(&self, key: &LockKey, ttl: Duration, max_wait: Duration) -> Result<Grant> {
        TTL.check(ttl)?;
        let start = Instant::now();
        let give_up = saturating_add(start, max_wait);
        let timed_out = |now: Instant| Error::Timeout {
            key: key.to_string(),
            waited: now - start,
        };
        // A free key is taken without touching the subscription, as Redisson does: a process
        // that never waits never opens the subscription connection (when every subscription
        // read every release, it cost an uncontended pair 11 % on one core, measured,
        // docs/performance-log.md). Only a caller who finds the key held subscribes, and then
        // tries again before it waits: a release in between is caught by that attempt.
        if let Attempt::Won(grant) = self
            .attempt(key, ttl, self.inner.subscription.hears())
            .await?
        {
            return Ok(grant);
        }
        let now = Instant::now();
        if now >= give_up {
            return Err(timed_out(now));
        }
        let subscription = &self.inner.subscription;
        let lock_key = self.inner.config.layout.lock_key(key);
        let waiters = subscription.waiters().for_key(&lock_key);
        subscription
            .settled(&lock_key, self.timeout().min(max_wait), false)
            .await;
        // Announcements make hand-offs immediate, but not every holder announces: a plain
        // `SET NX PX` client (redis-py's `Lock`, say) deletes its key silently, an ACL may
        // forbid publishing, a message can be lost, the subscription can be down. So between
        // announcements the waiter tries again with jittered backoff, capped at a few hundred
        // ms: one request per waiter per RETRY_CAP/2 at most, and a silent release is found
        // within one step instead of at the holder's expiry.
        let mut retry = Backoff::new(RETRY_FIRST, RETRY_CAP);
        // A release hands the key's turn to one waiter of this authority, not all of them
        // (only one can win the key). Held while this waiter acts on it; dropped unfinished
        // (an error, a cancellation) it passes to the next waiter.
        let mut turn: Option<Turn> = None;
        loop {
            // Register for the release announcement before the attempt: a release that happens
            // after the attempt ran at the server is then announced to a subscription that
            // already exists, and reaches this waiter (or the one holding the turn, which then
            // tries again).
            let mut released = pin!(waiters.turn_handed());
            released.as_mut().enable();
            let pttl = match self
                .attempt(key, ttl, self.inner.subscription.hears())
                .await?
            {
                Attempt::Won(grant) => {
                    if let Some(turn) = turn.take() {
                        turn.won();
                    }
                    return Ok(grant);
                }
                Attempt::Held { pttl } => pttl,
            };
            // Released again while this attempt was on its way: it may have missed that
            // release, so try once more at once, still holding the turn (which passes on if
            // this waiter gives up now).
            let again = turn.as_mut().is_some_and(Turn::held);
            if !again {
                turn = None;
            }
            let now = Instant::now();
            if now >= give_up {
                return Err(timed_out(now));
            }
            if again {
                continue;
            }
            let mut wait = retry.next_delay();
            // A lease that ends sooner than that is tried again right after its end by the
            // server's clock (a duration, never compared with our wall clock), with jitter so
            // that waiters do not arrive together.
            if let Some(remaining) = pttl {
                let jitter = Backoff::new(EXPIRY_JITTER, EXPIRY_JITTER).next_delay();
                wait = wait.min(remaining.saturating_add(jitter));
            }
            tokio::select! {
                _ = released => turn = Some(waiters.take_turn()),
                _ = tokio::time::sleep_until(saturating_add(now, wait).min(give_up)) => {}
            }
        }
    }

    async fn renew(&self, grant: &Grant, ttl: Duration) -> Result<Instant> {
        TTL.check(ttl)?;
        let lock_key = self.inner.config.layout.lock_key(grant.key());
        let (token, ttl_ms) = (hex(&grant.owner()), ttl.as_millis().to_string());
        let sent = Instant::now();
        let Int(renewed) = self
            .script(
                "renew",
                &self.inner.scripts.renew,
                &[&lock_key],
                &[token.as_str(), &ttl_ms],
            )
            .await?;
        if renewed != 1 {
            return Err(Error::lease_lost(grant.key().as_str(), LostReason::Refused));
        }
        Ok(self.inner.config.client.safety_margin.deadline(sent, ttl))
    }

    /// One script call renews up to [`RENEW_CHUNK`] leases, each key checked as `renew` checks
    /// it; a larger batch is sent as several calls, one after another. On a Redis Cluster, one
    /// renewal per grant instead.
    async fn renew_many(&self, grants: &[Grant]) -> Vec<Result<Instant>> {
        if let Err(refused) = leasehold_core::backend::check_batch_ttls(grants, &TTL) {
            return refused;
        }
        if self.inner.config.is_cluster() {
            // The lock keys of a batch hash to different slots, which one script cannot touch
            // (CROSSSLOT: every grant of the batch would fail). Each grant is renewed as `renew`
            // renews it, its deadline counted from its own request.
            let mut results = Vec::with_capacity(grants.len());
            for grant in grants {
                results.push(self.renew(grant, grant.ttl()).await);
            }
            return results;
        }
        let mut results = Vec::with_capacity(grants.len());
        let mut chunks = grants.chunks(RENEW_CHUNK);
        while let Some(chunk) = chunks.next() {
            let began = Instant::now();
            let answers = self.renew_chunk(chunk).await;
            // A call that failed after waiting most of a request timeout most likely had no
            // answer: the rest of the batch is left to the next try, at once, since sending
            // them one by one to a server that does not answer would spend a request timeout
            // on each, and the last leases' deadlines with them. A quick failure (a refusal, a
            // `READONLY` that sent the link to the new primary) lets the next call go.
            let silent = began.elapsed() >= self.timeout() / 2;
            let unanswered = answers.iter().find_map(|a| match a {
                Err(e) if silent && e.is_retryable() => Some(e.clone()),
                _ => None,
            });
            results.extend(answers);
            if let Some(error) = unanswered {
                for rest in chunks.by_ref() {
                    results.extend(leasehold_core::backend::batch_failed(
                        error.clone(),
                        rest.len(),
                    ));
                }
            }
        }
        results
    }

    async fn release(&self, grant: &Grant) -> Result<Released> {
        let lock_key = self.inner.config.layout.lock_key(grant.key());
        let value_key = KeyLayout::value_key_of(&lock_key);
        let waiters_key = KeyLayout::waiters_key_of(&lock_key);
        let token = hex(&grant.owner());
        let channel = self.inner.channel_of(&lock_key);
        let waiters = self.inner.subscription.waiters();
        let answered = self
            .script(
                "release",
                &self.inner.scripts.release,
                &[&lock_key, &value_key, &waiters_key],
                &[token.as_str(), &channel, waiters.me()],
            )
            .await;
        let Int(released) = answered.inspect_err(|_| {
            // The release may have run without its answer: if it named a waiter of this
            // authority, only this authority would have woken it.
            waiters.wake(&lock_key);
        })?;
        match released {
            released::ANNOUNCED => {}
            released::UNANNOUNCED => self.announcement_refused(),
            _ => return Ok(Released::AlreadyGone),
        }
        // Waiters of this authority need not wait for the announcement to come back.
        self.inner.subscription.waiters().wake(&lock_key);
        Ok(Released::Released)
    }

    /// Two steps: `GET` the holder's owner token, then the revoke script, which deletes the
    /// lock key only if it still holds that token (see [`crate::scripts`]). A key held by a
    /// client that is not leasehold's (a plain `SET NX` peer) has no fence that a resource
    /// could refuse, so it is not revoked.
    async fn revoke(&self, key: &LockKey) -> Result<Revoked> {
        let lock_key = self.inner.config.layout.lock_key(key);
        let fence_key = KeyLayout::fence_key_of(&lock_key);
        let value_key = KeyLayout::value_key_of(&lock_key);
        let holder: Option<Vec<u8>> = self
            .request("revoke", |mut con| {
                let lock_key = lock_key.clone();
                async move { redis::cmd("GET").arg(&lock_key).query_async(&mut con).await }
            })
            .await?;
        let Some(holder) = holder else {
            return Ok(Revoked::WasFree);
        };
        let Some(token) = std::str::from_utf8(&holder)
            .ok()
            .filter(|v| v.parse::<OwnerToken>().is_ok())
        else {
            return Err(Error::Unsupported {
                backend: BACKEND,
                operation: format!(
                    "revoking {key}: its holder is not a leasehold client, and has no fence a \
                     resource could refuse"
                ),
            });
        };
        let channel = self.inner.channel_of(&lock_key);
        let waiters_key = KeyLayout::waiters_key_of(&lock_key);
        let waiters = self.inner.subscription.waiters();
        let answered = self
            .script(
                "revoke",
                &self.inner.scripts.revoke,
                &[&lock_key, &value_key, &fence_key, &waiters_key],
                &[token, channel.as_str(), waiters.me()],
            )
            .await;
        let Int(ended) = answered.inspect_err(|_| {
            // As in release: a revoke that ran without its answer may have named a waiter here.
            waiters.wake(&lock_key);
        })?;
        if ended == 0 {
            // The holder it read went meanwhile (released or expired).
            return Ok(Revoked::WasFree);
        }
        if ended < 0 {
            self.announcement_refused();
        }
        self.inner.subscription.waiters().wake(&lock_key);
        let fence = RedisFence::from_reply(ended.saturating_abs())?
            .to_fence(BACKEND, self.inner.config.client.epoch)?;
        Ok(Revoked::Revoked { fence })
    }

    /// One round trip, one atomic read: `MULTI GET <lock key> PTTL <lock key> GET <counter>
    /// HMGET <value key> fence value EXEC`. Only reads (no script, so nothing to cache and
    /// nothing that could write), and the keys share a hash slot, so it works on a cluster too.
    ///
    /// * Held while the lock key exists; the remaining time is its `PTTL` on the server's
    ///   clock (`None` for a key some other client set without expiry).
    /// * The lock key holds only the owner token; the fence is the counter. A leasehold holder
    ///   took the key and raised the counter in one script, and no one raises it while the key
    ///   is held, so the counter *is* a leasehold holder's fence. A value that is not an owner
    ///   token is a plain `SET NX` peer's, which raised no counter: shown as `peer:foreign`
    ///   without a fence (a peer whose value happens to be 32 hex digits cannot be told apart).
    /// * The counter is also the last fence issued for the key, held or not.
    /// * The proclaimed value is shown only for a leasehold holder, and only when the fence
    ///   stored with it is that holder's fence (the counter): an earlier grant's value, left by
    ///   an expiry or a peer's release, belongs to a smaller fence and stays hidden.
    async fn inspect(&self, key: &LockKey) -> Result<Inspection> {
        let lock_key = self.inner.config.layout.lock_key(key);
        let fence_key = KeyLayout::fence_key_of(&lock_key);
        let value_key = KeyLayout::value_key_of(&lock_key);
        type Read = (Option<Vec<u8>>, i64, Option<i64>, Vec<Option<Vec<u8>>>);
        let (value, pttl, counter, proclaimed): Read = self
            .request("inspect", |mut con| {
                let (lock_key, fence_key, value_key) =
                    (lock_key.clone(), fence_key.clone(), value_key.clone());
                async move {
                    redis::pipe()
                        .atomic()
                        .get(&lock_key)
                        .pttl(&lock_key)
                        .get(&fence_key)
                        .cmd("HMGET")
                        .arg(&value_key)
                        .arg("fence")
                        .arg("value")
                        .query_async(&mut con)
                        .await
                }
            })
            .await?;
        let epoch = self.inner.config.client.epoch;
        let last = counter
            .filter(|raw| *raw > 0)
            .map(|raw| RedisFence::from_reply(raw).and_then(|f| f.to_fence(BACKEND, epoch)))
            .transpose()?;
        // PTTL -2 is "no such key"; the read is atomic, so it only ever agrees with GET's nil.
        let Some(value) = value.filter(|_| pttl != -2) else {
            return Ok(Inspection::free(BACKEND, key.clone()).with_last_fence(last));
        };
        let owner = std::str::from_utf8(&value)
            .ok()
            .and_then(|v| v.parse::<OwnerToken>().ok());
        let seen = match owner {
            Some(token) => Inspection::held(BACKEND, key.clone(), OwnerId::of(&token))
                .with_fence(last)
                .with_value(proclaimed_by(proclaimed, counter)),
            None => Inspection::held(BACKEND, key.clone(), OwnerId::peer("foreign")),
        };
        let remaining = u64::try_from(pttl).ok().map(Duration::from_millis);
        Ok(seen.with_remaining(remaining).with_last_fence(last))
    }

    /// One script, one round trip (the `PROCLAIM` script in scripts.rs): the value is stored with
    /// the grant's fence if the lock key still holds our owner token, and announced on the
    /// release channel so that observers read again at once.
    async fn proclaim(&self, grant: &Grant, value: &[u8]) -> Result<()> {
        leasehold_core::backend::check_proclaimed(value)?;
        let lock_key = self.inner.config.layout.lock_key(grant.key());
        let value_key = KeyLayout::value_key_of(&lock_key);
        let (token, fence) = (hex(&grant.owner()), grant.fence().raw().to_string());
        let channel = self.inner.channel_of(&lock_key);
        let args: [&[u8]; 4] = [
            token.as_bytes(),
            fence.as_bytes(),
            value,
            channel.as_bytes(),
        ];
        let Int(stored) = self
            .script(
                "proclaim",
                &self.inner.scripts.proclaim,
                &[&lock_key, &value_key],
                &args,
            )
            .await?;
        match stored {
            released::ANNOUNCED => {}
            released::UNANNOUNCED => self.announcement_refused(),
            _ => return Err(Error::lease_lost(grant.key().as_str(), LostReason::Refused)),
        }
        // Observers of this authority need not wait for the announcement to come back.
        self.inner.subscription.waiters().wake(&lock_key);
        Ok(())
    }

    /// Woken by the announcements on the release channel that name the key (a release or a
    /// proclaimed value, from any client that announces), through the authority's one
    /// subscription, or by a release or proclaim of this authority at once; otherwise after
    /// `max_wait`. A grant is not announced (acquiring stays one script without a `PUBLISH`), nor
    /// is an expiry: callers find those by reading again when the time runs out. While the
    /// subscription is down this is a timer. Waiting writes nothing at the server, and the
    /// key's entry among the waiters goes with the last one waiting on it.
    async fn wait_for_change(&self, key: &LockKey, max_wait: Duration) -> Result<()> {
        let until = saturating_add(Instant::now(), max_wait);
        let subscription = &self.inner.subscription;
        let lock_key = self.inner.config.layout.lock_key(key);
        let waiters = subscription.waiters().for_key(&lock_key);
        // Registered before anything else, so nothing announced from here on is missed.
        let mut changed = pin!(waiters.changed());
        changed.as_mut().enable();
        subscription
            .settled(&lock_key, self.timeout().min(max_wait), true)
            .await;
        tokio::select! {
            _ = changed => {}
            _ = tokio::time::sleep_until(until) => {}
        }
        Ok(())
    }

    /// `SCAN` over the layout's keys that start with the prefix, each request bounded by the
    /// request timeout: lock keys (held now, by leasehold or a plain peer) and fence counters
    /// (every key leasehold ever took; counters outlive release), merged. SCAN promises every
    /// key present for the whole scan, so a key held throughout is listed. Reads only.
    async fn list_keys(&self, prefix: &KeyPrefix, limit: usize) -> Result<Vec<LockKey>> {
        let layout = &self.inner.config.layout;
        let pattern = layout.scan_pattern(prefix);
        let mut keys = SmallestKeys::new(limit);
        // On a Redis Cluster every primary holds its own slots' keys: scan each in turn.
        let nodes = self
            .request("list_keys", |mut con| async move { con.primaries().await })
            .await?;
        for node in &nodes {
            let mut cursor: u64 = 0;
            loop {
                let (next, batch): (u64, Vec<Vec<u8>>) = self
                    .request("list_keys", |mut con| {
                        let mut cmd = redis::cmd("SCAN");
                        cmd.arg(cursor)
                            .arg("MATCH")
                            .arg(&pattern)
                            .arg("COUNT")
                            .arg(SCAN_COUNT);
                        async move { con.query_on(node, cmd).await }
                    })
                    .await?;
                for redis_key in &batch {
                    let key = std::str::from_utf8(redis_key)
                        .ok()
                        .and_then(|k| layout.key_of(k));
                    if let Some(key) = key.filter(|k| prefix.matches(k)) {
                        keys.offer(key);
                    }
                }
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        Ok(keys.into_sorted())
    }
}

/// The value in an `HMGET <value key> fence value` reply, if its fence is `counter` (the
/// holder's fence); `None` for a value of an earlier grant, or none at all.
fn proclaimed_by(reply: Vec<Option<Vec<u8>>>, counter: Option<i64>) -> Option<Vec<u8>> {
    let mut fields = reply.into_iter();
    let (fence, value) = (fields.next().flatten()?, fields.next().flatten()?);
    let fence = std::str::from_utf8(&fence).ok()?.parse::<i64>().ok()?;
    (Some(fence) == counter).then_some(value)
}

/// How many keys one `SCAN` step looks at: large enough that a listing of a big keyspace takes
/// few round trips, small enough that one step never blocks the server noticeably.
const SCAN_COUNT: usize = 1000;

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold_conformance::kit::{OrFail, TestResult};

    #[test]
    fn hex_is_what_the_core_stores() -> TestResult {
        for _ in 0..100 {
            let owner = OwnerToken::generate().or_fail("a generated owner token")?;
            assert_eq!(hex(&owner), owner.to_hex());
        }
        Ok(())
    }
}
