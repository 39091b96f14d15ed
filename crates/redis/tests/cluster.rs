//! The Redis authority on a Redis Cluster (`redis+cluster://`), against a real cluster the
//! harness starts as plain processes: three primaries with one replica each, node timeout 1 s.
//! The whole conformance suite runs with a failover as the fault (the primary that owns the
//! scenario's key is killed after its replica was cut off, and the replica takes over); a
//! focused test spreads keys over all three primaries through one authority, shows that a
//! waiter is woken by the sharded announcement of a release, and follows a primary's death with
//! the same authority object.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use leasehold_conformance::kit::{self, OrFail, TestResult};
use leasehold_conformance::scenarios::run_all;
use leasehold_conformance::{harness_error, Context, Failure, Faults, Residue, Verdict};
use leasehold_core::{Authority, FenceSafety, Grant, Instant, LockKey, Released};
use leasehold_redis::{KeyLayout, RedisAuthority};
use leasehold_servers::{ClusterNode, RedisCluster};

mod common;

use common::{blocking, clients, cut_replication, hand_off_rounds, median_under, wait_in_sync};

/// Every request gives up after one second.
const TIMEOUT: Duration = Duration::from_millis(1000);

/// The harness's `cluster-node-timeout`: how long a primary must be silent before the others
/// count it as failed and its replica is elected in its place.
const NODE_TIMEOUT: Duration = Duration::from_millis(1000);

/// While a pause or a restart lasts, the node timeout is raised to this, so that the cluster
/// does not fail over, nor count itself broken, in the middle of a scenario about something else
/// (the analogue of raising Sentinel's `down-after-milliseconds`).
const NO_FAILOVER: Duration = Duration::from_secs(3600);

fn with_timeout(url: &str) -> String {
    format!("{url}?timeout_ms={}", TIMEOUT.as_millis())
}

async fn start() -> TestResult<Arc<RedisCluster>> {
    kit::start("the Redis Cluster", || RedisCluster::start(3, 1)).await
}

fn s(e: leasehold_servers::HarnessError) -> String {
    e.to_string()
}

/// Sets `cluster-node-timeout` on every running node.
fn set_node_timeout(cluster: &RedisCluster, timeout: Duration) -> Result<(), String> {
    let ms = timeout.as_millis().to_string();
    for node in cluster.nodes().iter().filter(|n| n.process().is_running()) {
        node.command(&["CONFIG", "SET", "cluster-node-timeout", &ms])
            .map_err(s)?;
    }
    Ok(())
}

/// The running primaries.
fn primaries(cluster: &RedisCluster) -> Result<Vec<&ClusterNode>, String> {
    let mut found = Vec::new();
    for node in cluster.nodes().iter().filter(|n| n.process().is_running()) {
        if node.is_primary().map_err(s)? {
            found.push(node);
        }
    }
    Ok(found)
}

/// Faults on the cluster. A restart and a pause act on every primary (the faults do not know
/// the scenario's key): outages shorter than the raised node timeout, so nothing fails over. The
/// failover acts on the primary that owns `failover_key`, the failover scenario's key.
struct ClusterFaults {
    cluster: Arc<RedisCluster>,
    failover_key: String,
}

impl ClusterFaults {
    async fn call(
        &self,
        f: impl FnOnce(&RedisCluster) -> Result<(), String> + Send + 'static,
    ) -> leasehold_core::Result<()> {
        let cluster = self.cluster.clone();
        blocking(move || f(&cluster)).await.map_err(harness_error)
    }
}

#[async_trait]
impl Faults for ClusterFaults {
    /// Every primary is killed and started again (without persistence: empty), one after the
    /// other; returns once the cluster is ok and every replica synced again.
    async fn restart(&self) -> leasehold_core::Result<()> {
        self.call(|c| {
            set_node_timeout(c, NO_FAILOVER)?;
            for primary in primaries(c)? {
                primary.restart().map_err(s)?;
            }
            set_node_timeout(c, NODE_TIMEOUT)?;
            c.settle().map_err(s)
        })
        .await
    }

    async fn pause(&self) -> leasehold_core::Result<()> {
        self.call(|c| {
            set_node_timeout(c, NO_FAILOVER)?;
            for primary in primaries(c)? {
                primary.pause().map_err(s)?;
            }
            Ok(())
        })
        .await
    }

