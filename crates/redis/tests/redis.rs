//! The Redis authority against real Redis servers started by the harness: the whole conformance
//! suite with faults (restart, pause, revoke, and a failover from primary to replica), a lying
//! variant that the failover scenario must fail, the counter reset of a restart without
//! persistence, credentials, outages, interop with the plain `SET NX PX` convention, the
//! subscription, the scripts' round trips, `WAIT` for replicas, ACL users without channel
//! rights, waiters behind holders that never announce, the eviction policy and persistence read
//! at connect, `Duration::MAX` / huge URL durations, and proclaimed values and waiting for a
//! key to change.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use leasehold_conformance::harness_error;
use leasehold_conformance::scenarios::{self, run_all};
use leasehold_conformance::{Connector, Context, Faults, Residue, Verdict};
use leasehold_core::{
    Authority, Capabilities, Error, ExclusionSafety, Fence, FenceSafety, Grant, Instant, Lease,
    LeaseOptions, LockKey, LostReason, Released,
};
use leasehold_redis::{KeyLayout, RedisAuthority};
use leasehold_servers::{free_port, RedisServer};

mod common;

use common::{blocking, info_field, wait_in_sync};
use redis::aio::MultiplexedConnection;

/// Requests give up after one second, so an unresponsive server is noticed within a TTL.
fn url(server: &RedisServer) -> String {
    format!("{}?timeout_ms=1000", server.url())
}

async fn start() -> Arc<RedisServer> {
    let server = blocking(RedisServer::start)
        .await
        .unwrap_or_else(|e| panic!("Redis must start for these tests: {e}"));
    Arc::new(server)
}

async fn start_pair() -> (Arc<RedisServer>, Arc<RedisServer>) {
    let primary = start().await;
    let p = primary.clone();
    let replica = blocking(move || RedisServer::start_replica_of(&p))
        .await
        .unwrap_or_else(|e| panic!("the Redis replica must start for these tests: {e}"));
    (primary, Arc::new(replica))
}

/// A plain client of the same library, for what an operator or another application does.
async fn raw(server: &RedisServer) -> MultiplexedConnection {
    redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

async fn command(server: &Arc<RedisServer>, args: &[&str]) -> String {
    let (server, args) = (
        server.clone(),
        args.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
    );
    blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        server.command(&args).unwrap()
    })
    .await
}

/// Clients of whichever server is the primary right now.
struct Clients(Arc<Mutex<String>>);

#[async_trait]
impl Connector for Clients {
    async fn connect(&self) -> leasehold_core::Result<Arc<dyn Authority>> {
        let url = self.0.lock().unwrap().clone();
        Ok(Arc::new(RedisAuthority::connect(&url).await?))
    }
}

/// Crash, freeze, operator and failover faults on a primary and its replica.
struct RedisFaults {
    primary: Arc<RedisServer>,
    replica: Option<Arc<RedisServer>>,
    url: Arc<Mutex<String>>,
    failed_over: Mutex<bool>,
}

impl RedisFaults {
    fn new(
        primary: Arc<RedisServer>,
        replica: Option<Arc<RedisServer>>,
    ) -> (Self, Arc<Mutex<String>>) {
        let url = Arc::new(Mutex::new(url(&primary)));
        let faults = RedisFaults {
            primary,
            replica,
            url: url.clone(),
            failed_over: Mutex::new(false),
        };
        (faults, url)
    }

    /// The server clients reach now.
    fn current(&self) -> Arc<RedisServer> {
        match (&self.replica, *self.failed_over.lock().unwrap()) {
            (Some(replica), true) => replica.clone(),
            _ => self.primary.clone(),
        }
    }

    async fn on_current(
        &self,
        f: impl FnOnce(&RedisServer) -> leasehold_servers::Result<()> + Send + 'static,
    ) -> leasehold_core::Result<()> {
        let server = self.current();
        blocking(move || f(&server)).await.map_err(harness_error)
    }
}

#[async_trait]
impl Faults for RedisFaults {
    async fn restart(&self) -> leasehold_core::Result<()> {
        self.on_current(|s| s.restart()).await
    }

    async fn pause(&self) -> leasehold_core::Result<()> {
        self.on_current(|s| s.pause()).await
    }

    async fn resume(&self) -> leasehold_core::Result<()> {
        self.on_current(|s| s.resume()).await
    }

    /// An operator deletes the lock key.
    async fn revoke(&self, key: &LockKey) -> leasehold_core::Result<()> {
        let lock_key = KeyLayout::default().lock_key(key);
        self.on_current(move |s| s.command(&["DEL", &lock_key]).map(|_| ()))
            .await
    }

    /// The replica, in sync, is promoted while the old primary keeps serving the clients that
    /// are connected to it: what they write now never reaches the promoted server.
    async fn begin_failover(&self) -> leasehold_core::Result<()> {
        let Some(replica) = self.replica.clone() else {
            return Err(Error::Unsupported {
                backend: "fault harness",
                operation: "failover".into(),
            });
        };
        let primary = self.primary.clone();
        blocking(move || {
            wait_in_sync(&*primary, &*replica)?;
            replica.promote().map_err(|e| e.to_string())
        })
        .await
        .map_err(harness_error)
    }

    /// New clients reach the promoted server.
    async fn complete_failover(&self) -> leasehold_core::Result<()> {
        let replica = self
            .replica
            .as_ref()
            .ok_or_else(|| harness_error("no replica"))?;
        *self.url.lock().unwrap() = url(replica);
        *self.failed_over.lock().unwrap() = true;
        Ok(())
    }
}

/// What is left in Redis for a key: a lock key (the fence counter stays on purpose).
struct RedisResidue(Arc<Mutex<String>>);

#[async_trait]
impl Residue for RedisResidue {
    async fn leftovers(&self, key: &LockKey) -> leasehold_core::Result<Vec<String>> {
        let url = self.0.lock().unwrap().clone();
        let plain = url.split('?').next().unwrap_or(&url).to_string();
        let mut conn = redis::Client::open(plain)
            .map_err(harness_error)?
            .get_multiplexed_async_connection()
            .await
            .map_err(harness_error)?;
        let lock_key = KeyLayout::default().lock_key(key);
        let pttl: i64 = redis::cmd("PTTL")
            .arg(&lock_key)
            .query_async(&mut conn)
            .await
            .map_err(harness_error)?;
        Ok(match pttl {
            -2 => vec![],
            ttl => vec![format!("lock key {lock_key} with PTTL {ttl}")],
        })
    }
}

/// With `LEASEHOLD_REDIS_URL` set (external mode, e.g. docker compose), the suite runs against
/// that server without faults, which then show as not applicable; otherwise against a managed
/// primary and replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_the_conformance_suite_with_faults() {
    if let Some(external) = leasehold_servers::external::redis_url() {
        let sep = if external.contains('?') { '&' } else { '?' };
        let url = Arc::new(Mutex::new(format!("{external}{sep}timeout_ms=1000")));
        let ctx = Context::new(Arc::new(Clients(url))).await.unwrap();
        let report = run_all("redis (external)", &ctx).await;
        println!("{report}");
        report.assert_passed();
        return;
    }
    let (primary, replica) = start_pair().await;
    let (faults, url) = RedisFaults::new(primary, Some(replica));
    let ctx = Context::new(Arc::new(Clients(url.clone())))
        .await
        .unwrap()
        .with_residue(Arc::new(RedisResidue(url)))
        .with_faults(Arc::new(faults));
    let report = run_all("redis", &ctx).await;
    println!("{report}");
    report.assert_passed();
    for line in &report.lines {
        let expected = match line.scenario {
            // Declared in the capabilities, and shown: a restart without persistence resets the
            // counter (and so the election's epochs); a failover reissues a fence.
            "fences_survive_restart"
            | "election_epochs_survive_restart"
            | "fences_survive_failover" => {
                assert!(
                    matches!(line.outcome, Ok(Verdict::Declared(_))),
                    "{}:\n{report}",
                    line.scenario
                );
                continue;
            }
            _ => Ok(Verdict::Passed),
        };
        assert_eq!(line.outcome, expected, "{}:\n{report}", line.scenario);
    }
}

/// The Redis authority, claiming linearizable fences it does not have.
#[derive(Debug)]
struct Liar {
    inner: RedisAuthority,
    capabilities: Capabilities,
}

