//! The workload on an in-process authority: the reference and every conformance mutant.
//!
//! The in-process authority lives in one process, so the workers are tasks sharing one client
//! (as the threads of one application would) and a pause is a *freeze*: the worker's view of
//! the authority stops answering, its renewals included, as they would in a stopped process,
//! while it sleeps at its pause point. The resource is in memory; the history, the worker loop
//! and the checker are the ones the process runs use. This is how the workload proves it has
//! teeth: the reference passes, and each mutant whose defect a lock-set history can show fails.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use leasehold_conformance::mutants::Mutant;
use leasehold_conformance::workload::{Event, FaultKind, History, What};
use leasehold_conformance::Context;
use leasehold_core::{
    Authority, Capabilities, FenceSafety, Grant, Inspection, Instant, KeyPrefix, LockKey, Released,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::watch;

use crate::resource::{MemorySets, SetResource};
use crate::runner::RunError;
use crate::worker::{Clock, Log, PauseBy, Worker, WorkerConfig};

/// A worker's view of a shared client that a pause freezes: every call waits until the worker
/// runs again, as a stopped process sends nothing.
struct Freezable {
    inner: Arc<dyn Authority>,
    frozen: watch::Receiver<bool>,
}

impl std::fmt::Debug for Freezable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Freezable")
            .field("frozen", &*self.frozen.borrow())
            .finish_non_exhaustive()
    }
}

