//! The runner: starts the servers and the worker processes, runs the nemesis for the run's
//! duration, heals everything, stops the workers, reads the resource's final state, merges the
//! histories and judges them.
//!
//! A run has one or two *arms* on the same servers at the same time: the fenced run and the
//! unfenced control, each with its own workers, lock keys and resource rows. They share the
//! server faults, so the control's losses and the fenced run's zero are measured under the same
//! nemesis.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use leasehold_conformance::workload::clock::now_ns;
use leasehold_conformance::workload::{
    check_recorded, Event, FaultKind, History, RunVerdict, What, WorkerId,
};
use leasehold_core::{Authority, FenceSafety, LockKey};
use leasehold_servers::{CommandSpec, Cut, ManagedProcess};
use rand::rngs::StdRng;
use rand::seq::{IndexedRandom, SliceRandom};
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use crate::cli_worker::{self, CliWorkerConfig};
use crate::deployment::{Backend, Deployment};
use crate::primary_watch;
use crate::resource::{self, ResourceKind};
use crate::resource_server::ResourceServer;
use crate::server_fault::{resource_fault_task, server_fault_task};
use crate::worker::{Log, WorkerConfig};
use crate::{handoff, provenance};

/// How long the nemesis watches for a worker inside an SQLite write transaction before it
/// gives up on one attempt: transactions last milliseconds, and on a loaded machine the
/// watcher sees few of them.
const CATCH_WRITER_WITHIN: Duration = Duration::from_secs(4);
use crate::worker_cut::{authority_ports, can_switch_uid, give_to, worker_uid};

/// Errors of a run (not findings: those are in the verdict).
pub type RunError = Box<dyn std::error::Error + Send + Sync>;

/// The fenced run or the unfenced control.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arm {
    /// Writes carry the fence; the resource refuses older ones.
    Fenced,
    /// Writes ignore the fence: must lose updates under pauses, or the nemesis is too weak.
    Control,
}

impl Arm {
    /// `fenced` or `control`.
    pub fn name(self) -> &'static str {
        match self {
            Arm::Fenced => "fenced",
            Arm::Control => "control",
        }
    }
}

/// What to run.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// The backend under test.
    pub backend: Backend,
    /// Servers (3 for etcd and ZooKeeper clusters).
    pub nodes: usize,
    /// An authority started by someone else; then only worker faults are injected.
    pub authority_url: Option<String>,
    /// A resource server started by someone else (else one of `resource` is started).
    pub resource_url: Option<String>,
    /// The store the runner starts for the resource when `resource_url` names none.
    pub resource: ResourceKind,
    /// How long the nemesis runs.
    pub duration: Duration,
    /// Seeds the nemesis and every worker.
    pub seed: u64,
    /// Worker processes per arm.
    pub workers: u32,
    /// Lock keys per arm.
    pub keys: usize,
    /// The arms to run side by side.
    pub arms: Vec<Arm>,
    /// Where histories and the verdicts go.
    pub out: PathBuf,
    /// Chance that a round pauses between its validity check and its write.
    pub pause_probability: f64,
    /// Chance that an acquire is dropped at a random moment.
    pub cancel_probability: f64,
    /// The gap between two nemesis faults, drawn uniformly from this range.
    pub fault_gap: (Duration, Duration),
    /// Workers use [`crate::broken::IgnoresHolder`]: the run must fail on exclusion.
    pub ignores_holder: bool,
    /// Of each arm's workers, how many take their leases through the `leasehold` command.
    pub cli_workers: u32,
}

impl RunOptions {
    /// Defaults for `backend`: both arms, 4 workers each, 2 keys, a fault every 1-3 s.
    pub fn new(backend: Backend, duration: Duration, seed: u64, out: PathBuf) -> RunOptions {
        RunOptions {
            backend,
            nodes: backend.default_nodes(),
            authority_url: None,
            resource_url: None,
            resource: ResourceKind::Postgres,
            duration,
            seed,
            workers: 4,
            keys: 2,
            arms: vec![Arm::Fenced, Arm::Control],
            out,
            pause_probability: 0.2,
            cancel_probability: 0.1,
            fault_gap: (Duration::from_millis(1000), Duration::from_millis(3000)),
            ignores_holder: false,
            cli_workers: 1,
        }
    }
}

/// One arm's outcome.
#[derive(Debug)]
pub struct ArmResult {
    /// Which arm.
    pub arm: Arm,
    /// The merged history.
    pub history_path: PathBuf,
    /// The checker's verdict.
    pub verdict: RunVerdict,
}

/// A worker process and its nemesis state.
struct WorkerProc {
    id: WorkerId,
    process: Arc<ManagedProcess>,
    /// Paused (by itself or the nemesis): the fault's id and when to resume.
    paused: Option<(u64, Instant)>,
    /// Killed: the fault's id and when to start its replacement.
    killed: Option<(u64, Instant)>,
    /// The kind of the last kill, which its end repeats.
    killed_by: FaultKind,
    /// The uid it runs under, by which a cut finds its packets.
    uid: u32,
    /// Its history file.
    history: PathBuf,
    /// Cut off from the authority: the fault's id, when to heal, and the rule.
    cut: Option<(u64, Instant, Cut)>,
    /// A CLI worker: `leasehold` (with its command) runs below it, and the nemesis stops and
    /// kills that tree.
    cli: Option<Arc<PathBuf>>,
    /// Its `leasehold` was killed: the fault's id and node, the processes that must die with
    /// it, and by when.
    tree_kill: Option<(u64, String, Vec<u32>, Instant)>,
}

