//! `leasehold-bench <backend> [options]`: measures, in one run on the same server, leasehold as a
//! user holds it (through `connect(url)`) next to the backend's raw protocol minimum on a
//! dedicated connection, and prints p50, p99 and the p50 ratio. Run it in release mode:
//!
//! ```text
//! cargo run --release -p leasehold-bench -- memory
//! cargo run --release -p leasehold-bench -- postgres              # starts its own server
//! cargo run --release -p leasehold-bench -- postgres --url postgres://...
//! cargo run --release -p leasehold-bench -- redis --runtime multi --only throughput
//! cargo run --release -p leasehold-bench -- mysql                 # MariaDB from Debian
//! cargo run --release -p leasehold-bench -- object-store          # Azurite (no --url)
//! ```
//!
//! Measurements (`--only` picks one; all by default):
//! * `pair`: one uncontended acquire + release, against each baseline in a shuffled order per
//!   round, each timed pair right after an untimed one of the same contestant (`--cold`: right
//!   after another contestant's): the raw **fenced** minimum (the cheapest pair that still hands
//!   out an ordered fence), the raw unfenced minimum where the fence costs the protocol
//!   something, and peers (other lock libraries on the same server, printed for reference: none
//!   of them hands out a fence).
//!   Targets: <= 1.05x the raw fenced minimum, <= 1.10x the raw unfenced minimum.
//! * `handoff`: release -> the next waiter holds, against one raw pair after the same idle gap.
//!   Target: <= 1.5x. On PostgreSQL, whose release announces itself with `NOTIFY`, the raw
//!   hand-off by notification is measured in the same rounds too, for reference, and every
//!   hand-off's client and server CPU is printed, so the gap between the two can be split.
//! * `held`: `--held N` (default 10,000) leases of `--held-ttl-ms` (6,000) held at once and
//!   renewed in the background, for three renewal ticks:
//!   renewal calls and server commands per renewal tick, client CPU per tick, client memory per
//!   held lease; and, on a server the bench started, the server's CPU, bytes on the wire and
//!   proportional memory per acquisition, per renewal tick and per held lease. Target: <= 1
//!   round trip per tick per connection.
//! * `throughput`: `--tasks T` (64) tasks acquire and release over `--keys K` (1,000) keys for
//!   `--seconds S` (3), against the raw fenced pair driven the same way, on the runtime chosen by
//!   `--runtime current|multi` (default current: one thread, as an application's client task).
//!
//! `leasehold-bench compare [--backends ...] [--quick]` sets leasehold against each backend's
//! best-known peer recipe instead (see the `compare` module).
//!
//! The numbers are printed, never asserted: timing belongs in benchmarks, not in tests.

mod compare;
mod etcd;
mod harness;
mod held;
mod memory;
mod mysql;
mod object_store;
mod postgres;
mod process_tree;
mod redis;
mod server_cpu;
mod stats;
mod throughput;
mod zookeeper;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use leasehold::{Authority, Instant, LockKey};
use metrics_exporter_prometheus::PrometheusRecorder;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use stats::Samples;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What a baseline is, which decides its target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Baseline {
    /// The backend's raw protocol on a dedicated connection, with none of leasehold's checks;
    /// `fenced` when it still hands out an ordered fence (what leasehold must come close to).
    Raw { fenced: bool },
    /// Another lock library on the same server (no fence: printed for reference).
    Peer,
    /// The raw protocol doing more of what leasehold does (a release that announces itself to
    /// waiters, a write as leasehold sends it): printed for reference, no target.
    Reference,
}

impl Baseline {
    /// The p50 ratio leasehold must stay under against this baseline.
    pub fn target(self) -> Option<f64> {
        match self {
            Baseline::Raw { fenced: true } => Some(1.05),
            Baseline::Raw { fenced: false } => Some(1.10),
            Baseline::Peer | Baseline::Reference => None,
        }
    }
}

