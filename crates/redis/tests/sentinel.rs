//! The Redis authority behind Redis Sentinel (`redis+sentinel://`), against a real deployment
//! the harness starts as plain processes: a primary, one replica, three sentinels (quorum 2,
//! down after 1 s). The whole conformance suite runs with a Sentinel-driven failover as the
//! fault, through one sentinel URL that never changes; a focused test follows a failover with
//! the same authority object (requests and the release subscription); another moves with a
//! forced failover while the old primary still serves; another checks the primary's and the
//! sentinels' passwords, refused credentials, and that no secret is printed.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use leasehold_conformance::kit::{self, ErrOrFail, OrFail, TestResult};
use leasehold_conformance::scenarios::run_all;
use leasehold_conformance::{harness_error, Context, Failure, Faults, Residue, Verdict};
use leasehold_core::{Authority, Error, FenceSafety, Instant, LockKey, Released};
use leasehold_redis::{KeyLayout, RedisAuthority, RedisConfig};
use leasehold_servers::{RedisServer, SentinelDeployment, SentinelOptions};

mod common;

use common::{blocking, clients, cut_replication, wait_in_sync};

/// Every request, sentinel queries included, gives up after one second.
const TIMEOUT: Duration = Duration::from_millis(1000);

/// How often an authority asks the sentinels whether the primary moved (the crate's
/// `CHECK_EVERY`, documented in docs/redis.md).
const CHECK_EVERY: Duration = Duration::from_secs(1);

fn with_timeout(url: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}timeout_ms={}", TIMEOUT.as_millis())
}

async fn start_with(options: SentinelOptions) -> TestResult<Arc<SentinelDeployment>> {
    kit::start("Redis Sentinel", move || {
        SentinelDeployment::start_with(options)
    })
    .await
}

/// Faults on whichever server the sentinels name as the primary. A restart and a pause are
/// outages shorter than Sentinel's detection time (`down-after-milliseconds` is raised while
/// they last, so the sentinels do not fail over in the middle of a scenario about something
/// else); the failover is Sentinel's own.
struct SentinelFaults(Arc<SentinelDeployment>);

/// While a restart or a pause lasts: longer than any scenario's outage.
const NO_FAILOVER: Duration = Duration::from_secs(3600);

impl SentinelFaults {
    async fn call(
        &self,
        f: impl FnOnce(&SentinelDeployment) -> Result<(), String> + Send + 'static,
    ) -> leasehold_core::Result<()> {
        let deployment = self.0.clone();
        blocking(move || f(&deployment))
            .await
            .map_err(harness_error)
    }
}

fn s(e: leasehold_servers::HarnessError) -> String {
    e.to_string()
}

#[async_trait]
impl Faults for SentinelFaults {
    async fn restart(&self) -> leasehold_core::Result<()> {
        self.call(|d| {
            d.set_down_after(NO_FAILOVER).map_err(s)?;
            d.current_primary().and_then(|p| p.restart()).map_err(s)?;
            d.set_down_after(d.options().down_after).map_err(s)
        })
        .await
    }

    async fn pause(&self) -> leasehold_core::Result<()> {
        self.call(|d| {
            d.set_down_after(NO_FAILOVER).map_err(s)?;
            d.current_primary().and_then(|p| p.pause()).map_err(s)
        })
        .await
    }

    async fn resume(&self) -> leasehold_core::Result<()> {
        self.call(|d| {
            // The sentinels answer while the primary is frozen; ask them first.
            let primary = d.current_primary().map_err(s)?;
            primary.resume().map_err(s)?;
            d.set_down_after(d.options().down_after).map_err(s)
        })
        .await
    }

    /// An operator deletes the lock key on the primary.
    async fn revoke(&self, key: &LockKey) -> leasehold_core::Result<()> {
        let lock_key = KeyLayout::default().lock_key(key);
        self.call(move |d| {
            d.current_primary()
                .and_then(|p| p.command(&["DEL", &lock_key]))
                .map(|_| ())
                .map_err(s)
        })
        .await
    }