struct Nemesis {
    log: Log,
    rng: StdRng,
    next_fault: Arc<AtomicU64>,
    /// How long a paused worker stays paused: past the longest TTL.
    pause_for: (Duration, Duration),
    /// The workers were told to stop: their exits are expected.
    stopping: bool,
    /// The authority's ports, which a cut drops a worker's packets to.
    cut_ports: Vec<u16>,
    /// The TTLs workers ask for, shortest and longest: cuts last less than the one or more
    /// than the other.
    ttl_range: (Duration, Duration),
    /// Cuts so far: they alternate between shorter than any TTL and longer than every TTL.
    cuts: u64,
}

impl Nemesis {
    fn fault_id(&self) -> u64 {
        self.next_fault.fetch_add(1, Ordering::Relaxed)
    }

    fn start(&self, fault: u64, kind: FaultKind, worker: Option<WorkerId>, node: Option<String>) {
        self.log.record(What::FaultStart {
            fault,
            kind,
            worker,
            node,
        });
    }

    fn end(&self, fault: u64, kind: FaultKind, worker: Option<WorkerId>, node: Option<String>) {
        self.log.record(What::FaultEnd {
            fault,
            kind,
            worker,
            node,
        });
    }

    fn pause_duration(&mut self) -> Duration {
        let (lo, hi) = self.pause_for;
        Duration::from_millis(
            self.rng
                .random_range(lo.as_millis() as u64..=hi.as_millis() as u64),
        )
    }

    /// Notices workers that stopped themselves at their pause point, and pauses, resumes,
    /// kills and restarts workers as scheduled.
    async fn tend(&mut self, workers: &mut [WorkerProc]) -> Result<(), RunError> {
        let now = Instant::now();
        for w in workers.iter_mut() {
            if !self.stopping && w.killed.is_none() && !w.process.is_running() {
                return Err(format!(
                    "worker {} exited on its own ({}); its log ends:\n{}",
                    w.id,
                    w.process.exit_status().unwrap_or_default(),
                    w.process.log_tail(20)
                )
                .into());
            }
            if w.paused.is_none() && w.killed.is_none() && is_stopped(&w.process) {
                let fault = self.fault_id();
                self.start(fault, FaultKind::PauseWorker, Some(w.id), None);
                w.paused = Some((fault, now + self.pause_duration()));
            }
            if let Some((fault, at)) = w.paused {
                if now >= at {
                    if let Err(e) = w.process.resume() {
                        eprintln!("nemesis: cannot resume worker {}: {e}", w.id);
                    }
                    self.end(fault, FaultKind::PauseWorker, Some(w.id), None);
                    w.paused = None;
                }
            }
            if let Some((fault, node, pids, by)) = &w.tree_kill {
                let alive: Vec<u32> = pids
                    .iter()
                    .copied()
                    .filter(|&p| cli_worker::is_alive(p))
                    .collect();
                if alive.is_empty() {
                    self.end(
                        *fault,
                        FaultKind::KillWorker,
                        Some(w.id),
                        Some(node.clone()),
                    );
                    w.tree_kill = None;
                } else if now >= *by {
                    return Err(format!(
                        "worker {}: processes {alive:?} that leasehold's command started \
                         outlived leasehold's SIGKILL by more than {TREE_DIES_WITHIN:?}",
                        w.id
                    )
                    .into());
                }
            }
            if w.cut.as_ref().is_some_and(|(_, at, _)| now >= *at) {
                if let Some((fault, _, cut)) = w.cut.take() {
                    cut.heal()
                        .map_err(|e| format!("cannot heal the cut of worker {}: {e}", w.id))?;
                    self.end(fault, FaultKind::CutWorker, Some(w.id), None);
                }
            }
            if let Some((fault, at)) = w.killed {
                if now >= at {
                    let process = w.process.clone();
                    match tokio::task::spawn_blocking(move || process.respawn()).await {
                        Ok(Ok(())) => {
                            self.end(fault, w.killed_by, Some(w.id), None);
                            w.killed = None;
                        }
                        Ok(Err(e)) => eprintln!("nemesis: cannot restart worker {}: {e}", w.id),
                        Err(e) => eprintln!("nemesis: cannot restart worker {}: {e}", w.id),
                    }
                }
            }
        }
        Ok(())
    }

