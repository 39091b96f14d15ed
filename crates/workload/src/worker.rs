//! One worker: Jepsen's lock-set loop with a lease and a fence, writing its history as it goes.
//!
//! Each round: pick a key, acquire a [`Lease`] (random TTL in the backend's range, random
//! `max_wait`, now and then dropped on purpose at a random moment), claim-and-read the key's set
//! at the resource, work a little, check the lease is still valid, maybe get paused *right
//! there* (between the check and the write, where a GC pause or a frozen VM hurts most), write
//! the set plus one new element guarded by the fence, release.
//!
//! In a worker process the pause is a real `SIGSTOP` the worker sends itself; the runner notices
//! the stop and resumes it later. Workers that are tasks of one process (the in-process authority
//! and its mutants) sleep instead.

use std::fs::{File, OpenOptions};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_conformance::workload::clock::{instant_ns, now_ns};
use leasehold_conformance::workload::{Event, FaultKind, HistoryWriter, What, WorkerId};
use leasehold_core::{Authority, Error, Lease, LeaseOptions, LockKey, LostReason};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::resource::{Outcome, SetResource};

/// What a worker is told: everything it needs, so a worker process is started from one JSON
/// argument and a restarted one behaves the same.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WorkerConfig {
    /// The worker's number, unique in the run (across arms).
    pub worker: WorkerId,
    /// The authority under test.
    pub authority_url: String,
    /// The resource's PostgreSQL URL (process workers).
    pub resource_url: String,
    /// The resource rows' namespace: one per arm.
    pub run: String,
    /// The lock keys, also the resource's keys.
    pub keys: Vec<String>,
    /// Whether writes carry the fence (false: the unfenced control).
    pub fenced: bool,
    /// Seeds the worker's choices (mixed with its number and process id).
    pub seed: u64,
    /// The shortest TTL to ask for.
    pub ttl_min_ms: u64,
    /// The longest TTL to ask for.
    pub ttl_max_ms: u64,
    /// TTLs are multiples of this.
    pub ttl_step_ms: u64,
    /// Chance that a round pauses between its validity check and its write.
    pub pause_probability: f64,
    /// Chance that an acquire is dropped at a random moment.
    pub cancel_probability: f64,
    /// The latest moment, in milliseconds, at which an acquire is dropped: about a few round
    /// trips, so drops land while a request is in flight.
    pub cancel_within_ms: u64,
    /// The longest critical section, as a share of the TTL (so some leases are renewed while
    /// held).
    #[serde(default = "default_work")]
    pub work_fraction: f64,
    /// Where the worker appends its history.
    pub history: PathBuf,
    /// Run against [`crate::broken::IgnoresHolder`] wrapped around the authority: the
    /// workload's own check that a lock granting a key to everyone fails the run.
    #[serde(default)]
    pub ignores_holder: bool,
    /// The hand-off trigger the nemesis arms ([`crate::handoff`]): claimed just before each
    /// release. Absent where no leader change at hand-off is injected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handoff_armed: Option<PathBuf>,
}

fn default_work() -> f64 {
    0.2
}

/// How a worker pauses at the pause point.
#[derive(Clone, Debug)]
pub enum PauseBy {
    /// `SIGSTOP` to itself; the runner resumes it.
    Signal,
    /// A task cannot be stopped alone: freeze its view of the authority (renewals included)
    /// through this switch and sleep this long.
    Freeze(Arc<watch::Sender<bool>>, Duration),
}

/// The clock a history is written on.
#[derive(Clone, Copy, Debug)]
pub enum Clock {
    /// `CLOCK_MONOTONIC`, shared by every process on the machine.
    Monotonic,
    /// tokio's clock, counted from `origin` (which reads `origin_ns`): for runs inside one
    /// process, also on tokio's paused clock, where a minute of workload takes milliseconds.
    Tokio {
        /// The instant the history's time counts from.
        origin: leasehold_core::Instant,
        /// The history time of `origin`.
        origin_ns: u64,
    },
}

impl Clock {
    /// Now.
    pub fn now(&self) -> u64 {
        match self {
            Clock::Monotonic => now_ns(),
            Clock::Tokio { .. } => self.instant(leasehold_core::Instant::now()),
        }
    }

