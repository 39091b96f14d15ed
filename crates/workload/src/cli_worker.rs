//! A CLI worker: the lock-set loop with the lease taken by the `leasehold` command, wired as a
//! user would wire a cron job: each round is
//! `leasehold run --url URL --key KEY --ttl TTL -- leasehold-workload cli-round JSON`, which
//! tries once (a busy key is skipped), and the round (see [`crate::cli_round`]) claims, reads
//! and writes with the fence from its environment.
//!
//! The driver records the request and how `leasehold` ended; the round records the grant and
//! its operations. The nemesis stops and kills these trees ([`stop_tree`], [`kill_leasehold`]),
//! so the command's guarantees are checked by the workload too: nothing the command started
//! outlives `leasehold`'s SIGKILL, and a stopped `leasehold` gets its command killed by its
//! watcher when the lease's deadline passes, so no late write comes from it.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use leasehold_conformance::workload::clock::now_ns;
use leasehold_conformance::workload::What;
use leasehold_core::SafetyMargin;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use tokio::io::AsyncReadExt;
use tokio::sync::watch;

use crate::cli_round::{RoundConfig, DONE};
use crate::worker::{Elements, Log, WorkerConfig};

/// What a CLI worker is told.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CliWorkerConfig {
    /// What every worker is told (its TTLs, keys, resource, history, seed).
    pub worker: WorkerConfig,
    /// The `leasehold` binary.
    pub cli: PathBuf,
    /// The workload binary, which `leasehold` runs as its command.
    pub exe: PathBuf,
}

/// The exit status `leasehold` gives when the key is held by someone else.
const BUSY: i32 = 75;
/// The exit status `leasehold` gives when the lease was lost while the command ran.
const LOST: i32 = 76;

/// The `leasehold` binary: `$LEASEHOLD_CLI`, else `leasehold` beside this program (cargo puts
/// both in `target/<profile>/`).
pub fn find_cli() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os("LEASEHOLD_CLI") {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(format!("LEASEHOLD_CLI={} is not a file", path.display()))
        };
    }
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let beside = exe.with_file_name("leasehold");
    if beside.is_file() {
        Ok(beside)
    } else {
        Err(format!(
            "no leasehold binary at {} (build it with `cargo build -p leasehold-cli`, or set \
             LEASEHOLD_CLI, or run with --cli-workers 0)",
            beside.display()
        ))
    }
}

/// The authority's URL as the command gets it: a 1 s request timeout, so that TTLs of a second
/// or two are above the command's floor (the request timeout plus the safety margin).
pub fn cli_url(url: &str) -> String {
    if url.contains("timeout_ms=") {
        url.to_string()
    } else if url.contains('?') {
        format!("{url}&timeout_ms=1000")
    } else {
        format!("{url}?timeout_ms=1000")
    }
}

/// The TTLs a CLI worker asks for: the worker's range, raised above the command's floor (1 s
/// request timeout plus the margin) on the backend's granularity.
fn cli_ttl(config: &WorkerConfig, rng: &mut StdRng) -> Duration {
    let step = config.ttl_step_ms.max(1);
    let floor = config.ttl_min_ms.max(1100);
    let lo = floor.div_ceil(step);
    let hi = (config.ttl_max_ms / step).max(lo);
    Duration::from_millis(rng.random_range(lo..=hi) * step)
}

/// Runs `leasehold run` rounds until `stop` turns true (a round in progress finishes first).
pub async fn run(config: CliWorkerConfig, mut stop: watch::Receiver<bool>) -> Result<(), String> {
    let log = Log::open(&config.worker.history).map_err(|e| e.to_string())?;
    let me = std::process::id();
    let mut rng = StdRng::seed_from_u64(
        config.worker.seed ^ (u64::from(config.worker.worker) << 40) ^ u64::from(me),
    );
    let mut elements = Elements::new(config.worker.worker, me);
    let url = cli_url(&config.worker.authority_url);
    while !*stop.borrow() {
        one_round(&config, &url, &log, &mut rng, &mut elements).await;
        let breath = Duration::from_millis(rng.random_range(1..=20));
        tokio::select! {
            () = tokio::time::sleep(breath) => {}
            _ = stop.changed() => {}
        }
    }
    Ok(())
}