    fn pause_worker(&mut self, workers: &mut [WorkerProc], among: Option<&[WorkerId]>) {
        let idle: Vec<usize> = (0..workers.len())
            .filter(|&i| among.is_none_or(|ids| ids.contains(&workers[i].id)))
            .filter(|&i| workers[i].paused.is_none() && workers[i].killed.is_none())
            .collect();
        let Some(&i) = idle.choose(&mut self.rng) else {
            return;
        };
        let w = &mut workers[i];
        let fault = self.fault_id();
        self.start(fault, FaultKind::PauseWorker, Some(w.id), None);
        let paused = match (&w.cli, w.process.pid()) {
            // The tree but leasehold's watcher, as a Ctrl-Z or a SIGSTOP of leasehold leaves it.
            (Some(_), Some(pid)) => cli_worker::signal_all(&cli_worker::tree_to_stop(pid), "STOP"),
            _ => w.process.pause().map_err(|e| e.to_string()),
        };
        if let Err(e) = paused {
            eprintln!("nemesis: cannot pause worker {}: {e}", w.id);
        }
        w.paused = Some((fault, Instant::now() + self.pause_duration()));
    }

    /// Drops a worker's packets to the authority (no reset) for less than the shortest TTL or
    /// for more than the longest, by turns. An error when the rule cannot be put in place: a
    /// planned cut that silently did not happen would let the run pass on faults it never had.
    /// False when no worker of `among` can be cut now (all paused, killed or cut already).
    fn cut_worker(
        &mut self,
        workers: &mut [WorkerProc],
        among: Option<&[WorkerId]>,
    ) -> Result<bool, RunError> {
        let idle: Vec<usize> = (0..workers.len())
            .filter(|&i| among.is_none_or(|ids| ids.contains(&workers[i].id)))
            .filter(|&i| workers[i].cut.is_none() && workers[i].killed.is_none())
            .filter(|&i| workers[i].paused.is_none())
            .collect();
        // A holder, if there is one: cutting a worker that holds nothing shows little.
        let holders: Vec<usize> = idle
            .iter()
            .copied()
            .filter(|&i| holds_a_lease(&workers[i].history))
            .collect();
        let Some(&i) = holders.choose(&mut self.rng).or(idle.choose(&mut self.rng)) else {
            return Ok(false);
        };
        let (shortest, longest) = self.ttl_range;
        let (lo, hi) = if self.cuts.is_multiple_of(2) {
            (shortest / 2, shortest * 9 / 10)
        } else {
            (longest * 3 / 2, longest * 3)
        };
        self.cuts += 1;
        let hold = Duration::from_millis(
            self.rng
                .random_range(lo.as_millis() as u64..=hi.as_millis() as u64),
        );
        let w = &mut workers[i];
        let cut = Cut::uid_from_ports(w.uid, &self.cut_ports)
            .map_err(|e| format!("cannot cut worker {} off the authority: {e}", w.id))?;
        let fault = self.fault_id();
        self.start(fault, FaultKind::CutWorker, Some(w.id), None);
        w.cut = Some((fault, Instant::now() + hold, cut));
        Ok(true)
    }

    /// SIGKILL to a CLI worker's `leasehold` alone, while a round runs: what it started must
    /// die with it (checked in [`Nemesis::tend`]). False when no round is running right now.
    fn kill_leasehold(&mut self, w: &mut WorkerProc) -> Result<bool, RunError> {
        let (Some(cli), Some(driver)) = (&w.cli, w.process.pid()) else {
            return Ok(false);
        };
        let Some(leasehold) = cli_worker::leasehold_of(driver, cli) else {
            return Ok(false);
        };
        // The round may have ended since it was seen: then there was nothing to kill. The
        // fault is recorded once the signal went out (nothing of the round is recorded in the
        // meantime: its processes are dead).
        let below = match cli_worker::kill_leasehold(leasehold) {
            Ok(Some(below)) => below,
            Ok(None) => return Ok(false),
            Err(_) if !cli_worker::is_alive(leasehold) => return Ok(false),
            Err(e) => return Err(e.into()),
        };
        let fault = self.fault_id();
        let node = format!("leasehold pid {leasehold}");
        self.start(fault, FaultKind::KillWorker, Some(w.id), Some(node.clone()));
        w.tree_kill = Some((fault, node, below, Instant::now() + TREE_DIES_WITHIN));
        Ok(true)
    }

    /// Kills a worker: a CLI worker's `leasehold` when `trees` (false if none runs now),
    /// else the worker process.
    fn kill_worker(
        &mut self,
        workers: &mut [WorkerProc],
        among: Option<&[WorkerId]>,
        trees: bool,
    ) -> Result<bool, RunError> {
        let idle: Vec<usize> = (0..workers.len())
            .filter(|&i| among.is_none_or(|ids| ids.contains(&workers[i].id)))
            .filter(|&i| workers[i].killed.is_none() && workers[i].tree_kill.is_none())
            // A tree kill aims at a running round: in a stopped tree, the watcher may have
            // ended the command already.
            .filter(|&i| !trees || workers[i].paused.is_none())
            .collect();
        let Some(&i) = idle.choose(&mut self.rng) else {
            return Ok(false);
        };
        if workers[i].cli.is_some() {
            if self.kill_leasehold(&mut workers[i])? {
                return Ok(true);
            }
            if trees {
                return Ok(false);
            }
        }
        self.kill_chosen(&mut workers[i], FaultKind::KillWorker, None);
        Ok(true)
    }