    /// A tokio instant (a lease's deadline) on this clock.
    pub fn instant(&self, at: leasehold_core::Instant) -> u64 {
        match self {
            Clock::Monotonic => instant_ns(at.into_std()),
            Clock::Tokio { origin, origin_ns } => {
                let since = at.saturating_duration_since(*origin).as_nanos();
                origin_ns.saturating_add(u64::try_from(since).unwrap_or(u64::MAX))
            }
        }
    }
}

/// A worker's history file, shared by its loop and its loss watchers.
#[derive(Clone, Debug)]
pub struct Log {
    writer: Arc<Mutex<HistoryWriter<File>>>,
    clock: Clock,
}

impl Log {
    /// Opens `path` for appending (a restarted worker goes on in the same file), on
    /// `CLOCK_MONOTONIC`.
    pub fn open(path: &std::path::Path) -> std::io::Result<Log> {
        Log::open_on(path, Clock::Monotonic)
    }

    /// Opens `path` for appending, on `clock`.
    pub fn open_on(path: &std::path::Path, clock: Clock) -> std::io::Result<Log> {
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        Ok(Log {
            writer: Arc::new(Mutex::new(HistoryWriter::new(file))),
            clock,
        })
    }

    /// The log's clock.
    pub fn clock(&self) -> Clock {
        self.clock
    }

    /// Records `what` now. A history that cannot be written makes the run worthless, so the
    /// error is reported on stderr and the run's checker will see the gap.
    pub fn record(&self, what: What) {
        let event = Event::new(self.clock.now(), what);
        let mut writer = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = writer.record(&event).and_then(|()| writer.flush()) {
            eprintln!("worker: cannot write the history: {e}");
        }
    }
}

/// The source of element numbers, unique in the run: the worker's number, its process id (a
/// restarted worker is a new process) and a counter.
#[derive(Debug)]
pub(crate) struct Elements {
    base: u64,
    next: u64,
}

impl Elements {
    pub(crate) fn new(worker: WorkerId, incarnation: u32) -> Self {
        Elements {
            base: (u64::from(worker & 0x1FF) << 54) | (u64::from(incarnation & 0x3F_FFFF) << 32),
            next: 0,
        }
    }

    pub(crate) fn take(&mut self) -> u64 {
        self.next = self.next.wrapping_add(1) & 0xFFFF_FFFF;
        self.base | self.next
    }
}

/// A worker ready to run.
pub struct Worker {
    config: WorkerConfig,
    authority: Arc<dyn Authority>,
    resource: Arc<dyn SetResource>,
    log: Log,
    pause_by: PauseBy,
    rng: StdRng,
    elements: Elements,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("worker", &self.config.worker)
            .finish_non_exhaustive()
    }
}

/// Random milliseconds in `lo..=hi`.
fn millis(rng: &mut StdRng, lo: u64, hi: u64) -> Duration {
    Duration::from_millis(rng.random_range(lo..=hi.max(lo)))
}

impl Worker {
    /// A worker of `config` on `authority` and `resource`. `incarnation` tells restarted
    /// workers apart (a process id).
    pub fn new(
        config: WorkerConfig,
        authority: Arc<dyn Authority>,
        resource: Arc<dyn SetResource>,
        log: Log,
        pause_by: PauseBy,
        incarnation: u32,
    ) -> Worker {
        let seed = config.seed
            ^ (u64::from(config.worker) << 40)
            ^ u64::from(incarnation).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        Worker {
            elements: Elements::new(config.worker, incarnation),
            rng: StdRng::seed_from_u64(seed),
            config,
            authority,
            resource,
            log,
            pause_by,
        }
    }

    /// Runs rounds until `stop` turns true; a round waiting for a lease is abandoned (recorded
    /// as cancelled), any other round finishes first.
    pub async fn run(mut self, mut stop: watch::Receiver<bool>) {
        while !*stop.borrow() {
            self.round(&mut stop).await;
            // A breath between rounds, as any real caller takes: a round can end at once (no
            // wait, a refused claim), and a loop that never sleeps would starve the holder it
            // is waiting for on a single thread or a paused clock.
            tokio::time::sleep(millis(&mut self.rng, 1, 20)).await;
        }
    }