impl Liar {
    fn lie(grant: Grant) -> leasehold_core::Result<Grant> {
        let fence = Fence::from_value(grant.fence().value(), FenceSafety::Linearizable)?;
        Ok(Grant::new(
            grant.key().clone(),
            grant.owner(),
            fence,
            grant.ttl(),
            grant.deadline(),
        ))
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl Authority for Liar {
    fn capabilities(&self) -> &Capabilities {
        &self.capabilities
    }

    async fn try_acquire(
        &self,
        key: &LockKey,
        ttl: Duration,
    ) -> leasehold_core::Result<Option<Grant>> {
        self.inner
            .try_acquire(key, ttl)
            .await?
            .map(Liar::lie)
            .transpose()
    }

    async fn acquire(
        &self,
        key: &LockKey,
        ttl: Duration,
        max_wait: Duration,
    ) -> leasehold_core::Result<Grant> {
        Liar::lie(self.inner.acquire(key, ttl, max_wait).await?)
    }

    async fn renew(&self, grant: &Grant, ttl: Duration) -> leasehold_core::Result<Instant> {
        self.inner.renew(grant, ttl).await
    }

    async fn release(&self, grant: &Grant) -> leasehold_core::Result<Released> {
        self.inner.release(grant).await
    }

    async fn renew_many(&self, grants: &[Grant]) -> Vec<leasehold_core::Result<Instant>> {
        self.inner.renew_many(grants).await
    }

    async fn inspect(&self, key: &LockKey) -> leasehold_core::Result<leasehold_core::Inspection> {
        self.inner.inspect(key).await
    }

    async fn list_keys(
        &self,
        prefix: &leasehold_core::KeyPrefix,
        limit: usize,
    ) -> leasehold_core::Result<Vec<LockKey>> {
        self.inner.list_keys(prefix, limit).await
    }

    async fn proclaim(&self, grant: &Grant, value: &[u8]) -> leasehold_core::Result<()> {
        self.inner.proclaim(grant, value).await
    }

    async fn wait_for_change(
        &self,
        key: &LockKey,
        max_wait: Duration,
    ) -> leasehold_core::Result<()> {
        self.inner.wait_for_change(key, max_wait).await
    }

    async fn close(&self) -> leasehold_core::Result<()> {
        self.inner.close().await
    }
}

struct LyingClients(Arc<Mutex<String>>);

#[async_trait]
impl Connector for LyingClients {
    async fn connect(&self) -> leasehold_core::Result<Arc<dyn Authority>> {
        let url = self.0.lock().unwrap().clone();
        let inner = RedisAuthority::connect(&url).await?;
        let mut capabilities = inner.capabilities().clone();
        capabilities.fence_safety = FenceSafety::Linearizable;
        Ok(Arc::new(Liar {
            inner,
            capabilities,
        }))
    }
}

/// The same failover, against a Redis authority that declares linearizable fences: the
/// scenario must fail it (the honest one gets DECLARED in the suite above). Its fences are
/// otherwise consistent with what it declares, so it is the failover that catches it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_authority_that_claims_linearizable_fences_fails_the_failover_scenario() {
    let (primary, replica) = start_pair().await;
    let (faults, url) = RedisFaults::new(primary, Some(replica));
    let ctx = Context::new(Arc::new(LyingClients(url)))
        .await
        .unwrap()
        .with_faults(Arc::new(faults));
    assert_eq!(ctx.capabilities().fence_safety, FenceSafety::Linearizable);
    assert_eq!(scenarios::fences_increase(&ctx).await, Ok(Verdict::Passed));
    let outcome = scenarios::fences_survive_failover(&ctx).await;
    println!("lying redis, fences_survive_failover: {outcome:?}");
    let failure =
        outcome.expect_err("a failover-unsafe backend that claims linearizable fences must fail");
    assert!(failure.0.contains("declared linearizable"), "{failure}");
}

/// Without persistence, a crash resets the fence counter: declared, and shown. Raising the
/// deployment epoch afterwards puts every new fence above every old one again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_without_persistence_resets_the_counter_as_declared() {
    let server = start().await;
    let a = RedisAuthority::connect(&url(&server)).await.unwrap();
    assert!(!a.capabilities().durable_fences);
    assert_eq!(a.capabilities().fence_safety, FenceSafety::FailoverUnsafe);
    let key = LockKey::new("restart").unwrap();
    let ttl = Duration::from_secs(5);
    let mut before = Vec::new();
    for _ in 0..3 {
        let g = a.try_acquire(&key, ttl).await.unwrap().unwrap();
        assert_eq!(g.fence().safety(), FenceSafety::FailoverUnsafe);
        before.push(g.fence());
        assert_eq!(a.release(&g).await.unwrap(), Released::Released);
    }
    assert!(before.windows(2).all(|w| w[1] > w[0]), "{before:?}");
    {
        let s = server.clone();
        blocking(move || s.restart()).await.unwrap();
    }
    let b = RedisAuthority::connect(&url(&server)).await.unwrap();
    let after = b.try_acquire(&key, ttl).await.unwrap().unwrap();
    assert_eq!(
        after.fence().raw(),
        1,
        "the counter starts again after a restart"
    );
    assert!(
        after.fence() < before[2],
        "{:?} after, {:?} before",
        after.fence(),
        before
    );
    assert_eq!(b.release(&after).await.unwrap(), Released::Released);

    let bumped = RedisAuthority::connect(&format!("{}&epoch=1", url(&server)))
        .await
        .unwrap();
    let g = bumped.try_acquire(&key, ttl).await.unwrap().unwrap();
    assert!(
        g.fence() > before[2],
        "epoch 1: {:?} vs {:?}",
        g.fence(),
        before[2]
    );
    assert_eq!(g.fence().epoch().get(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_credentials_are_unauthorized_and_never_printed() {
    let server = blocking(|| RedisServer::start_with_password("s3cret-pw"))
        .await
        .unwrap();
    let good = format!("{}?timeout_ms=2000", server.url_with_password("s3cret-pw"));
    let a = RedisAuthority::connect(&good).await.unwrap();
    assert!(!format!("{a:?} {:?}", a.config()).contains("s3cret"));
    let key = LockKey::new("auth").unwrap();
    assert!(a
        .try_acquire(&key, Duration::from_secs(1))
        .await
        .unwrap()
        .is_some());

    let wrong = format!(
        "{}?timeout_ms=2000",
        server.url_with_password("hunter2-wrong")
    );
    let started = Instant::now();
    let err = RedisAuthority::connect(&wrong).await.unwrap_err();
    assert!(
        matches!(err, Error::Unauthorized { .. }) && !err.is_retryable(),
        "{err:?}"
    );
    // At once, not after retries: a refused password is not an outage.
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "took {:?}",
        started.elapsed()
    );
    assert!(!format!("{err} {err:?}").contains("hunter2"), "{err:?}");

    let none = format!("redis://127.0.0.1:{}?timeout_ms=2000", server.port());
    let err = RedisAuthority::connect(&none).await.unwrap_err();
    assert!(matches!(err, Error::Unauthorized { .. }), "{err:?}");

    // ACL users: the right one works, an unknown one is refused, and one that may not run
    // scripts is refused at its first acquisition.
    let plain = start().await;
    command(
        &plain,
        &[
            "ACL",
            "SETUSER",
            "locker",
            "on",
            ">locker-pw",
            "~*",
            "&*",
            "+@all",
        ],
    )
    .await;
    command(
        &plain,
        &[
            "ACL",
            "SETUSER",
            "reader",
            "on",
            ">reader-pw",
            "~*",
            "&*",
            "+@read",
            "+ping",
        ],
    )
    .await;
    let acl = |user: &str, pw: &str| {
        format!(
            "redis://{user}:{pw}@127.0.0.1:{}?timeout_ms=2000",
            plain.port()
        )
    };
    let locker = RedisAuthority::connect(&acl("locker", "locker-pw"))
        .await
        .unwrap();
    let g = locker
        .try_acquire(&key, Duration::from_secs(1))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(locker.release(&g).await.unwrap(), Released::Released);
    let err = RedisAuthority::connect(&acl("nobody", "locker-pw"))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Unauthorized { .. }), "{err:?}");
    let err = RedisAuthority::connect(&acl("locker", "hunter2"))
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::Unauthorized { .. }) && !format!("{err:?}").contains("hunter2"),
        "{err:?}"
    );
    let reader = RedisAuthority::connect(&acl("reader", "reader-pw"))
        .await
        .unwrap();
    let err = reader
        .try_acquire(&key, Duration::from_secs(1))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Unauthorized { .. }), "{err:?}");
    assert!(!format!("{err:?}").contains("reader-pw"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_or_frozen_server_is_unavailable_within_the_timeout() {
    let port = free_port().unwrap();
    let started = Instant::now();
    let err = RedisAuthority::connect(&format!("redis://127.0.0.1:{port}?timeout_ms=500"))
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::Unavailable { .. }) && err.is_retryable(),
        "{err:?}"
    );
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "took {:?}",
        started.elapsed()
    );

    // A frozen server accepts the TCP connection (the kernel does) but never answers.
    let server = start().await;
    {
        let s = server.clone();
        blocking(move || s.pause()).await.unwrap();
    }
    let started = Instant::now();
    let err = RedisAuthority::connect(&format!("{}?timeout_ms=500", server.url()))
        .await
        .unwrap_err();
    let took = started.elapsed();
    {
        let s = server.clone();
        blocking(move || s.resume()).await.unwrap();
    }
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
    assert!(
        took >= Duration::from_millis(450) && took < Duration::from_millis(1500),
        "took {took:?}"
    );
}

/// The server freezes while an acquisition is on the wire. The client gets `Unavailable`
/// within its timeout; when the server resumes it runs that acquisition after all (the fence
/// counter moved), and the compare-and-delete the client queued behind it frees the key at
/// once, long before the lease's TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_frozen_mid_acquire_leaves_no_lock_behind() {
    let server = start().await;
    let a = RedisAuthority::connect(&format!("{}?timeout_ms=500", server.url()))
        .await
        .unwrap();
    let key = LockKey::new("frozen").unwrap();
    let ttl = Duration::from_secs(20);
    // Warm the script cache, so the frozen request is the acquisition itself.
    let warm = a.try_acquire(&key, ttl).await.unwrap().unwrap();
    assert_eq!(a.release(&warm).await.unwrap(), Released::Released);
    {
        let s = server.clone();
        blocking(move || s.pause()).await.unwrap();
    }
    let started = Instant::now();
    let err = a.try_acquire(&key, ttl).await.unwrap_err();
    let took = started.elapsed();
    {
        let s = server.clone();
        blocking(move || s.resume()).await.unwrap();
    }
    assert!(
        matches!(err, Error::Unavailable { .. }) && err.is_retryable(),
        "{err:?}"
    );
    assert!(took < Duration::from_millis(1500), "took {took:?}");

    let layout = KeyLayout::default();
    let mut con = raw(&server).await;
    let resumed = Instant::now();
    loop {
        let (holder, fence): (Option<String>, Option<u64>) = redis::pipe()
            .get(layout.lock_key(&key))
            .get(layout.fence_key(&key))
            .query_async(&mut con)
            .await
            .unwrap();
        if holder.is_none() && fence == Some(2) {
            break;
        }
        assert!(
            resumed.elapsed() < ttl / 10,
            "after the resume: holder {holder:?}, fence counter {fence:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let g = a
        .try_acquire(&key, ttl)
        .await
        .unwrap()
        .expect("the key is free");
    assert_eq!(g.fence().raw(), 3);
}

/// A client that follows the plain convention on the same Redis key excludes leasehold and is
/// excluded by it, and a plain compare-and-delete with leasehold's token releases it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interoperates_with_the_plain_set_nx_px_convention() {
    let server = start().await;
    let a = RedisAuthority::connect(&url(&server)).await.unwrap();
    let mut con = raw(&server).await;
    let key = LockKey::new("invoice:inv_72").unwrap();
    let lock_key = "{leasehold:invoice:inv_72}";
    assert_eq!(a.config().layout().lock_key(&key), lock_key);
    let ttl = Duration::from_secs(10);
    let compare_and_delete = redis::Script::new(
        "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0",
    );

    // Plain holder first.
    let set: Option<String> = redis::cmd("SET")
        .arg(lock_key)
        .arg("plain-token")
        .arg("NX")
        .arg("PX")
        .arg(10_000)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(set.as_deref(), Some("OK"));
    assert!(a.try_acquire(&key, ttl).await.unwrap().is_none());
    // inspect shows the plain holder as a peer (its value is not an owner token, and it raised
    // no counter, so it has no fence), with its PTTL, and never its value.
    let seen = a.inspect(&key).await.unwrap();
    assert!(seen.held && seen.fence.is_none(), "{seen:?}");
    assert_eq!(
        seen.owner.as_ref().map(|o| o.as_str()),
        Some("peer:foreign")
    );
    assert!(seen
        .remaining
        .is_some_and(|r| r > Duration::from_secs(9) && r <= ttl));
    assert!(!format!("{seen:?}").contains("plain-token"));
    let err = a
        .acquire(&key, ttl, Duration::from_millis(200))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Timeout { .. }), "{err:?}");
    let deleted: i64 = compare_and_delete
        .key(lock_key)
        .arg("plain-token")
        .invoke_async(&mut con)
        .await
        .unwrap();
    assert_eq!(deleted, 1);

    // leasehold holder: the value is exactly the owner token, and the fence is the counter.
    let g = a.try_acquire(&key, ttl).await.unwrap().unwrap();
    let value: String = redis::cmd("GET")
        .arg(lock_key)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(value, g.owner().to_hex());
    let counter: u64 = redis::cmd("GET")
        .arg("{leasehold:invoice:inv_72}:fence")
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(counter, g.fence().raw());
    let pttl: i64 = redis::cmd("PTTL")
        .arg(lock_key)
        .query_async(&mut con)
        .await
        .unwrap();
    assert!(pttl > 9_000 && pttl <= 10_000, "{pttl}");
    let set: Option<String> = redis::cmd("SET")
        .arg(lock_key)
        .arg("plain-token")
        .arg("NX")
        .arg("PX")
        .arg(10_000)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(set, None, "the plain client must be excluded");
    let wrong: i64 = compare_and_delete
        .key(lock_key)
        .arg("plain-token")
        .invoke_async(&mut con)
        .await
        .unwrap();
    assert_eq!(wrong, 0);
    let deleted: i64 = compare_and_delete
        .key(lock_key)
        .arg(g.owner().to_hex())
        .invoke_async(&mut con)
        .await
        .unwrap();
    assert_eq!(
        deleted, 1,
        "a plain compare-and-delete with leasehold's token releases it"
    );
    assert!(a.renew(&g, ttl).await.unwrap_err().is_lease_lost());
    assert_eq!(a.release(&g).await.unwrap(), Released::AlreadyGone);
    let next = a.try_acquire(&key, ttl).await.unwrap().unwrap();
    assert!(next.fence() > g.fence());
}