    /// A kill that lands inside a write transaction: a worker caught holding the write lock
    /// of `lock_file` (see [`crate::deployment::sqlite::catch_writer`]), killed while stopped
    /// there. Returns whether one was: none may be inside a transaction while it tries.
    async fn kill_worker_in_transaction(
        &mut self,
        workers: &mut [WorkerProc],
        among: Option<&[WorkerId]>,
        lock_file: Option<PathBuf>,
    ) -> bool {
        let Some(lock_file) = lock_file else {
            return false;
        };
        let idle: Vec<usize> = (0..workers.len())
            .filter(|&i| among.is_none_or(|ids| ids.contains(&workers[i].id)))
            .filter(|&i| workers[i].paused.is_none() && workers[i].killed.is_none())
            .filter(|&i| workers[i].cli.is_none() && workers[i].tree_kill.is_none())
            .collect();
        let candidates: Vec<Arc<ManagedProcess>> =
            idle.iter().map(|&i| workers[i].process.clone()).collect();
        let caught = tokio::task::spawn_blocking(move || {
            crate::deployment::sqlite::catch_writer(&lock_file, &candidates, CATCH_WRITER_WITHIN)
        })
        .await;
        match caught {
            Ok(Some((c, seen))) => {
                self.kill_chosen(
                    &mut workers[idle[c]],
                    FaultKind::KillWorkerInTransaction,
                    Some(seen),
                );
                true
            }
            Ok(None) => {
                eprintln!(
                    "nemesis: no worker was caught inside a transaction in {CATCH_WRITER_WITHIN:?}"
                );
                false
            }
            Err(e) => {
                eprintln!("nemesis: catching a worker inside a transaction: {e}");
                false
            }
        }
    }

    fn kill_chosen(&mut self, w: &mut WorkerProc, kind: FaultKind, node: Option<String>) {
        let restart_in = Duration::from_millis(self.rng.random_range(200..=1000));
        let fault = self.fault_id();
        self.start(fault, kind, Some(w.id), node);
        w.killed_by = kind;
        if let Err(e) = w.process.kill() {
            eprintln!("nemesis: cannot kill worker {}: {e}", w.id);
        }
        // A paused worker that is killed stays down until its replacement starts.
        if let Some((paused, _)) = w.paused.take() {
            self.end(paused, FaultKind::PauseWorker, Some(w.id), None);
        }
        w.killed = Some((fault, Instant::now() + restart_in));
    }
}

/// How soon what `leasehold` started must be gone after `leasehold` is SIGKILLed: the kernel's
/// parent-death signal and the watcher act at once, so this is scheduling slack.
const TREE_DIES_WITHIN: Duration = Duration::from_secs(5);

/// Sends `SIG<name>` through the shell's kill built-in (no `unsafe` in this crate).
async fn signal(pid: u32, name: &str) {
    let sent = tokio::process::Command::new("/bin/sh")
        .arg("-c")
        .arg("kill -s \"$0\" \"$1\"")
        .arg(name)
        .arg(pid.to_string())
        .status()
        .await;
    if let Err(e) = sent {
        eprintln!("cannot send SIG{name} to {pid}: {e}");
    }
}

/// Puts the next scheduled fault, which cannot happen yet (a server fault in progress, no CLI
/// round running), behind the others, so that one waiting fault does not hold up the rest of
/// the first pass; it comes round again.
fn rotate<T>(schedule: &mut Vec<T>) {
    if let Some(next) = schedule.pop() {
        schedule.insert(0, next);
    }
}

/// Whether a worker's last recorded event leaves it holding a lease (granted, and neither
/// released nor lost since), from the last line of its history file.
fn holds_a_lease(history: &Path) -> bool {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut file) = std::fs::File::open(history) else {
        return false;
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    if file
        .seek(SeekFrom::Start(len.saturating_sub(4096)))
        .is_err()
    {
        return false;
    }
    let mut tail = String::new();
    if file.read_to_string(&mut tail).is_err() {
        return false;
    }
    let Some(last) = tail.lines().rev().find(|l| !l.trim().is_empty()) else {
        return false;
    };
    serde_json::from_str::<Event>(last).is_ok_and(|e| {
        matches!(
            e.what,
            What::AcquireOk { .. }
                | What::Renewed { .. }
                | What::ReadInvoke { .. }
                | What::ReadOk { .. }
                | What::WriteInvoke { .. }
                | What::WriteOk { .. }
                | What::WriteStale { .. }
                | What::WriteUnknown { .. }
        )
    })
}

/// Whether a process is stopped (`T` in `/proc/PID/stat`).
fn is_stopped(process: &ManagedProcess) -> bool {
    let Some(pid) = process.pid() else {
        return false;
    };
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    stat.rfind(')')
        .and_then(|i| stat[i + 1..].split_whitespace().next())
        .is_some_and(|state| state == "T")
}

/// The TTLs workers ask for: 1-3 s, inside the backend's range and on its granularity.
fn ttl_bounds(authority: &dyn Authority) -> (u64, u64, u64) {
    let range = authority.capabilities().ttl;
    let step = range.granularity.as_millis().max(1) as u64;
    let min = (range.min.as_millis() as u64).max(1000).div_ceil(step) * step;
    let max = ((range.max.as_millis() as u64).min(3000) / step * step).max(min);
    (min, max, step)
}

