//! The `Lease` handle's own behaviour, on the reference authority and tokio's paused clock.

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::time::saturating_add;
use leasehold_core::{
    Authority, Capabilities, ClientOptions, Error, Grant, Instant, Lease, LeaseOptions, LeaseState,
    LockKey, LossSignal, LostReason, Released, SafetyMargin,
};
use leasehold_memory::{MemoryAuthority, MemoryServer};

mod common;

use common::{OrFail, Result};

const TTL: Duration = Duration::from_millis(300);

fn key() -> Result<LockKey> {
    LockKey::new("lease-test").or_fail("the test's key")
}

/// A lease on [`key`], taken through `a`.
async fn lease(a: &MemoryAuthority, options: LeaseOptions) -> Result<Lease> {
    let authority: Arc<dyn Authority> = Arc::new(a.clone());
    Lease::try_acquire(authority, &key()?, TTL, options)
        .await
        .or_fail("acquire")?
        .or_fail("acquire: the key was held")
}

type RenewFuture<'a> = std::pin::Pin<
    Box<dyn std::future::Future<Output = leasehold_core::Result<Instant>> + Send + 'a>,
>;

/// The reference authority with its `renew` replaced: a backend whose renewals misbehave.
struct RenewedBy<F> {
    inner: MemoryAuthority,
    capabilities: Capabilities,
    renew: F,
}

impl<F> std::fmt::Debug for RenewedBy<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RenewedBy")
    }
}

impl<F> RenewedBy<F>
where
    F: for<'a> Fn(&'a MemoryAuthority, &'a Grant, Duration) -> RenewFuture<'a> + Send + Sync,
{
    fn new(inner: MemoryAuthority, renew: F) -> Arc<Self> {
        let capabilities = inner.capabilities().clone();
        Arc::new(RenewedBy {
            inner,
            capabilities,
            renew,
        })
    }

    /// The same, declaring no batched renewal: each lease sends its own renewals, as on etcd
    /// and ZooKeeper.
    fn one_by_one(inner: MemoryAuthority, renew: F) -> Arc<Self> {
        let capabilities = inner.capabilities().clone().with_batch_renewal(false);
        Arc::new(RenewedBy {
            inner,
            capabilities,
            renew,
        })
    }
}