    fn ttl(&mut self) -> Duration {
        let step = self.config.ttl_step_ms.max(1);
        let lo = self.config.ttl_min_ms.div_ceil(step);
        let hi = (self.config.ttl_max_ms / step).max(lo);
        Duration::from_millis(self.rng.random_range(lo..=hi) * step)
    }

    async fn round(&mut self, stop: &mut watch::Receiver<bool>) {
        let worker = self.config.worker;
        let key = self.config.keys[self.rng.random_range(0..self.config.keys.len().max(1))].clone();
        let Ok(lock_key) = LockKey::new(&key) else {
            eprintln!("worker {worker}: invalid key {key:?}");
            return;
        };
        let ttl = self.ttl();
        // A quarter of the rounds try once (as a scheduled job that skips when busy does); the
        // rest wait up to three TTLs.
        let try_once = self.rng.random_bool(0.25);
        let max_wait = if try_once {
            Duration::ZERO
        } else {
            millis(&mut self.rng, 0, 3 * ttl.as_millis() as u64)
        };
        let cancel_after = self
            .rng
            .random_bool(self.config.cancel_probability)
            .then(|| millis(&mut self.rng, 0, self.config.cancel_within_ms));
        self.log.record(What::AcquireInvoke {
            worker,
            key: key.clone(),
            ttl_ns: ttl.as_nanos() as u64,
            max_wait_ns: Some(max_wait.as_nanos() as u64),
        });
        let authority = self.authority.clone();
        let acquire = async {
            if try_once {
                match Lease::try_acquire(authority, &lock_key, ttl, LeaseOptions::default()).await {
                    Ok(Some(lease)) => Ok(lease),
                    Ok(None) => Err(Error::Timeout {
                        key: key.clone(),
                        waited: Duration::ZERO,
                    }),
                    Err(e) => Err(e),
                }
            } else {
                Lease::acquire(authority, &lock_key, ttl, max_wait, LeaseOptions::default()).await
            }
        };
        let cancel = async {
            match cancel_after {
                Some(after) => tokio::time::sleep(after).await,
                None => std::future::pending().await,
            }
        };
        let result = tokio::select! {
            result = acquire => Some(result),
            () = cancel => None,
            _ = stop.wait_for(|stop| *stop) => None,
        };
        let lease = match result {
            None => {
                self.log.record(What::AcquireCancelled { worker, key });
                return;
            }
            Some(Ok(lease)) => lease,
            Some(Err(Error::Timeout { .. })) => {
                self.log.record(What::AcquireTimeout { worker, key });
                return;
            }
            Some(Err(e)) => {
                self.log.record(What::AcquireFail {
                    worker,
                    key,
                    error: error_chain(&e),
                });
                // The authority may be down (a fault): do not spin.
                tokio::time::sleep(millis(&mut self.rng, 50, 250)).await;
                return;
            }
        };
        let fence = lease.fence().value();
        let mut deadline = lease.deadline();
        self.log.record(What::AcquireOk {
            worker,
            key: key.clone(),
            fence,
            deadline: Some(self.log.clock().instant(deadline)),
        });
        let watcher = tokio::spawn({
            let (lost, log, key) = (lease.lost(), self.log.clone(), key.clone());
            async move {
                let reason = lost.await;
                if !matches!(reason, LostReason::Released) {
                    log.record(What::Lost {
                        worker,
                        key,
                        fence,
                        reason: reason.to_string(),
                    });
                }
            }
        });
        self.hold(&lease, &key, fence, ttl, &mut deadline).await;
        self.note_renewal(&lease, &key, fence, &mut deadline);
        if let Some(armed) = &self.config.handoff_armed {
            // Whoever waits for this key now waits through the leader change this may start.
            crate::handoff::claim(armed);
        }
        self.log.record(What::ReleaseInvoke {
            worker,
            key: key.clone(),
            fence,
        });
        watcher.abort();
        match lease.release().await {
            Ok(_) => self.log.record(What::ReleaseOk { worker, key, fence }),
            Err(e) => self.log.record(What::ReleaseFail {
                worker,
                key,
                fence,
                error: error_chain(&e),
            }),
        }
    }