impl Freezable {
    async fn thawed(&self) {
        let mut frozen = self.frozen.clone();
        let _ = frozen.wait_for(|f| !*f).await;
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl Authority for Freezable {
    fn capabilities(&self) -> &Capabilities {
        self.inner.capabilities()
    }

    async fn try_acquire(
        &self,
        key: &LockKey,
        ttl: Duration,
    ) -> leasehold_core::Result<Option<Grant>> {
        self.thawed().await;
        self.inner.try_acquire(key, ttl).await
    }

    async fn try_acquire_all(
        &self,
        keys: &[LockKey],
        ttl: Duration,
    ) -> leasehold_core::Result<Option<Vec<Grant>>> {
        self.thawed().await;
        self.inner.try_acquire_all(keys, ttl).await
    }

    async fn acquire(
        &self,
        key: &LockKey,
        ttl: Duration,
        max_wait: Duration,
    ) -> leasehold_core::Result<Grant> {
        self.thawed().await;
        self.inner.acquire(key, ttl, max_wait).await
    }

    async fn renew(&self, grant: &Grant, ttl: Duration) -> leasehold_core::Result<Instant> {
        self.thawed().await;
        self.inner.renew(grant, ttl).await
    }

    /// Forwarded whole, as a worker process's client would send it: a `Lease` on a batching
    /// authority renews through `renew_many`, and the trait's default would split the batch
    /// into lone renewals the workers never send.
    async fn renew_many(&self, grants: &[Grant]) -> Vec<leasehold_core::Result<Instant>> {
        self.thawed().await;
        self.inner.renew_many(grants).await
    }

    async fn release(&self, grant: &Grant) -> leasehold_core::Result<Released> {
        self.thawed().await;
        self.inner.release(grant).await
    }

    async fn inspect(&self, key: &LockKey) -> leasehold_core::Result<Inspection> {
        self.thawed().await;
        self.inner.inspect(key).await
    }

    async fn list_keys(
        &self,
        prefix: &KeyPrefix,
        limit: usize,
    ) -> leasehold_core::Result<Vec<LockKey>> {
        self.thawed().await;
        self.inner.list_keys(prefix, limit).await
    }

    async fn proclaim(&self, grant: &Grant, value: &[u8]) -> leasehold_core::Result<()> {
        self.thawed().await;
        self.inner.proclaim(grant, value).await
    }

    async fn revoke(&self, key: &LockKey) -> leasehold_core::Result<leasehold_core::Revoked> {
        self.thawed().await;
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
        self.thawed().await;
        self.inner.close().await
    }
}

/// What an in-process run does.
#[derive(Clone, Debug)]
pub struct InProcessOptions {
    /// How long the workers run.
    pub duration: Duration,
    /// Seeds the nemesis and the workers.
    pub seed: u64,
    /// Worker tasks.
    pub workers: u32,
    /// Lock keys.
    pub keys: usize,
    /// Chance that a round pauses (freezes) between its validity check and its write.
    pub pause_probability: f64,
    /// Chance that an acquire is dropped at a random moment (a round trip here is nearly
    /// instant, so more often than against a server to hit the same windows).
    pub cancel_probability: f64,
}

impl Default for InProcessOptions {
    fn default() -> Self {
        InProcessOptions {
            duration: Duration::from_secs(6),
            seed: 7,
            workers: 4,
            keys: 3,
            pause_probability: 0.3,
            cancel_probability: 0.3,
        }
    }
}

/// Runs the fenced workload against `context`'s authority (named `backend` in the history) with
/// the server faults its [`Context::faults`] offers (a pause, a failover to its standby) and
/// replies slowed past the safety margin.
pub async fn run_in_process(
    context: &Context,
    backend: &str,
    options: &InProcessOptions,
    dir: &std::path::Path,
) -> Result<History, RunError> {
    std::fs::create_dir_all(dir)?;
    let client = context.connect().await.map_err(|f| f.to_string())?;
    let capabilities = client.capabilities().clone();
    // Short TTLs: many hand-offs in a few seconds.
    let step = capabilities.ttl.granularity.as_millis().max(1) as u64;
    let ttl_min = (capabilities.ttl.min.as_millis() as u64)
        .max(200)
        .div_ceil(step)
        * step;
    let ttl_max = ((capabilities.ttl.max.as_millis() as u64).min(600) / step * step).max(ttl_min);
    let resource: Arc<dyn SetResource> = Arc::new(MemorySets::default());
    let clock = Clock::Tokio {
        origin: Instant::now(),
        origin_ns: 1_000_000_000,
    };
    let started = clock.now();
    let keys: Vec<String> = (0..options.keys)
        .map(|k| format!("workload/k{k}"))
        .collect();
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut tasks = Vec::new();
    let mut files = Vec::new();
    let mut freezers = Vec::new();
    // Longer than any safety margin of these TTLs (5 ms + 1 % of at most 600 ms).
    let slow_by = Duration::from_millis(40);
    for worker in 0..options.workers {
        let path = dir.join(format!("worker-{worker}.jsonl"));
        let _ = std::fs::remove_file(&path);
        let (freeze, frozen) = watch::channel(false);
        let authority: Arc<dyn Authority> = Arc::new(Freezable {
            inner: client.clone(),
            frozen,
        });
        let config = WorkerConfig {
            worker,
            authority_url: String::new(),
            resource_url: String::new(),
            run: backend.to_string(),
            keys: keys.clone(),
            fenced: true,
            seed: options.seed,
            ttl_min_ms: ttl_min,
            ttl_max_ms: ttl_max,
            ttl_step_ms: step,
            pause_probability: options.pause_probability,
            cancel_probability: options.cancel_probability,
            cancel_within_ms: 5,
            // Long enough that leases are renewed (through slow replies too) before a pause.
            work_fraction: 0.8,
            history: path.clone(),
            ignores_holder: false,
            handoff_armed: None,
        };
        let freeze = Arc::new(freeze);
        let pause = PauseBy::Freeze(freeze.clone(), Duration::from_millis(ttl_max * 2));
        let log = Log::open_on(&path, clock)?;
        let w = Worker::new(config, authority, resource.clone(), log, pause, worker);
        tasks.push(tokio::spawn(w.run(stop_rx.clone())));
        files.push(path);
        freezers.push(freeze);
    }

    // The nemesis: the server paused, failed over to its standby, or its replies slowed, now
    // and then.
    let nemesis_path = dir.join("nemesis.jsonl");
    let _ = std::fs::remove_file(&nemesis_path);
    let log = Log::open_on(&nemesis_path, clock)?;
    let mut rng = StdRng::seed_from_u64(options.seed);
    let end = tokio::time::Instant::now() + options.duration;
    let mut fault = 0;
    while tokio::time::Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(rng.random_range(2000..=5000))).await;
        fault += 1;
        let hold = Duration::from_millis(rng.random_range(100..=ttl_max));
        // Half the faults are slow replies: the deadline mutants need a grant or a renewal
        // answered slowly and then a pause, which is rare.
        let choice = rng.random_range(0..4);
        if choice >= 2 {
            if context.faults().slow_replies(slow_by).await.is_ok() {
                log.record(start(fault, FaultKind::SlowReplies));
                tokio::time::sleep(hold + Duration::from_millis(1000)).await;
                let _ = context.faults().slow_replies(Duration::ZERO).await;
                log.record(end_of(fault, FaultKind::SlowReplies));
            }
        } else if choice == 1 {
            if context.faults().begin_failover().await.is_ok() {
                log.record(start(fault, FaultKind::PromoteReplica));
                // Long enough that some acquisition lands on the old primary before the standby
                // takes over (what an asynchronous standby then loses), whatever the workers'
                // rhythm.
                tokio::time::sleep(hold + Duration::from_millis(1000)).await;
                let _ = context.faults().complete_failover().await;
                log.record(end_of(fault, FaultKind::PromoteReplica));
            }
        } else if context.faults().pause().await.is_ok() {
            // The one server is its own leader. (Not a restart: the in-process server keeps
            // its fences but not its leases across one, as a server without durable leases.)
            log.record(start(fault, FaultKind::PauseLeader));
            tokio::time::sleep(hold).await;
            let _ = context.faults().resume().await;
            log.record(end_of(fault, FaultKind::PauseLeader));
        }
    }
    let _ = stop_tx.send(true);
    for freeze in &freezers {
        freeze.send_replace(false);
    }
    for task in tasks {
        task.await?;
    }
    let _ = client.close().await;