#[async_trait::async_trait]
#[deny(clippy::missing_trait_methods)]
impl<F> Authority for RenewedBy<F>
where
    F: for<'a> Fn(&'a MemoryAuthority, &'a Grant, Duration) -> RenewFuture<'a> + Send + Sync,
{
    fn capabilities(&self) -> &Capabilities {
        &self.capabilities
    }
    async fn try_acquire(
        &self,
        key: &LockKey,
        ttl: Duration,
    ) -> leasehold_core::Result<Option<Grant>> {
        self.inner.try_acquire(key, ttl).await
    }
    async fn try_acquire_all(
        &self,
        keys: &[LockKey],
        ttl: Duration,
    ) -> leasehold_core::Result<Option<Vec<Grant>>> {
        self.inner.try_acquire_all(keys, ttl).await
    }
    async fn acquire(
        &self,
        key: &LockKey,
        ttl: Duration,
        wait: Duration,
    ) -> leasehold_core::Result<Grant> {
        self.inner.acquire(key, ttl, wait).await
    }
    async fn renew(&self, grant: &Grant, ttl: Duration) -> leasehold_core::Result<Instant> {
        (self.renew)(&self.inner, grant, ttl).await
    }
    async fn release(&self, grant: &Grant) -> leasehold_core::Result<Released> {
        self.inner.release(grant).await
    }
    /// One grant after another, each through the renewal given.
    async fn renew_many(&self, grants: &[Grant]) -> Vec<leasehold_core::Result<Instant>> {
        let mut results = Vec::with_capacity(grants.len());
        for grant in grants {
            results.push(self.renew(grant, grant.ttl()).await);
        }
        results
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
    async fn revoke(&self, key: &LockKey) -> leasehold_core::Result<leasehold_core::Revoked> {
        self.inner.revoke(key).await
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

/// A renewal that cannot reach the authority has an unknown outcome: the lease is suspended (no
/// new side effects), renewal goes on, and only the local deadline passing makes it lost.
#[tokio::test(start_paused = true)]
async fn an_unreachable_authority_suspends_the_lease_until_its_deadline() -> Result {
    let a = MemoryAuthority::standalone();
    let l = lease(&a, LeaseOptions::default()).await?;
    let deadline = l.deadline();
    let mut states = l.watch();
    a.server().kill();
    let state = states.changed().await;
    assert!(matches!(state, LeaseState::Suspended), "{state:?}");
    assert!(Instant::now() < deadline, "suspended only at the deadline");
    let err = match l.ensure_valid() {
        Ok(()) => return Err("a suspended lease is still valid".into()),
        Err(e) => e,
    };
    assert!(matches!(err, Error::LeaseSuspended { .. }), "{err}");
    assert!(l.remaining() > Duration::ZERO);
    let reason = l.lost().await;
    assert!(
        Instant::now() >= deadline,
        "lost before the deadline: {reason}"
    );
    assert!(matches!(reason, LostReason::RenewalFailed(_)), "{reason:?}");
    assert!(matches!(l.state(), LeaseState::Lost(_)));
    assert_eq!(l.remaining(), Duration::ZERO);
    Ok(())
}

/// A pause shorter than the TTL: suspended while the renewal hangs, held again once it lands,
/// with the same fence and a deadline past the first one.
#[tokio::test(start_paused = true)]
async fn a_short_outage_suspends_then_holds_again() -> Result {
    let options = ClientOptions {
        request_timeout: TTL / 10,
        ..ClientOptions::default()
    };
    let a = MemoryServer::new().authority(options);
    let l = lease(&a, LeaseOptions::default()).await?;
    let (fence, first) = (l.fence(), l.deadline());
    let mut states = l.watch();
    a.server().pause();
    assert!(matches!(states.changed().await, LeaseState::Suspended));
    assert!(l.ensure_valid().is_err());
    assert!(Instant::now() < first);
    a.server().resume();
    assert!(matches!(states.changed().await, LeaseState::Held));
    assert!(Instant::now() < first, "held again only after the deadline");
    l.ensure_valid().or_fail("held again after the outage")?;
    assert_eq!(l.fence(), fence);
    tokio::time::sleep(TTL * 3).await;
    l.ensure_valid()
        .or_fail("renewal goes on after the outage")?;
    assert!(l.deadline() > first + TTL * 2);
    Ok(())
}

/// A hung renewal (the server never answers within the request timeout) suspends the lease
/// before the deadline, even when the request timeout is longer than the TTL.
#[tokio::test(start_paused = true)]
async fn a_hung_renewal_suspends_before_the_deadline() -> Result {
    let options = ClientOptions {
        request_timeout: TTL * 10,
        ..ClientOptions::default()
    };
    let a = MemoryServer::new().authority(options);
    let l = lease(&a, LeaseOptions::default()).await?;
    let deadline = l.deadline();
    let mut states = l.watch();
    a.server().pause();
    assert!(matches!(states.changed().await, LeaseState::Suspended));
    assert!(Instant::now() < deadline);
    a.server().resume();
    assert!(matches!(states.changed().await, LeaseState::Held));
    l.ensure_valid()
        .or_fail("held again after the hung renewal")
}

/// The backend's loss signal (a session that ended) reaches the lease at once: `ensure_valid`
/// fails without waiting for the renewal task, and `lost()` resolves long before the next renewal.
#[tokio::test(start_paused = true)]
async fn a_fired_loss_signal_ends_the_lease_at_once() -> Result {
    let a = MemoryAuthority::standalone();
    let signal = LossSignal::new();
    let grant = a
        .try_acquire(&key()?, TTL)
        .await
        .or_fail("acquire")?
        .or_fail("acquire: the key was held")?
        .with_loss_signal(signal.clone());
    let authority: Arc<dyn Authority> = Arc::new(a.clone());
    let l = Lease::from_grant(authority, grant, LeaseOptions::default());
    l.ensure_valid().or_fail("a fresh lease")?;
    let start = Instant::now();
    signal.fire(LostReason::SessionEnded);
    // No yield in between: the check itself must see the signal.
    assert!(l.ensure_valid().is_err());
    let reason = l.lost().await;
    assert!(matches!(reason, LostReason::SessionEnded), "{reason:?}");
    assert!(
        start.elapsed() < TTL / 10,
        "lost only after {:?}",
        start.elapsed()
    );
    Ok(())
}

/// `ensure_valid` must check the local deadline itself: the renewal task may not have run (a
/// blocked runtime, a paused process) when the deadline passes.
#[test]
fn ensure_valid_checks_the_deadline_without_the_renewal_task() -> Result {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .or_fail("a runtime")?;
    runtime.block_on(async {
        let a = MemoryAuthority::standalone();
        let l = lease(&a, LeaseOptions::default().with_auto_renew(false)).await?;
        l.ensure_valid().or_fail("a fresh lease")?;
        // Block the only runtime thread past the deadline: the lease's task cannot run.
        std::thread::sleep(TTL + TTL / 2);
        assert!(
            l.watch().current().is_held(),
            "the task ran; this test needs it not to"
        );
        let err = match l.ensure_valid() {
            Ok(()) => return Err("valid past its deadline".into()),
            Err(e) => e,
        };
        assert!(err.is_lease_lost(), "{err}");
        Ok(())
    })
}

/// A lease reported lost is over: its renewal task sends no renewal after that, and gives the
/// key back. The runtime is blocked past the local deadline (the renewal task cannot run) but
/// not past the authority's expiry (a margin of half the TTL keeps them apart), `is_lost()`
/// reports the loss, and then the task runs: it must not renew, and another client must get the
/// key before the authority would have expired it.
#[test]
fn a_lease_reported_lost_renews_nothing_and_gives_the_key_back() -> Result {
    use std::sync::atomic::{AtomicUsize, Ordering};
    const LONG_TTL: Duration = Duration::from_secs(1);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .or_fail("a runtime")?;
    runtime.block_on(async {
        let options = ClientOptions {
            safety_margin: SafetyMargin::new(Duration::ZERO, 500)
                .or_fail("a margin of half the TTL")?,
            ..ClientOptions::default()
        };
        let server = MemoryServer::new();
        let renewals = Arc::new(AtomicUsize::new(0));
        let counted = renewals.clone();
        let authority =
            RenewedBy::one_by_one(server.authority(options), move |inner, grant, ttl| {
                counted.fetch_add(1, Ordering::SeqCst);
                Box::pin(inner.renew(grant, ttl))
            });
        let acquired = Instant::now();
        let lease = Lease::try_acquire(authority, &key()?, LONG_TTL, LeaseOptions::default())
            .await
            .or_fail("acquire")?
            .or_fail("acquire: a fresh key was held")?;
        // The authority's lease runs a whole TTL from before the request; the local deadline
        // half of it.
        let expires = acquired + LONG_TTL;
        let deadline = lease.deadline();
        std::thread::sleep(
            saturating_add(deadline, LONG_TTL / 8).saturating_duration_since(Instant::now()),
        );
        if !lease.is_lost() {
            return Err(format!("not lost {:?} past its deadline", deadline.elapsed()).into());
        }
        let before = renewals.load(Ordering::SeqCst);
        // Let the renewal task run, briefly against the TTL.
        tokio::time::sleep(LONG_TTL / 20).await;
        let after = renewals.load(Ordering::SeqCst);
        let other = server.authority(ClientOptions::default());
        let taken = other
            .try_acquire(&key()?, LONG_TTL)
            .await
            .or_fail("another client's acquire")?;
        let now = Instant::now();
        if now >= expires {
            return Err(format!(
                "the runtime came back {:?} after the authority's expiry: too late to judge",
                now - expires
            )
            .into());
        }
        if after != before {
            return Err(format!(
                "{} renewal(s) sent after the lease was reported lost ({})",
                after - before,
                lease.state()
            )
            .into());
        }
        if taken.is_none() {
            return Err(format!(
                "the lost lease was not given back: the key is still held {:?} before the \
                 authority's expiry",
                expires - now
            )
            .into());
        }
        Ok(())
    })
}

/// `Duration::MAX` is "no limit", not a panic in the renewal task.
#[tokio::test(start_paused = true)]
async fn max_hold_of_duration_max_means_no_limit() -> Result {
    let a = MemoryAuthority::standalone();
    let l = lease(&a, LeaseOptions::default().with_max_hold(Duration::MAX)).await?;
    tokio::time::sleep(TTL * 5).await;
    l.ensure_valid().or_fail("still renewing")?;
    a.server().revoke(&key()?);
    let reason = tokio::time::timeout(TTL * 2, l.lost())
        .await
        .or_fail("lost() resolves")?;
    assert!(matches!(reason, LostReason::Refused), "{reason:?}");
    Ok(())
}

/// `max_wait = Duration::MAX` waits as long as it takes, without a panic.
#[tokio::test(start_paused = true)]
async fn acquire_with_duration_max_waits_for_the_release() -> Result {
    let a = MemoryAuthority::standalone();
    let held = a
        .try_acquire(&key()?, TTL)
        .await
        .or_fail("acquire")?
        .or_fail("acquire: the key was held")?;
    let waiter = tokio::spawn({
        let (a, key) = (a.clone(), key()?);
        async move { a.acquire(&key, TTL, Duration::MAX).await }
    });
    tokio::time::sleep(TTL / 3).await;
    let _ = a.release(&held).await.or_fail("release")?;
    let grant = waiter
        .await
        .or_fail("the waiter's task")?
        .or_fail("the waiter")?;
    assert!(grant.fence() > held.fence());
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn max_hold_stops_renewing() -> Result {
    let a = MemoryAuthority::standalone();
    let start = Instant::now();
    let l = lease(&a, LeaseOptions::default().with_max_hold(TTL * 2)).await?;
    let reason = l.lost().await;
    let held = start.elapsed();
    assert!(matches!(reason, LostReason::MaxHoldReached), "{reason:?}");
    assert!(held >= TTL * 2 && held <= TTL * 3, "held {held:?}");
    // The authority lets the lease run out: soon after, someone else can take the key.
    tokio::time::sleep(TTL).await;
    assert!(a
        .try_acquire(&key()?, TTL)
        .await
        .or_fail("acquire after max_hold")?
        .is_some());
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn drop_without_release_on_drop_leaves_the_ttl_to_free_the_key() -> Result {
    let a = MemoryAuthority::standalone();
    let l = lease(&a, LeaseOptions::default().with_release_on_drop(false)).await?;
    drop(l);
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert!(
        a.try_acquire(&key()?, TTL)
            .await
            .or_fail("acquire after the drop")?
            .is_none(),
        "freed before the TTL"
    );
    tokio::time::sleep(TTL).await;
    assert!(
        a.try_acquire(&key()?, TTL)
            .await
            .or_fail("acquire after the TTL")?
            .is_some(),
        "not freed by the TTL"
    );
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn lost_resolves_on_release_and_waiters_are_not_stranded() -> Result {
    let a = MemoryAuthority::standalone();
    let l = lease(&a, LeaseOptions::default()).await?;
    let lost = tokio::spawn(l.lost());
    let _ = l.release().await.or_fail("release")?;
    let reason = lost.await.or_fail("the task waiting on lost()")?;
    assert!(matches!(reason, LostReason::Released), "{reason:?}");
    Ok(())
}

/// A release records the lease as released before it stops the renewal task: with the task
/// on another worker thread, stopping it first let its exit guard report "the renewal task
/// ended unexpectedly" as a loss (logged at info on every release now and then).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_and_drop_report_released_never_a_failed_renewal() -> Result {
    let a = MemoryAuthority::standalone();
    let authority: Arc<dyn Authority> = Arc::new(a.clone());
    for round in 0..300 {
        let key = LockKey::new(format!("release-race-{round}")).or_fail("the round's key")?;
        let l = Lease::try_acquire(authority.clone(), &key, TTL, LeaseOptions::default())
            .await
            .or_fail(format!("round {round}: acquire"))?
            .or_fail(format!("round {round}: acquire: the key was held"))?;
        let watch = l.watch();
        // Let the renewal task start on the other worker thread.
        tokio::task::yield_now().await;
        if round % 2 == 0 {
            let _ = l
                .release()
                .await
                .or_fail(format!("round {round}: release"))?;
        } else {
            drop(l);
        }
        let state = watch.current();
        assert!(
            matches!(state, LeaseState::Lost(LostReason::Released)),
            "round {round}: {state:?}"
        );
    }
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn renewal_keeps_the_fence_and_moves_the_deadline() -> Result {
    let a = MemoryAuthority::standalone();
    let l = lease(&a, LeaseOptions::default()).await?;
    let (fence, first) = (l.fence(), l.deadline());
    tokio::time::sleep(TTL * 5).await;
    l.ensure_valid().or_fail("renewed past five TTLs")?;
    assert_eq!(l.fence(), fence);
    assert!(l.deadline() > first + TTL * 4);
    Ok(())
}

#[test]
fn renew_fraction_must_be_inside_zero_and_one() -> Result {
    for bad in [0.0, 1.0, -0.5, f64::NAN, 2.0] {
        assert!(
            LeaseOptions::default().with_renew_fraction(bad).is_err(),
            "{bad}"
        );
    }
    assert!(LeaseOptions::default().with_renew_fraction(0.5).is_ok());
    Ok(())
}

/// A renewal whose deadline lands before the next scheduled renewal (a lagging session) is
/// followed by another attempt before that deadline, not by giving up on the lease.
#[tokio::test(start_paused = true)]
async fn a_short_renewal_is_retried_before_its_deadline() -> Result {
    use std::sync::atomic::{AtomicUsize, Ordering};
    // Answers the first renewal with a deadline only TTL/5 ahead.
    let renewals = Arc::new(AtomicUsize::new(0));
    let counted = renewals.clone();
    let authority = RenewedBy::new(MemoryAuthority::standalone(), move |inner, grant, ttl| {
        let n = counted.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            let deadline = inner.renew(grant, ttl).await?;
            Ok(if n == 0 {
                Instant::now() + ttl / 5
            } else {
                deadline
            })
        })
    });
    let l = Lease::try_acquire(authority.clone(), &key()?, TTL, LeaseOptions::default())
        .await
        .or_fail("acquire")?
        .or_fail("acquire: the key was held")?;
    tokio::time::sleep(TTL * 3).await;
    l.ensure_valid()
        .or_fail("the lease must survive one short renewal")?;
    assert!(renewals.load(Ordering::SeqCst) >= 3);
    Ok(())
}

/// A renewal answered only after the local deadline does not make a lost lease held again: loss
/// is final, and the key is given back.
#[tokio::test(start_paused = true)]
async fn a_renewal_answered_after_the_deadline_does_not_revive_the_lease() -> Result {
    // Renewals answer successfully, but only after the grant's deadline.
    let inner = MemoryAuthority::standalone();
    let authority = RenewedBy::new(inner.clone(), |inner, grant, ttl| {
        Box::pin(async move {
            let sent = Instant::now();
            tokio::time::sleep_until(grant.deadline()).await;
            inner.renew(grant, ttl).await?;
            Ok(sent + ttl / 2)
        })
    });
    let l = Lease::try_acquire(authority, &key()?, TTL, LeaseOptions::default())
        .await
        .or_fail("acquire")?
        .or_fail("acquire: the key was held")?;
    let reason = l.lost().await;
    assert!(matches!(reason, LostReason::DeadlinePassed), "{reason:?}");
    tokio::time::sleep(TTL).await;
    assert!(l.state().is_lost(), "lost is final: {}", l.state());
    assert!(l.ensure_valid().is_err());
    assert!(
        inner
            .try_acquire(&key()?, TTL)
            .await
            .or_fail("another acquisition")?
            .is_some(),
        "the lost lease was not given back"
    );
    Ok(())
}

/// A backend whose renew panics kills the renewal task; `lost()` must still resolve.
#[tokio::test(start_paused = true)]
async fn a_renewal_task_that_dies_loses_the_lease() -> Result {
    let authority = RenewedBy::new(MemoryAuthority::standalone(), |_, _, _| {
        Box::pin(async { panic!("a backend bug") })
    });
    let l = Lease::try_acquire(authority, &key()?, TTL, LeaseOptions::default())
        .await
        .or_fail("acquire")?
        .or_fail("acquire: the key was held")?;
    let reason = tokio::time::timeout(TTL / 2, l.lost())
        .await
        .or_fail("lost() resolves when the renewal task dies")?;
    assert!(matches!(reason, LostReason::RenewalFailed(_)), "{reason:?}");
    Ok(())
}