async fn one_round(
    config: &CliWorkerConfig,
    url: &str,
    log: &Log,
    rng: &mut StdRng,
    elements: &mut Elements,
) {
    let w = &config.worker;
    let worker = w.worker;
    let key = w.keys[rng.random_range(0..w.keys.len().max(1))].clone();
    let ttl = cli_ttl(w, rng);
    let margin = SafetyMargin::default().for_ttl(ttl);
    let most = (ttl.as_millis() as f64 * w.work_fraction.clamp(0.0, 1.0)) as u64;
    let sent_at_ns = now_ns();
    let round = RoundConfig {
        worker,
        key: key.clone(),
        resource_url: w.resource_url.clone(),
        run: w.run.clone(),
        fenced: w.fenced,
        ttl_ms: ttl.as_millis() as u64,
        sent_at_ns,
        margin_ns: margin.as_nanos() as u64,
        element: elements.take(),
        pause: rng.random_bool(w.pause_probability),
        work_ms: most,
        seed: rng.random(),
        history: w.history.clone(),
    };
    let json = match serde_json::to_string(&round) {
        Ok(j) => j,
        Err(e) => {
            eprintln!("cli worker {worker}: {e}");
            return;
        }
    };
    log.record(What::AcquireInvoke {
        worker,
        key: key.clone(),
        ttl_ns: ttl.as_nanos() as u64,
        max_wait_ns: Some(0),
    });
    let child = tokio::process::Command::new(&config.cli)
        .args(["run", "--quiet", "--url", url, "--key", &key])
        .args(["--ttl", &format!("{}ms", ttl.as_millis())])
        .args(["--wait", "0s", "--grace", "1s", "--"])
        .arg(&config.exe)
        .args(["cli-round", &json])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            log.record(What::AcquireFail {
                worker,
                key,
                error: format!("cannot start {}: {e}", config.cli.display()),
            });
            return;
        }
    };
    let (mut out, mut err) = (String::new(), String::new());
    let mut stdout = child.stdout.take();
    let mut stderr = child.stderr.take();
    let read_out = async {
        if let Some(s) = stdout.as_mut() {
            let _ = s.read_to_string(&mut out).await;
        }
    };
    let read_err = async {
        if let Some(s) = stderr.as_mut() {
            let _ = s.read_to_string(&mut err).await;
        }
    };
    let ((), (), status) = tokio::join!(read_out, read_err, child.wait());
    let fence: Option<u64> = out.lines().next().and_then(|l| l.trim().parse().ok());
    let done = out.lines().any(|l| l.trim() == DONE);
    let err = err.trim().lines().last().unwrap_or_default().to_string();
    let status = match status {
        Ok(s) => s,
        Err(e) => {
            eprintln!("cli worker {worker}: waiting for leasehold: {e}");
            return;
        }
    };
    let what = match (status.code(), fence) {
        // Killed by a signal (the nemesis's SIGKILL): the kill fault covers the round, whose
        // outcome the history leaves open.
        (None, _) => return,
        (Some(BUSY), None) => What::AcquireTimeout { worker, key },
        (Some(0), Some(fence)) if done => What::ReleaseOk { worker, key, fence },
        (Some(LOST), Some(fence)) if !done => What::Lost {
            worker,
            key,
            fence,
            reason: format!("leasehold exited {LOST} (lease lost; its command was ended): {err}"),
        },
        (Some(code), Some(fence)) if done => What::ReleaseFail {
            worker,
            key,
            fence,
            error: format!("leasehold exited {code}: {err}"),
        },
        (Some(code), Some(fence)) => What::Lost {
            worker,
            key,
            fence,
            reason: format!("the round ended early, leasehold exited {code}: {err}"),
        },
        (Some(code), None) => What::AcquireFail {
            worker,
            key,
            error: format!("leasehold exited {code}: {err}"),
        },
    };
    let failed = matches!(what, What::AcquireFail { .. });
    log.record(what);
    if failed {
        // The authority may be down (a fault): do not spin.
        tokio::time::sleep(Duration::from_millis(rng.random_range(50..=250))).await;
    }
}

pub use leasehold_servers::process::{descendants, is_alive};

fn cmdline(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default()
}