/// A baseline pair: the cheapest take-and-free its client library can do.
#[async_trait]
pub trait RawPair: Send + Sync + std::fmt::Debug {
    /// What the pair is, for the printed line.
    fn name(&self) -> &'static str;
    /// Raw (fenced or not) or a peer.
    fn baseline(&self) -> Baseline;
    /// One take + free on `key`.
    async fn pair(&self, key: &str) -> Result<(), BoxError>;
}

/// A raw hand-off: the protocol's own way for a waiter on one connection to learn that the
/// holder on another released, and take the key, with nothing of leasehold in between. What a
/// hand-off by notification costs the protocol itself, apart from what leasehold adds.
#[async_trait]
pub trait RawHandoff: Send + Sync {
    /// What the hand-off is, for the printed line.
    fn name(&self) -> &'static str;
    /// Frees what the last round's waiter holds, makes one connection hold `key` and another
    /// find it held and wait (untimed).
    async fn prepare(&self, key: &str) -> Result<(), BoxError>;
    /// From the holder's release until the waiter holds.
    async fn hand_off(&self, key: &str) -> Result<Duration, BoxError>;
}

/// Counts what the server did, for the `held` measurement (Redis commands, PostgreSQL
/// transactions, etcd RPCs, ZooKeeper packets).
#[async_trait]
pub trait ServerOps: Send + Sync {
    /// What is counted.
    fn unit(&self) -> &'static str;
    /// The server's counter now.
    async fn count(&self) -> Result<u64, BoxError>;
    /// Whether the counter is up to date at once, so that a hundred pairs show in it.
    fn immediate(&self) -> bool {
        true
    }
}

/// A backend under measurement.
pub struct Subject {
    pub authority: Arc<dyn Authority>,
    /// Baselines on dedicated connections, used one request at a time.
    pub raw: Vec<Box<dyn RawPair>>,
    /// The raw fenced pair for many concurrent tasks (pipelined on one connection where the
    /// protocol allows, else a pool without per-checkout pings).
    pub concurrent_raw: Option<Arc<dyn RawPair>>,
    /// The server's own counter of work done.
    pub server_ops: Option<Box<dyn ServerOps>>,
    /// The raw hand-off by notification, where the protocol has one to set leasehold's against.
    pub raw_handoff: Option<Box<dyn RawHandoff>>,
    /// Whether the ratio targets apply (they do for every network backend).
    pub targets: bool,
}

impl std::fmt::Debug for Subject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subject")
            .field("authority", &self.authority)
            .field("raw", &self.raw)
            .finish_non_exhaustive()
    }
}

const TTL: Duration = Duration::from_secs(10);

#[derive(Debug, Clone)]
struct Options {
    backend: String,
    url: Option<String>,
    iterations: usize,
    multi_thread: bool,
    only: Option<String>,
    /// Time each pair right after another contestant's (cold), instead of after an untimed
    /// pair of its own (warm, the default).
    cold: bool,
    held: usize,
    held_ttl: Duration,
    keys: usize,
    tasks: usize,
    seconds: u64,
}

