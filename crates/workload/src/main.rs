//! `leasehold-workload`: runs the fault workload, re-executes itself as a worker, checks stored
//! histories and renders the report.
//!
//! ```text
//! leasehold-workload run --backend etcd --duration 60s --seed 7      # both arms, 3-node etcd
//! leasehold-workload check target/workload/etcd-fenced.history.jsonl
//! leasehold-workload report --out docs/report target/workload/*.history.jsonl
//! ```
//!
//! Exit status: 0 when every run passed (declared weaknesses pass, labelled), 1 when a run
//! failed, 2 for a usage error.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use leasehold_conformance::workload::{check_recorded, History};
use leasehold_workload::broken::IgnoresHolder;
use leasehold_workload::cli_round::{self, RoundConfig};
use leasehold_workload::cli_worker::{self, CliWorkerConfig};
use leasehold_workload::deployment::{object_store, Backend};
use leasehold_workload::report::{render, ReportRun};
use leasehold_workload::resource::{self, ResourceKind};
use leasehold_workload::runner::{run, Arm, RunOptions};
use leasehold_workload::worker::{Log, PauseBy, Worker, WorkerConfig};

const USAGE: &str = "usage:
  leasehold-workload run --backend etcd|zookeeper|postgres|postgres-standby|postgres-pgbouncer|
      redis|redis-sentinel|redis-cluster|sqlite|mysql|object-store [--nodes N] [--duration 60s]
      [--seed N] [--workers N] [--keys N] [--arms fenced,control] [--url AUTHORITY_URL]
      [--resource postgres|azurite] [--resource-url URL] [--out DIR] [--pause-probability P]
      [--cancel-probability P] [--fault-gap 1s..3s] [--cli-workers N] [--broken ignores-holder]
  leasehold-workload check HISTORY...
  leasehold-workload report --out DIR [--how TEXT] HISTORY...
The runner starts the servers itself (Debian packages) unless --url / --resource-url name them.
--resource picks the store it starts for the protected sets: a PostgreSQL table (default) or
objects on Azurite behind the object gate; --resource-url takes postgres:// or
azurite://HOST:PORT/CONTAINER.
--cli-workers (default 1) of each arm's workers take their leases through the `leasehold` command
($LEASEHOLD_CLI, else `leasehold` beside this program).";