    async fn resume(&self) -> leasehold_core::Result<()> {
        self.call(|c| {
            for node in c.nodes() {
                if node.process().is_running() && !node.process().is_serving() {
                    node.resume().map_err(s)?;
                }
            }
            // Let the nodes answer each other's pings from before the pause, so that none
            // counts another as silent for longer than the node timeout once it is back.
            c.settle().map_err(s)?;
            std::thread::sleep(Duration::from_millis(300));
            set_node_timeout(c, NODE_TIMEOUT)
        })
        .await
    }

    /// An operator deletes the lock key on the primary that owns it.
    async fn revoke(&self, key: &LockKey) -> leasehold_core::Result<()> {
        let lock_key = KeyLayout::default().lock_key(key);
        self.call(move |c| {
            c.primary_for(&lock_key)
                .and_then(|p| p.command(&["DEL", &lock_key]))
                .map(|_| ())
                .map_err(s)
        })
        .await
    }

    /// The replica of the key's primary catches up, then is cut off: the old primary still
    /// grants what clients ask of it, and the replica never sees it.
    async fn begin_failover(&self) -> leasehold_core::Result<()> {
        let key = self.failover_key.clone();
        self.call(move |c| {
            let primary = c.primary_for(&key).map_err(s)?;
            let replica = c.replica_of(primary).map_err(s)?;
            wait_in_sync(primary, replica)?;
            cut_replication(primary, replica)
        })
        .await
    }

    /// The old primary dies, and its replica takes its slots over (`CLUSTER FAILOVER
    /// TAKEOVER`); returns once the cluster is ok. Clients keep their URL.
    async fn complete_failover(&self) -> leasehold_core::Result<()> {
        let key = self.failover_key.clone();
        self.call(move |c| {
            let primary = c.primary_for(&key).map_err(s)?;
            let replica = c.replica_of(primary).map_err(s)?;
            primary.kill().map_err(s)?;
            c.take_over(replica).map_err(s)
        })
        .await
    }
}

/// A lock key left on the primary that owns it.
struct ClusterResidue(Arc<RedisCluster>);

#[async_trait]
impl Residue for ClusterResidue {
    async fn leftovers(&self, key: &LockKey) -> leasehold_core::Result<Vec<String>> {
        let lock_key = KeyLayout::default().lock_key(key);
        let cluster = self.0.clone();
        let pttl = blocking(move || {
            cluster
                .primary_for(&lock_key)
                .and_then(|p| p.command(&["PTTL", &lock_key]))
        })
        .await
        .map_err(harness_error)?;
        Ok(match pttl.as_str() {
            "-2" => vec![],
            ttl => vec![format!("lock key with PTTL {ttl}")],
        })
    }
}

/// The whole suite through one `redis+cluster://` URL. The failover scenario must end DECLARED
/// (the old primary granted a lease its replica never saw, and the replica that took over hands
/// out its fence again) or PASSED, never fail; restarts without persistence reset the counters,
/// as declared; everything else passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_the_conformance_suite_on_a_cluster_with_a_failover() -> TestResult {
    let cluster = start().await?;
    let url = with_timeout(&cluster.url());
    let ctx = Context::new(Arc::new(clients(&url)))
        .await
        .or_fail("connect the first client")?;
    let failover_key = KeyLayout::default().lock_key(&ctx.key("fences-failover"));
    let ctx = ctx
        .with_residue(Arc::new(ClusterResidue(cluster.clone())))
        .with_faults(Arc::new(ClusterFaults {
            cluster: cluster.clone(),
            failover_key: failover_key.clone(),
        }));
    assert_eq!(ctx.capabilities().fence_safety, FenceSafety::FailoverUnsafe);
    assert!(!ctx.capabilities().batch_renewal);
    let old_owner = {
        let (c, k) = (cluster.clone(), failover_key.clone());
        blocking(move || c.primary_for(&k).map(|n| n.port()))
            .await
            .or_fail("the primary that owns the failover key")?
    };
    let started = std::time::Instant::now();
    let report = run_all("redis cluster", &ctx).await;
    println!("{report}");
    println!("the suite took {:?}", started.elapsed());
    report.assert_passed();
    for line in &report.lines {
        match line.scenario {
            "fences_survive_restart" | "election_epochs_survive_restart" => assert!(
                matches!(line.outcome, Ok(Verdict::Declared(_))),
                "{}:\n{report}",
                line.scenario
            ),
            "fences_survive_failover" => assert!(
                matches!(line.outcome, Ok(Verdict::Declared(_) | Verdict::Passed)),
                "{}:\n{report}",
                line.scenario
            ),
            // The scenario's keys lie on different slots, which one script cannot reach: the
            // cluster leaves `atomic_acquire_all` off (its one-slot sets are tested below).
            _ if report.declared_absent(line) => {}
            _ => assert_eq!(
                line.outcome,
                Ok(Verdict::Passed),
                "{}:\n{report}",
                line.scenario
            ),
        }
    }
    // The failover happened: another node owns the key's slot now.
    let (c, k) = (cluster.clone(), failover_key);
    let new_owner = blocking(move || c.primary_for(&k).map(|n| n.port()))
        .await
        .or_fail("the primary that owns the failover key after the suite")?;
    assert_ne!(new_owner, old_owner);
    Ok(())
}