fn parse() -> Result<Options, BoxError> {
    let mut args = std::env::args().skip(1);
    let mut o = Options {
        backend: args.next().unwrap_or_else(|| "memory".into()),
        url: None,
        iterations: 2000,
        multi_thread: false,
        only: None,
        cold: false,
        held: 10_000,
        held_ttl: Duration::from_secs(6),
        keys: 1000,
        tasks: 64,
        seconds: 3,
    };
    let number = |v: Option<String>, what: &str| -> Result<usize, BoxError> {
        v.and_then(|n| n.parse().ok())
            .ok_or_else(|| format!("{what} needs a number").into())
    };
    while let Some(a) = args.next() {
        match a.as_str() {
            "--url" => o.url = Some(args.next().ok_or("--url needs a URL")?),
            "--cold" => o.cold = true,
            "--iterations" => o.iterations = number(args.next(), "--iterations")?,
            "--held" => o.held = number(args.next(), "--held")?,
            "--held-ttl-ms" => {
                o.held_ttl =
                    Duration::from_millis(number(args.next(), "--held-ttl-ms")?.max(30) as u64)
            }
            "--keys" => o.keys = number(args.next(), "--keys")?.max(1),
            "--tasks" => o.tasks = number(args.next(), "--tasks")?.max(1),
            "--seconds" => o.seconds = number(args.next(), "--seconds")? as u64,
            "--runtime" => {
                o.multi_thread = match args.next().as_deref() {
                    Some("current") => false,
                    Some("multi") => true,
                    _ => return Err("--runtime is current or multi".into()),
                }
            }
            "--only" => {
                let what = args.next().ok_or("--only needs a measurement")?;
                if !["pair", "handoff", "held", "throughput"].contains(&what.as_str()) {
                    return Err(format!(
                        "unknown measurement {what}; known: pair, handoff, held, throughput"
                    )
                    .into());
                }
                o.only = Some(what);
            }
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    Ok(o)
}

fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some(compare::worker::WORKER_FLAG) => {
            let worker = compare::worker::WorkerArgs::parse(&args)?;
            return tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?
                .block_on(compare::worker::run(worker));
        }
        Some("compare") => {
            let options = compare::CompareOptions::parse(&args[1..])?;
            return tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?
                .block_on(compare::run(options));
        }
        _ => {}
    }
    let options = parse()?;
    if options.backend == "object-store" {
        // Before any thread exists: leasehold's client and the raw one read the store's key
        // from the environment, never from a URL (Azurite's public development key).
        use leasehold_servers::object_stores::AZURITE_KEY;
        if std::env::var_os("AZURE_STORAGE_ACCOUNT_KEY").is_none() {
            std::env::set_var("AZURE_STORAGE_ACCOUNT_KEY", AZURITE_KEY);
        }
    }
    let runtime = if options.multi_thread {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?
    } else {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
    };
    runtime.block_on(bench(options))
}

async fn bench(o: Options) -> Result<(), BoxError> {
    let backend = o.backend.as_str();
    // Keeps a server the bench started alive until the end of the run.
    let mut _server: Option<Box<dyn std::any::Any>> = None;
    let mut server_pid = None;
    let subject = match backend {
        "memory" => memory::subject().await?,
        "object-store" => {
            if o.url.is_some() {
                return Err("object-store measures the Azurite it starts itself (no --url)".into());
            }
            let started = harness::start(backend)?;
            println!("started Azurite for this run: {}", started.url);
            server_pid = started.pid;
            let endpoint = started.endpoint.clone().unwrap_or_default();
            let url = started.url.clone();
            _server = Some(started.guard);
            object_store::subject(&url, &endpoint).await?
        }
        "postgres" | "mysql" | "redis" | "etcd" | "zookeeper" => {
            let url = match o.url.clone() {
                Some(url) => url,
                None => {
                    let started = harness::start(backend)?;
                    println!("started a {backend} server for this run: {}", started.url);
                    _server = Some(started.guard);
                    server_pid = started.pid;
                    started.url
                }
            };
            match backend {
                "postgres" => postgres::subject(&url).await?,
                "mysql" => mysql::subject(&url).await?,
                "redis" => redis::subject(&url).await?,
                "etcd" => etcd::subject(&url).await?,
                _ => zookeeper::subject(&url).await?,
            }
        }
        other => {
            return Err(format!(
                "unknown backend {other}; known: memory, postgres, mysql, redis, etcd, \
                 zookeeper, object-store"
            )
            .into())
        }
    };
    println!(
        "leasehold-bench: backend {backend}, {} runtime, {} iterations per measurement{}",
        if o.multi_thread {
            "multi_thread (2 workers)"
        } else {
            "current_thread"
        },
        o.iterations,
        if cfg!(debug_assertions) {
            " (DEBUG BUILD: use --release for real figures)"
        } else {
            ""
        }
    );
    if !subject.targets {
        println!(
            "(no targets: the in-memory raw pair has no round trip to amortise leasehold's work)"
        );
    }
    let wants = |m: &str| o.only.as_deref().is_none_or(|only| only == m);
    if wants("pair") || wants("handoff") {
        let server = server_pid.and_then(server_cpu::ServerCpu::new);
        run(
            &subject,
            server,
            o.iterations,
            o.cold,
            wants("pair"),
            wants("handoff"),
        )
        .await?;
    }
    if wants("throughput") {
        throughput::run(&subject, o.keys, o.tasks, Duration::from_secs(o.seconds)).await?;
    }
    if wants("held") {
        let server = server_pid.and_then(server_cpu::ServerCpu::new);
        held::run(&subject, server, o.held, o.held_ttl).await?;
    }
    Ok(())
}