/// `(calls, failed_calls)` of a command from `INFO commandstats`.
async fn calls(server: &Arc<RedisServer>, command_name: &str) -> (u64, u64) {
    let info = command(server, &["INFO", "commandstats"]).await;
    let Some(stats) = info_field(&info, &format!("cmdstat_{command_name}")) else {
        return (0, 0);
    };
    let get = |name: &str| {
        stats
            .split(',')
            .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (get("calls"), get("failed_calls"))
}

/// Each step is one `EVALSHA`; after the server forgot the scripts, one `EVAL` per script
/// brings them back, and then it is `EVALSHA` alone again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_cost_one_round_trip_and_survive_a_flushed_script_cache() {
    let server = start().await;
    let a = RedisAuthority::connect(&url(&server)).await.unwrap();
    let key = LockKey::new("round-trips").unwrap();
    let ttl = Duration::from_secs(5);
    let pair = || async {
        let g = a.try_acquire(&key, ttl).await.unwrap().unwrap();
        let _ = a.renew(&g, ttl).await.unwrap();
        assert_eq!(a.release(&g).await.unwrap(), Released::Released);
    };
    pair().await; // loads the three scripts
    let (sha0, eval0) = (
        calls(&server, "evalsha").await,
        calls(&server, "eval").await,
    );
    for _ in 0..20 {
        pair().await;
    }
    let (sha1, eval1) = (
        calls(&server, "evalsha").await,
        calls(&server, "eval").await,
    );
    assert_eq!(sha1.0 - sha0.0, 60, "one EVALSHA per step");
    assert_eq!(sha1.1, sha0.1, "no failed EVALSHA");
    assert_eq!(eval1, eval0, "no EVAL while the scripts are cached");

    command(&server, &["SCRIPT", "FLUSH"]).await;
    pair().await;
    let (sha2, eval2) = (
        calls(&server, "evalsha").await,
        calls(&server, "eval").await,
    );
    assert_eq!(eval2.0 - eval1.0, 3, "each script sent in full once");
    assert_eq!(sha2.0 - sha1.0, 3);
    pair().await;
    assert_eq!(calls(&server, "eval").await, eval2, "and then by SHA again");
}

/// 200 leases held through one authority renew as one script call per renewal tick
/// (counted by the server), and a lease whose key was deleted behind its back is refused in its
/// batch and lost while the other 199 stay held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_leases_renew_in_one_script_call_per_tick() {
    let server = start().await;
    let a: Arc<dyn Authority> = Arc::new(RedisAuthority::connect(&url(&server)).await.unwrap());
    let ttl = Duration::from_millis(1500);
    let mut leases = Vec::new();
    for i in 0..200 {
        let key = LockKey::new(format!("batched/{i}")).unwrap();
        leases.push(
            Lease::try_acquire(a.clone(), &key, ttl, LeaseOptions::default())
                .await
                .unwrap()
                .unwrap(),
        );
    }
    // Let the first tick align them, then count three ticks.
    tokio::time::sleep(ttl / 2).await;
    let before = calls(&server, "evalsha").await.0;
    tokio::time::sleep(ttl).await;
    let calls_in_three_ticks = calls(&server, "evalsha").await.0 - before;
    assert!(
        (2..=5).contains(&calls_in_three_ticks),
        "{calls_in_three_ticks} script calls renewed 200 leases for three ticks"
    );
    let victim = leases.remove(17);
    let lock_key = KeyLayout::default().lock_key(victim.key());
    command(&server, &["DEL", &lock_key]).await;
    let reason = tokio::time::timeout(ttl, victim.lost()).await.unwrap();
    assert!(matches!(reason, LostReason::Refused), "{reason:?}");
    tokio::time::sleep(ttl / 2).await;
    assert!(leases.iter().all(|l| l.state().is_held()));
    let mut con = raw(&server).await;
    let ttl_left: i64 = redis::cmd("PTTL")
        .arg(KeyLayout::default().lock_key(leases[0].key()))
        .query_async(&mut con)
        .await
        .unwrap();
    assert!(
        ttl_left > 0,
        "the first lease's key has no TTL left: {ttl_left}"
    );
}