/// Each history's label in the report: its file name without `.history.jsonl[.gz]`, or where
/// two files share a name (the same backend run twice into different directories), its
/// directory and file name, so no run's row or kept history stands in for another's.
fn run_labels<'a>(paths: impl Iterator<Item = &'a str>) -> Vec<String> {
    let paths: Vec<&std::path::Path> = paths.map(std::path::Path::new).collect();
    let name = |p: &std::path::Path| {
        p.file_name()
            .and_then(|n| n.to_str())
            .map(|n| {
                n.trim_end_matches(".gz")
                    .trim_end_matches(".history.jsonl")
                    .to_string()
            })
            .unwrap_or_else(|| p.display().to_string())
    };
    let names: Vec<String> = paths.iter().map(|p| name(p)).collect();
    paths
        .iter()
        .zip(&names)
        .map(|(path, n)| {
            let shared = names.iter().filter(|other| *other == n).count() > 1;
            let dir = path
                .parent()
                .and_then(|d| d.file_name())
                .and_then(|d| d.to_str());
            match (shared, dir) {
                (true, Some(dir)) => format!("{dir}/{n}"),
                _ => n.clone(),
            }
        })
        .collect()
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if starts_object_store(&args) {
        // Before any thread exists: the runner's connects and its workers (which inherit the
        // environment) read the store's key from it, never from a URL.
        for (name, value) in object_store::ENV {
            if std::env::var_os(name).is_none() {
                std::env::set_var(name, value);
            }
        }
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("leasehold-workload: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("LEASEHOLD_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .try_init();
    match args.first().map(String::as_str) {
        Some("run") => runtime.block_on(run_command(&args[1..])),
        Some("worker") => runtime.block_on(worker_command(&args[1..])),
        Some("cli-worker") => runtime.block_on(cli_worker_command(&args[1..])),
        Some("cli-round") => runtime.block_on(cli_round_command(&args[1..])),
        Some("check") => check_command(&args[1..]),
        Some("report") => report_command(&args[1..]),
        Some("-h" | "--help" | "help") => {
            println!("{USAGE}");
            ExitCode::SUCCESS
        }
        _ => usage("expected a command"),
    }
}

/// Whether `args` run the object-store form on an Azurite the runner starts (not one given by
/// `--url`, whose credentials are the caller's).
fn starts_object_store(args: &[String]) -> bool {
    let flag = |name: &str| {
        args.windows(2)
            .find(|w| w[0] == name)
            .map(|w| w[1].as_str())
    };
    args.first().map(String::as_str) == Some("run")
        && flag("--backend").and_then(Backend::parse) == Some(Backend::ObjectStore)
        && flag("--url").is_none()
}

fn usage(problem: &str) -> ExitCode {
    eprintln!("leasehold-workload: {problem}\n{USAGE}");
    ExitCode::from(2)
}

/// `500ms`, `20s`, `10m`.
fn parse_duration(text: &str) -> Option<Duration> {
    let (number, unit) = text.split_at(text.find(|c: char| !c.is_ascii_digit())?);
    let n: u64 = number.parse().ok()?;
    match unit {
        "ms" => Some(Duration::from_millis(n)),
        "s" => Some(Duration::from_secs(n)),
        "m" => Some(Duration::from_secs(n.checked_mul(60)?)),
        _ => None,
    }
}

fn parse_probability(text: &str) -> Option<f64> {
    text.parse::<f64>().ok().filter(|p| (0.0..=1.0).contains(p))
}

async fn run_command(args: &[String]) -> ExitCode {
    let mut backend = None;
    let mut options = RunOptions::new(
        Backend::Etcd,
        Duration::from_secs(60),
        7,
        PathBuf::from("target/workload"),
    );
    let mut nodes = None;
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let Some(value) = it.next() else {
            return usage(&format!("{flag} needs a value"));
        };
        let ok = match flag.as_str() {
            "--backend" => Backend::parse(value).map(|b| backend = Some(b)).is_some(),
            "--nodes" => value.parse().ok().map(|n| nodes = Some(n)).is_some(),
            "--duration" => parse_duration(value)
                .map(|d| options.duration = d)
                .is_some(),
            "--seed" => value.parse().ok().map(|s| options.seed = s).is_some(),
            "--workers" => value
                .parse()
                .ok()
                .filter(|&n| (1..=256).contains(&n))
                .map(|n| options.workers = n)
                .is_some(),
            "--cli-workers" => value
                .parse()
                .ok()
                .map(|n| options.cli_workers = n)
                .is_some(),
            "--keys" => value
                .parse()
                .ok()
                .filter(|&n| n >= 1)
                .map(|n| options.keys = n)
                .is_some(),
            "--arms" => {
                let arms: Option<Vec<Arm>> = value
                    .split(',')
                    .map(|a| match a {
                        "fenced" => Some(Arm::Fenced),
                        "control" => Some(Arm::Control),
                        _ => None,
                    })
                    .collect();
                arms.map(|a| options.arms = a).is_some()
            }
            "--url" => {
                options.authority_url = Some(value.clone());
                true
            }
            "--resource" => ResourceKind::parse(value)
                .map(|k| options.resource = k)
                .is_some(),
            "--resource-url" => {
                options.resource_url = Some(value.clone());
                true
            }
            "--out" => {
                options.out = PathBuf::from(value);
                true
            }
            "--pause-probability" => parse_probability(value)
                .map(|p| options.pause_probability = p)
                .is_some(),
            "--cancel-probability" => parse_probability(value)
                .map(|p| options.cancel_probability = p)
                .is_some(),
            "--broken" => (value == "ignores-holder")
                .then(|| options.ignores_holder = true)
                .is_some(),
            "--fault-gap" => value
                .split_once("..")
                .and_then(|(lo, hi)| Some((parse_duration(lo)?, parse_duration(hi)?)))
                .filter(|(lo, hi)| lo <= hi)
                .map(|gap| options.fault_gap = gap)
                .is_some(),
            _ => return usage(&format!("unknown flag {flag}")),
        };
        if !ok {
            return usage(&format!("invalid value {value:?} for {flag}"));
        }
    }
    let Some(backend) = backend else {
        return usage("--backend is required");
    };
    options.backend = backend;
    options.nodes = nodes.unwrap_or(backend.default_nodes());
    match run(&options).await {
        Ok(results) => {
            let mut failed = false;
            for result in results {
                println!("{}", result.verdict);
                println!("history: {}\n", result.history_path.display());
                failed |= !result.verdict.passed();
            }
            if failed {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(e) => {
            eprintln!("leasehold-workload: the run could not complete: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn cli_worker_command(args: &[String]) -> ExitCode {
    use tokio::signal::unix::{signal, SignalKind};
    let Some(config) = args
        .first()
        .and_then(|json| serde_json::from_str::<CliWorkerConfig>(json).ok())
    else {
        return usage("cli-worker needs its configuration as JSON");
    };
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut terminate = match signal(SignalKind::terminate()) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("cli worker: {e}");
            return ExitCode::FAILURE;
        }
    };
    tokio::spawn(async move {
        terminate.recv().await;
        let _ = stop_tx.send(true);
    });
    match cli_worker::run(config, stop_rx).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cli worker: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn cli_round_command(args: &[String]) -> ExitCode {
    let Some(config) = args
        .first()
        .and_then(|json| serde_json::from_str::<RoundConfig>(json).ok())
    else {
        return usage("cli-round needs its configuration as JSON");
    };
    match cli_round::round(config).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cli round: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn worker_command(args: &[String]) -> ExitCode {
    let Some(config) = args
        .first()
        .and_then(|json| serde_json::from_str::<WorkerConfig>(json).ok())
    else {
        return usage("worker needs its configuration as JSON");
    };
    match worker(config).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("worker: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn worker(config: WorkerConfig) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    use tokio::signal::unix::{signal, SignalKind};
    let log = Log::open(&config.history)?;
    // The authority may be down right now (the worker was restarted during a fault).
    let give_up = tokio::time::Instant::now() + Duration::from_secs(60);
    let authority = loop {
        match leasehold::connect(&config.authority_url).await {
            Ok(a) => break a,
            Err(e) if tokio::time::Instant::now() >= give_up => return Err(Box::new(e)),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    };
    let authority: Arc<dyn leasehold_core::Authority> = if config.ignores_holder {
        Arc::new(IgnoresHolder::new(authority, std::process::id()))
    } else {
        authority
    };
    // So may the resource (its server restarting, its connections being killed).
    let resource = loop {
        match resource::connect(&config.resource_url, &config.run).await {
            Ok(r) => break r,
            Err(e) if tokio::time::Instant::now() >= give_up => return Err(e),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    };
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut terminate = signal(SignalKind::terminate())?;
    tokio::spawn(async move {
        terminate.recv().await;
        let _ = stop_tx.send(true);
    });
    Worker::new(
        config,
        authority.clone(),
        resource,
        log,
        PauseBy::Signal,
        std::process::id(),
    )
    .run(stop_rx)
    .await;
    let _ = authority.close().await;
    Ok(())
}

fn read_histories(paths: &[String]) -> Result<Vec<(String, History)>, String> {
    paths
        .iter()
        .map(|p| {
            History::read_file(p)
                .map(|h| (p.clone(), h))
                .map_err(|e| format!("{p}: {e}"))
        })
        .collect()
}

fn check_command(args: &[String]) -> ExitCode {
    if args.is_empty() {
        return usage("check needs a history");
    }
    let histories = match read_histories(args) {
        Ok(h) => h,
        Err(e) => {
            eprintln!("leasehold-workload: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut failed = false;
    for (path, history) in histories {
        match check_recorded(&history) {
            Some(verdict) => {
                println!("{path}:\n{verdict}");
                failed |= !verdict.passed();
            }
            None => {
                eprintln!("{path}: no run line; not a workload history");
                failed = true;
            }
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

fn report_command(args: &[String]) -> ExitCode {
    let mut out = None;
    let mut how = String::new();
    let mut paths = Vec::new();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--out" => out = it.next().map(PathBuf::from),
            "--how" => how = it.next().cloned().unwrap_or_default(),
            _ => paths.push(arg.clone()),
        }
    }
    let Some(out) = out else {
        return usage("report needs --out DIR");
    };
    if paths.is_empty() {
        return usage("report needs histories");
    }
    let runs = match read_histories(&paths) {
        Ok(h) => h,
        Err(e) => {
            eprintln!("leasehold-workload: {e}");
            return ExitCode::FAILURE;
        }
    };
    let labels = run_labels(runs.iter().map(|(path, _)| path.as_str()));
    let runs: Vec<ReportRun> = runs
        .into_iter()
        .zip(labels)
        .map(|((_, history), label)| ReportRun { label, history })
        .collect();
    match render(&runs, &how, &out) {
        Ok(()) => {
            println!("report written to {}", out.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("leasehold-workload: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::run_labels;

    #[test]
    fn histories_that_share_a_file_name_are_told_apart_by_their_directory() {
        let labels = run_labels(
            [
                "wl/etcd/etcd-fenced.history.jsonl",
                "wl/zookeeper/zookeeper-fenced.history.jsonl",
                "wl/zk-azurite/zookeeper-fenced.history.jsonl.gz",
            ]
            .into_iter(),
        );
        assert_eq!(
            labels,
            [
                "etcd-fenced",
                "zookeeper/zookeeper-fenced",
                "zk-azurite/zookeeper-fenced"
            ]
        );
    }
}