/// On a cluster, a user granted the keys' release shard channels alone
/// (`&{leasehold:*}:leasehold:released`) still hands a key on at once: the server refuses the
/// waiter's own shard channel, so it subscribes the key's release shard channel instead and
/// reads it as before there were own channels; the release's copy on the refused channel goes
/// instead as a release-channel copy naming nobody. Median of five rounds, against retries 150
/// to 300 ms apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_with_the_release_shard_channels_alone_still_hands_off_at_once() -> TestResult {
    let cluster = start().await?;
    {
        let c = cluster.clone();
        blocking(move || -> Result<(), String> {
            for node in c.nodes() {
                node.command(&[
                    "ACL",
                    "SETUSER",
                    "relonly",
                    "on",
                    ">relonly-pw",
                    "~*",
                    "+@all",
                    "resetchannels",
                    "&{leasehold:*}:leasehold:released",
                ])
                .map_err(s)?;
            }
            Ok(())
        })
        .await
        .or_fail("create the user on every node")?;
    }
    let url = with_timeout(&cluster.url()).replacen(
        "redis+cluster://",
        "redis+cluster://relonly:relonly-pw@",
        1,
    );
    let holder = RedisAuthority::connect(&url)
        .await
        .or_fail("connect the holder")?;
    let waiter = Arc::new(
        RedisAuthority::connect(&url)
            .await
            .or_fail("connect the waiter")?,
    );
    let key = LockKey::new("acl-shard").or_fail("the key")?;
    let lock_key = KeyLayout::default().lock_key(&key);
    let release_channel = format!("{lock_key}:{}", leasehold_redis::DEFAULT_CHANNEL);
    let ready = async || {
        let since = Instant::now();
        loop {
            let (c, k, ch) = (cluster.clone(), lock_key.clone(), release_channel.clone());
            let n = blocking(move || c.primary_for(&k).map(|p| shard_subscribers(p, &ch)))
                .await
                .unwrap_or(0);
            if n == 1 {
                return Ok(());
            }
            if since.elapsed() > TIMEOUT * 5 {
                return Err(Failure::new(
                    "the waiter, refused its own shard channel, never subscribed the key's \
                     release shard channel",
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let release = async |held: Grant| match holder.release(&held).await {
        Ok(Released::Released) => Ok(()),
        other => Err(Failure::new(format!("the holder's release: {other:?}"))),
    };
    let latencies = hand_off_rounds(&holder, &waiter, &key, 5, ready, release).await?;
    median_under(
        &latencies,
        Duration::from_millis(40),
        "for a user with the release shard channels alone",
    )
}

/// How many shard channels matching `pattern` have subscribers on `node`.
fn shard_subscribers(node: &ClusterNode, pattern: &str) -> u64 {
    node.command(&["PUBSUB", "SHARDCHANNELS", pattern])
        .ok()
        .map(|reply| reply.lines().filter(|l| !l.trim().is_empty()).count() as u64)
        .unwrap_or(0)
}

/// The shard channels a waiter of `key` subscribes to, under the default layout and channel:
/// its authority's own, `<lock key>:<channel>:<its waiter id>`.
fn shard_channel_of(key: &LockKey) -> String {
    format!(
        "{}:{}:*",
        KeyLayout::default().lock_key(key),
        leasehold_redis::DEFAULT_CHANNEL
    )
}

/// Waits (bounded) until the shard channel of `key` has one subscriber on the primary that
/// owns the key now.
async fn wait_for_shard_subscriber(cluster: &Arc<RedisCluster>, key: &LockKey, within: Duration) {
    let started = Instant::now();
    let (lock_key, channel) = (KeyLayout::default().lock_key(key), shard_channel_of(key));
    loop {
        let (c, k, ch) = (cluster.clone(), lock_key.clone(), channel.clone());
        let n = blocking(move || c.primary_for(&k).map(|p| shard_subscribers(p, &ch)))
            .await
            .unwrap_or(0);
        if n == 1 {
            return;
        }
        assert!(
            started.elapsed() < within,
            "no subscriber to {channel} on its primary after {:?}",
            started.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One key per primary: names tried in turn until each primary owns one.
async fn keys_on_every_primary(cluster: &Arc<RedisCluster>) -> TestResult<Vec<(LockKey, u16)>> {
    let c = cluster.clone();
    blocking(move || {
        let mut found: Vec<(LockKey, u16)> = Vec::new();
        for i in 0..1000 {
            let key = LockKey::new(format!("spread-{i}")).or_fail("a spread key")?;
            let port = c
                .primary_for(&KeyLayout::default().lock_key(&key))
                .or_fail(format!("the primary that owns {key}"))?
                .port();
            if !found.iter().any(|(_, p)| *p == port) {
                found.push((key, port));
            }
            if found.len() == 3 {
                break;
            }
        }
        Ok(found)
    })
    .await
}

/// One authority spreads its locks over every primary (each lock key lands on the primary that
/// owns its slot, with its counter beside it), a waiter is woken by the sharded announcement of
/// another client's release, and after a primary is killed, the cluster's own failover moves its
/// slots to the replica and the same authority object acquires there again, within a bound set
/// by the node timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spreads_keys_wakes_waiters_by_shard_and_follows_a_failover() -> TestResult {
    let cluster = start().await?;
    let url = with_timeout(&cluster.url());
    let a = Arc::new(RedisAuthority::connect(&url).await.or_fail("connect a")?);
    let b = Arc::new(RedisAuthority::connect(&url).await.or_fail("connect b")?);
    let ttl = Duration::from_secs(30);

    // Every primary serves one of the keys; each lock key and its counter are on that primary.
    let keys = keys_on_every_primary(&cluster).await?;
    assert_eq!(keys.len(), 3, "{keys:?}");
    let mut held = Vec::new();
    for (key, port) in &keys {
        let grant = a
            .try_acquire(key, ttl)
            .await
            .or_fail(format!("acquire {key}"))?
            .or_fail(format!("{key} is free"))?;
        let (c, lock_key, port) = (cluster.clone(), KeyLayout::default().lock_key(key), *port);
        let owner = grant.owner().to_hex();
        let stored = blocking(move || -> TestResult<(String, String)> {
            let node = c
                .nodes()
                .iter()
                .find(|n| n.port() == port)
                .or_fail(format!("the node on port {port}"))?;
            Ok((
                node.command(&["GET", &lock_key])
                    .or_fail(format!("GET {lock_key}"))?,
                node.command(&["GET", &format!("{lock_key}:fence")])
                    .or_fail(format!("GET {lock_key}:fence"))?,
            ))
        })
        .await?;
        assert_eq!(stored.0, owner, "{key}");
        assert_eq!(stored.1, grant.fence().raw().to_string(), "{key}");
        assert_eq!(
            a.release(&grant).await.or_fail(format!("release {key}"))?,
            Released::Released
        );
        let again = a
            .try_acquire(key, ttl)
            .await
            .or_fail(format!("acquire {key} again"))?
            .or_fail(format!("{key} was released"))?;
        assert!(again.fence() > grant.fence());
        held.push(again);
    }
    let listed = a
        .list_keys(
            &leasehold_core::KeyPrefix::new("spread-").or_fail("the prefix")?,
            10,
        )
        .await
        .or_fail("list the spread keys")?;
    let mut expected: Vec<LockKey> = keys.iter().map(|(k, _)| k.clone()).collect();
    expected.sort();
    assert_eq!(listed, expected, "every primary was scanned");
    for grant in held.drain(..) {
        assert_eq!(
            a.release(&grant).await.or_fail("release a spread key")?,
            Released::Released
        );
    }

    // A waiter on `b`, woken by `a`'s release through its shard channel. A waiter that has
    // waited this long retries only every 150-300 ms between announcements, so a wake-up far
    // below that, round after round, is the announcement, not the timer; the subscription is
    // also seen at the primary that owns the key.
    let key = LockKey::new("shard-wake").or_fail("the key")?;
    let mut latencies = Vec::new();
    for _ in 0..9 {
        let held = a
            .try_acquire(&key, ttl)
            .await
            .or_fail("a acquires")?
            .or_fail("the key is free")?;
        let waiter = {
            let (b, key) = (b.clone(), key.clone());
            tokio::spawn(async move {
                let grant = b.acquire(&key, ttl, Duration::from_secs(20)).await;
                (grant, Instant::now())
            })
        };
        wait_for_shard_subscriber(&cluster, &key, TIMEOUT * 3).await;
        // Long enough for the waiter's backoff to reach its cap.
        tokio::time::sleep(Duration::from_millis(700)).await;
        assert_eq!(
            a.release(&held).await.or_fail("a releases")?,
            Released::Released
        );
        let released_at = Instant::now();
        let (grant, woke_at) = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .or_fail("the waiter must get the key")?
            .or_fail("the waiter's task")?;
        let grant = grant.or_fail("the waiter acquires")?;
        latencies.push(woke_at.saturating_duration_since(released_at));
        assert!(grant.fence() > held.fence());
        assert_eq!(
            b.release(&grant).await.or_fail("the waiter releases")?,
            Released::Released
        );
    }
    latencies.sort();
    let median = latencies[latencies.len() / 2];
    println!("hand-off latencies by shard announcement: {latencies:?}");
    assert!(
        median < Duration::from_millis(40),
        "median wake-up {median:?}: not the announcement ({latencies:?})"
    );
    // Nobody waits any more: the shard channel is dropped (swept once a second).
    {
        let started = Instant::now();
        loop {
            let (c, lk, ch) = (
                cluster.clone(),
                KeyLayout::default().lock_key(&key),
                shard_channel_of(&key),
            );
            let n = blocking(move || c.primary_for(&lk).map(|p| shard_subscribers(p, &ch)))
                .await
                .or_fail("the primary that owns the shard-wake key")?;
            if n == 0 {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "the shard channel stayed subscribed"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    // A primary dies. The cluster notices within the node timeout, its replica is elected, and
    // the same authority object acquires a key of those slots again.
    let (victim_key, victim_port) = keys[0].clone();
    let replica_port = {
        let c = cluster.clone();
        blocking(move || -> TestResult<u16> {
            let primary = c
                .nodes()
                .iter()
                .find(|n| n.port() == victim_port)
                .or_fail(format!("the primary on port {victim_port}"))?;
            let replica = c.replica_of(primary).or_fail("the victim's replica")?;
            wait_in_sync(primary, replica).or_fail("the replica catches up")?;
            let port = replica.port();
            primary.kill().or_fail("kill the victim")?;
            Ok(port)
        })
        .await?
    };
    let killed_at = Instant::now();
    // Detection (the node timeout), the failure report reaching a majority of primaries, the
    // replica's election (a delay of 0.5-1 s, then a vote), and the client's next slot map:
    // well within ten node timeouts, plus the requests that time out meanwhile.
    let failover_bound = NODE_TIMEOUT * 10 + TIMEOUT * 2;
    let mut regained = None;
    while killed_at.elapsed() < failover_bound {
        match a.try_acquire(&victim_key, ttl).await {
            Ok(Some(grant)) => {
                regained = Some(grant);
                break;
            }
            Ok(None) => {
                return Err(Failure::new(format!(
                    "{victim_key} was released before the kill"
                )))
            }
            Err(e) => assert!(e.is_retryable(), "{e}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let took = killed_at.elapsed();
    let grant = regained.or_fail(format!(
        "a grant on the promoted replica within {failover_bound:?} of the kill"
    ))?;
    println!("acquired on the promoted replica {took:?} after the primary was killed");
    let c = cluster.clone();
    let lk = KeyLayout::default().lock_key(&victim_key);
    let owner = blocking(move || c.primary_for(&lk).map(|n| n.port()))
        .await
        .or_fail("the primary that owns the victim's key")?;
    assert_eq!(owner, replica_port, "the replica serves the slot now");

    // The subscription follows the slot: a waiter on `b` is subscribed at the new primary and
    // woken by `a`'s release there.
    let waiter = {
        let (b, key) = (b.clone(), victim_key.clone());
        tokio::spawn(async move { b.acquire(&key, ttl, Duration::from_secs(20)).await })
    };
    wait_for_shard_subscriber(&cluster, &victim_key, TIMEOUT * 5).await;
    assert_eq!(
        a.release(&grant)
            .await
            .or_fail("release on the promoted replica")?,
        Released::Released
    );
    let next = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .or_fail("the waiter must get the key on the promoted replica")?
        .or_fail("the waiter's task")?
        .or_fail("the waiter acquires on the promoted replica")?;
    assert!(next.fence() > grant.fence());
    Ok(())
}

/// On a cluster one script reaches one slot. A set whose keys share a hash tag (`job}1`,
/// `job}2`, ... all hash `leasehold:job`) is taken in one step, all or none; a set across
/// slots is answered `Unsupported` before anything is sent, and `acquire_all` still takes it,
/// one key at a time. The cluster does not declare the one-step capability: most sets span
/// slots, so the recipe goes one by one there without asking.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_slot_sets_go_in_one_step_and_cross_slot_sets_key_by_key() -> TestResult {
    use leasehold_core::{acquire_all, canonical, Error, LeaseOptions};
    use redis::cluster_routing::Slot;

    let cluster = start().await?;
    let url = with_timeout(&cluster.url());
    let a = Arc::new(RedisAuthority::connect(&url).await.or_fail("connect a")?);
    let b = RedisAuthority::connect(&url).await.or_fail("connect b")?;
    assert!(!a.capabilities().atomic_acquire_all);
    let ttl = Duration::from_secs(30);
    let layout = KeyLayout::default();
    let slot = |key: &LockKey| Slot::for_key(layout.lock_key(key));

    let tagged: Vec<LockKey> = (1..=3)
        .map(|i| LockKey::new(format!("job}}{i}")))
        .collect::<Result<_, _>>()
        .or_fail("the tagged keys")?;
    let tagged = canonical(&tagged).or_fail("order the tagged set")?;
    assert!(tagged.iter().all(|k| slot(k) == slot(&tagged[0])));
    let blocker = b
        .try_acquire(&tagged[1], ttl)
        .await
        .or_fail("b takes one tagged key")?
        .or_fail("the tagged key is free")?;
    let busy = a
        .try_acquire_all(&tagged, ttl)
        .await
        .or_fail("try the tagged set beside b")?;
    assert!(busy.is_none(), "the tagged set was taken beside b's key");
    for key in [&tagged[0], &tagged[2]] {
        let seen = b.inspect(key).await.or_fail("inspect")?;
        assert!(!seen.held, "{key} was taken by a step that answered held");
    }
    assert_eq!(
        b.release(&blocker).await.or_fail("b releases")?,
        Released::Released
    );
    let grants = a
        .try_acquire_all(&tagged, ttl)
        .await
        .or_fail("take the tagged set")?
        .or_fail("the tagged set is free")?;
    assert_eq!(grants.len(), tagged.len());
    assert!(
        grants[1].fence() > blocker.fence(),
        "the set's fence on {} is not above b's",
        tagged[1]
    );
    for (grant, key) in grants.iter().zip(&tagged) {
        assert_eq!(grant.key(), key);
        let seen = b.inspect(key).await.or_fail("inspect")?;
        assert!(
            seen.held && seen.fence == Some(grant.fence()),
            "{key}: {seen:?}"
        );
    }
    for grant in &grants {
        assert_eq!(
            a.release(grant).await.or_fail("release")?,
            Released::Released
        );
    }

    // Two keys on different slots: refused before sending, taken one by one by the recipe.
    let spread = keys_on_every_primary(&cluster).await?;
    let apart: Vec<LockKey> = spread.iter().map(|(k, _)| k.clone()).collect();
    let apart = canonical(&apart).or_fail("order the spread set")?;
    assert!(slot(&apart[0]) != slot(&apart[1]), "{apart:?}");
    match a.try_acquire_all(&apart, ttl).await {
        Err(Error::Unsupported { .. }) => {}
        other => {
            return Err(Failure::new(format!(
                "a set across slots gave {:?}, not Unsupported",
                other.map(|g| g.map(|g| g.len()))
            )))
        }
    }
    for key in &apart {
        let seen = b.inspect(key).await.or_fail("inspect")?;
        assert!(!seen.held, "{key} was taken by a refused step");
    }
    let all = acquire_all(
        a.clone(),
        &apart,
        ttl,
        Duration::from_secs(5),
        LeaseOptions::default(),
    )
    .await
    .or_fail("acquire_all takes the spread set key by key")?;
    for key in &apart {
        let seen = b.inspect(key).await.or_fail("inspect")?;
        assert!(
            seen.held && seen.fence == all.fence(key),
            "{key} is not held with the recipe's fence: {seen:?}"
        );
    }
    all.release().await.or_fail("release the spread set")?;
    Ok(())
}