    /// The replica catches up, then is cut off: the old primary still grants what clients
    /// connected to it ask for, and the replica never sees it.
    async fn begin_failover(&self) -> leasehold_core::Result<()> {
        self.call(|d| {
            let primary = d.current_primary().map_err(s)?;
            let replica = d.current_replica().map_err(s)?;
            wait_in_sync(primary, replica)?;
            cut_replication(primary, replica)
        })
        .await
    }

    /// The old primary dies; the sentinels notice, agree, and promote the replica. Returns once
    /// every sentinel names it and it says it is the primary. Clients keep their URL.
    async fn complete_failover(&self) -> leasehold_core::Result<()> {
        self.call(|d| {
            let primary = d.current_primary().map_err(s)?;
            let replica = d.current_replica().map_err(s)?;
            primary.kill().map_err(s)?;
            d.wait_for_primary(replica, d.failover_bound()).map_err(s)
        })
        .await
    }
}

/// A lock key left on the primary.
struct SentinelResidue(Arc<SentinelDeployment>);

#[async_trait]
impl Residue for SentinelResidue {
    async fn leftovers(&self, key: &LockKey) -> leasehold_core::Result<Vec<String>> {
        let lock_key = KeyLayout::default().lock_key(key);
        let deployment = self.0.clone();
        let pttl = blocking(move || {
            deployment
                .current_primary()
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

/// The whole suite through one `redis+sentinel://` URL. The failover scenario must end
/// DECLARED (the old primary granted a lease the replica never saw, and the promoted replica
/// hands out its fence again) or PASSED, never fail; restarts without persistence reset the
/// counter, as declared; everything else passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_the_conformance_suite_with_a_sentinel_failover() -> TestResult {
    let deployment = start_with(SentinelOptions::default()).await?;
    let url = with_timeout(&deployment.url());
    let ctx = Context::new(Arc::new(clients(&url)))
        .await
        .or_fail("connect the first client")?
        .with_residue(Arc::new(SentinelResidue(deployment.clone())))
        .with_faults(Arc::new(SentinelFaults(deployment.clone())));
    assert_eq!(ctx.capabilities().fence_safety, FenceSafety::FailoverUnsafe);
    let report = run_all("redis sentinel", &ctx).await;
    println!("{report}");
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
            _ if report.declared_absent(line) => {}
            _ => assert_eq!(
                line.outcome,
                Ok(Verdict::Passed),
                "{}:\n{report}",
                line.scenario
            ),
        }
    }
    // The failover happened: the server started as the replica is the primary now.
    let d = deployment.clone();
    blocking(move || d.wait_for_primary(d.servers()[1], d.failover_bound()))
        .await
        .or_fail("the server started as the replica is the primary")?;
    Ok(())
}

/// How many authorities' subscriptions are on `server`: each subscribes to its own channel,
/// `leasehold:released:<its waiter id>`.
fn subscribers(server: &RedisServer) -> TestResult<u64> {
    let reply = server
        .command(&["PUBSUB", "CHANNELS", "leasehold:released:*"])
        .or_fail("PUBSUB CHANNELS")?;
    Ok(reply.lines().filter(|l| !l.trim().is_empty()).count() as u64)
}

/// Waits until the authority's subscription is on `servers()[index]` (within a few request
/// timeouts: it re-subscribes after a failure with a short backoff).
async fn wait_for_subscriber(deployment: &Arc<SentinelDeployment>, index: usize) -> TestResult {
    let started = Instant::now();
    loop {
        let d = deployment.clone();
        if blocking(move || subscribers(d.servers()[index])).await? == 1 {
            return Ok(());
        }
        assert!(
            started.elapsed() < TIMEOUT * 5,
            "no subscription on server {index} after {:?}",
            started.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One authority object, never reconnected by the caller, across a Sentinel failover: after the
/// primary dies, its requests fail with a retryable `Unavailable` within the request timeout
/// (never a wrong answer), and succeed on the promoted replica within the time Sentinel's
/// settings allow for a failover; its release subscription moves to the new primary, where a
/// waiter blocked in `acquire` is woken by another client's release. A paused sentinel, first
/// in the URL, costs a connect no more than its share of the request timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_authority_follows_a_sentinel_failover() -> TestResult {
    let deployment = start_with(SentinelOptions::default()).await?;
    let url = with_timeout(&deployment.url());

    // A frozen sentinel first in the list: the others are asked within the same timeout.
    {
        let d = deployment.clone();
        blocking(move || d.sentinels()[0].pause())
            .await
            .or_fail("pause the first sentinel")?;
        let started = Instant::now();
        let probe = RedisAuthority::connect(&url).await;
        let took = started.elapsed();
        let d = deployment.clone();
        blocking(move || d.sentinels()[0].resume())
            .await
            .or_fail("resume the first sentinel")?;
        probe.or_fail("one frozen sentinel of three")?;
        assert!(took < TIMEOUT * 2, "connecting took {took:?}");
    }

    let a = Arc::new(RedisAuthority::connect(&url).await.or_fail("connect")?);
    let ttl = Duration::from_secs(30);
    let held_key = LockKey::new("sentinel-held").or_fail("the held key")?;
    let held = a
        .try_acquire(&held_key, ttl)
        .await
        .or_fail("acquire the held key")?
        .or_fail("the held key is free")?;
    // The waiter's subscription starts on the first primary.
    a.wait_for_change(
        &LockKey::new("sentinel-warmup").or_fail("the warm-up key")?,
        Duration::from_millis(1),
    )
    .await
    .or_fail("wait for a change of the warm-up key")?;
    wait_for_subscriber(&deployment, 0).await?;
    {
        let d = deployment.clone();
        blocking(move || {
            let [p1, p2] = d.servers();
            wait_in_sync(p1, p2)
        })
        .await
        .or_fail("the replica catches up")?;
    }

    // The primary dies.
    let killed = Instant::now();
    {
        let d = deployment.clone();
        blocking(move || d.servers()[0].kill())
            .await
            .or_fail("kill the primary")?;
    }
    let bound = deployment.failover_bound().saturating_add(TIMEOUT * 2);
    let key = LockKey::new("sentinel-after").or_fail("the key")?;
    let mut unavailable = 0;
    let grant = loop {
        let sent = Instant::now();
        let answer = a.try_acquire(&key, ttl).await;
        let took = sent.elapsed();
        assert!(
            took <= TIMEOUT + Duration::from_millis(500),
            "one attempt took {took:?}, more than the request timeout allows"
        );
        match answer {
            Ok(Some(grant)) => break grant,
            Ok(None) => return Err(Failure::new("the key is free, yet held?")),
            Err(e) => {
                assert!(
                    matches!(e, Error::Unavailable { .. }) && e.is_retryable(),
                    "during the failover: {e:?}"
                );
                unavailable += 1;
            }
        }
        assert!(
            killed.elapsed() < bound,
            "no acquisition within {bound:?} of the primary's death"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let followed = killed.elapsed();
    println!(
        "acquired on the new primary {followed:?} after the old one died ({unavailable} \
         attempts Unavailable before); bound {bound:?}"
    );
    assert!(
        unavailable > 0,
        "the first attempt cannot have reached a dead server"
    );
    {
        let d = deployment.clone();
        let lock_key = a.config().layout().lock_key(&key);
        let pttl = blocking(move || {
            let p2 = d.servers()[1];
            // Every sentinel names the promoted replica (one may lag the others briefly).
            d.wait_for_primary(p2, d.failover_bound())
                .and_then(|()| p2.command(&["PTTL", &lock_key]))
        })
        .await
        .or_fail("PTTL of the lock key on the promoted replica")?;
        let pttl: i64 = pttl.parse().or_fail(format!("PTTL {pttl:?}"))?;
        assert!(pttl > 0, "the new primary holds the lock key: PTTL {pttl}");
    }
    assert!(grant.fence().raw() > 0);

    // The replicated lease is still held on the new primary: a waiter in the same authority
    // blocks, and another client's release (through its own connect) wakes it.
    let waiter = {
        let (a, key) = (a.clone(), held_key.clone());
        tokio::spawn(async move { a.acquire(&key, ttl, Duration::from_secs(20)).await })
    };
    wait_for_subscriber(&deployment, 1).await?;
    // Long enough for the waiter's retries to back off to their cap.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        !waiter.is_finished(),
        "the key is held: the waiter must wait"
    );
    let other = RedisAuthority::connect(&url)
        .await
        .or_fail("connect another client")?;
    let released_at = Instant::now();
    assert_eq!(
        other
            .release(&held)
            .await
            .or_fail("the other client releases")?,
        Released::Released
    );
    let next = tokio::time::timeout(TIMEOUT * 3, waiter)
        .await
        .or_fail("the waiter missed the release on the new primary")?
        .or_fail("the waiter's task")?
        .or_fail("the waiter acquires")?;
    println!(
        "hand-off on the new primary: {:?} after the release",
        released_at.elapsed()
    );
    assert_eq!(next.key(), &held_key);
    // A failover-unsafe fence: whatever it is, it is a fence of this key, and the next grant
    // on the same server is greater.
    assert_eq!(
        a.release(&next)
            .await
            .or_fail("release the waiter's grant")?,
        Released::Released
    );
    let after = a
        .try_acquire(&held_key, ttl)
        .await
        .or_fail("acquire again")?
        .or_fail("the key was released")?;
    assert!(after.fence() > next.fence());
    Ok(())
}

/// A forced failover (`SENTINEL FAILOVER`) leaves the old primary up and still a master for
/// seconds, until the sentinels convert it into a replica (about 10 s on the test machine), and
/// what it grants meanwhile is thrown away then. The authority does not wait for that: it asks
/// the sentinels every second, and moves its requests and its subscription to the new primary
/// once they name it and `ROLE` confirms it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_failover_moves_the_authority_while_the_old_primary_still_serves() -> TestResult {
    let deployment = start_with(SentinelOptions::default()).await?;
    let url = with_timeout(&deployment.url());
    let a = RedisAuthority::connect(&url).await.or_fail("connect")?;
    let ttl = Duration::from_secs(30);
    let first = LockKey::new("forced-0").or_fail("the first key")?;
    let _ = a
        .try_acquire(&first, ttl)
        .await
        .or_fail("acquire the first key")?
        .or_fail("the first key is free")?;
    a.wait_for_change(&first, Duration::from_millis(1))
        .await
        .or_fail("wait for a change of the first key")?;
    wait_for_subscriber(&deployment, 0).await?;
    {
        let d = deployment.clone();
        blocking(move || {
            let [p1, p2] = d.servers();
            wait_in_sync(p1, p2)?;
            d.failover().map_err(|e| e.to_string())?;
            d.wait_for_primary(p2, d.failover_bound())
                .map_err(|e| e.to_string())
        })
        .await
        .or_fail("the forced failover")?;
    }
    let switched = Instant::now();
    // The watcher's period, then one request timeout for its question and the ROLE check, one
    // for the request that notices, and one of slack for a loaded machine.
    let bound = CHECK_EVERY + TIMEOUT * 3;
    let mut n = 0;
    let (took, old_role) = loop {
        n += 1;
        let key = LockKey::new(format!("forced-{n}")).or_fail("a fresh key")?;
        match a.try_acquire(&key, ttl).await {
            Ok(Some(_)) => {
                let d = deployment.clone();
                let lock_key = a.config().layout().lock_key(&key);
                let (on_new, old_role) = blocking(move || -> TestResult<(bool, String)> {
                    let [p1, p2] = d.servers();
                    let pttl = p2
                        .command(&["PTTL", &lock_key])
                        .or_fail("PTTL on the new primary")?;
                    let pttl: i64 = pttl.parse().or_fail(format!("PTTL {pttl:?}"))?;
                    Ok((pttl > 0, p1.role().unwrap_or_else(|e| e.to_string())))
                })
                .await?;
                if on_new {
                    break (switched.elapsed(), old_role);
                }
            }
            Ok(None) => return Err(Failure::new(format!("a fresh key {key} is held?"))),
            Err(e) => assert!(
                matches!(e, Error::Unavailable { .. }) && e.is_retryable(),
                "during the switch: {e:?}"
            ),
        }
        assert!(
            switched.elapsed() < bound,
            "the authority still used the old primary {bound:?} after the sentinels switched"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    println!(
        "requests on the new primary {took:?} after the sentinels switched (attempt {n}); the \
         old primary then said it was a {old_role}"
    );
    wait_for_subscriber(&deployment, 1).await
}

/// A deployment whose primary and sentinels both want passwords: the right ones connect and
/// lock; a wrong sentinel password or primary password is `Unauthorized` (not retried), a
/// master name no sentinel knows is `Unavailable`; no password shows in any error, `Debug`,
/// or config.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwords_for_the_primary_and_the_sentinels() -> TestResult {
    let options = SentinelOptions {
        password: Some("primary-Pw-1".into()),
        sentinel_password: Some("sentinel-Pw-2".into()),
        ..SentinelOptions::default()
    };
    let deployment = start_with(options).await?;
    let url = with_timeout(&deployment.url());
    assert!(url.contains("sentinel_password="), "{url}");
    let a = RedisAuthority::connect(&url)
        .await
        .or_fail("connect with both passwords")?;
    let key = LockKey::new("sentinel-auth").or_fail("the key")?;
    let g = a
        .try_acquire(&key, Duration::from_secs(5))
        .await
        .or_fail("acquire")?
        .or_fail("the key is free")?;
    assert_eq!(a.release(&g).await.or_fail("release")?, Released::Released);
    let config = RedisConfig::from_url(&url).or_fail("the URL parses")?;
    let shown = format!("{a:?} {config:?}");
    assert!(
        !shown.contains("primary-Pw-1") && !shown.contains("sentinel-Pw-2"),
        "{shown}"
    );

    let wrong_sentinel = url.replace("sentinel-Pw-2", "wrong-sentinel-pw");
    let no_sentinel = url.replace("sentinel_password=sentinel-Pw-2&", "");
    assert!(!no_sentinel.contains("sentinel_password"), "{no_sentinel}");
    let wrong_primary = url.replace("primary-Pw-1", "wrong-primary-pw");
    for (bad, who) in [
        (&wrong_sentinel, "sentinel_password"),
        (&no_sentinel, "sentinel_password"),
        (&wrong_primary, "the primary"),
    ] {
        let started = Instant::now();
        let err = RedisAuthority::connect(bad)
            .await
            .err_or_fail(format!("connect with a bad {who}"))?;
        println!("{err}");
        assert!(
            matches!(err, Error::Unauthorized { .. }) && !err.is_retryable(),
            "{bad}: {err:?}"
        );
        assert!(err.to_string().contains(who), "{err}");
        assert!(started.elapsed() < TIMEOUT * 2);
        let shown = format!("{err} {err:?}");
        for secret in [
            "primary-Pw-1",
            "sentinel-Pw-2",
            "wrong-sentinel-pw",
            "wrong-primary-pw",
        ] {
            assert!(!shown.contains(secret), "{shown}");
        }
    }
    let unknown = url.replace(
        &format!("/{}", deployment.master_name()),
        "/no-such-primary",
    );
    let err = RedisAuthority::connect(&unknown)
        .await
        .err_or_fail("connect to a master no sentinel knows")?;
    println!("{err}");
    assert!(
        matches!(err, Error::Unavailable { .. }) && err.to_string().contains("no-such-primary"),
        "{err:?}"
    );
    Ok(())
}

/// The configuration epoch a sentinel reports for `name` (`config-epoch` in `SENTINEL MASTER`).
fn config_epoch(sentinel: &leasehold_servers::RedisSentinel, name: &str) -> Result<u64, String> {
    let reply = sentinel
        .command(&["SENTINEL", "MASTER", name])
        .map_err(|e| format!("SENTINEL MASTER: {e}"))?;
    let fields: Vec<&str> = reply.lines().collect();
    fields
        .chunks(2)
        .find(|pair| pair.first() == Some(&"config-epoch"))
        .and_then(|pair| pair.get(1))
        .and_then(|epoch| epoch.parse().ok())
        .ok_or_else(|| format!("SENTINEL MASTER without a config-epoch: {reply:?}"))
}

/// Sentinels that are re-provisioned (`SENTINEL REMOVE` and `MONITOR`, which is also what a
/// redeploy without its sentinel.conf amounts to) number the primary's configuration from 0
/// again. An authority that saw a failover remembers a greater epoch; once its connection
/// breaks, it must still find the primary the sentinels now agree on, instead of passing over
/// every answer as one from a sentinel that missed the failover. Bound: the broken request's
/// timeout plus one more for the sentinels, the `ROLE` check and the acquisition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn re_provisioned_sentinels_are_followed_after_a_broken_connection() -> TestResult {
    let deployment = start_with(SentinelOptions::default()).await?;
    let url = with_timeout(&deployment.url());
    let a = RedisAuthority::connect(&url).await.or_fail("connect")?;
    let ttl = Duration::from_secs(30);
    let name = deployment.master_name().to_string();

    // One failover: the first primary dies, the sentinels promote the replica under epoch 1.
    let d = deployment.clone();
    blocking(move || {
        let [p1, p2] = d.servers();
        wait_in_sync(p1, p2)?;
        p1.kill().map_err(s)?;
        d.wait_for_primary(p2, d.failover_bound()).map_err(s)
    })
    .await
    .or_fail("the first failover")?;
    let killed = Instant::now();
    let bound = deployment.failover_bound().saturating_add(TIMEOUT * 2);
    let mut n = 0;
    loop {
        n += 1;
        let key = LockKey::new(format!("reprovision-before-{n}")).or_fail("a fresh key")?;
        match a.try_acquire(&key, ttl).await {
            Ok(Some(_)) => break,
            Ok(None) => return Err(Failure::new(format!("the fresh key {key} is held"))),
            Err(Error::Unavailable { .. }) => {}
            Err(e) => return Err(Failure::new(format!("following the failover: {e:?}"))),
        }
        if killed.elapsed() >= bound {
            return Err(Failure::new(format!(
                "the authority did not follow the failover within {bound:?}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Re-provisioned: every sentinel forgets the primary and monitors it anew.
    let d = deployment.clone();
    let monitored = name.clone();
    let epochs = blocking(move || {
        let primary = d.servers()[1].port().to_string();
        let quorum = d.options().quorum.to_string();
        let down = d.options().down_after.as_millis().to_string();
        let mut before = Vec::new();
        for sentinel in d.sentinels() {
            before.push(config_epoch(sentinel, &monitored)?);
            for args in [
                vec!["SENTINEL", "REMOVE", &monitored],
                vec![
                    "SENTINEL",
                    "MONITOR",
                    &monitored,
                    "127.0.0.1",
                    &primary,
                    &quorum,
                ],
                vec![
                    "SENTINEL",
                    "SET",
                    &monitored,
                    "down-after-milliseconds",
                    &down,
                ],
            ] {
                sentinel.command(&args).map_err(s)?;
            }
        }
        let after = d
            .sentinels()
            .iter()
            .map(|sentinel| config_epoch(sentinel, &monitored))
            .collect::<Result<Vec<u64>, String>>()?;
        Ok::<_, String>((before, after))
    })
    .await
    .or_fail("re-provision the sentinels")?;
    let (before, after) = epochs;
    if before.contains(&0) || after.iter().any(|e| *e != 0) {
        return Err(Failure::new(format!(
            "expected configuration epochs above 0 before and 0 after re-provisioning: \
             {before:?} -> {after:?}"
        )));
    }

    // The authority's connection to the primary breaks.
    let d = deployment.clone();
    let killed_clients = blocking(move || {
        d.servers()[1]
            .command(&["CLIENT", "KILL", "TYPE", "normal"])
            .map_err(s)
    })
    .await
    .or_fail("break the authority's connection")?;
    if killed_clients.parse::<u64>().unwrap_or(0) == 0 {
        return Err(Failure::new(format!(
            "CLIENT KILL found no connection: {killed_clients:?}"
        )));
    }
    let broken = Instant::now();
    let bound = TIMEOUT * 2;
    let mut last = None;
    let mut n = 0;
    while broken.elapsed() < bound {
        n += 1;
        let key = LockKey::new(format!("reprovision-after-{n}")).or_fail("a fresh key")?;
        match a.try_acquire(&key, ttl).await {
            Ok(Some(_)) => {
                println!(
                    "acquired {:?} after the connection broke (attempt {n}); configuration \
                     epochs {before:?} -> {after:?}",
                    broken.elapsed()
                );
                return Ok(());
            }
            Ok(None) => return Err(Failure::new(format!("the fresh key {key} is held"))),
            Err(e) => last = Some(e.to_string()),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Err(Failure::new(format!(
        "no acquisition within {bound:?} of the broken connection ({n} attempts), the last \
         answer: {}",
        last.unwrap_or_default()
    )))
}
