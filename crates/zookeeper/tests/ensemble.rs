//! Faults on a 3-node ZooKeeper ensemble: the suite with a leader crash as the failover, a leader
//! crash while a lease is held, and a holder whose session expires while it is cut off.
//!
//! Each test starts its own ensemble; they run one at a time (three JVMs each).

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use leasehold_conformance::kit::{ErrOrFail, OrFail, TestResult};
use leasehold_conformance::scenarios::run_all;
use leasehold_conformance::{Context, Faults, Verdict};
use leasehold_core::{
    Authority, Error, FencedRegister, FencedResource, Guarded, Instant, Lease, LeaseOptions,
    LockKey, LostReason,
};
use leasehold_servers::ZkEnsemble;
use leasehold_zookeeper::ZkAuthority;

use common::{clients, ensemble};
use leasehold_conformance::harness_call as blocking;

static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Faults on the whole ensemble. A failover is the leader's crash: the survivors elect a new
/// one (with a new epoch), then the crashed member rejoins as a follower.
struct EnsembleFaults {
    ensemble: Arc<ZkEnsemble>,
    url: String,
    killed: Mutex<Option<usize>>,
}

impl EnsembleFaults {
    async fn each(
        &self,
        f: fn(&leasehold_servers::ZkServer) -> leasehold_servers::Result<()>,
    ) -> leasehold_core::Result<()> {
        let e = self.ensemble.clone();
        blocking(move || e.members().iter().try_for_each(f)).await
    }
}

#[async_trait]
impl Faults for EnsembleFaults {
    /// Every member crashes, then all start again on their data.
    async fn restart(&self) -> leasehold_core::Result<()> {
        self.each(|m| m.kill()).await?;
        let e = self.ensemble.clone();
        blocking(move || e.restart_members(&[0, 1, 2])).await
    }

    async fn pause(&self) -> leasehold_core::Result<()> {
        self.each(|m| m.pause()).await
    }

