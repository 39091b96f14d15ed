//! The `Lease` handle's own behaviour, on the reference authority and tokio's paused clock.

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{Authority, Instant, Lease, LeaseOptions, LockKey, LostReason};
use leasehold_memory::MemoryAuthority;

const TTL: Duration = Duration::from_millis(300);

fn key() -> LockKey {
    LockKey::new("lease-test").unwrap()
}

async fn lease(a: &MemoryAuthority, options: LeaseOptions) -> Lease {
    let authority: Arc<dyn Authority> = Arc::new(a.clone());
    Lease::try_acquire(authority, &key(), TTL, options)
        .await
        .unwrap()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_failed_renewal_is_loss_at_once_not_at_the_deadline() {
    let a = MemoryAuthority::standalone();
    let l = lease(&a, LeaseOptions::default()).await;
    let deadline = l.deadline();
    a.server().kill();
    let reason = l.lost().await;
    let at = Instant::now();
    assert!(matches!(reason, LostReason::RenewalFailed(_)), "{reason:?}");
    assert!(
        at < deadline,
        "lost at the deadline, not at the failed renewal"
    );
    assert!(at <= Instant::now() && l.ensure_valid().is_err());
    assert_eq!(l.remaining(), Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn max_hold_stops_renewing() {
    let a = MemoryAuthority::standalone();
    let start = Instant::now();
    let l = lease(&a, LeaseOptions::default().with_max_hold(TTL * 2)).await;
    let reason = l.lost().await;
    let held = start.elapsed();
    assert!(matches!(reason, LostReason::MaxHoldReached), "{reason:?}");
    assert!(held >= TTL * 2 && held <= TTL * 3, "held {held:?}");
    // The authority lets the lease run out: soon after, someone else can take the key.
    tokio::time::sleep(TTL).await;
    assert!(a.try_acquire(&key(), TTL).await.unwrap().is_some());
}

#[tokio::test(start_paused = true)]
async fn drop_without_release_on_drop_leaves_the_ttl_to_free_the_key() {
    let a = MemoryAuthority::standalone();
    let l = lease(&a, LeaseOptions::default().with_release_on_drop(false)).await;
    drop(l);
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert!(
        a.try_acquire(&key(), TTL).await.unwrap().is_none(),
        "freed before the TTL"
    );
    tokio::time::sleep(TTL).await;
    assert!(
        a.try_acquire(&key(), TTL).await.unwrap().is_some(),
        "not freed by the TTL"
    );
}

#[tokio::test(start_paused = true)]
async fn lost_resolves_on_release_and_waiters_are_not_stranded() {
    let a = MemoryAuthority::standalone();
    let l = lease(&a, LeaseOptions::default()).await;
    let lost = tokio::spawn(l.lost());
    let _ = l.release().await.unwrap();
    let reason = lost.await.unwrap();
    assert!(matches!(reason, LostReason::Released), "{reason:?}");
}

#[tokio::test(start_paused = true)]
async fn renewal_keeps_the_fence_and_moves_the_deadline() {
    let a = MemoryAuthority::standalone();
    let l = lease(&a, LeaseOptions::default()).await;
    let (fence, first) = (l.fence(), l.deadline());
    tokio::time::sleep(TTL * 5).await;
    l.ensure_valid().unwrap();
    assert_eq!(l.fence(), fence);
    assert!(l.deadline() > first + TTL * 4);
}

#[test]
fn renew_fraction_must_be_inside_zero_and_one() {
    for bad in [0.0, 1.0, -0.5, f64::NAN, 2.0] {
        assert!(
            LeaseOptions::default().with_renew_fraction(bad).is_err(),
            "{bad}"
        );
    }
    assert!(LeaseOptions::default().with_renew_fraction(0.5).is_ok());
}

/// A renewal whose deadline lands before the next scheduled renewal (a lagging session) is
/// followed by another attempt before that deadline, not by giving up on the lease.
#[tokio::test(start_paused = true)]
async fn a_short_renewal_is_retried_before_its_deadline() {
    use async_trait::async_trait;
    use leasehold_core::{Capabilities, Grant, Released};

    /// Answers the first renewal with a deadline only TTL/5 ahead.
    #[derive(Debug)]
    struct Lagging {
        inner: MemoryAuthority,
        renewals: std::sync::atomic::AtomicUsize,
    }

    #[async_trait]
    impl Authority for Lagging {
        fn capabilities(&self) -> &Capabilities {
            self.inner.capabilities()
        }
        async fn try_acquire(
            &self,
            key: &LockKey,
            ttl: Duration,
        ) -> leasehold_core::Result<Option<Grant>> {
            self.inner.try_acquire(key, ttl).await
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
            let n = self
                .renewals
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let deadline = self.inner.renew(grant, ttl).await?;
            Ok(if n == 0 {
                Instant::now() + ttl / 5
            } else {
                deadline
            })
        }
        async fn release(&self, grant: &Grant) -> leasehold_core::Result<Released> {
            self.inner.release(grant).await
        }
    }

    let authority = Arc::new(Lagging {
        inner: MemoryAuthority::standalone(),
        renewals: Default::default(),
    });
    let l = Lease::try_acquire(authority.clone(), &key(), TTL, LeaseOptions::default())
        .await
        .unwrap()
        .unwrap();
    tokio::time::sleep(TTL * 3).await;
    l.ensure_valid()
        .expect("the lease must survive one short renewal");
    assert!(authority.renewals.load(std::sync::atomic::Ordering::SeqCst) >= 3);
}