async fn connect_retrying(url: &str, within: Duration) -> Result<Arc<dyn Authority>, RunError> {
    let give_up = Instant::now() + within;
    loop {
        match leasehold::connect(url).await {
            Ok(a) => return Ok(a),
            Err(e) if Instant::now() < give_up => {
                tracing::debug!("connect: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(Box::new(e)),
        }
    }
}

/// Waits until the authority grants a fresh key again after the faults healed.
async fn wait_for_recovery(url: &str, ttl: Duration, within: Duration) -> Result<(), RunError> {
    let give_up = Instant::now() + within;
    let key = LockKey::new(format!("workload/recovery/{}", now_ns()))?;
    let mut last = String::new();
    while Instant::now() < give_up {
        if let Ok(Ok(authority)) =
            tokio::time::timeout(Duration::from_secs(5), leasehold::connect(url)).await
        {
            match tokio::time::timeout(Duration::from_secs(5), authority.try_acquire(&key, ttl))
                .await
            {
                Ok(Ok(Some(grant))) => {
                    let _ = authority.release(&grant).await;
                    let _ = authority.close().await;
                    return Ok(());
                }
                Ok(Ok(None)) => last = "the recovery key is held".into(),
                Ok(Err(e)) => last = e.to_string(),
                Err(_) => last = "try_acquire timed out".into(),
            }
            let _ = authority.close().await;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Err(format!("the authority did not recover within {within:?}: {last}").into())
}

/// The file an arm's merged history is written to: `<backend>-<arm>.history.jsonl`, with the
/// resource's store between them when it is not the default PostgreSQL table
/// (`zookeeper-azurite-fenced.history.jsonl`), so that runs of one backend on two resources
/// keep apart in one report.
pub fn history_file(backend: Backend, resource: ResourceKind, arm: Arm) -> String {
    match resource {
        ResourceKind::Postgres => format!("{}-{}.history.jsonl", backend.name(), arm.name()),
        other => format!(
            "{}-{}-{}.history.jsonl",
            backend.name(),
            other.name(),
            arm.name()
        ),
    }
}

/// Runs the workload as `options` say; one result per arm.
pub async fn run(options: &RunOptions) -> Result<Vec<ArmResult>, RunError> {
    std::fs::create_dir_all(&options.out)?;
    // Workers run in directories of their own: every path they get must be absolute.
    let out = std::fs::canonicalize(&options.out)?;
    let options = &RunOptions {
        out,
        // A CLI round takes the real key with the real fence, which a broken authority's
        // rising fences would collide with: such a run has library workers only.
        cli_workers: if options.ignores_holder {
            0
        } else {
            options.cli_workers
        },
        ..options.clone()
    };
    let cli = if options.cli_workers > 0 {
        Some(Arc::new(cli_worker::find_cli()?))
    } else {
        None
    };
    if !can_switch_uid() {
        return Err(
            "the workload runs as root: each worker process gets a uid of its own, \
                    which the worker cut fault drops packets by"
                .into(),
        );
    }
    // The resource server is faulted only when the runner started it.
    let resource_kind = match &options.resource_url {
        Some(url) => ResourceKind::of_url(url)?,
        None => options.resource,
    };
    let (resource_url, resource_server) = match &options.resource_url {
        Some(url) => (url.clone(), None),
        None => {
            let server = ResourceServer::start(options.resource).await?;
            (server.url(), Some(server))
        }
    };
    let deployment = match &options.authority_url {
        Some(_) => None,
        None => Some(Deployment::start(options.backend, options.nodes, &options.out).await?),
    };
    let url = match (&options.authority_url, &deployment) {
        (Some(url), _) => url.clone(),
        (None, Some(d)) => d.url(),
        (None, None) => return Err("no authority".into()),
    };
    if matches!(
        options.backend,
        Backend::Postgres | Backend::PostgresStandby
    ) {
        // The lease table is the operator's to create; the runner is the operator here.
        leasehold_postgres::PostgresAuthority::connect(&url)
            .await?
            .migrate()
            .await?;
    }
    if options.backend == Backend::MySql {
        leasehold::mysql::MysqlAuthority::connect(&url)
            .await?
            .migrate()
            .await?;
    }
    let probe = connect_retrying(&url, Duration::from_secs(30)).await?;
    let (ttl_min, ttl_max, ttl_step) = ttl_bounds(probe.as_ref());
    let failover_unsafe = probe.capabilities().fence_safety == FenceSafety::FailoverUnsafe
        || !probe.capabilities().durable_fences;
    // etcd before 3.4.31 and 3.5.13 revokes live leases when a paused leader resumes (the
    // `pause_leader` fault does exactly that): declared by the backend, labelled by the checker.
    let early_revocation = probe.capabilities().exclusion.can_end_early();
    // One SQLite file has one write lock for every key, and a worker stopped while one of its
    // requests held it blocks them all: its pauses explain waits on any key.
    let one_writer = options.backend == Backend::Sqlite;
    let _ = probe.close().await;
    drop(probe);

    resource::prepare(&resource_url).await?;
    let (commit, versions, command) = {
        let options = options.clone();
        tokio::task::spawn_blocking(move || {
            let versions = provenance::versions(&options);
            (
                provenance::commit(),
                versions,
                provenance::command(&options),
            )
        })
        .await?
    };
    let trigger = handoff::Trigger::in_dir(&options.out)?;
    let started = now_ns();
    let exe = std::env::current_exe()?;
    let nemesis_path = options.out.join("nemesis.jsonl");
    let _ = std::fs::remove_file(&nemesis_path);
    let mut nemesis = Nemesis {
        log: Log::open(&nemesis_path)?,
        rng: StdRng::seed_from_u64(options.seed),
        next_fault: Arc::new(AtomicU64::new(1)),
        pause_for: (
            Duration::from_millis(ttl_max * 3 / 2),
            Duration::from_millis(ttl_max * 3),
        ),
        stopping: false,
        cut_ports: authority_ports(&url),
        ttl_range: (
            Duration::from_millis(ttl_min),
            Duration::from_millis(ttl_max),
        ),
        cuts: 0,
    };
    // Where the primary can move without the nemesis moving it, a watch records when it does.
    let (stop_watch, watch_stopped) = tokio::sync::watch::channel(false);
    let primary_watch = deployment.as_ref().map(|d| {
        tokio::spawn(primary_watch::watch(
            d.clone(),
            nemesis.log.clone(),
            nemesis.next_fault.clone(),
            watch_stopped,
        ))
    });

    // The workers of every arm.
    let mut workers = Vec::new();
    let mut arm_workers: Vec<(Arm, String, Vec<WorkerId>, Vec<PathBuf>)> = Vec::new();
    let mut arm_cli: Vec<Vec<WorkerId>> = Vec::new();
    let mut next_id: WorkerId = 0;
    for &arm in &options.arms {
        let run = format!("{}-{}-{started}", options.backend.name(), arm.name());
        let keys: Vec<String> = (0..options.keys)
            .map(|k| format!("workload/{}/{started}/k{k}", arm.name()))
            .collect();
        let mut ids = Vec::new();
        let mut files = Vec::new();
        let mut cli_ids = Vec::new();
        for n in 0..options.workers {
            let id = next_id;
            next_id += 1;
            let history = options
                .out
                .join(format!("{}-worker-{id}.jsonl", arm.name()));
            let _ = std::fs::remove_file(&history);
            let uid = worker_uid(id);
            give_to(&history, uid)?;
            let config = WorkerConfig {
                worker: id,
                authority_url: url.clone(),
                resource_url: resource_url.clone(),
                run: run.clone(),
                keys: keys.clone(),
                fenced: arm == Arm::Fenced,
                seed: options.seed,
                ttl_min_ms: ttl_min,
                ttl_max_ms: ttl_max,
                ttl_step_ms: ttl_step,
                pause_probability: options.pause_probability,
                cancel_probability: options.cancel_probability,
                cancel_within_ms: 30,
                work_fraction: 0.2,
                history: history.clone(),
                ignores_holder: options.ignores_holder,
                handoff_armed: Some(trigger.armed_path().to_path_buf()),
            };
            // The last workers of the arm take their leases through the CLI.
            let cli = cli
                .clone()
                .filter(|_| n >= options.workers.saturating_sub(options.cli_workers));
            let args = match &cli {
                Some(path) => [
                    "cli-worker".to_string(),
                    serde_json::to_string(&CliWorkerConfig {
                        worker: config,
                        cli: path.as_ref().clone(),
                        exe: exe.clone(),
                    })?,
                ],
                None => ["worker".to_string(), serde_json::to_string(&config)?],
            };
            if cli.is_some() {
                cli_ids.push(id);
            }
            let name = format!("worker-{id}");
            let dir = leasehold_servers::process::server_dir(&name)?;
            give_to(dir.path(), uid)?;
            let mut spec = CommandSpec::new(exe.clone(), args);
            spec.user = Some((uid, uid));
            // A home the worker's uid may read (libraries look there, e.g. for `.pgpass`).
            spec.envs.push(("HOME".into(), dir.path().into()));
            let process =
                tokio::task::spawn_blocking(move || ManagedProcess::spawn(name, dir, spec))
                    .await??;
            workers.push(WorkerProc {
                id,
                process: Arc::new(process),
                paused: None,
                killed: None,
                killed_by: FaultKind::KillWorker,
                uid,
                history: history.clone(),
                cut: None,
                cli,
                tree_kill: None,
            });
            ids.push(id);
            files.push(history);
        }
        arm_workers.push((arm, run, ids, files));
        arm_cli.push(cli_ids);
    }

    // The nemesis: worker faults in this loop, server faults in a task of their own (a restart
    // takes seconds, and paused workers must be resumed on time meanwhile).
    let mut kinds: Vec<FaultKind> = vec![FaultKind::PauseWorker, FaultKind::KillWorker];
    // A worker is cut off an authority it reaches over the network; an embedded one (SQLite)
    // has no port to cut.
    if !nemesis.cut_ports.is_empty() {
        kinds.push(FaultKind::CutWorker);
    }
    if let Some(d) = &deployment {
        kinds.extend(d.faults());
    }
    if let Some(server) = &resource_server {
        kinds.extend(server.faults());
    }
    // The first pass makes sure every kind happens (worker faults once per arm); then faults
    // are drawn at random.
    // An entry's flag aims it at the arm's CLI workers' trees.
    let mut schedule: Vec<(FaultKind, Option<usize>, bool)> = Vec::new();
    for &kind in &kinds {
        match kind {
            FaultKind::PauseWorker
            | FaultKind::KillWorker
            | FaultKind::KillWorkerInTransaction
            | FaultKind::CutWorker => {
                schedule.extend((0..arm_workers.len()).map(|arm| (kind, Some(arm), false)))
            }
            kind => schedule.push((kind, None, false)),
        }
    }
    for (arm, ids) in arm_cli.iter().enumerate() {
        if !ids.is_empty() {
            schedule.push((FaultKind::PauseWorker, Some(arm), true));
            schedule.push((FaultKind::KillWorker, Some(arm), true));
        }
    }
    schedule.shuffle(&mut nemesis.rng);
    schedule.reverse();
    // The entries aimed at the CLI workers' trees go first (the schedule is taken from its
    // end): they land only while a worker runs a round unpaused, and once the random draws
    // begin, a CLI worker may spend most of a short run paused past its TTL. The kills inside
    // a transaction come next, for the same reason: they need a worker that is neither paused
    // nor killed to be caught writing, and the pauses of the first pass thin those out (a
    // loaded short run caught none in its 4 s attempts).
    schedule.sort_by_key(|&(kind, _, trees)| (trees, kind == FaultKind::KillWorkerInTransaction));
    let gap = |rng: &mut StdRng| {
        let (lo, hi) = options.fault_gap;
        Duration::from_millis(rng.random_range(lo.as_millis() as u64..=hi.as_millis() as u64))
    };
    let end = Instant::now() + options.duration;
    let mut next_at = Instant::now() + gap(&mut nemesis.rng);
    let mut server_fault: Option<tokio::task::JoinHandle<()>> = None;
    // One resource fault at a time, beside the authority's: it fails the run when it could not
    // land or heal.
    let mut resource_fault: Option<tokio::task::JoinHandle<Result<(), String>>> = None;
    let mut quiet_until = Instant::now();
    while Instant::now() < end {
        nemesis.tend(&mut workers).await?;
        // After a server fault heals, servers stay quiet for a TTL: a lease outlives the
        // fault that paused its holder only until it expires, and a leader change renews
        // every etcd lease, so without quiet spells no paused holder's lease would ever end.
        if server_fault.as_ref().is_some_and(|t| t.is_finished()) {
            server_fault = None;
            quiet_until = Instant::now() + Duration::from_millis(ttl_max);
        }
        if resource_fault.as_ref().is_some_and(|t| t.is_finished()) {
            if let Some(task) = resource_fault.take() {
                task.await??;
            }
        }
        let server_busy = server_fault.is_some() || Instant::now() < quiet_until;
        if Instant::now() >= next_at {
            let (kind, arm, trees) = schedule.last().copied().unwrap_or_else(|| {
                // Worker pauses are the fault that makes stale writes; weigh them up, and
                // leave servers quiet spells (etcd refreshes every lease at each new leader,
                // so a leader fault every other second would keep every paused holder's
                // lease alive).
                if nemesis.rng.random_bool(0.5) {
                    (FaultKind::PauseWorker, None, false)
                } else {
                    (kinds[nemesis.rng.random_range(0..kinds.len())], None, false)
                }
            });
            let among = arm.map(|a| {
                if trees {
                    arm_cli[a].as_slice()
                } else {
                    arm_workers[a].2.as_slice()
                }
            });
            let worker_fault = matches!(
                kind,
                FaultKind::PauseWorker
                    | FaultKind::KillWorker
                    | FaultKind::KillWorkerInTransaction
                    | FaultKind::CutWorker
            );
            let resource = matches!(
                kind,
                FaultKind::KillResourceConnection
                    | FaultKind::StallResource
                    | FaultKind::RestartResource
            );
            // A server fault waits for the one in progress to heal; worker faults go on, and
            // the resource's faults take turns among themselves.
            let go = if resource {
                resource_fault.is_none()
            } else {
                worker_fault || !server_busy
            };
            if go {
                // A tree kill lands only while a round runs, a cut only on a worker that runs;
                // until then it is tried again.
                let mut landed = true;
                match kind {
                    FaultKind::PauseWorker => nemesis.pause_worker(&mut workers, among),
                    FaultKind::KillWorker => {
                        landed = nemesis.kill_worker(&mut workers, among, trees)? || !trees
                    }
                    // Every worker of the arm may be paused, killed or cut right now.
                    FaultKind::CutWorker => landed = nemesis.cut_worker(&mut workers, among)?,
                    FaultKind::KillWorkerInTransaction => {
                        let lock_file = deployment.as_ref().and_then(|d| d.write_lock_file());
                        let caught = nemesis
                            .kill_worker_in_transaction(&mut workers, among, lock_file)
                            .await;
                        // The first pass guarantees every kind: one not caught this time comes
                        // round again after the others, which must not wait behind it (a short
                        // run has room for few of its 4 s attempts).
                        landed = caught || arm.is_none();
                    }
                    FaultKind::KillResourceConnection
                    | FaultKind::StallResource
                    | FaultKind::RestartResource => {
                        if let Some(server) = &resource_server {
                            resource_fault = Some(tokio::spawn(resource_fault_task(
                                server.clone(),
                                kind,
                                nemesis.log.clone(),
                                nemesis.fault_id(),
                            )));
                        }
                    }
                    kind => {
                        if let Some(d) = &deployment {
                            let hold = gap(&mut nemesis.rng);
                            let seed = nemesis.rng.random();
                            let (log, id) = (nemesis.log.clone(), nemesis.fault_id());
                            server_fault = Some(if kind == FaultKind::HandoffLeaderChange {
                                let trigger = trigger.clone();
                                tokio::spawn(handoff::fault(
                                    d.clone(),
                                    trigger,
                                    hold,
                                    seed,
                                    log,
                                    id,
                                ))
                            } else {
                                tokio::spawn(server_fault_task(
                                    d.clone(),
                                    kind,
                                    hold,
                                    seed,
                                    log,
                                    id,
                                ))
                            });
                        }
                    }
                }
                if landed {
                    schedule.pop();
                    next_at = Instant::now() + gap(&mut nemesis.rng);
                } else {
                    rotate(&mut schedule);
                }
            } else {
                rotate(&mut schedule);
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Heal everything: the server fault ends on its own; wait until the authority serves, put
    // killed workers back, then stop every worker. A worker finishes its round first and may
    // pause itself once more on the way: from now on pauses end at once.
    if let Some(task) = server_fault {
        task.await?;
    }
    if let Some(task) = resource_fault {
        task.await??;
    }
    wait_for_recovery(
        &url,
        Duration::from_millis(ttl_min),
        Duration::from_secs(60),
    )
    .await?;
    if let Some(d) = deployment.as_ref() {
        primary_watch::settle(d, Duration::from_secs(30)).await;
    }
    nemesis.pause_for = (Duration::ZERO, Duration::ZERO);
    for w in workers.iter_mut() {
        if let Some((_, at)) = w.paused.as_mut() {
            *at = Instant::now();
        }
        if let Some((_, at)) = w.killed.as_mut() {
            *at = Instant::now();
        }
        if let Some((_, at, _)) = w.cut.as_mut() {
            *at = Instant::now();
        }
    }
    while workers
        .iter()
        .any(|w| w.killed.is_some() || w.tree_kill.is_some())
    {
        nemesis.tend(&mut workers).await?;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    nemesis.stopping = true;
    for w in &workers {
        if let Some(pid) = w.process.pid() {
            signal(pid, "TERM").await;
        }
    }
    let give_up = Instant::now() + Duration::from_secs(30);
    while workers.iter().any(|w| w.process.is_running()) && Instant::now() < give_up {
        nemesis.tend(&mut workers).await?;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for w in &workers {
        if w.process.is_running() {
            eprintln!("worker {} did not stop within 30 s; killing it", w.id);
            let _ = w.process.kill();
        }
    }
    stop_watch.send_replace(true);
    if let Some(task) = primary_watch {
        task.await?;
    }
    let nemesis_events = History::read_file(&nemesis_path)?;

    let mut results = Vec::new();
    for (arm, run, ids, files) in arm_workers {
        let resource = resource::connect(&resource_url, &run).await?;
        let finals = resource.final_state().await?;
        let mut parts = Vec::new();
        for file in &files {
            if file.exists() {
                parts.push(History::read_file(file)?);
            }
        }
        let ids: BTreeSet<WorkerId> = ids.into_iter().collect();
        parts.push(History::new(
            nemesis_events
                .events()
                .iter()
                .filter(|e| e.what.fault_worker().is_none_or(|w| ids.contains(&w)))
                .cloned()
                .collect(),
        ));
        let merged = History::merge(parts);
        let mut history = History::new(vec![Event::new(
            started,
            What::Run {
                seed: options.seed,
                backend: if options.ignores_holder {
                    format!("{} wrapped to ignore the holder", options.backend.name())
                } else {
                    options.backend.name().to_string()
                },
                fenced: arm == Arm::Fenced,
                failover_unsafe,
                early_revocation,
                one_writer,
                planned_faults: kinds.clone(),
                commit: Some(commit.clone()),
                versions: versions.clone(),
                command: Some(command.clone()),
                resource: Some(resource_kind.name().to_string()),
            },
        )]);
        for event in merged.events() {
            history.push(event.clone());
        }
        let at = now_ns();
        for (key, (elements, last_fence)) in finals {
            history.push(Event::new(
                at,
                What::Final {
                    key,
                    elements,
                    last_fence,
                },
            ));
        }
        let history_path = options
            .out
            .join(history_file(options.backend, resource_kind, arm));
        history.write_to(std::io::BufWriter::new(std::fs::File::create(
            &history_path,
        )?))?;
        let verdict = check_recorded(&history).ok_or("the merged history has no run line")?;
        results.push(ArmResult {
            arm,
            history_path,
            verdict,
        });
    }
    for file in arm_files_to_remove(&options.out) {
        let _ = std::fs::remove_file(file);
    }
    Ok(results)
}

/// The per-worker files, once merged.
fn arm_files_to_remove(out: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(out)
        .map(|dir| {
            dir.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                        n.contains("-worker-") || n == "nemesis.jsonl" || n.starts_with("handoff-")
                    })
                })
                .collect()
        })
        .unwrap_or_default()
}