async fn run(
    subject: &Subject,
    mut server: Option<server_cpu::ServerCpu>,
    iterations: usize,
    cold: bool,
    pairs: bool,
    handoffs: bool,
) -> Result<(), BoxError> {
    let key = LockKey::new(format!("bench/{}", std::process::id()))?;
    let warmup = iterations / 10 + 1;
    let mut ours = Samples::default();
    // The same pair with a recorder installed (this thread's, for that pair only), interleaved
    // with the rest: what recording the metrics costs on the hot path.
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let mut recorded = Samples::default();
    let mut through_acquire = Samples::default();
    let mut raws: Vec<Samples> = subject.raw.iter().map(|_| Samples::default()).collect();
    // Every round measures each contestant once, in a new order each round (see `ORDER_SEED`), so
    // drift on a noisy machine, "who goes first after a pause" and "who runs right after whom"
    // hit them all alike.
    let contestants = subject.raw.len() + FIRST_RAW;
    let mut order: Vec<usize> = (0..contestants).collect();
    let mut shuffle = rand::rngs::StdRng::seed_from_u64(ORDER_SEED);
    // This thread's CPU time in each contestant's pairs: on a current_thread runtime, all the
    // client work of a pair (its own and its library's, tasks included) runs here.
    let mut cpu = vec![Duration::ZERO; contestants];
    // The server's CPU time in each: read outside the client's (the reading is client work).
    // Server work still running after a pair has answered is charged to the next pair: in the
    // warm order that is the same contestant's untimed pair, in `--cold` another contestant's,
    // so cold server figures are rough. A thread that exits between two readings loses its
    // share of that pair (rare: the servers keep their threads). CPU figures are means over
    // the timed pairs; the latencies are percentiles.
    let mut server_cpu = vec![Duration::ZERO; contestants];
    for i in 0..warmup + iterations {
        if i % 64 == 0 {
            if let Some(server) = server.as_mut() {
                server.refresh();
            }
        }
        order.shuffle(&mut shuffle);
        for &which in &order {
            // Warm: an untimed pair of the same contestant first, so that no contestant is timed
            // while its connection, its server process and its code come back into the caches
            // after another's (on one core, following a different PostgreSQL backend cost a
            // pair 9 to 13 µs, and the contestant that followed leasehold's own pair ran 20 %
            // faster than leasehold for that reason alone).
            if !cold {
                contestant_pair(subject, which, &key, &recorder).await?;
            }
            let server_before = server.as_ref().map(|s| s.total());
            let cpu_before = thread_cpu();
            let took = contestant_pair(subject, which, &key, &recorder).await?;
            let cpu_after = thread_cpu();
            if i >= warmup {
                cpu[which] += cpu_after.saturating_sub(cpu_before);
                if let (Some(server), Some(before)) = (server.as_ref(), server_before) {
                    server_cpu[which] += server.total().saturating_sub(before);
                }
                match which {
                    0 => ours.push(took),
                    1 => recorded.push(took),
                    2 => through_acquire.push(took),
                    n => raws[n - FIRST_RAW].push(took),
                }
            }
        }
    }
    if pairs {
        // After the timed rounds, so that no contestant's count carries its one-time setup
        // (a session, a lease, a parent node).
        if let Some(ops) = subject.server_ops.as_ref().filter(|o| o.immediate()) {
            requests_per_pair(subject, ops.as_ref(), &key, &recorder).await?;
        }
        for (raw, samples) in subject.raw.iter().zip(&raws) {
            let target = raw.baseline().target().filter(|_| subject.targets);
            stats::report(
                "uncontended acquire+release",
                &ours,
                raw.name(),
                samples,
                target,
            );
        }
        stats::report(
            "acquire() (may wait) + release",
            &through_acquire,
            "try_acquire() + release",
            &ours,
            None,
        );
        if let Some(raw) = subject.raw.first() {
            stats::report(
                "acquire() (may wait) + release",
                &through_acquire,
                raw.name(),
                &raws[0],
                None,
            );
        }
        stats::report(
            "acquire+release, metrics recorded (Prometheus recorder)",
            &recorded,
            "the same with no recorder installed",
            &ours,
            None,
        );
        let current = tokio::runtime::Handle::current().runtime_flavor()
            == tokio::runtime::RuntimeFlavor::CurrentThread;
        if current && iterations > 0 {
            let per_pair = |d: Duration| d / iterations as u32;
            let mut line = format!("client CPU per pair: leasehold {:.1?}", per_pair(cpu[0]));
            for (n, raw) in subject.raw.iter().enumerate() {
                line += &format!(" | {} {:.1?}", raw.name(), per_pair(cpu[n + FIRST_RAW]));
            }
            println!("{line}");
        }
        if server.is_some() && iterations > 0 {
            let per_pair = |d: Duration| d / iterations as u32;
            let mut line = format!(
                "server CPU per pair: leasehold {:.1?}",
                per_pair(server_cpu[0])
            );
            for (n, raw) in subject.raw.iter().enumerate() {
                line += &format!(
                    " | {} {:.1?}",
                    raw.name(),
                    per_pair(server_cpu[n + FIRST_RAW])
                );
            }
            println!("{line}");
        }
    }
    if !handoffs {
        return Ok(());
    }
    let (handoff, idle_raw, raw_handoffs) =
        handoff(subject, server.as_mut(), &key, iterations / 4 + 1).await?;
    if let Some(raw) = subject.raw.first() {
        let target = subject.targets.then_some(1.5);
        stats::report(
            "hand-off (release -> waiter holds)",
            &handoff,
            "same raw pair, after a 2 ms idle gap",
            &idle_raw,
            target,
        );
        stats::report(
            "hand-off (release -> waiter holds)",
            &handoff,
            raw.name(),
            &raws[0],
            None,
        );
    }
    if let Some(raw) = &subject.raw_handoff {
        stats::report(
            "hand-off (release -> waiter holds)",
            &handoff,
            raw.name(),
            &raw_handoffs,
            None,
        );
    }
    Ok(())
}