    /// Records a renewal that moved the lease's deadline since the last look.
    fn note_renewal(
        &self,
        lease: &Lease,
        key: &str,
        fence: u64,
        seen: &mut leasehold_core::Instant,
    ) {
        let now = lease.deadline();
        if now > *seen {
            *seen = now;
            self.log.record(What::Renewed {
                worker: self.config.worker,
                key: key.to_string(),
                fence,
                deadline: self.log.clock().instant(now),
            });
        }
    }

    /// The critical section: claim and read, work, check, (pause), write.
    async fn hold(
        &mut self,
        lease: &Lease,
        key: &str,
        fence: u64,
        ttl: Duration,
        deadline: &mut leasehold_core::Instant,
    ) {
        let worker = self.config.worker;
        let claim = self.config.fenced.then_some(fence);
        self.log.record(What::ReadInvoke {
            worker,
            key: key.to_string(),
            fence: claim,
        });
        let set = match self.resource.read(key, claim).await {
            Ok(Outcome::Done(set)) => {
                self.log.record(What::ReadOk {
                    worker,
                    key: key.to_string(),
                    fence: claim,
                    elements: set.clone(),
                });
                set
            }
            Ok(Outcome::Stale { newest }) => {
                self.log.record(What::ReadStale {
                    worker,
                    key: key.to_string(),
                    fence,
                    newest,
                });
                return;
            }
            Err(e) => {
                self.log.record(What::ReadFail {
                    worker,
                    key: key.to_string(),
                    fence: claim,
                    error: e.to_string(),
                });
                return;
            }
        };
        // Work: a critical section takes time.
        let most = (ttl.as_millis() as f64 * self.config.work_fraction.clamp(0.0, 1.0)) as u64;
        let work = millis(&mut self.rng, 0, most);
        tokio::time::sleep(work).await;
        self.note_renewal(lease, key, fence, deadline);
        if lease.ensure_valid().is_err() {
            return;
        }
        if self.rng.random_bool(self.config.pause_probability) {
            self.pause().await;
        }
        let element = self.elements.take();
        let mut elements = set;
        elements.push(element);
        self.log.record(What::WriteInvoke {
            worker,
            key: key.to_string(),
            fence,
            element,
        });
        let what = match self
            .resource
            .write(key, &elements, fence, self.config.fenced)
            .await
        {
            Ok(Outcome::Done(prior)) => What::WriteOk {
                worker,
                key: key.to_string(),
                fence,
                element,
                prior,
            },
            Ok(Outcome::Stale { newest }) => What::WriteStale {
                worker,
                key: key.to_string(),
                fence,
                element,
                newest,
            },
            Err(e) => What::WriteUnknown {
                worker,
                key: key.to_string(),
                fence,
                element,
                error: e.to_string(),
            },
        };
        self.log.record(what);
    }

    async fn pause(&self) {
        match &self.pause_by {
            PauseBy::Signal => {
                // Through the shell's kill built-in, which keeps this crate free of `unsafe`.
                let stopped = tokio::process::Command::new("/bin/sh")
                    .arg("-c")
                    .arg("kill -s STOP \"$0\"")
                    .arg(std::process::id().to_string())
                    .status()
                    .await;
                if let Err(e) = stopped {
                    eprintln!("worker {}: could not pause itself: {e}", self.config.worker);
                }
            }
            PauseBy::Freeze(freeze, d) => {
                // Recorded as the nemesis records a process's pause, with ids of this worker's
                // own that no nemesis fault uses.
                let worker = self.config.worker;
                let fault = FREEZE_FAULTS | (u64::from(worker) << 32) | self.elements.next;
                let kind = FaultKind::PauseWorker;
                self.log.record(What::FaultStart {
                    fault,
                    kind,
                    worker: Some(worker),
                    node: None,
                });
                freeze.send_replace(true);
                tokio::time::sleep(*d).await;
                freeze.send_replace(false);
                self.log.record(What::FaultEnd {
                    fault,
                    kind,
                    worker: Some(worker),
                    node: None,
                });
            }
        }
    }
}

/// The high bit of the fault ids a freezing worker gives its own pauses.
const FREEZE_FAULTS: u64 = 1 << 63;

/// An error and its sources on one line, for the history.
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let s_text = s.to_string();
        if !text.contains(&s_text) {
            text.push_str(": ");
            text.push_str(&s_text);
        }
        source = s.source();
    }
    text
}