fn is_leasehold(pid: u32, cli: &Path) -> bool {
    std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|exe| exe == cli)
        && !cmdline(pid).contains("__watch-group")
}

/// The `leasehold run` process below a driver, if a round is in progress.
pub fn leasehold_of(driver: u32, cli: &Path) -> Option<u32> {
    descendants(driver)
        .into_iter()
        .find(|&p| is_leasehold(p, cli))
}

/// The pids a tree stop hits: the driver and everything below it but `leasehold`'s watcher,
/// which must stay awake to kill the command when the stopped `leasehold`'s lease runs out.
pub fn tree_to_stop(driver: u32) -> Vec<u32> {
    let mut pids = vec![driver];
    pids.extend(
        descendants(driver)
            .into_iter()
            .filter(|&p| !cmdline(p).contains("__watch-group")),
    );
    pids
}

/// Sends `SIG<name>` to `pids` through the shell's kill built-in (no `unsafe` in this crate).
/// A process of the tree that ended between the listing and the signal (a short-lived child of
/// the command) makes `kill` fail for that pid only: not an error.
pub fn signal_all(pids: &[u32], name: &str) -> Result<(), String> {
    let status = std::process::Command::new("/bin/sh")
        .arg("-c")
        .arg("kill -s \"$0\" \"$@\"")
        .arg(name)
        .args(pids.iter().map(u32::to_string))
        .stderr(Stdio::null())
        .status()
        .map_err(|e| e.to_string())?;
    // As root, `kill` fails only for a pid that no longer exists.
    if status.success() || pids.iter().any(|&p| !is_alive(p)) {
        Ok(())
    } else {
        Err(format!("kill -s {name} {pids:?} failed ({status})"))
    }
}

/// SIGKILL to `leasehold` alone, once its command runs; returns what the command is (the
/// command and what it started, not `leasehold`'s watcher), which must all be gone soon: the
/// runner checks. `None`, and nothing killed, while no command runs below it yet.
pub fn kill_leasehold(leasehold: u32) -> Result<Option<Vec<u32>>, String> {
    let below: Vec<u32> = descendants(leasehold)
        .into_iter()
        .filter(|&p| !cmdline(p).contains("__watch-group"))
        .collect();
    if below.is_empty() {
        return Ok(None);
    }
    signal_all(&[leasehold], "KILL")?;
    Ok(Some(below))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_gets_a_one_second_request_timeout_unless_the_url_has_one() {
        assert_eq!(
            cli_url("postgres://u@127.0.0.1:5432/db"),
            "postgres://u@127.0.0.1:5432/db?timeout_ms=1000"
        );
        assert_eq!(cli_url("zk://h:1/w?x=1"), "zk://h:1/w?x=1&timeout_ms=1000");
        assert_eq!(
            cli_url("etcd://h:1?timeout_ms=1000"),
            "etcd://h:1?timeout_ms=1000"
        );
    }

    fn config(min: u64, max: u64, step: u64) -> WorkerConfig {
        WorkerConfig {
            worker: 0,
            authority_url: String::new(),
            resource_url: String::new(),
            run: String::new(),
            keys: vec!["k".into()],
            fenced: true,
            seed: 1,
            ttl_min_ms: min,
            ttl_max_ms: max,
            ttl_step_ms: step,
            pause_probability: 0.0,
            cancel_probability: 0.0,
            cancel_within_ms: 0,
            work_fraction: 0.2,
            history: PathBuf::new(),
            ignores_holder: false,
            handoff_armed: None,
        }
    }

    /// The command refuses a TTL below its floor (1.016 s with a 1 s request timeout): every
    /// TTL drawn is above it, on the backend's granularity.
    #[test]
    fn ttls_stay_above_the_commands_floor() {
        let mut rng = StdRng::seed_from_u64(3);
        for (min, max, step) in [(1000, 3000, 1), (1000, 3000, 1000), (1000, 1000, 1)] {
            let c = config(min, max, step);
            for _ in 0..200 {
                let ttl = cli_ttl(&c, &mut rng).as_millis() as u64;
                assert!(ttl >= 1100, "{ttl} ms from {min}..{max} step {step}");
                assert_eq!(ttl % step, 0, "{ttl} ms is off the {step} ms step");
            }
        }
    }
}