/// What the server counts (commands, transactions, RPCs, packets) per pair of each contestant:
/// 100 pairs in a row between two readings of its counter, less what two readings alone add.
async fn requests_per_pair(
    subject: &Subject,
    ops: &dyn ServerOps,
    key: &LockKey,
    recorder: &PrometheusRecorder,
) -> Result<(), BoxError> {
    const PAIRS: u32 = 100;
    let reading = {
        let a = ops.count().await?;
        ops.count().await?.saturating_sub(a)
    };
    let mut line = format!("server {} per pair:", ops.unit());
    // Leasehold (0) and every raw pair; the recorded contestant (1) sends what 0 sends, and
    // the one through acquire() (2) sends as many requests.
    for which in std::iter::once(0).chain(FIRST_RAW..subject.raw.len() + FIRST_RAW) {
        let before = ops.count().await?;
        for _ in 0..PAIRS {
            contestant_pair(subject, which, key, recorder).await?;
        }
        let counted = ops.count().await?.saturating_sub(before);
        let name = match which {
            0 => "leasehold",
            n => subject.raw[n - FIRST_RAW].name(),
        };
        let per_pair = counted.saturating_sub(reading) as f64 / f64::from(PAIRS);
        line += &format!(
            "{}{name} {per_pair:.2}",
            if which == 0 { " " } else { " | " }
        );
    }
    println!("{line}");
    Ok(())
}

/// The first raw contestant's number: 0 is leasehold, 1 leasehold with a Prometheus recorder
/// installed for that pair, 2 leasehold through `acquire` instead of `try_acquire`.
const FIRST_RAW: usize = 3;

