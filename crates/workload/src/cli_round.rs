//! One round of a CLI worker, as the command that `leasehold run` starts: it holds no lease of
//! its own, it is handed one. It reads the fence from `LEASEHOLD_FENCE` as any user's script
//! would, claims and reads the key's set at the resource, works, checks its deadline, maybe
//! stops its whole tree right there (the worst moment for a pause), writes with the fence, and
//! exits; `leasehold` releases the lease when it does.
//!
//! The command is not told its lease's deadline, so the round records a conservative stand-in:
//! the moment its driver started `leasehold` (before the acquire request left) plus the TTL
//! less the safety margin, as the library counts a deadline from the request's sending. That is
//! never later than the real local deadline of the first grant; the renewals `leasehold` makes
//! meanwhile are not seen, so a round that outlives the stand-in stops acting as a holder
//! (records the loss) although its lease may still be valid.

use std::io::Write;
use std::time::Duration;

use leasehold_conformance::workload::clock::now_ns;
use leasehold_conformance::workload::{What, WorkerId};
use leasehold_servers::process::parent_of;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::resource::{self, Outcome};
use crate::worker::Log;

/// What the round's command line carries.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RoundConfig {
    /// The worker (the driver's number).
    pub worker: WorkerId,
    /// The key the lease is on.
    pub key: String,
    /// The resource's PostgreSQL URL.
    pub resource_url: String,
    /// The resource rows' namespace.
    pub run: String,
    /// Whether writes carry the fence.
    pub fenced: bool,
    /// The TTL `leasehold` was given.
    pub ttl_ms: u64,
    /// `CLOCK_MONOTONIC` when the driver started `leasehold`: before its request left.
    pub sent_at_ns: u64,
    /// The safety margin the library takes off that TTL.
    pub margin_ns: u64,
    /// The element this round writes (unique in the run).
    pub element: u64,
    /// Whether to stop the tree between the deadline check and the write.
    pub pause: bool,
    /// How long to work, at most.
    pub work_ms: u64,
    /// Seeds the work time.
    pub seed: u64,
    /// The worker's history file.
    pub history: std::path::PathBuf,
}

/// What the round prints on stdout for its driver: the fence first, `done` once it stopped
/// acting as the holder.
pub const DONE: &str = "done";

/// Runs one round; errors end it (exit status non-zero), and the driver records them.
pub async fn round(config: RoundConfig) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let fence: u64 = std::env::var("LEASEHOLD_FENCE")?.parse()?;
    let key = std::env::var("LEASEHOLD_KEY")?;
    if key != config.key {
        return Err(format!("LEASEHOLD_KEY is {key:?}, the round is on {:?}", config.key).into());
    }
    let mut stdout = std::io::stdout();
    writeln!(stdout, "{fence}")?;
    stdout.flush()?;
    let log = Log::open(&config.history)?;
    let worker = config.worker;
    let deadline = config
        .sent_at_ns
        .saturating_add(config.ttl_ms.saturating_mul(1_000_000))
        .saturating_sub(config.margin_ns);
    log.record(What::AcquireOk {
        worker,
        key: key.clone(),
        fence,
        deadline: Some(deadline),
    });
    hold(&config, &log, fence, deadline).await;
    log.record(What::ReleaseInvoke {
        worker,
        key: key.clone(),
        fence,
    });
    writeln!(stdout, "{DONE}")?;
    stdout.flush()?;
    Ok(())
}

async fn hold(config: &RoundConfig, log: &Log, fence: u64, deadline: u64) {
    let (worker, key) = (config.worker, config.key.clone());
    let lost = |log: &Log| {
        log.record(What::Lost {
            worker,
            key: key.clone(),
            fence,
            reason: "the local deadline passed (the command's stand-in: request sent + TTL - \
                     margin, renewals unseen)"
                .into(),
        })
    };
    let claim = config.fenced.then_some(fence);
    log.record(What::ReadInvoke {
        worker,
        key: key.clone(),
        fence: claim,
    });
    let resource = match resource::connect(&config.resource_url, &config.run).await {
        Ok(r) => r,
        Err(e) => {
            log.record(What::ReadFail {
                worker,
                key: key.clone(),
                fence: claim,
                error: e.to_string(),
            });
            return;
        }
    };
    let mut set = match resource.read(&key, claim).await {
        Ok(Outcome::Done(set)) => {
            log.record(What::ReadOk {
                worker,
                key: key.clone(),
                fence: claim,
                elements: set.clone(),
            });
            set
        }
        Ok(Outcome::Stale { newest }) => {
            log.record(What::ReadStale {
                worker,
                key: key.clone(),
                fence,
                newest,
            });
            return;
        }
        Err(e) => {
            log.record(What::ReadFail {
                worker,
                key: key.clone(),
                fence: claim,
                error: e.to_string(),
            });
            return;
        }
    };
    let mut rng = StdRng::seed_from_u64(config.seed);
    tokio::time::sleep(Duration::from_millis(rng.random_range(0..=config.work_ms))).await;
    if now_ns() >= deadline {
        lost(log);
        return;
    }
    if config.pause {
        stop_tree().await;
    }
    set.push(config.element);
    log.record(What::WriteInvoke {
        worker,
        key: key.clone(),
        fence,
        element: config.element,
    });
    let what = match resource.write(&key, &set, fence, config.fenced).await {
        Ok(Outcome::Done(prior)) => What::WriteOk {
            worker,
            key: key.clone(),
            fence,
            element: config.element,
            prior,
        },
        Ok(Outcome::Stale { newest }) => What::WriteStale {
            worker,
            key: key.clone(),
            fence,
            element: config.element,
            newest,
        },
        Err(e) => What::WriteUnknown {
            worker,
            key: key.clone(),
            fence,
            element: config.element,
            error: e.to_string(),
        },
    };
    log.record(what);
}

/// Stops the driver, `leasehold` and this command at once, as a frozen machine would, but not
/// `leasehold`'s watcher: with `leasehold` stopped, nobody renews the lease, and the watcher is
/// what must end this command when the lease's deadline passes. The runner sees the driver
/// stopped and continues the tree later.
async fn stop_tree() {
    let me = std::process::id();
    let leasehold = parent_of(me);
    let driver = leasehold.and_then(parent_of);
    let mut pids: Vec<String> = [driver, leasehold]
        .into_iter()
        .flatten()
        .map(|p| p.to_string())
        .collect();
    pids.push(me.to_string());
    // Through the shell's kill built-in, which keeps this crate free of `unsafe`; this process
    // is last, so the others are stopped before it.
    let stopped = tokio::process::Command::new("/bin/sh")
        .arg("-c")
        .arg("kill -s STOP \"$@\"")
        .arg("sh")
        .args(&pids)
        .status()
        .await;
    if let Err(e) = stopped {
        eprintln!("cli round: could not stop its tree: {e}");
    }
}
