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

use crate::process_tree;
use crate::server_cpu::ServerCpu;
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

/// Bytes this process read and wrote through system calls so far (`rchar` and `wchar` of
/// `/proc/self/io`): the bench does almost no file I/O, so this is its network traffic.
fn io_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/io")
        .ok()
        .map_or(0, |s| {
            s.lines()
                .filter_map(|l| {
                    let (name, value) = l.split_once(':')?;
                    ["rchar", "wchar"]
                        .contains(&name)
                        .then(|| value.trim().parse::<u64>().ok())?
                })
                .sum()
        })
}

/// What the server and this client have done so far.
#[derive(Debug, Clone, Copy)]
struct Reading {
    at: Instant,
    renewals: u64,
    requests: u64,
    ops: Option<u64>,
    client_cpu: Duration,
    server_cpu: Option<Duration>,
    bytes: u64,
}

impl Reading {
    async fn take(
        subject: &Subject,
        counting: &Counting,
        server: &mut Option<ServerCpu>,
    ) -> Reading {
        if let Some(server) = server.as_mut() {
            server.refresh();
        }
        Reading {
            at: Instant::now(),
            renewals: counting.renewals.load(Ordering::Relaxed),
            requests: counting.requests.load(Ordering::Relaxed),
            ops: server_ops(subject).await,
            client_cpu: cpu(),
            server_cpu: server.as_ref().map(ServerCpu::total),
            bytes: io_bytes(),
        }
    }

    /// The server's CPU from `self` to `later`, less what it spends at rest over as long
    /// (`rest`: its CPU per second with nothing held).
    fn server_cpu_to(&self, later: &Reading, rest: Option<f64>) -> Option<Duration> {
        let spent = later.server_cpu?.saturating_sub(self.server_cpu?);
        let idle = rest.unwrap_or(0.0) * later.at.saturating_duration_since(self.at).as_secs_f64();
        Some(spent.saturating_sub(Duration::from_secs_f64(idle.max(0.0))))
    }
}

/// Holds `n` leases of `ttl` (renewed every third of it) for three renewal ticks, and prints
/// what they cost: acquiring them (server operations, server CPU and bytes per acquisition)
/// and holding them (per renewal tick: renewal requests, server operations, server and client
/// CPU, bytes; per held lease: client memory and the server's proportional memory).
///
/// The server's CPU at rest is measured first, for two seconds, and taken off both phases;
/// `server` is `None` when the bench did not start the server itself (`--url`).
pub async fn run(
    subject: &Subject,
    mut server: Option<ServerCpu>,
    n: usize,
    ttl: Duration,
) -> std::result::Result<(), BoxError> {
    let counting = Arc::new(Counting {
        inner: subject.authority.clone(),
        renewals: AtomicU64::new(0),
        requests: AtomicU64::new(0),
    });
    let authority: Arc<dyn Authority> = counting.clone();
    let pid = std::process::id();
    let immediate = subject.server_ops.as_ref().is_some_and(|o| o.immediate());
    let root = server.as_ref().map(ServerCpu::root);
    let rest = {
        let before = Reading::take(subject, &counting, &mut server).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let after = Reading::take(subject, &counting, &mut server).await;
        match (before.server_cpu, after.server_cpu) {
            (Some(a), Some(b)) => Some(
                b.saturating_sub(a).as_secs_f64()
                    / after.at.saturating_duration_since(before.at).as_secs_f64(),
            ),
            _ => None,
        }
    };
    let memory_before = (resident(), root.and_then(process_tree::proportional_set));
    let start = Reading::take(subject, &counting, &mut server).await;
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
    let acquired = Reading::take(subject, &counting, &mut server).await;
    let took = acquired.at.saturating_duration_since(start.at);
    let memory_after = (resident(), root.and_then(process_tree::proportional_set));
    let tick = ttl / 3;
    tokio::time::sleep(tick / 2).await;
    let first = Reading::take(subject, &counting, &mut server).await;
    tokio::time::sleep(tick * TICKS).await;
    let last = Reading::take(subject, &counting, &mut server).await;
    let lost = leases.iter().filter(|l| l.is_lost()).count();
    let ticks = last.at.saturating_duration_since(first.at).as_secs_f64() / tick.as_secs_f64();
    let per_tick = |a: u64, b: u64| (b.saturating_sub(a)) as f64 / ticks;
    let per_lease = |a: u64, b: u64| b.saturating_sub(a) as f64 / n.max(1) as f64;
    let ops = match (first.ops, last.ops, &subject.server_ops) {
        (Some(a), Some(b), Some(s)) => format!("{:.0} {} per tick", per_tick(a, b), s.unit()),
        _ => "server ops not counted".to_string(),
    };
    println!(
        "held {n} leases (acquired in {took:?}): per renewal tick ({tick:?}) {:.0} renewals in \
         {:.1} requests{}, {ops}, client CPU {:.1?}; {:.0} bytes resident per lease; {lost} lost",
        per_tick(first.renewals, last.renewals),
        per_tick(first.requests, last.requests),
        if subject.authority.capabilities().batch_renewal {
            " (batched)"
        } else {
            " (one per lease)"
        },
        last.client_cpu
            .saturating_sub(first.client_cpu)
            .div_f64(ticks),
        per_lease(memory_before.0, memory_after.0),
    );
    let shown = |d: Option<Duration>, per: f64| {
        d.map_or("not read (--url)".to_string(), |d| {
            format!("{:.1?}", d.div_f64(per.max(f64::MIN_POSITIVE)))
        })
    };
    let acquisition_ops = match (start.ops, acquired.ops, immediate) {
        (Some(a), Some(b), true) => format!("{:.2}", per_lease(a, b)),
        _ => "not counted".to_string(),
    };
    println!(
        "  server, per acquisition: {acquisition_ops} ops, CPU {}, {:.0} bytes on the wire \
         (while {} renewals ran among them)",
        shown(start.server_cpu_to(&acquired, rest), n as f64),
        per_lease(start.bytes, acquired.bytes),
        acquired.renewals.saturating_sub(start.renewals),
    );
    println!(
        "  server, per renewal tick: CPU {} (at rest {}/s taken off), {:.0} bytes on the wire; \
         server memory per held lease {}",
        shown(first.server_cpu_to(&last, rest), ticks),
        rest.map_or("?".to_string(), |r| format!(
            "{:.1?}",
            Duration::from_secs_f64(r)
        )),
        per_tick(first.bytes, last.bytes),
        match memory_before.1.zip(memory_after.1) {
            Some((a, b)) => format!("{:.0} bytes (proportional set)", per_lease(a, b)),
            None => "not read".to_string(),
        },
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