/// An `acquire` that finds the key free takes it without subscribing: once an authority's
/// subscription exists, every release announced on the channel is delivered to it, which cost
/// each uncontended pair 11 % on one core. The first caller that has to wait
/// subscribes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_that_need_not_wait_does_not_subscribe() {
    let server = start().await;
    let a = Arc::new(RedisAuthority::connect(&url(&server)).await.unwrap());
    let mut con = raw(&server).await;
    let key = LockKey::new("free").unwrap();
    for _ in 0..3 {
        let grant = a
            .acquire(&key, Duration::from_secs(5), Duration::from_secs(1))
            .await
            .unwrap();
        let _ = a.release(&grant).await.unwrap();
    }
    assert_eq!(subscribers(&mut con).await, Some(redis::Value::Int(0)));

    let held = a
        .try_acquire(&key, Duration::from_secs(5))
        .await
        .unwrap()
        .unwrap();
    let waiter = {
        let (a, key) = (a.clone(), key.clone());
        tokio::spawn(async move {
            a.acquire(&key, Duration::from_secs(5), Duration::from_secs(5))
                .await
        })
    };
    let up = Instant::now();
    while subscribers(&mut con).await != Some(redis::Value::Int(1)) {
        assert!(
            up.elapsed() < Duration::from_secs(5),
            "the waiter never subscribed"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let _ = a.release(&held).await.unwrap();
    let grant = waiter.await.unwrap().unwrap();
    assert!(grant.fence() > held.fence());
}

/// All waiters of an authority share one subscription connection. A holder that never
/// announces its end (a plain client's lease expiring) is found by retries whose backoff is
/// bounded: no waiter gets the key before the lease ends, and none spins meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_share_one_subscription_and_retry_silent_holders_with_bounded_backoff() {
    let server = start().await;
    let a = Arc::new(RedisAuthority::connect(&url(&server)).await.unwrap());
    let mut con = raw(&server).await;
    let ttl = Duration::from_secs(5);
    let hold = Duration::from_millis(800);
    let keys: Vec<LockKey> = (0..5)
        .map(|i| LockKey::new(format!("silent-{i}")).unwrap())
        .collect();
    for key in &keys {
        let _: () = redis::cmd("SET")
            .arg(a.config().layout().lock_key(key))
            .arg("plain")
            .arg("PX")
            .arg(hold.as_millis() as u64)
            .query_async(&mut con)
            .await
            .unwrap();
    }
    let (sha0, _) = calls(&server, "evalsha").await;
    let started = Instant::now();
    let waiters: Vec<_> = keys
        .iter()
        .map(|key| {
            let (a, key) = (a.clone(), key.clone());
            tokio::spawn(async move {
                let g = a.acquire(&key, ttl, Duration::from_secs(5)).await;
                (g, started.elapsed())
            })
        })
        .collect();
    tokio::time::sleep(hold / 2).await;
    let numsub = subscribers(&mut con).await;
    assert_eq!(
        numsub,
        Some(redis::Value::Int(1)),
        "one subscription for five waiters: {numsub:?}"
    );
    // A waiter's retry delays are at least 10, 20, 40, 75 ms, then 150 ms each (half of each
    // backoff step); add its first attempt, the one after the subscription came up and the one
    // at the holder's expiry.
    let mut most_attempts = 0;
    for w in waiters {
        let (g, at) = w.await.unwrap();
        g.unwrap();
        assert!(
            at >= hold - Duration::from_millis(50) && at < hold + Duration::from_millis(700),
            "got it after {at:?}"
        );
        most_attempts += 7 + at.as_millis() / 150;
    }
    let (sha1, _) = calls(&server, "evalsha").await;
    println!("{} attempts by 5 waiters in {hold:?}", sha1 - sha0);
    assert!(
        u128::from(sha1 - sha0) <= most_attempts,
        "{} attempts by 5 waiters, more than their backoff allows ({most_attempts})",
        sha1 - sha0
    );
    drop(a);
    let dropped = Instant::now();
    loop {
        let numsub = subscribers(&mut con).await;
        if numsub == Some(redis::Value::Int(0)) {
            break;
        }
        assert!(
            dropped.elapsed() < Duration::from_secs(2),
            "the subscription outlived its authority"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The most attempts a waiter's timer can make within `elapsed` once it waits: its backoff
/// delays are at least 10, 20, 40 and 75 ms, then 150 ms each (half of each step is fixed).
fn timer_attempts_within(elapsed: Duration) -> u64 {
    let mut at = Duration::ZERO;
    let mut attempts = 0;
    for step in [10, 20, 40, 75].into_iter().chain(std::iter::repeat(150)) {
        at = at.saturating_add(Duration::from_millis(step));
        if at > elapsed {
            return attempts + 1;
        }
        attempts += 1;
    }
    attempts
}

/// A release wakes one waiter of the key in this authority, not every one: 50 waiters take the
/// key in turn, each releasing it at once, and the attempts counted at the server (`EVALSHA` in
/// `INFO commandstats`) are one per hand-off plus the releases, within what the waiters' own
/// timers can add over the same time. Waking every waiter costs one attempt per remaining
/// waiter per hand-off (about 1,275 for the chain).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_one_waiter_not_all() -> Result<(), String> {
    const WAITERS: u64 = 50;
    let server = start().await;
    let e = |what: &'static str| move |e: Error| format!("{what}: {e}");
    let holder = RedisAuthority::connect(&url(&server))
        .await
        .map_err(e("connect"))?;
    let a = Arc::new(
        RedisAuthority::connect(&url(&server))
            .await
            .map_err(e("connect"))?,
    );
    let key = LockKey::new("handoff-50").map_err(|e| e.to_string())?;
    let ttl = Duration::from_secs(30);
    let first = holder
        .try_acquire(&key, ttl)
        .await
        .map_err(e("holder"))?
        .ok_or("the fresh key is held")?;
    let (sha0, _) = calls(&server, "evalsha").await;
    let started = Instant::now();
    let waiters: Vec<_> = (0..WAITERS)
        .map(|_| {
            let (a, key) = (a.clone(), key.clone());
            tokio::spawn(async move {
                let grant = a
                    .acquire(&key, ttl, Duration::from_secs(120))
                    .await
                    .map_err(|e| format!("acquire: {e}"))?;
                match a.release(&grant).await {
                    Ok(Released::Released) => Ok(()),
                    other => Err(format!("the waiter's release: {other:?}")),
                }
            })
        })
        .collect();
    // Every waiter is waiting once it made its first attempt and the one after subscribing.
    loop {
        let (sha, _) = calls(&server, "evalsha").await;
        if sha - sha0 >= 2 * WAITERS {
            break;
        }
        if started.elapsed() > Duration::from_secs(20) {
            return Err(format!("only {} attempts by {WAITERS} waiters", sha - sha0));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    match holder.release(&first).await {
        Ok(Released::Released) => {}
        other => return Err(format!("the holder's release: {other:?}")),
    }
    for waiter in waiters {
        waiter.await.map_err(|e| e.to_string())??;
    }
    let elapsed = started.elapsed();
    let (sha1, _) = calls(&server, "evalsha").await;
    let spent = sha1 - sha0;
    // Per waiter: two attempts before it waits, its timer's, and its release; per hand-off:
    // the woken waiter's attempt and one more woken by the same release's announcement when
    // it arrives after that attempt ended; the holder's release.
    let allowed = WAITERS * (3 + timer_attempts_within(elapsed)) + 2 * WAITERS + 1;
    println!(
        "{spent} EVALSHA for {WAITERS} hand-offs in {elapsed:?} ({:.1} per hand-off beyond the \
         waiters' first two attempts and their releases); allowed {allowed}",
        spent.saturating_sub(3 * WAITERS + 1) as f64 / WAITERS as f64
    );
    if spent > allowed {
        return Err(format!(
            "{spent} EVALSHA for {WAITERS} hand-offs in {elapsed:?}: more than one attempt per \
             hand-off and the waiters' timers allow ({allowed})"
        ));
    }
    Ok(())
}

/// Three rounds of: the authority `a` holds `key`, two of its waiters wait until their backoff
/// is at its cap, the fence counter is set to `poison` so that every attempt fails, and the
/// holder releases. Nothing but the authority itself wakes its waiters: its ACL user has no
/// channel rights (releases are not announced, the subscription is refused), so the release
/// wakes them through the authority alone. Both waiters must end with an error `expected`
/// accepts within 100 ms of the release: two thirds of the shortest delay of a grown backoff
/// (150 ms), so a waiter left to its timer, ending at a random point of its 150-300 ms step,
/// is inside the bound less than half the time in each round.
async fn failing_waiters_end_at_once(
    server: &Arc<RedisServer>,
    poison: &str,
    expected: fn(&Error) -> bool,
) -> Result<(), String> {
    let s = server.clone();
    blocking(move || s.command(&["ACL", "SETUSER", "mute", "on", ">mute-pw", "~*", "+@all"]))
        .await
        .map_err(|e| format!("ACL SETUSER: {e}"))?;
    let acl_url = format!(
        "redis://mute:mute-pw@127.0.0.1:{}?timeout_ms=1000",
        server.port()
    );
    let a = Arc::new(
        RedisAuthority::connect(&acl_url)
            .await
            .map_err(|e| format!("connect: {e}"))?,
    );
    let key = LockKey::new("failing-waiters").map_err(|e| e.to_string())?;
    let ttl = Duration::from_secs(30);
    let bound = Duration::from_millis(100);
    let set_counter = |value: String| {
        let (s, fence_key) = (server.clone(), a.config().layout().fence_key(&key));
        blocking(move || s.command(&["SET", &fence_key, &value]))
    };
    for round in 1..=3 {
        set_counter("1".into())
            .await
            .map_err(|e| format!("SET the counter: {e}"))?;
        let held = a
            .try_acquire(&key, ttl)
            .await
            .map_err(|e| format!("the holder: {e}"))?
            .ok_or("the key is held")?;
        set_counter(poison.to_string())
            .await
            .map_err(|e| format!("SET the counter: {e}"))?;
        let (sha0, _) = calls(server, "evalsha").await;
        let waiters: Vec<_> = (0..2)
            .map(|_| {
                let (a, key) = (a.clone(), key.clone());
                tokio::spawn(async move {
                    let answer = a.acquire(&key, ttl, Duration::from_secs(60)).await;
                    (answer, Instant::now())
                })
            })
            .collect();
        // Each waiter's first two attempts and five timer attempts: its backoff (steps of 20,
        // 40, 80, 160 and 300 ms) is then at its cap.
        let started = Instant::now();
        loop {
            let (sha, _) = calls(server, "evalsha").await;
            if sha - sha0 >= 2 * 7 {
                break;
            }
            if started.elapsed() > Duration::from_secs(20) {
                return Err(format!("the waiters made only {} attempts", sha - sha0));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let released = Instant::now();
        match a.release(&held).await {
            Ok(Released::Released) => {}
            other => return Err(format!("the holder's release: {other:?}")),
        }
        for waiter in waiters {
            let (answer, ended) = tokio::time::timeout(Duration::from_secs(5), waiter)
                .await
                .map_err(|_| "a waiter was never woken".to_string())?
                .map_err(|e| e.to_string())?;
            let after = ended.saturating_duration_since(released);
            match answer {
                Err(e) if expected(&e) && after < bound => {}
                other => {
                    return Err(format!(
                        "round {round}: a waiter ended {after:?} after the release with \
                         {other:?}; expected its error within {bound:?}"
                    ))
                }
            }
        }
    }
    Ok(())
}

/// A release hands the key's turn to one waiter of the authority; one whose attempt then fails
/// (here the acquire script finds the counter is no integer, and takes nothing) passes the turn
/// on, so the next waiter tries at once rather than at its timer. Without the passing on, a
/// waiter ended 151 and 158 ms after the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_attempt_fails_passes_its_turn_on() -> Result<(), String> {
    let server = start().await;
    failing_waiters_end_at_once(&server, "not a number", |e| {
        matches!(
            e,
            Error::Backend {
                retryable: false,
                ..
            }
        )
    })
    .await
}

/// An attempt that won but cannot use its grant (its fence out of range) gives the lease back
/// in the background; that give-back wakes this authority's waiters as a release does, since
/// the waiter handed the turn next may have found the lease not yet given back, and no
/// announcement follows where publishing is refused. Without that wake-up the second waiter
/// ends at its timer in some runs (174 to 215 ms after the release; one to two runs of three).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_given_back_after_a_failed_attempt_wakes_the_next_waiter() -> Result<(), String> {
    let server = start().await;
    let largest = ((1u64 << 48) - 1).to_string();
    failing_waiters_end_at_once(&server, &largest, |e| {
        matches!(e, Error::FenceOutOfRange { .. })
    })
    .await
}

/// The subscription connection is killed, and the holder releases while it is down: the
/// announcement is lost, yet the waiter gets the key at once after the subscription is back,
/// not after the holder's TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_while_the_subscription_is_down_is_not_missed() {
    let server = start().await;
    let holder = RedisAuthority::connect(&url(&server)).await.unwrap();
    let waiter = Arc::new(RedisAuthority::connect(&url(&server)).await.unwrap());
    let key = LockKey::new("outage").unwrap();
    let ttl = Duration::from_secs(20);
    let held = holder.try_acquire(&key, ttl).await.unwrap().unwrap();
    let task = {
        let (waiter, key) = (waiter.clone(), key.clone());
        tokio::spawn(async move { waiter.acquire(&key, ttl, Duration::from_secs(10)).await })
    };
    let mut con = raw(&server).await;
    let subscribed = Instant::now();
    loop {
        let numsub = subscribers(&mut con).await;
        if numsub == Some(redis::Value::Int(1)) {
            break;
        }
        assert!(subscribed.elapsed() < Duration::from_secs(2));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(killed, 1);
    let released_at = Instant::now();
    assert_eq!(holder.release(&held).await.unwrap(), Released::Released);
    let g = tokio::time::timeout(Duration::from_secs(3), task)
        .await
        .expect("the waiter missed the release")
        .unwrap()
        .unwrap();
    assert!(g.fence() > held.fence());
    println!(
        "hand-off across a subscription outage: {:?}",
        released_at.elapsed()
    );
}

/// With `wait_replicas`, an acquisition returns only once a replica has it; when no replica
/// acknowledges in time the acquisition fails, retryably, and leaves no lock behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_replicas_confirms_or_gives_the_lock_back() {
    let (primary, replica) = start_pair().await;
    // Generous for the replica that answers (a loaded machine), short for the frozen one.
    let a = RedisAuthority::connect(&format!(
        "{}?timeout_ms=3000&wait_replicas=1&wait_timeout_ms=2000",
        primary.url()
    ))
    .await
    .unwrap();
    let impatient = RedisAuthority::connect(&format!(
        "{}?timeout_ms=1000&wait_replicas=1&wait_timeout_ms=200",
        primary.url()
    ))
    .await
    .unwrap();
    let layout = KeyLayout::default();
    let key = LockKey::new("replicated").unwrap();
    let ttl = Duration::from_secs(10);
    let g = a.try_acquire(&key, ttl).await.unwrap().unwrap();
    let mut on_replica = raw(&replica).await;
    let (value, fence): (Option<String>, Option<u64>) = redis::pipe()
        .get(layout.lock_key(&key))
        .get(layout.fence_key(&key))
        .query_async(&mut on_replica)
        .await
        .unwrap();
    assert_eq!(
        value,
        Some(g.owner().to_hex()),
        "the replica has the lock when acquire returns"
    );
    assert_eq!(fence, Some(g.fence().raw()));

    {
        let r = replica.clone();
        blocking(move || r.pause()).await.unwrap();
    }
    let other = LockKey::new("unreplicated").unwrap();
    let started = Instant::now();
    let err = impatient.try_acquire(&other, ttl).await.unwrap_err();
    let took = started.elapsed();
    {
        let r = replica.clone();
        blocking(move || r.resume()).await.unwrap();
    }
    assert!(
        matches!(
            err,
            Error::Backend {
                retryable: true,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("0 of 1 replicas"), "{err}");
    assert!(
        took >= Duration::from_millis(190) && took < Duration::from_millis(1500),
        "took {took:?}"
    );
    let mut on_primary = raw(&primary).await;
    let gave_back = Instant::now();
    loop {
        let holder: Option<String> = redis::cmd("GET")
            .arg(layout.lock_key(&other))
            .query_async(&mut on_primary)
            .await
            .unwrap();
        if holder.is_none() {
            break;
        }
        assert!(
            gave_back.elapsed() < Duration::from_secs(1),
            "the unconfirmed lock was kept"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(a.release(&g).await.unwrap(), Released::Released);
}

/// A fence counter that cannot be raised (an operator overwrote it with text) makes the
/// acquisition fail with a permanent error, and the script gives the fresh lease back before
/// answering: nothing is held by a client that got an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_fence_counter_fails_the_acquisition_and_holds_nothing() {
    let server = start().await;
    let a = RedisAuthority::connect(&url(&server)).await.unwrap();
    let key = LockKey::new("broken-counter").unwrap();
    let layout = a.config().layout().clone();
    let mut con = raw(&server).await;
    let _: () = redis::cmd("SET")
        .arg(layout.fence_key(&key))
        .arg("not a number")
        .query_async(&mut con)
        .await
        .unwrap();
    let err = a
        .try_acquire(&key, Duration::from_secs(10))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Backend {
                retryable: false,
                ..
            }
        ),
        "{err:?}"
    );
    let holder: Option<String> = redis::cmd("GET")
        .arg(layout.lock_key(&key))
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(holder, None, "the failed acquisition left a lease behind");
    // Repaired by hand, with a counter above every fence handed out: the lock works again.
    let _: () = redis::cmd("SET")
        .arg(layout.fence_key(&key))
        .arg(1000)
        .query_async(&mut con)
        .await
        .unwrap();
    let g = a
        .try_acquire(&key, Duration::from_secs(10))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(g.fence().raw(), 1001);
}

/// A Redis that speaks only TLS, with certificates made for the test (started with the
/// harness's process management, since its Redis servers are plain-text).
struct TlsRedis {
    port: u16,
    certs: leasehold_servers::TestCerts,
    _process: leasehold_servers::ManagedProcess,
}

fn start_tls_redis() -> TlsRedis {
    let certs = leasehold_servers::TestCerts::generate().unwrap();
    let file = |p: std::path::PathBuf| p.display().to_string();
    use leasehold_servers::process::{find_program, server_dir};
    use leasehold_servers::{CommandSpec, ManagedProcess, READY_TIMEOUT};
    let program = find_program("redis-server").expect("redis-server must be installed");
    let port = free_port().unwrap();
    let dir = server_dir("redis-tls").unwrap();
    let args = vec![
        "--port".to_string(),
        "0".into(),
        "--tls-port".into(),
        port.to_string(),
        "--bind".into(),
        "127.0.0.1".into(),
        "--tls-cert-file".into(),
        file(certs.server_cert()),
        "--tls-key-file".into(),
        file(certs.server_key()),
        "--tls-ca-cert-file".into(),
        file(certs.ca()),
        "--tls-auth-clients".into(),
        "no".into(),
        "--requirepass".into(),
        "tls-pw".into(),
        "--save".into(),
        String::new(),
        "--appendonly".into(),
        "no".into(),
        "--dir".into(),
        dir.path().display().to_string(),
    ];
    let process = ManagedProcess::spawn("redis-tls", dir, CommandSpec::new(program, args)).unwrap();
    process
        .wait_ready(READY_TIMEOUT, || {
            if process
                .current_log()
                .contains("Ready to accept connections")
            {
                Ok(())
            } else {
                Err("not ready yet".into())
            }
        })
        .expect("the TLS Redis must start for this test");
    TlsRedis {
        port,
        certs,
        _process: process,
    }
}

/// `rediss://` with the CA from the URL: acquire, hand-off through the (TLS) subscription,
/// release. Without that CA the certificate is refused; plain text to a TLS port fails; no
/// failure prints the password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_a_ca_from_the_url() {
    let server = blocking(start_tls_redis).await;
    let base = format!("rediss://:tls-pw@127.0.0.1:{}", server.port);
    let url = format!(
        "{base}?timeout_ms=2000&tls_ca_file={}",
        server.certs.ca().display()
    );
    let a = Arc::new(RedisAuthority::connect(&url).await.unwrap());
    let b = RedisAuthority::connect(&url).await.unwrap();
    let key = LockKey::new("tls").unwrap();
    let ttl = Duration::from_secs(10);
    let held = a.try_acquire(&key, ttl).await.unwrap().unwrap();
    let waiter = {
        let (a, key) = (a.clone(), key.clone());
        tokio::spawn(async move { a.acquire(&key, ttl, Duration::from_secs(5)).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let released = Instant::now();
    assert_eq!(b.release(&held).await.unwrap(), Released::Released);
    let next = waiter.await.unwrap().unwrap();
    assert!(
        released.elapsed() < ttl / 4,
        "the hand-off over TLS took {:?}",
        released.elapsed()
    );
    assert!(next.fence() > held.fence());

    let untrusted = RedisAuthority::connect(&format!("{base}?timeout_ms=2000"))
        .await
        .unwrap_err();
    assert!(
        matches!(untrusted, Error::Unavailable { .. }),
        "{untrusted:?}"
    );
    // Trusting another CA is no better.
    let other = leasehold_servers::TestCerts::generate().unwrap();
    let wrong_ca = RedisAuthority::connect(&format!(
        "{base}?timeout_ms=2000&tls_ca_file={}",
        other.ca().display()
    ))
    .await
    .unwrap_err();
    assert!(
        matches!(wrong_ca, Error::Unavailable { .. }),
        "{wrong_ca:?}"
    );
    let plain = RedisAuthority::connect(&format!(
        "redis://:tls-pw@127.0.0.1:{}?timeout_ms=500",
        server.port
    ))
    .await
    .unwrap_err();
    assert!(matches!(plain, Error::Unavailable { .. }), "{plain:?}");
    for err in [&untrusted, &wrong_ca, &plain] {
        assert!(!format!("{err} {err:?}").contains("tls-pw"), "{err:?}");
    }
    let missing = RedisAuthority::connect(&format!("{base}?tls_ca_file=/nonexistent/ca.pem"))
        .await
        .unwrap_err();
    assert!(
        matches!(missing, Error::InvalidConfig { .. }),
        "{missing:?}"
    );
}

/// `Duration::MAX` is how a caller says "wait forever". It must not panic (`Instant +
/// Duration` overflows): on a free key it acquires at once, and on a held key it waits until
/// the holder releases, against a real server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_with_duration_max_waits_forever_without_panicking() {
    let server = start().await;
    let a = Arc::new(RedisAuthority::connect(&url(&server)).await.unwrap());
    let holder = RedisAuthority::connect(&url(&server)).await.unwrap();
    let key = LockKey::new("forever").unwrap();
    let ttl = Duration::from_secs(10);

    let free = tokio::spawn({
        let (a, key) = (a.clone(), key.clone());
        async move { a.acquire(&key, ttl, Duration::MAX).await }
    })
    .await
    .expect("acquire on a free key with max_wait = Duration::MAX panicked")
    .unwrap();
    assert_eq!(a.release(&free).await.unwrap(), Released::Released);

    let held = holder.try_acquire(&key, ttl).await.unwrap().unwrap();
    let waiter = tokio::spawn({
        let (a, key) = (a.clone(), key.clone());
        async move { a.acquire(&key, ttl, Duration::MAX).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiter.is_finished(), "the waiter got a held key");
    let released_at = Instant::now();
    assert_eq!(holder.release(&held).await.unwrap(), Released::Released);
    // The release is announced: the waiter holds the key long before the holder's TTL would
    // have ended (half of it leaves room for a loaded machine).
    let got = tokio::time::timeout(ttl / 2, waiter)
        .await
        .expect("the waiter missed the release")
        .expect("acquire on a held key with max_wait = Duration::MAX panicked")
        .unwrap();
    assert!(got.fence() > held.fence());
    println!("hand-off with max_wait = MAX: {:?}", released_at.elapsed());
    assert_eq!(a.release(&got).await.unwrap(), Released::Released);
}

/// Huge durations in the URL (`timeout_ms`, `safety_margin_ms`, `wait_timeout_ms`) are either
/// refused as invalid or mean "very long"; none of them panics at connect, in a request or
/// while waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_durations_in_the_url_do_not_panic() {
    let server = start().await;
    let max = u64::MAX;
    let huge_timeout = format!("{}?timeout_ms={max}", server.url());
    let a = Arc::new(
        tokio::spawn(async move { RedisAuthority::connect(&huge_timeout).await })
            .await
            .expect("connect with timeout_ms = u64::MAX panicked")
            .unwrap(),
    );
    let key = LockKey::new("huge-url").unwrap();
    let ttl = Duration::from_secs(10);
    let (g, waited) = tokio::spawn({
        let (a, key) = (a.clone(), key.clone());
        async move {
            let g = a.try_acquire(&key, ttl).await.unwrap().unwrap();
            // Held by ourselves: the wait ends by max_wait, with the request timeout huge.
            let waited = a.acquire(&key, ttl, Duration::from_millis(100)).await;
            (g, waited)
        }
    })
    .await
    .expect("a request with timeout_ms = u64::MAX panicked");
    assert!(matches!(waited, Err(Error::Timeout { .. })), "{waited:?}");
    assert_eq!(a.release(&g).await.unwrap(), Released::Released);

    for params in [
        format!("safety_margin_ms={max}"),
        format!(
            "wait_replicas=1&wait_timeout_ms={}&timeout_ms={max}",
            max - 1
        ),
    ] {
        let url = format!("{}?{params}", server.url());
        let outcome = tokio::spawn(async move {
            match RedisAuthority::connect(&url).await {
                Ok(a) => {
                    let key = LockKey::new("huge-url-2").unwrap();
                    match a.try_acquire(&key, Duration::from_secs(1)).await {
                        Ok(Some(g)) => a.release(&g).await.map(|_| ()),
                        Ok(None) => panic!("nobody holds the key"),
                        Err(e) => Err(e),
                    }
                }
                Err(e) => Err(e),
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{params} panicked"));
        match outcome {
            Ok(()) => {}
            Err(e) => assert!(
                matches!(e, Error::InvalidUrl { .. } | Error::InvalidConfig { .. }),
                "{params}: {e:?}"
            ),
        }
    }
}

/// An ACL user created the Redis 7 way (`acl-pubsub-default resetchannels`: no channel rights
/// unless granted) may lock keys but not publish. Its release deletes the key and must say so,
/// not fail because the announcement was refused after the `DEL`; and a waiter of such a user
/// (whose subscription is refused too) still gets the key by retrying, well before the TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_by_an_acl_user_without_channel_rights_releases_and_hands_off() {
    let server = start().await;
    command(
        &server,
        &[
            "ACL",
            "SETUSER",
            "nochan",
            "on",
            ">nochan-pw",
            "~*",
            "+@all",
        ],
    )
    .await;
    // The precondition: this user may not publish on the release channel.
    let dry = {
        let s = server.clone();
        blocking(move || {
            s.command(&[
                "ACL",
                "DRYRUN",
                "nochan",
                "PUBLISH",
                "leasehold:released",
                "x",
            ])
        })
        .await
    };
    assert!(
        !matches!(dry.as_deref(), Ok("OK")),
        "the user must lack channel rights: {dry:?}"
    );
    let acl_url = format!(
        "redis://nochan:nochan-pw@127.0.0.1:{}?timeout_ms=1000",
        server.port()
    );
    let holder = RedisAuthority::connect(&acl_url).await.unwrap();
    let waiter = Arc::new(RedisAuthority::connect(&acl_url).await.unwrap());
    let key = LockKey::new("acl-release").unwrap();
    let lock_key = holder.config().layout().lock_key(&key);
    let ttl = Duration::from_secs(10);

    let held = holder.try_acquire(&key, ttl).await.unwrap().unwrap();
    let task = {
        let (waiter, key) = (waiter.clone(), key.clone());
        tokio::spawn(async move { waiter.acquire(&key, ttl, ttl).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!task.is_finished(), "the waiter got a held key");
    let released_at = Instant::now();
    let warnings = Warnings::default();
    let released = {
        // The release runs on this thread: its warning is collected here.
        let _guard = tracing::subscriber::set_default(warnings.clone());
        holder.release(&held).await
    };
    assert_eq!(
        released.as_ref().ok(),
        Some(&Released::Released),
        "release under an ACL without channel rights: {released:?}"
    );
    // The waiter's subscription is refused as well, so it finds the free key by retrying, not
    // by the holder's TTL: half of it leaves room for a loaded machine.
    let got = tokio::time::timeout(ttl / 2, task)
        .await
        .expect("the waiter waited for the TTL")
        .unwrap()
        .unwrap();
    println!(
        "hand-off without channel rights: {:?}",
        released_at.elapsed()
    );
    assert!(got.fence() > held.fence());
    let value = command(&server, &["GET", &lock_key]).await;
    assert_eq!(value, got.owner().to_hex(), "the waiter holds the key");
    assert_eq!(holder.release(&held).await.unwrap(), Released::AlreadyGone);
    let again = holder.try_acquire(&key, ttl).await;
    assert!(matches!(again, Ok(None)), "{again:?}");
    assert_eq!(waiter.release(&got).await.unwrap(), Released::Released);
    assert_eq!(command(&server, &["EXISTS", &lock_key]).await, "0");
    // One warning for the refused announcement, and only one, however many releases.
    let second = holder.try_acquire(&key, ttl).await.unwrap().unwrap();
    {
        let _guard = tracing::subscriber::set_default(warnings.clone());
        // A proclaim is announced the same way: refused, yet stored, and not warned twice.
        holder.proclaim(&second, b"10.0.0.9:80").await.unwrap();
        let seen = waiter.inspect(&key).await.unwrap();
        assert_eq!(seen.value.as_deref(), Some(&b"10.0.0.9:80"[..]));
        assert_eq!(holder.release(&second).await.unwrap(), Released::Released);
    }
    let warnings = warnings.taken();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].contains("announce"), "{warnings:?}");
    assert!(!warnings[0].contains("nochan-pw"), "{warnings:?}");
}

/// How many subscribers the release channel has (`PUBSUB NUMSUB`).
async fn subscribers(con: &mut MultiplexedConnection) -> Option<redis::Value> {
    let numsub: Vec<redis::Value> = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg("leasehold:released")
        .query_async(con)
        .await
        .unwrap();
    numsub.get(1).cloned()
}

/// Waits until the authority's subscription is on the release channel (`PUBSUB NUMSUB`).
async fn wait_subscribed(con: &mut MultiplexedConnection, count: i64) {
    let since = Instant::now();
    loop {
        let numsub = subscribers(con).await;
        if numsub == Some(redis::Value::Int(count)) {
            return;
        }
        assert!(
            since.elapsed() < Duration::from_secs(5),
            "no subscription: {numsub:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A holder that never announces its release (redis-py's `Lock`, any plain `SET NX PX` client,
/// or a leasehold release whose message was lost) deletes its key long before its TTL. A
/// waiter whose subscription is up must find the key free within its retry backoff, not sleep
/// until the expiry it saw at its first try.
///
/// The bound: the waiter holds the key less than TTL/2 after the delete. Retrying every few
/// hundred ms meets it with seconds to spare on a loaded machine. A waiter that sleeps until the
/// expiry it saw cannot: its first try is after the `SET`, so it wakes at the earliest at
/// `set + TTL`, which is `TTL - (delete - set)` after the delete; the test checks that
/// `delete - set < TTL/4`, so that is more than `3/4 TTL` after the delete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_holder_that_deletes_without_announcing_hands_off_well_before_its_ttl() {
    let server = start().await;
    let waiter = Arc::new(RedisAuthority::connect(&url(&server)).await.unwrap());
    let mut con = raw(&server).await;
    let key = LockKey::new("silent-plain-holder").unwrap();
    let lock_key = waiter.config().layout().lock_key(&key);
    let ttl = Duration::from_secs(8);
    let compare_and_delete = redis::Script::new(
        "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0",
    );

    let set_at = Instant::now();
    let set: Option<String> = redis::cmd("SET")
        .arg(&lock_key)
        .arg("0123456789abcdef0123456789abcdef")
        .arg("NX")
        .arg("PX")
        .arg(ttl.as_millis() as u64)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(set.as_deref(), Some("OK"));
    let task = {
        let (waiter, key) = (waiter.clone(), key.clone());
        tokio::spawn(async move { waiter.acquire(&key, ttl, ttl).await })
    };
    // The waiter's subscription is up: the announcement path is live, so this is not the
    // fallback for a subscription that is down.
    wait_subscribed(&mut con, 1).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!task.is_finished(), "the waiter got a held key");
    let deleted: i64 = compare_and_delete
        .key(&lock_key)
        .arg("0123456789abcdef0123456789abcdef")
        .invoke_async(&mut con)
        .await
        .unwrap();
    let deleted_at = Instant::now();
    assert_eq!(deleted, 1);
    assert!(
        deleted_at - set_at < ttl / 4,
        "the machine is too slow for this test's bound: {:?} from SET to DEL",
        deleted_at - set_at
    );
    let got = tokio::time::timeout(ttl / 2, task).await;
    let took = deleted_at.elapsed();
    let got = got
        .unwrap_or_else(|_| {
            panic!("the waiter did not get the free key within TTL/2 ({took:?} after the delete)")
        })
        .unwrap()
        .unwrap();
    println!("hand-off from a silent plain holder: {took:?} after its delete");
    let value = command(&server, &["GET", &lock_key]).await;
    assert_eq!(value, got.owner().to_hex());
    assert_eq!(waiter.release(&got).await.unwrap(), Released::Released);
}

/// Collects the warnings logged on this thread (a minimal `tracing` subscriber, so the tests
/// need no logging crate).
#[derive(Clone, Default)]
struct Warnings(Arc<Mutex<Vec<String>>>);

impl Warnings {
    fn taken(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

struct Message(String);

impl tracing::field::Visit for Message {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.push_str(&format!(" {}={value:?}", field.name()));
    }
}

impl tracing::Subscriber for Warnings {
    fn enabled(&self, metadata: &tracing::Metadata<'_>) -> bool {
        *metadata.level() <= tracing::Level::WARN
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut message = Message(String::new());
        event.record(&mut message);
        self.0.lock().unwrap().push(message.0);
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// Sets the server's eviction policy and connects a fresh authority, collecting its warnings.
async fn connect_under_policy(
    server: &Arc<RedisServer>,
    url: &str,
    policy: &str,
) -> (RedisAuthority, Vec<String>) {
    assert_eq!(
        command(server, &["CONFIG", "SET", "maxmemory-policy", policy]).await,
        "OK"
    );
    let warnings = Warnings::default();
    let a = {
        let _guard = tracing::subscriber::set_default(warnings.clone());
        RedisAuthority::connect(url).await.unwrap()
    };
    (a, warnings.taken())
}

/// An evicting `maxmemory-policy` can drop a lock key (every policy but `noeviction`) or a fence
/// counter (`allkeys-*`). The authority reads the policy at connect and warns; and since the
/// server persists every write (`appendonly yes`, `appendfsync always`), it declares its fences
/// durable exactly when no counter can be evicted, and leases exclusive only under
/// `noeviction`. A user that may not read the configuration still connects, and nothing is
/// claimed for it: fences not durable, leases declared able to end early.
///
/// A current-thread runtime, so that the warnings are logged on the thread that collects them.
#[tokio::test]
async fn an_evicting_maxmemory_policy_is_warned_about_and_fences_are_not_declared_durable() {
    let server = start().await;
    for (name, value) in [("appendonly", "yes"), ("appendfsync", "always")] {
        assert_eq!(
            command(&server, &["CONFIG", "SET", name, value]).await,
            "OK"
        );
    }
    let url = url(&server);

    let (a, warnings) = connect_under_policy(&server, &url, "allkeys-lru").await;
    assert!(!a.capabilities().durable_fences);
    let settings = a
        .server_settings()
        .expect("the default user may read the configuration");
    assert_eq!(settings.maxmemory_policy(), "allkeys-lru");
    assert!(settings.appendonly() && settings.appendfsync() == "always");
    assert!(settings.may_evict_fence_counters());
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("allkeys-lru") && w.contains("fence")),
        "no warning about evicted fence counters: {warnings:?}"
    );

    let (a, warnings) = connect_under_policy(&server, &url, "volatile-lru").await;
    assert!(
        a.capabilities().durable_fences,
        "volatile-* never evicts a counter (it has no expiry)"
    );
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("volatile-lru") && w.contains("lock key")),
        "no warning about evicted lock keys: {warnings:?}"
    );

    let (a, warnings) = connect_under_policy(&server, &url, "noeviction").await;
    assert!(a.capabilities().durable_fences);
    assert_eq!(a.capabilities().exclusion, ExclusionSafety::Exclusive);
    assert!(warnings.is_empty(), "{warnings:?}");

    // Without persistence, fences are not durable whatever the policy.
    assert_eq!(
        command(&server, &["CONFIG", "SET", "appendonly", "no"]).await,
        "OK"
    );
    let (a, warnings) = connect_under_policy(&server, &url, "noeviction").await;
    assert!(!a.capabilities().durable_fences);
    assert!(warnings.is_empty(), "{warnings:?}");

    // A user that may not run CONFIG: it connects and locks; nothing is claimed.
    command(
        &server,
        &[
            "ACL", "SETUSER", "app", "on", ">app-pw", "~*", "&*", "+@all", "-config",
        ],
    )
    .await;
    let app_url = format!(
        "redis://app:app-pw@127.0.0.1:{}?timeout_ms=1000",
        server.port()
    );
    let (app, warnings) = connect_under_policy(&server, &app_url, "allkeys-lru").await;
    assert!(!app.capabilities().durable_fences);
    assert!(
        app.capabilities().exclusion.can_end_early(),
        "an eviction policy that cannot be read cannot be ruled out"
    );
    assert_eq!(app.server_settings(), None);
    assert!(warnings.is_empty(), "{warnings:?}");
    let key = LockKey::new("policy").unwrap();
    let g = app
        .try_acquire(&key, Duration::from_secs(5))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(app.release(&g).await.unwrap(), Released::Released);
}

/// Under a `volatile-*` policy the lock keys, which carry an expiry, are exactly what the server
/// evicts. With `volatile-ttl` and a lock TTL shorter than every other key's, the first eviction
/// takes the lock key: a second client then gets the key while the first grant is valid by its
/// holder's own deadline, with a greater fence. The authority must declare that leases can end
/// early there (and only a `noeviction` server is declared exclusive).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volatile_policy_evicts_a_live_lock_key_as_declared() -> Result<(), String> {
    let server = start().await;
    let url = url(&server);
    let set = |name: &'static str, value: String| {
        let server = server.clone();
        blocking(move || {
            server
                .command(&["CONFIG", "SET", name, &value])
                .map_err(|e| format!("CONFIG SET {name} {value}: {e}"))
        })
    };
    set("maxmemory-policy", "volatile-ttl".into()).await?;
    let a = RedisAuthority::connect(&url)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let b = RedisAuthority::connect(&url)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let declared = &a.capabilities().exclusion;
    if !declared.can_end_early() || !declared.to_string().contains("volatile-ttl") {
        return Err(format!(
            "under volatile-ttl the authority declares its leases {declared}"
        ));
    }

    let key = LockKey::new("evicted").map_err(|e| e.to_string())?;
    let ttl = Duration::from_secs(60);
    let first = a
        .try_acquire(&key, ttl)
        .await
        .map_err(|e| format!("first acquisition: {e}"))?
        .ok_or("the fresh key is held")?;
    // Memory pressure: a limit just above what is used, then keys that live longer than the
    // lock, until the server evicts.
    let server2 = server.clone();
    let used = blocking(move || server2.command(&["INFO", "memory"]))
        .await
        .map_err(|e| e.to_string())?;
    let used: u64 = info_field(&used, "used_memory")
        .and_then(|v| v.parse().ok())
        .ok_or("INFO memory without used_memory")?;
    set("maxmemory", (used + 512 * 1024).to_string()).await?;
    let lock_key = a.config().layout().lock_key(&key);
    let server2 = server.clone();
    let filled = blocking(move || {
        let value = "x".repeat(16 * 1024);
        for n in 0..2000 {
            let filler = format!("filler:{n}");
            server2
                .command(&["SET", &filler, &value, "PX", "3600000"])
                .map_err(|e| format!("SET {filler}: {e}"))?;
            let exists = server2
                .command(&["EXISTS", &lock_key])
                .map_err(|e| format!("EXISTS: {e}"))?;
            if exists == "0" {
                return Ok(n + 1);
            }
        }
        Err("2000 long-lived keys of 16 KiB did not evict the lock key".to_string())
    })
    .await?;
    set("maxmemory", "0".into()).await?;
    if !first.is_valid() {
        return Err("the first grant's own deadline passed during the test".into());
    }
    let second = b
        .try_acquire(&key, ttl)
        .await
        .map_err(|e| format!("second acquisition: {e}"))?
        .ok_or("the evicted key is still held")?;
    let overlap = first.remaining();
    println!(
        "lock key evicted after {filled} fillers; a second client holds it with fence {} while \
         the first grant (fence {}) has {overlap:?} left by its own deadline",
        second.fence(),
        first.fence()
    );
    if second.fence() <= first.fence() || overlap.is_zero() {
        return Err(format!(
            "expected a greater fence while the first grant is valid: {} after {}, {overlap:?} \
             left",
            second.fence(),
            first.fence()
        ));
    }
    Ok(())
}

/// A Redis that persists every write before acknowledging it (`appendonly yes`,
/// `appendfsync always`), which the harness does not offer: started here the way the harness
/// starts servers, and crashed (SIGKILL) and restarted on the same data by its `restart` fault.
struct PersistentRedis {
    port: u16,
    process: leasehold_servers::ManagedProcess,
}

impl PersistentRedis {
    fn start() -> Self {
        use leasehold_servers::process::{find_program, server_dir};
        use leasehold_servers::{CommandSpec, ManagedProcess, READY_TIMEOUT};
        let program = find_program("redis-server").expect("redis-server must be installed");
        let port = free_port().unwrap();
        let dir = server_dir("redis-aof").unwrap();
        let args = vec![
            "--port".to_string(),
            port.to_string(),
            "--bind".into(),
            "127.0.0.1".into(),
            "--save".into(),
            String::new(),
            "--appendonly".into(),
            "yes".into(),
            "--appendfsync".into(),
            "always".into(),
            "--dir".into(),
            dir.path().display().to_string(),
        ];
        let process =
            ManagedProcess::spawn("redis-aof", dir, CommandSpec::new(program, args)).unwrap();
        let server = PersistentRedis { port, process };
        server
            .process
            .wait_ready(READY_TIMEOUT, || server.ping())
            .expect("the persistent Redis must start for this test");
        server
    }

    fn ping(&self) -> Result<(), String> {
        let answer = leasehold_servers::redis::resp_command(
            self.port,
            None,
            &["PING"],
            Duration::from_secs(1),
        )?;
        if answer == "PONG" {
            Ok(())
        } else {
            Err(format!("PING answered {answer:?}"))
        }
    }

    fn crash_and_restart(&self) -> leasehold_servers::Result<()> {
        self.process.kill()?;
        self.process.respawn()?;
        self.process
            .wait_ready(leasehold_servers::READY_TIMEOUT, || self.ping())
    }
}

struct PersistentFaults(Arc<PersistentRedis>);

#[async_trait]
impl Faults for PersistentFaults {
    async fn restart(&self) -> leasehold_core::Result<()> {
        let server = self.0.clone();
        blocking(move || server.crash_and_restart())
            .await
            .map_err(harness_error)
    }
}

/// Where the server persists every write before acknowledging it and evicts no counter, the
/// authority declares its fences durable, and they are: across a crash (SIGKILL) and restart,
/// fences keep growing (the shared scenario passes, where without persistence it reports the
/// declared reset).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_declared_durable_on_an_fsyncing_server_survive_a_crash() {
    let server = Arc::new(blocking(PersistentRedis::start).await);
    let url = format!("redis://127.0.0.1:{}?timeout_ms=1000", server.port);
    let a = RedisAuthority::connect(&url).await.unwrap();
    assert!(
        a.capabilities().durable_fences,
        "appendonly yes, appendfsync always, noeviction: {:?}",
        a.server_settings()
    );
    let ctx = Context::new(Arc::new(Clients(Arc::new(Mutex::new(url)))))
        .await
        .unwrap()
        .with_faults(Arc::new(PersistentFaults(server.clone())));
    assert!(ctx.capabilities().durable_fences);
    let outcome = scenarios::fences_survive_restart(&ctx).await;
    assert_eq!(outcome, Ok(Verdict::Passed), "{outcome:?}");
    let outcome = scenarios::election_epochs_survive_restart(&ctx).await;
    assert_eq!(outcome, Ok(Verdict::Passed), "{outcome:?}");
}

/// A leasehold release whose announcement never reaches the waiter (here: the holder announces
/// on another channel, as a misconfigured client, or a message lost on the way would) is found
/// by the waiter's retries, well before the holder's TTL. The bound is derived as in
/// `a_plain_holder_that_deletes_without_announcing_hands_off_well_before_its_ttl`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_whose_announcement_is_lost_is_found_well_before_the_ttl() {
    let server = start().await;
    let holder = RedisAuthority::connect(&format!("{}&channel=elsewhere", url(&server)))
        .await
        .unwrap();
    let waiter = Arc::new(RedisAuthority::connect(&url(&server)).await.unwrap());
    let mut con = raw(&server).await;
    let key = LockKey::new("lost-announcement").unwrap();
    let ttl = Duration::from_secs(8);
    let held = holder.try_acquire(&key, ttl).await.unwrap().unwrap();
    let acquired_at = Instant::now();
    let task = {
        let (waiter, key) = (waiter.clone(), key.clone());
        tokio::spawn(async move { waiter.acquire(&key, ttl, ttl).await })
    };
    wait_subscribed(&mut con, 1).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!task.is_finished(), "the waiter got a held key");
    assert_eq!(holder.release(&held).await.unwrap(), Released::Released);
    let released_at = Instant::now();
    assert!(
        released_at - acquired_at < ttl / 4,
        "the machine is too slow for this test's bound: {:?} from acquire to release",
        released_at - acquired_at
    );
    let got = tokio::time::timeout(ttl / 2, task)
        .await
        .unwrap_or_else(|_| {
            panic!(
                "the waiter did not get the free key within TTL/2 ({:?} after the release)",
                released_at.elapsed()
            )
        })
        .unwrap()
        .unwrap();
    println!(
        "hand-off after a lost announcement: {:?}",
        released_at.elapsed()
    );
    assert!(got.fence() > held.fence());
    assert_eq!(waiter.release(&got).await.unwrap(), Released::Released);
}

/// The value key of a lock, as a plain client reads it: `(fence, value)`, each `None` when
/// absent.
async fn stored_value(
    con: &mut MultiplexedConnection,
    a: &RedisAuthority,
    key: &LockKey,
) -> (Option<u64>, Option<Vec<u8>>) {
    redis::cmd("HMGET")
        .arg(a.config().layout().value_key(key))
        .arg("fence")
        .arg("value")
        .query_async(con)
        .await
        .unwrap()
}

/// A grant whose lease ran out and went to someone else cannot proclaim: `LeaseLost`, and the
/// new holder's value (and the fence stored with it) are untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_grants_proclaim_is_refused_and_leaves_the_holders_value() {
    let server = start().await;
    let a = RedisAuthority::connect(&url(&server)).await.unwrap();
    let b = RedisAuthority::connect(&url(&server)).await.unwrap();
    let mut con = raw(&server).await;
    let key = LockKey::new("proclaim-stale").unwrap();
    let old = a
        .try_acquire(&key, Duration::from_millis(200))
        .await
        .unwrap()
        .unwrap();
    a.proclaim(&old, b"old leader").await.unwrap();
    assert_eq!(
        a.inspect(&key).await.unwrap().value.as_deref(),
        Some(&b"old leader"[..])
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    let new = b
        .try_acquire(&key, Duration::from_secs(10))
        .await
        .unwrap()
        .expect("the old lease ran out");
    b.proclaim(&new, b"new leader").await.unwrap();

    let err = a.proclaim(&old, b"stale").await.unwrap_err();
    assert!(err.is_lease_lost(), "{err:?}");
    let seen = b.inspect(&key).await.unwrap();
    assert_eq!(seen.fence, Some(new.fence()), "{seen:?}");
    assert_eq!(seen.value.as_deref(), Some(&b"new leader"[..]));
    assert_eq!(
        stored_value(&mut con, &b, &key).await,
        (Some(new.fence().raw()), Some(b"new leader".to_vec()))
    );
    // A grant that was released is refused too.
    assert_eq!(b.release(&new).await.unwrap(), Released::Released);
    let err = b.proclaim(&new, b"after release").await.unwrap_err();
    assert!(err.is_lease_lost(), "{err:?}");
    assert_eq!(stored_value(&mut con, &b, &key).await, (None, None));
}

/// A value belongs to its grant: a later grant starts without one, whether the earlier lease
/// was released (its value key is deleted with it), ran out, or was released by a plain peer's
/// compare-and-delete (its value key stays, but holds a smaller fence); nor is it shown for a
/// plain peer holding the key. The lock key still holds exactly the owner token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_grant_starts_without_the_previous_value() {
    let server = start().await;
    let a = RedisAuthority::connect(&url(&server)).await.unwrap();
    let mut con = raw(&server).await;
    let key = LockKey::new("proclaim-fresh").unwrap();
    let lock_key = a.config().layout().lock_key(&key);
    let ttl = Duration::from_secs(10);

    // Released: the value key goes with the lease.
    let first = a.try_acquire(&key, ttl).await.unwrap().unwrap();
    a.proclaim(&first, b"first").await.unwrap();
    let token: String = redis::cmd("GET")
        .arg(&lock_key)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(token, first.owner().to_hex(), "the lock key is unchanged");
    assert_eq!(a.release(&first).await.unwrap(), Released::Released);
    assert_eq!(stored_value(&mut con, &a, &key).await, (None, None));
    let seen = a.inspect(&key).await.unwrap();
    assert!(!seen.held && seen.value.is_none(), "{seen:?}");
    let second = a.try_acquire(&key, ttl).await.unwrap().unwrap();
    assert_eq!(a.inspect(&key).await.unwrap().value, None);

    // Ran out: the value key is left, with the old fence, and not shown for the next grant.
    a.proclaim(&second, b"second").await.unwrap();
    let _: () = redis::cmd("PEXPIRE")
        .arg(&lock_key)
        .arg(1)
        .query_async(&mut con)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(
        stored_value(&mut con, &a, &key).await,
        (Some(second.fence().raw()), Some(b"second".to_vec()))
    );
    let third = a.try_acquire(&key, ttl).await.unwrap().unwrap();
    let seen = a.inspect(&key).await.unwrap();
    assert_eq!(seen.fence, Some(third.fence()));
    assert_eq!(seen.value, None, "{seen:?}");

    // Released by a plain compare-and-delete: the same.
    a.proclaim(&third, b"third").await.unwrap();
    let deleted: i64 = redis::Script::new(
        "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0",
    )
    .key(&lock_key)
    .arg(third.owner().to_hex())
    .invoke_async(&mut con)
    .await
    .unwrap();
    assert_eq!(deleted, 1);
    assert_eq!(a.inspect(&key).await.unwrap().value, None);
    // A plain peer holds the key now: no fence, no value.
    let _: () = redis::cmd("SET")
        .arg(&lock_key)
        .arg("plain-token")
        .arg("PX")
        .arg(10_000)
        .query_async(&mut con)
        .await
        .unwrap();
    let seen = a.inspect(&key).await.unwrap();
    assert!(
        seen.held && seen.fence.is_none() && seen.value.is_none(),
        "{seen:?}"
    );
    let _: () = redis::cmd("DEL")
        .arg(&lock_key)
        .query_async(&mut con)
        .await
        .unwrap();
    let fourth = a.try_acquire(&key, ttl).await.unwrap().unwrap();
    assert!(fourth.fence() > third.fence());
    assert_eq!(a.inspect(&key).await.unwrap().value, None);
    a.proclaim(&fourth, b"fourth").await.unwrap();
    assert_eq!(
        a.inspect(&key).await.unwrap().value.as_deref(),
        Some(&b"fourth"[..])
    );
    assert_eq!(a.release(&fourth).await.unwrap(), Released::Released);
}

/// Values are bytes: any byte (NUL, invalid UTF-8), up to `MAX_VALUE_LEN` of them, round-trip
/// exactly; an empty value is a value; a longer one is refused before anything is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_binary_value_round_trips() {
    let server = start().await;
    let a = RedisAuthority::connect(&url(&server)).await.unwrap();
    let observer = RedisAuthority::connect(&url(&server)).await.unwrap();
    let mut con = raw(&server).await;
    let key = LockKey::new("proclaim-binary").unwrap();
    let g = a
        .try_acquire(&key, Duration::from_secs(10))
        .await
        .unwrap()
        .unwrap();
    let binary = vec![0x00, 0xff, 0xfe, b'\n', 0xc3, 0x28, b' ', b'{', b'}', 0x80];
    assert!(std::str::from_utf8(&binary).is_err());
    let largest: Vec<u8> = (0..leasehold_core::MAX_VALUE_LEN)
        .map(|i| (i * 7 % 256) as u8)
        .collect();
    for value in [binary.clone(), largest.clone(), Vec::new()] {
        a.proclaim(&g, &value).await.unwrap();
        let seen = observer.inspect(&key).await.unwrap();
        assert_eq!(seen.value.as_ref(), Some(&value), "{} bytes", value.len());
    }
    a.proclaim(&g, &binary).await.unwrap();
    let too_long = vec![0u8; leasehold_core::MAX_VALUE_LEN + 1];
    let (evalsha, _) = calls(&server, "evalsha").await;
    let err = a.proclaim(&g, &too_long).await.unwrap_err();
    assert!(matches!(err, Error::InvalidConfig { .. }), "{err:?}");
    assert_eq!(calls(&server, "evalsha").await.0, evalsha, "nothing sent");
    assert_eq!(
        stored_value(&mut con, &a, &key).await,
        (Some(g.fence().raw()), Some(binary.clone()))
    );
    assert_eq!(a.release(&g).await.unwrap(), Released::Released);
}

/// `wait_for_change` returns soon after another client releases the key or proclaims a value
/// (by the announcement, long before its `max_wait`, also `Duration::MAX`), and after
/// `max_wait` when nothing happens (once the subscription is up). However many waits come and go, the authority keeps one
/// subscription connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_for_change_wakes_on_another_clients_release_and_proclaim() {
    let server = start().await;
    let holder = RedisAuthority::connect(&url(&server)).await.unwrap();
    let observer = Arc::new(RedisAuthority::connect(&url(&server)).await.unwrap());
    let mut con = raw(&server).await;
    let key = LockKey::new("wait-for-change").unwrap();
    let ttl = Duration::from_secs(30);
    let held = holder.try_acquire(&key, ttl).await.unwrap().unwrap();

    // The first wait starts the subscription, and may return as soon as it is up (whatever
    // changed before that was not announced to it).
    observer
        .wait_for_change(&key, Duration::from_millis(50))
        .await
        .unwrap();
    wait_subscribed(&mut con, 1).await;
    // Nothing happens: it returns after max_wait, not before.
    let since = Instant::now();
    observer
        .wait_for_change(&key, Duration::from_millis(150))
        .await
        .unwrap();
    let waited = since.elapsed();
    assert!(
        waited >= Duration::from_millis(150) && waited < Duration::from_secs(2),
        "{waited:?}"
    );

    let wait = |max_wait: Duration| {
        let (observer, key) = (observer.clone(), key.clone());
        tokio::spawn(async move {
            observer.wait_for_change(&key, max_wait).await.unwrap();
            Instant::now()
        })
    };
    // A proclaim wakes it.
    let task = wait(Duration::from_secs(20));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!task.is_finished(), "woke with nothing changed");
    let proclaimed = Instant::now();
    holder.proclaim(&held, b"leader-1").await.unwrap();
    let woke = tokio::time::timeout(Duration::from_secs(2), task)
        .await
        .expect("the proclaim did not wake the waiter")
        .unwrap();
    println!("woken by a proclaim after {:?}", woke - proclaimed);

    // A release wakes it, with no bound on the wait at all.
    let task = wait(Duration::MAX);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!task.is_finished(), "woke with nothing changed");
    let released = Instant::now();
    assert_eq!(holder.release(&held).await.unwrap(), Released::Released);
    let woke = tokio::time::timeout(Duration::from_secs(2), task)
        .await
        .expect("the release did not wake the waiter")
        .unwrap();
    println!("woken by a release after {:?}", woke - released);

    // Dropped waits leave nothing behind: still one subscription, and a later one still works.
    for _ in 0..50 {
        let _ = tokio::time::timeout(
            Duration::from_millis(1),
            observer.wait_for_change(&key, Duration::from_secs(60)),
        )
        .await;
    }
    wait_subscribed(&mut con, 1).await;
    let again = holder.try_acquire(&key, ttl).await.unwrap().unwrap();
    let task = wait(Duration::from_secs(20));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(holder.release(&again).await.unwrap(), Released::Released);
    tokio::time::timeout(Duration::from_secs(2), task)
        .await
        .expect("a release after dropped waits did not wake the waiter")
        .unwrap();
}