    /// Every member runs again, and the resume is over when the ensemble takes writes again.
    /// After a pause of every member, the followers may give up on the leader and elect anew;
    /// on a loaded machine that once took over 15 s (CI), and the scenarios measure clients
    /// after the servers are back, not the ensemble's recovery. Bounded by 30 s.
    async fn resume(&self) -> leasehold_core::Result<()> {
        self.each(|m| m.resume()).await?;
        let probe_key = LockKey::new("harness/resume-probe")?;
        let ttl = self.ensemble.tick_time() * 4;
        let started = Instant::now();
        loop {
            let probe = async {
                let a = ZkAuthority::connect(&self.url).await?;
                if let Some(g) = a.try_acquire(&probe_key, ttl).await? {
                    let _ = a.release(&g).await?;
                }
                Ok::<_, Error>(())
            };
            match probe.await {
                Ok(()) => return Ok(()),
                Err(_) if started.elapsed() < Duration::from_secs(30) => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn revoke(&self, key: &LockKey) -> leasehold_core::Result<()> {
        let admin = ZkAuthority::connect(&self.url).await?;
        common::revoke(&self.ensemble.connect_string(), &admin, key).await
    }

    async fn begin_failover(&self) -> leasehold_core::Result<()> {
        let e = self.ensemble.clone();
        let killed = blocking(move || {
            let leader = e.leader()?;
            e.member(leader).kill()?;
            Ok(leader)
        })
        .await?;
        *self.killed.lock().unwrap_or_else(|e| e.into_inner()) = Some(killed);
        Ok(())
    }

    async fn complete_failover(&self) -> leasehold_core::Result<()> {
        let killed = self.killed.lock().unwrap_or_else(|e| e.into_inner()).take();
        let e = self.ensemble.clone();
        blocking(move || {
            e.leader()?;
            if let Some(i) = killed {
                e.member(i).restart()?;
            }
            Ok(())
        })
        .await
    }
}

fn epoch(fence: leasehold_core::Fence) -> u64 {
    fence.raw() >> 32
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_the_conformance_suite_on_an_ensemble_with_a_leader_crash() -> TestResult {
    let _one = ONE_AT_A_TIME.lock().await;
    let ensemble = ensemble().await?;
    let url = common::url(&ensemble.connect_string(), "/conformance");
    let ctx = Context::new(Arc::new(clients(&url)))
        .await
        .or_fail("connect the first client")?
        .with_idle_cleanup(common::IDLE_CLEANUP)
        .with_residue(Arc::new(common::ZkResidue {
            hosts: ensemble.connect_string(),
            url: url.clone(),
        }))
        .with_faults(Arc::new(EnsembleFaults {
            ensemble,
            url,
            killed: Mutex::new(None),
        }));
    let report = run_all("zookeeper, 3-node ensemble", &ctx).await;
    println!("{report}");
    report.assert_passed();
    for line in report.lines.iter().filter(|l| !report.declared_absent(l)) {
        assert_eq!(
            line.outcome,
            Ok(Verdict::Passed),
            "{}:\n{report}",
            line.scenario
        );
    }
    Ok(())
}

/// The leader crashes while A holds a renewed lease and B keeps trying: B never gets the key
/// while A's lease is valid, and every fence after the election is greater (a greater epoch).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_crash_while_held_keeps_one_holder_and_fences_grow() -> TestResult {
    let _one = ONE_AT_A_TIME.lock().await;
    let ensemble = ensemble().await?;
    let url = format!(
        "zk://{}/failover?timeout_ms=2000",
        ensemble.connect_string()
    );
    let a: Arc<dyn Authority> = Arc::new(ZkAuthority::connect(&url).await.or_fail("connect A")?);
    let b = ZkAuthority::connect(&url).await.or_fail("connect B")?;
    let key = LockKey::new("failover").or_fail("the key")?;
    let ttl = Duration::from_secs(2);
    let lease = Arc::new(
        Lease::try_acquire(a.clone(), &key, ttl, LeaseOptions::default())
            .await
            .or_fail("A's lease")?
            .or_fail("the key is free")?,
    );
    let before = lease.fence();

    let stop = Arc::new(tokio::sync::Notify::new());
    let prober = tokio::spawn({
        let (b, key, lease, stop) = (b.clone(), key.clone(), lease.clone(), stop.clone());
        async move {
            let mut got = Vec::new();
            loop {
                if let Ok(Some(grant)) = b.try_acquire(&key, ttl).await {
                    let a_valid = lease.ensure_valid().is_ok();
                    let _ = b.release(&grant).await;
                    got.push((grant.fence(), a_valid));
                }
                tokio::select! {
                    _ = stop.notified() => return got,
                    _ = tokio::time::sleep(Duration::from_millis(20)) => {}
                }
            }
        }
    });

    let e = ensemble.clone();
    let killed = blocking(move || {
        let leader = e.leader()?;
        e.member(leader).kill()?;
        e.leader()?;
        Ok(leader)
    })
    .await
    .or_fail("kill the leader")?;
    // Let the clients find the new leader, then a while longer.
    tokio::time::sleep(ttl).await;
    stop.notify_one();
    let got = prober.await.or_fail("the prober")?;
    for (fence, a_valid) in &got {
        assert!(
            !a_valid,
            "B was granted fence {fence} while A's lease was still valid"
        );
        assert!(*fence > before);
    }
    let survived = !lease.is_lost();
    eprintln!(
        "leader {killed} killed; A's lease {}; B got the key {} times meanwhile",
        if survived { "survived" } else { "was lost" },
        got.len()
    );
    drop(lease);
    let after = b
        .acquire(&key, ttl, ttl * 3)
        .await
        .or_fail("B acquires after the election")?;
    assert!(
        after.fence() > before,
        "{} after the election, {} before",
        after.fence(),
        before
    );
    assert!(
        epoch(after.fence()) > epoch(before),
        "the new leader's epoch is in the fence: {:#x} -> {:#x}",
        before.raw(),
        after.fence().raw()
    );
    let _ = b.release(&after).await.or_fail("B releases")?;
    Ok(())
}

/// A's server stops answering (SIGSTOP of the one member A talks to) for longer than A's session
/// timeout: the leader expires A's session, A's `lost()` fires, B acquires with a greater fence
/// and claims the resource, and A's late write with its old fence is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_holder_loses_its_lease_and_its_stale_write_is_refused() -> TestResult {
    let _one = ONE_AT_A_TIME.lock().await;
    let ensemble = ensemble().await?;
    let e = ensemble.clone();
    let leader = blocking(move || e.leader()).await.or_fail("the leader")?;
    let x = (0..3).find(|&i| i != leader).or_fail("a follower")?;
    let others: Vec<String> = (0..3)
        .filter(|&i| i != x)
        .map(|i| ensemble.member(i).connect_string())
        .collect();
    let a_url = format!(
        "zk://{}/expiry?timeout_ms=1000",
        ensemble.member(x).connect_string()
    );
    let b_url = format!("zk://{}/expiry?timeout_ms=1000", others.join(","));
    let a: Arc<dyn Authority> = Arc::new(ZkAuthority::connect(&a_url).await.or_fail("connect A")?);
    let b = ZkAuthority::connect(&b_url).await.or_fail("connect B")?;
    let key = LockKey::new("payout:7").or_fail("the key")?;
    let ttl = Duration::from_secs(1);
    let register = FencedRegister::new();

    let lease = Lease::try_acquire(a.clone(), &key, ttl, LeaseOptions::default())
        .await
        .or_fail("A's lease")?
        .or_fail("the key is free")?;
    let stale = lease.grant().clone();
    assert_eq!(
        register.claim(lease.fence()).await.or_fail("A claims")?,
        Guarded::Accepted
    );
    assert_eq!(
        register
            .write(lease.fence(), "A: 1")
            .await
            .or_fail("A writes")?,
        Guarded::Accepted
    );

    let e = ensemble.clone();
    blocking(move || e.member(x).pause())
        .await
        .or_fail("pause A's server")?;
    let paused = Instant::now();
    let waiter = tokio::spawn({
        let (b, key) = (b.clone(), key.clone());
        async move {
            let grant = b.acquire(&key, ttl, Duration::from_secs(10)).await;
            (grant, Instant::now())
        }
    });
    let deadline = lease.deadline();
    let reason = tokio::time::timeout_at(deadline + Duration::from_millis(500), lease.lost())
        .await
        .or_fail("lost() fires by the deadline while A's server is frozen")?;
    assert!(
        matches!(
            reason,
            LostReason::RenewalFailed(_) | LostReason::DeadlinePassed | LostReason::SessionEnded
        ),
        "{reason:?}"
    );
    let lost_at = Instant::now();
    let (granted, got_at) = waiter.await.or_fail("B's waiting task")?;
    let fresh = granted.or_fail("B gets the key once the leader expires A's session")?;
    assert!(
        got_at >= lost_at,
        "B held the key before A knew it had lost it"
    );
    assert!(lease.ensure_valid().is_err());
    assert!(
        got_at - paused >= ttl,
        "B got the key {:?} after A was cut off, before A's session could expire",
        got_at - paused
    );
    assert!(fresh.fence() > stale.fence());

    // B claims the resource first thing; A's write, late, carries the old fence.
    assert_eq!(
        register.claim(fresh.fence()).await.or_fail("B claims")?,
        Guarded::Accepted
    );
    assert_eq!(
        register
            .write(stale.fence(), "A: 2")
            .await
            .or_fail("A's late write")?,
        Guarded::Stale {
            newest: fresh.fence().value()
        }
    );
    assert!(register
        .write(fresh.fence(), "B: 1")
        .await
        .or_fail("B writes")?
        .is_accepted());

    // Once A's client knows (its side gives up after 7/5 of the timeout), renewing says why.
    tokio::time::sleep_until(paused + ttl * 2).await;
    let e = ensemble.clone();
    blocking(move || e.member(x).resume())
        .await
        .or_fail("resume A's server")?;
    let err = a
        .renew(&stale, ttl)
        .await
        .err_or_fail("A renews after its session ended")?;
    assert!(
        matches!(
            err,
            Error::LeaseLost {
                reason: LostReason::SessionEnded | LostReason::Refused,
                ..
            }
        ),
        "{err:?}"
    );
    drop(lease);
    let _ = b.release(&fresh).await.or_fail("B releases")?;
    Ok(())
}

/// Starts an ensemble of `size` members as `config` says, or says why it did not start.
async fn ensemble_with(
    size: usize,
    config: leasehold_servers::ZkConfig,
) -> Result<Arc<ZkEnsemble>, String> {
    tokio::task::spawn_blocking(move || ZkEnsemble::start_with(size, config))
        .await
        .map_err(|e| e.to_string())?
        .map(Arc::new)
        .map_err(|e| format!("the ZooKeeper ensemble must start for this test: {e}"))
}

/// A lease granted through `url`, with the instant its acquisition returned: its deadline must
/// leave room for half the ensemble's real tick (the leader learns of a session through a
/// follower's or an observer's reply to its ping, every half tick), counted from no later than
/// that instant.
async fn deadline_allows_half_a_tick(url: &str, tick: Duration) -> Result<(), String> {
    let a = ZkAuthority::connect(url)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let ttl = Duration::from_secs(2);
    let key = LockKey::new("touch-lag").map_err(|e| e.to_string())?;
    let grant = a
        .try_acquire(&key, ttl)
        .await
        .map_err(|e| format!("try_acquire: {e}"))?
        .ok_or("the fresh key is held")?;
    let returned = Instant::now();
    let latest = returned + ttl.saturating_sub(tick / 2);
    if grant.deadline() > latest {
        return Err(format!(
            "the deadline ends {:?} after the grant returned, later than the TTL {ttl:?} less \
             half the real tick {tick:?} allows",
            grant.deadline().saturating_duration_since(returned)
        ));
    }
    Ok(())
}

/// `minSessionTimeout` is set apart from `tickTime` (here half a tick): the tick is read from
/// the servers (`conf`), not guessed as half the minimum session timeout, and both the expiry
/// slack and the deadlines' allowance for the leader's touch lag follow the real one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tick_is_read_from_the_servers_not_guessed_from_the_minimum_session_timeout(
) -> Result<(), String> {
    let _one = ONE_AT_A_TIME.lock().await;
    // Half a tick stays above the shortest session the authority probes for (250 ms).
    let tick = Duration::from_millis(1000);
    let config = leasehold_servers::ZkConfig::default()
        .tick_time(tick)
        .min_session_timeout(tick / 2);
    let ensemble = ensemble_with(3, config).await?;
    let url = common::url(&ensemble.connect_string(), "/tick");
    let a = ZkAuthority::connect(&url)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let capabilities = a.capabilities();
    if capabilities.ttl.min != tick / 2 {
        return Err(format!(
            "the server grants {:?} at least, not minSessionTimeout {:?}",
            capabilities.ttl.min,
            tick / 2
        ));
    }
    if capabilities.expiry_slack != tick {
        return Err(format!(
            "expiry slack {:?}, not the servers' tick {tick:?}",
            capabilities.expiry_slack
        ));
    }
    if capabilities.exclusion.can_end_early() {
        return Err(format!("declared: {}", capabilities.exclusion));
    }
    deadline_allows_half_a_tick(&url, tick).await
}

/// One voter and two observers: a client of an observer is touched at the leader only when
/// the observer reports it, as a follower does, so the deadlines allow for that lag.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observers_count_as_learners_for_the_touch_lag() -> Result<(), String> {
    let _one = ONE_AT_A_TIME.lock().await;
    let config = leasehold_servers::ZkConfig::default().observers(2);
    let ensemble = ensemble_with(3, config).await?;
    let tick = ensemble.tick_time();
    let observers: Vec<String> = ensemble.members()[1..]
        .iter()
        .map(|m| m.connect_string())
        .collect();
    let url = common::url(&observers.join(","), "/observed");
    deadline_allows_half_a_tick(&url, tick).await
}

/// Without `conf` in `4lw.commands.whitelist` the tick cannot be read: an ensemble's
/// deadlines then rest on an estimate, and the authority declares that a lease can end before
/// its holder's deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_tick_on_an_ensemble_is_declared() -> Result<(), String> {
    let _one = ONE_AT_A_TIME.lock().await;
    let config = leasehold_servers::ZkConfig::default().without_conf_word();
    let ensemble = ensemble_with(3, config).await?;
    let url = common::url(&ensemble.connect_string(), "/untold");
    let a = ZkAuthority::connect(&url)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let declared = &a.capabilities().exclusion;
    if !declared.can_end_early() || !declared.to_string().contains("conf") {
        return Err(format!(
            "with the tick unknown on an ensemble the authority declares its leases {declared}"
        ));
    }
    Ok(())
}