/// One pair of contestant `which` in a round, timed: 0 is leasehold, 1 leasehold with a
/// Prometheus recorder installed for that pair, 2 leasehold through `acquire`, [`FIRST_RAW`]
/// and on the raw pairs (each on a key of its own, made before the clock starts).
async fn contestant_pair(
    subject: &Subject,
    which: usize,
    key: &LockKey,
    recorder: &PrometheusRecorder,
) -> Result<Duration, BoxError> {
    match which {
        0 => pair(subject, key).await,
        1 => {
            let _recording = metrics::set_default_local_recorder(recorder);
            pair(subject, key).await
        }
        2 => waiting_pair(subject, key).await,
        n => {
            let raw = subject.raw.get(n - FIRST_RAW).ok_or("no such contestant")?;
            let raw_key = format!("{key}-raw{n}");
            let t = Instant::now();
            raw.pair(&raw_key).await?;
            Ok(t.elapsed())
        }
    }
}

/// The seed of the contestants' order, shuffled anew every round (fixed, so a run can be
/// repeated). Rotating where each round starts, as the bench first did, left every contestant
/// behind the same neighbour in every round, and on one core what the neighbour leaves in the
/// caches moves a pair by a few percent: ZooKeeper's `acquire()` pair, always timed after
/// leasehold's own, measured 0.97x its `try_acquire()` pair, always timed after a raw one.
const ORDER_SEED: u64 = 0x9E37_79B9_7F4A_7C15;

/// One round's raw measurements for the hand-off: a raw pair after an idle gap, and the raw
/// hand-off where the backend has one.
struct RawRound<'a> {
    idle_raw: &'a mut Samples,
    raw_handoffs: &'a mut Samples,
    cpu: &'a mut Cpu,
}

impl RawRound<'_> {
    async fn run(
        &mut self,
        subject: &Subject,
        server: Option<&server_cpu::ServerCpu>,
        raw_key: &str,
        handoff_key: &str,
    ) -> Result<(), BoxError> {
        if let Some(raw) = subject.raw.first() {
            tokio::time::sleep(Duration::from_millis(2)).await;
            let t = Instant::now();
            raw.pair(raw_key).await?;
            self.idle_raw.push(t.elapsed());
        }
        if let Some(raw) = &subject.raw_handoff {
            raw.prepare(handoff_key).await?;
            tokio::time::sleep(Duration::from_millis(2)).await;
            let before = Cpu::now(server);
            self.raw_handoffs.push(raw.hand_off(handoff_key).await?);
            self.cpu.add_since(&before, server);
        }
        Ok(())
    }
}

/// Client and server CPU time, summed over timed windows.
#[derive(Debug, Default)]
struct Cpu {
    client: Duration,
    server: Duration,
}

impl Cpu {
    /// The readings at the start of a window: the server's first, so that reading it (client
    /// work) is outside the client's window.
    fn now(server: Option<&server_cpu::ServerCpu>) -> Self {
        let server = server.map_or(Duration::ZERO, |s| s.total());
        Cpu {
            client: thread_cpu(),
            server,
        }
    }

    /// Adds the window that started at `before`: the client's reading first, for the same
    /// reason.
    fn add_since(&mut self, before: &Cpu, server: Option<&server_cpu::ServerCpu>) {
        let client = thread_cpu();
        let server = server.map_or(Duration::ZERO, |s| s.total());
        self.client += client.saturating_sub(before.client);
        self.server += server.saturating_sub(before.server);
    }
}

/// CPU time of the calling thread so far.
fn thread_cpu() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(
        u64::try_from(t.tv_sec).unwrap_or(0),
        u32::try_from(t.tv_nsec).unwrap_or(0),
    )
}

/// One uncontended try_acquire + release through leasehold, timed.
async fn pair(subject: &Subject, key: &LockKey) -> Result<Duration, BoxError> {
    let t = Instant::now();
    let grant = subject
        .authority
        .try_acquire(key, TTL)
        .await?
        .ok_or("the bench key is held by someone else")?;
    let _ = subject.authority.release(&grant).await?;
    Ok(t.elapsed())
}

