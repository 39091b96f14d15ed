//! Cost at scale: many leases held at once and renewed in the background. Prints renewal calls
//! and server operations per renewal tick, client CPU per tick, and client memory per lease.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use leasehold::{
    Authority, Capabilities, Grant, Inspection, Instant, KeyPrefix, Lease, LeaseOptions, LockKey,
    Released, Result,
};

use crate::{BoxError, Subject};

/// How many renewal ticks the window covers.
const TICKS: u32 = 3;

/// Counts renewal requests on the way to the backend: each `renew` is one, and so is each
/// `renew_many` batch.
#[derive(Debug)]
struct Counting {
    inner: Arc<dyn Authority>,
    renewals: AtomicU64,
    requests: AtomicU64,
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl Authority for Counting {
    fn capabilities(&self) -> &Capabilities {
        self.inner.capabilities()
    }
    async fn try_acquire(&self, key: &LockKey, ttl: Duration) -> Result<Option<Grant>> {
        self.inner.try_acquire(key, ttl).await
    }
    async fn try_acquire_all(&self, keys: &[LockKey], ttl: Duration) -> Result<Option<Vec<Grant>>> {
        self.inner.try_acquire_all(keys, ttl).await
    }
    async fn acquire(&self, key: &LockKey, ttl: Duration, max_wait: Duration) -> Result<Grant> {
        self.inner.acquire(key, ttl, max_wait).await
    }
    async fn renew(&self, grant: &Grant, ttl: Duration) -> Result<Instant> {
        self.renewals.fetch_add(1, Ordering::Relaxed);
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.inner.renew(grant, ttl).await
    }
    async fn renew_many(&self, grants: &[Grant]) -> Vec<Result<Instant>> {
        self.renewals
            .fetch_add(grants.len() as u64, Ordering::Relaxed);
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.inner.renew_many(grants).await
    }
    async fn release(&self, grant: &Grant) -> Result<Released> {
        self.inner.release(grant).await
    }
    async fn inspect(&self, key: &LockKey) -> Result<Inspection> {
        self.inner.inspect(key).await
    }
    async fn list_keys(&self, prefix: &KeyPrefix, limit: usize) -> Result<Vec<LockKey>> {
        self.inner.list_keys(prefix, limit).await
    }
    async fn proclaim(&self, grant: &Grant, value: &[u8]) -> Result<()> {
        self.inner.proclaim(grant, value).await
    }
    async fn revoke(&self, key: &LockKey) -> leasehold::Result<leasehold::Revoked> {
        self.inner.revoke(key).await
    }
    async fn wait_for_change(&self, key: &LockKey, max_wait: Duration) -> Result<()> {
        self.inner.wait_for_change(key, max_wait).await
    }
    async fn close(&self) -> Result<()> {
        self.inner.close().await
    }
}

/// Resident memory of this process, in bytes.
fn resident() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096)
}

/// User + system CPU time of this process, all threads (`/proc/self/stat` counts it in
/// USER_HZ ticks, which Linux fixes at 100 per second for user space).
fn cpu() -> Duration {
    let ticks = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| {
            // The command name may contain spaces; the fields after it start at `)`.
            let rest = &s[s.rfind(')')? + 2..];
            let fields: Vec<&str> = rest.split_whitespace().collect();
            let utime: u64 = fields.get(11)?.parse().ok()?;
            let stime: u64 = fields.get(12)?.parse().ok()?;
            Some(utime + stime)
        })
        .unwrap_or(0);
    Duration::from_millis(ticks * 10)
}

/// Holds `n` leases of `ttl` (renewed every third of it) for three renewal ticks.
pub async fn run(subject: &Subject, n: usize, ttl: Duration) -> std::result::Result<(), BoxError> {
    let counting = Arc::new(Counting {
        inner: subject.authority.clone(),
        renewals: AtomicU64::new(0),
        requests: AtomicU64::new(0),
    });
    let authority: Arc<dyn Authority> = counting.clone();
    let pid = std::process::id();
    let before = resident();
    let started = Instant::now();
    // Acquired by 64 tasks at once, so 10,000 leases do not take minutes on a slow backend.
    let mut handles = Vec::new();
    let per_task = n.div_ceil(64);
    for t in 0..64usize {
        let authority = authority.clone();
        handles.push(tokio::spawn(async move {
            let mut leases = Vec::new();
            for i in (t * per_task)..((t + 1) * per_task).min(n) {
                let key = LockKey::new(format!("bench-held/{pid}/{i}"))?;
                let lease =
                    Lease::try_acquire(authority.clone(), &key, ttl, LeaseOptions::default())
                        .await?
                        .ok_or("a bench-held key was taken")?;
                leases.push(lease);
            }
            Ok::<_, BoxError>(leases)
        }));
    }
    let mut leases = Vec::with_capacity(n);
    for h in handles {
        leases.extend(h.await??);
    }
    let took = started.elapsed();
    let after = resident();
    let tick = ttl / 3;
    let window = tick * TICKS;
    let (renewals0, requests0, ops0, cpu0) = (
        counting.renewals.load(Ordering::Relaxed),
        counting.requests.load(Ordering::Relaxed),
        server_ops(subject).await,
        cpu(),
    );
    tokio::time::sleep(window).await;
    let (renewals1, requests1, ops1, cpu1) = (
        counting.renewals.load(Ordering::Relaxed),
        counting.requests.load(Ordering::Relaxed),
        server_ops(subject).await,
        cpu(),
    );
    let lost = leases.iter().filter(|l| l.is_lost()).count();
    let per_tick = |a: u64, b: u64| (b.saturating_sub(a)) as f64 / f64::from(TICKS);
    let ops = match (ops0, ops1, &subject.server_ops) {
        (Some(a), Some(b), Some(s)) => format!("{:.0} {} per tick", per_tick(a, b), s.unit()),
        _ => "server ops not counted".to_string(),
    };
    println!(
        "held {n} leases (acquired in {took:?}): per renewal tick ({tick:?}) {:.0} renewals in \
         {:.1} requests{}, {ops}, client CPU {:.1?}; {:.0} bytes resident per lease; {lost} lost",
        per_tick(renewals0, renewals1),
        per_tick(requests0, requests1),
        if subject.authority.capabilities().batch_renewal {
            " (batched)"
        } else {
            " (one per lease)"
        },
        (cpu1.saturating_sub(cpu0)) / TICKS,
        after.saturating_sub(before) as f64 / n.max(1) as f64,
    );
    // Release concurrently as well.
    let mut handles = Vec::new();
    let mut rest = leases;
    while !rest.is_empty() {
        let chunk: Vec<Lease> = rest.drain(..rest.len().min(per_task.max(1))).collect();
        handles.push(tokio::spawn(async move {
            for lease in chunk {
                let _ = lease.release().await;
            }
        }));
    }
    for h in handles {
        h.await?;
    }
    Ok(())
}

async fn server_ops(subject: &Subject) -> Option<u64> {
    subject.server_ops.as_ref()?.count().await.ok()
}