    let mut parts = vec![History::read_file(&nemesis_path)?];
    for file in &files {
        parts.push(History::read_file(file)?);
    }
    let merged = History::merge(parts);
    let mut history = History::new(vec![Event::new(
        started,
        What::Run {
            seed: options.seed,
            backend: backend.to_string(),
            fenced: true,
            failover_unsafe: capabilities.fence_safety == FenceSafety::FailoverUnsafe,
            early_revocation: capabilities.exclusion.can_end_early(),
            // One SQLite file has one write lock for every key: a frozen worker whose request
            // held it blocks them all.
            one_writer: capabilities.backend == "sqlite",
            // Workers freeze themselves at their pause points; the server faults are drawn at
            // random and not promised.
            planned_faults: vec![FaultKind::PauseWorker],
            commit: None,
            versions: Default::default(),
            command: None,
            resource: Some("memory".to_string()),
        },
    )]);
    for event in merged.events() {
        history.push(event.clone());
    }
    let at = clock.now();
    for (key, (elements, last_fence)) in resource.final_state().await? {
        history.push(Event::new(
            at,
            What::Final {
                key,
                elements,
                last_fence,
            },
        ));
    }
    history.write_to(std::io::BufWriter::new(std::fs::File::create(
        dir.join("history.jsonl"),
    )?))?;
    Ok(history)
}

fn start(fault: u64, kind: FaultKind) -> What {
    What::FaultStart {
        fault,
        kind,
        worker: None,
        node: None,
    }
}

fn end_of(fault: u64, kind: FaultKind) -> What {
    What::FaultEnd {
        fault,
        kind,
        worker: None,
        node: None,
    }
}

/// Whether the workload can show `mutant`'s defect at all, and if not, why: the answer the
/// teeth test and the docs give.
pub fn invisible_to_the_workload(mutant: Mutant) -> Option<&'static str> {
    match mutant {
        Mutant::DeadlineAfterResponse | Mutant::BatchRenewalDeadlineAfterResponse => Some(
            "not reliably: it overstates a deadline only by how late a reply arrives, so the \
             run must answer a grant or renewal slowly (the slow_replies fault), then pause its \
             holder before the next renewal, then grant the key to a waiter in the overstated \
             part; seeded runs catch it now and then, the scenarios \
             delayed_reply_shortens_the_grant, delayed_batch_reply_shortens_the_renewals, \
             deadline_counts_from_the_request and batch_deadline_counts_from_the_request every \
             time",
        ),
        Mutant::RenewalDeadlineAfterResponse => Some(
            "a Lease on the reference authority renews through renew_many, in batches, never \
             through a lone renew, so the workload never meets it; only a caller of \
             Authority::renew does (the scenario deadline_counts_from_the_request)",
        ),
        Mutant::RenewWithoutOwnerCheck | Mutant::BatchRenewWithoutOwnerCheck => Some(
            "not reliably: a Lease asks for a renewal only before its local deadline, which falls \
             before the authority's expiry, so the mutant shows only when a freeze holds that \
             request back past the expiry and the key went to another worker meanwhile; seeded \
             runs catch it now and then, a caller of Authority::renew or renew_many with an \
             expired grant every time (the scenarios renew_after_expiry_is_refused and \
             batch_renew_after_expiry_is_refused)",
        ),
        Mutant::RevokeReusesFence => Some(
            "its defect lives in Authority::revoke, which no worker calls: an operator revokes, \
             not a holder (the scenario revoke_ends_the_holder_and_fences_it_out catches it \
             every time)",
        ),
        Mutant::RenewKeepsTheFirstTtl => Some(
            "its defect shows only when a renewal asks for another TTL than the grant's, which no \
             worker does: a lease renews with its own TTL (the scenario \
             semaphore_permit_lease_renews_by_hand catches it every time)",
        ),
        Mutant::AcquireAllKeepsPartOfASet => Some(
            "its defect lives in Authority::try_acquire_all, which workers do not call: they take \
             one key each (the scenario try_acquire_all_takes_all_or_none catches it every time)",
        ),
        _ => None,
    }
}