/// One uncontended `acquire` (which may wait) + release through leasehold, timed: what most
/// callers send, which on some backends is a different statement from `try_acquire`'s
/// (PostgreSQL's marks the key waited on in the same round trip when it finds it held).
async fn waiting_pair(subject: &Subject, key: &LockKey) -> Result<Duration, BoxError> {
    let t = Instant::now();
    let grant = subject
        .authority
        .acquire(key, TTL, Duration::from_secs(1))
        .await?;
    let _ = subject.authority.release(&grant).await?;
    Ok(t.elapsed())
}

/// A waiter blocks in `acquire`; the holder releases; measured from the release call until the
/// waiter's `acquire` returns. Each round starts after a 2 ms idle gap (so the waiter is parked),
/// and the same round measures one raw pair after the same kind of gap: an idle connection and a
/// sleeping runtime wake slower than a hot loop, and the ratio should compare like with like.
async fn handoff(
    subject: &Subject,
    mut server: Option<&mut server_cpu::ServerCpu>,
    key: &LockKey,
    rounds: usize,
) -> Result<(Samples, Samples, Samples), BoxError> {
    let mut samples = Samples::default();
    let mut idle_raw = Samples::default();
    let mut raw_handoffs = Samples::default();
    // Client (this thread: the waiter's task runs here too) and server CPU within the timed
    // window of leasehold's hand-offs and of the raw ones, so a gap between them can be split.
    let (mut cpu, mut raw_cpu) = (Cpu::default(), Cpu::default());
    let raw_key = format!("{key}-raw");
    let handoff_key = format!("{key}-raw-handoff");
    let mut held = subject
        .authority
        .try_acquire(key, TTL)
        .await?
        .ok_or("the bench key is held by someone else")?;
    for round in 0..rounds {
        // Server processes start as connections open (PostgreSQL's for the listening
        // connection that waiting opens, and for each lane, mostly in the first rounds): find
        // them outside the timed windows. Not every round: walking /proc evicts enough of the
        // caches to slow the next timed pair by 15 % (measured: the idle raw pair 110 -> 127 µs).
        if round < 4 || round % 16 == 0 {
            if let Some(server) = server.as_deref_mut() {
                server.refresh();
            }
        }
        let server = server.as_deref();
        // The raw rounds go first in even rounds and last in odd ones, so neither side always
        // follows the other.
        let mut raws = RawRound {
            idle_raw: &mut idle_raw,
            raw_handoffs: &mut raw_handoffs,
            cpu: &mut raw_cpu,
        };
        if round % 2 == 0 {
            raws.run(subject, server, &raw_key, &handoff_key).await?;
        }
        let waiter = {
            let (authority, key) = (subject.authority.clone(), key.clone());
            tokio::spawn(async move {
                let g = authority.acquire(&key, TTL, Duration::from_secs(30)).await;
                (g, Instant::now())
            })
        };
        // Let the waiter reach its wait.
        tokio::time::sleep(Duration::from_millis(2)).await;
        let before = Cpu::now(server);
        let released_at = Instant::now();
        let _ = subject.authority.release(&held).await?;
        let (grant, got_at) = waiter.await?;
        cpu.add_since(&before, server);
        held = grant?;
        samples.push(got_at - released_at);
        if round % 2 == 1 {
            raws.run(subject, server, &raw_key, &handoff_key).await?;
        }
    }
    let _ = subject.authority.release(&held).await?;
    let per = |d: Duration| d / rounds.max(1) as u32;
    let mut line = format!(
        "hand-off mean wall, client CPU, server CPU: leasehold {:.1?}, {:.1?}, {:.1?}",
        samples.mean(),
        per(cpu.client),
        per(cpu.server)
    );
    if let Some(raw) = &subject.raw_handoff {
        line += &format!(
            " | {} {:.1?}, {:.1?}, {:.1?}",
            raw.name(),
            raw_handoffs.mean(),
            per(raw_cpu.client),
            per(raw_cpu.server)
        );
    }
    println!("{line}");
    Ok((samples, idle_raw, raw_handoffs))
}
