//! Batched renewal (issue 15): leases on one client renew together, one request per renewal
//! tick, and a refusal inside a batch loses only the lease it names. On the reference authority
//! and tokio's paused clock; the conformance scenario `renewal_refusal_loses_only_that_lease`
//! checks the same on every backend against its real server.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_core::{
    Authority, Capabilities, Grant, Instant, Lease, LeaseOptions, LockKey, LostReason, Released,
    Result,
};
use leasehold_memory::MemoryAuthority;

/// Counts `renew_many` requests and the grants in each.
#[derive(Debug)]
struct Counted {
    inner: MemoryAuthority,
    batches: Mutex<Vec<Vec<LockKey>>>,
    single: AtomicUsize,
}

#[async_trait::async_trait]
impl Authority for Counted {
    fn capabilities(&self) -> &Capabilities {
        self.inner.capabilities()
    }
    async fn try_acquire(&self, key: &LockKey, ttl: Duration) -> Result<Option<Grant>> {
        self.inner.try_acquire(key, ttl).await
    }
    async fn acquire(&self, key: &LockKey, ttl: Duration, wait: Duration) -> Result<Grant> {
        self.inner.acquire(key, ttl, wait).await
    }
    async fn renew(&self, grant: &Grant, ttl: Duration) -> Result<Instant> {
        self.single.fetch_add(1, Ordering::SeqCst);
        self.inner.renew(grant, ttl).await
    }
    async fn renew_many(&self, grants: &[Grant]) -> Vec<Result<Instant>> {
        self.batches
            .lock()
            .unwrap()
            .push(grants.iter().map(|g| g.key().clone()).collect());
        self.inner.renew_many(grants).await
    }
    async fn release(&self, grant: &Grant) -> Result<Released> {
        self.inner.release(grant).await
    }
}

fn counted() -> Arc<Counted> {
    Arc::new(Counted {
        inner: MemoryAuthority::standalone(),
        batches: Mutex::default(),
        single: AtomicUsize::new(0),
    })
}

const TTL: Duration = Duration::from_secs(3);

async fn hold(authority: &Arc<Counted>, n: usize, gap: Duration) -> Vec<Lease> {
    let client: Arc<dyn Authority> = authority.clone();
    let mut leases = Vec::new();
    for i in 0..n {
        let key = LockKey::new(format!("batched/{i}")).unwrap();
        leases.push(
            Lease::try_acquire(client.clone(), &key, TTL, LeaseOptions::default())
                .await
                .unwrap()
                .unwrap(),
        );
        tokio::time::sleep(gap).await;
    }
    leases
}

/// 100 leases taken 5 ms apart (half a second between the first and the last) renew every
/// second (a third of the TTL). After the first tick they renew as one batch: in the following
/// three ticks, at most four requests carry every renewal, and no lease was renewed alone.
#[tokio::test(start_paused = true)]
async fn leases_on_one_client_renew_in_one_batch_per_tick() {
    let authority = counted();
    let leases = hold(&authority, 100, Duration::from_millis(5)).await;
    tokio::time::sleep(TTL / 3 + TTL / 6).await;
    let before = authority.batches.lock().unwrap().len();
    tokio::time::sleep(TTL).await;
    let batches = authority.batches.lock().unwrap()[before..].to_vec();
    let renewed: usize = batches.iter().map(Vec::len).sum();
    assert!(
        batches.len() <= 4,
        "{} requests in three ticks: {:?}",
        batches.len(),
        batches.iter().map(Vec::len).collect::<Vec<_>>()
    );
    assert!(renewed >= 300, "only {renewed} renewals in three ticks");
    assert_eq!(authority.single.load(Ordering::SeqCst), 0);
    assert!(leases.iter().all(|l| l.state().is_held()));
}

/// One lease of ten is released behind its back (an operator, or its own stale handle): at the
/// next batch, its renewal is refused and it is lost, while the nine renewed in the same batch
/// stay held and keep renewing.
#[tokio::test(start_paused = true)]
async fn a_refusal_in_a_batch_loses_only_that_lease() {
    let authority = counted();
    let leases = hold(&authority, 10, Duration::ZERO).await;
    let victim = &leases[3];
    let _ = authority.inner.release(victim.grant()).await.unwrap();
    let reason = tokio::time::timeout(TTL, victim.lost()).await.unwrap();
    assert!(matches!(reason, LostReason::Refused), "{reason:?}");
    let batches = authority.batches.lock().unwrap().clone();
    let with_victim = batches
        .iter()
        .find(|b| b.contains(victim.key()))
        .expect("the victim's renewal went in a batch");
    assert!(with_victim.len() > 1, "the victim was renewed alone");
    tokio::time::sleep(TTL * 2).await;
    for (i, lease) in leases.iter().enumerate() {
        if i != 3 {
            assert!(lease.state().is_held(), "lease {i}: {:?}", lease.state());
        }
    }
}
