//! MariaDB failovers against real servers: a replica promoted by hand while the old primary
//! may still grant once more. An asynchronous replica reissues a fence, which the conformance
//! scenario shows as declared (and as a failure when linearizable fences are claimed for the
//! same setup); a semi-synchronous replica whose primary never stops waiting for it keeps
//! fences growing, and is declared so at connect.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use leasehold_conformance::kit::{SharedUrl, UrlConnector};
use leasehold_conformance::scenarios::{self, run_all, run_selected};
use leasehold_conformance::{harness_call, Context, Faults, Verdict};
use leasehold_core::{FenceSafety, Instant, LockKey};
use leasehold_servers::MariaDbServer;

mod common;
mod suite;

use common::{connect, start_server, OrFail, Result};

/// How the primary replicates to its replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Replication {
    /// The default: commits do not wait for the replica.
    Asynchronous,
    /// Semi-synchronous, `AFTER_SYNC`, with the longest acknowledgement timeout MariaDB takes
    /// (about 49 days): a commit returns only once the replica has it, and the primary never
    /// falls back to asynchronous within a test.
    SemiSynchronous,
}

/// The longest `rpl_semi_sync_master_timeout`.
const NEVER: Duration = Duration::from_millis(4_294_967_295);

/// A primary and a replica of it.
struct Pair {
    primary: Arc<MariaDbServer>,
    replica: MariaDbServer,
    /// Where clients connect: the primary until the failover completes.
    url: SharedUrl,
    /// Whether the replica was promoted: then it is the server the other faults act on.
    failed_over: AtomicBool,
    replication: Replication,
    options: String,
}

impl Pair {
    /// The server clients reach now: the primary, or the replica once promoted.
    fn current(&self) -> &MariaDbServer {
        if self.failed_over.load(Ordering::Acquire) {
            &self.replica
        } else {
            &self.primary
        }
    }

    fn primary_url(&self) -> String {
        format!("{}?timeout_ms=1000{}", self.primary.url(), self.options)
    }

    fn replica_url(&self) -> String {
        format!("{}?timeout_ms=1000{}", self.replica.url(), self.options)
    }
}

/// The pair, and its clients: they connect at the pair's URL, which the failover moves from the
/// primary to the promoted replica.
async fn pair_with(options: &str, replication: Replication) -> Result<(Arc<Pair>, UrlConnector)> {
    let primary = start_server().await?;
    let replica = {
        let primary = primary.clone();
        tokio::task::spawn_blocking(move || match replication {
            Replication::Asynchronous => MariaDbServer::start_replica_of(&primary),
            Replication::SemiSynchronous => {
                MariaDbServer::start_semi_sync_replica_of(&primary, NEVER)
            }
        })
        .await
        .or_fail("the task starting the replica")?
        .or_fail("the replica must start for this test")?
    };
    let clients = suite::clients("");
    let pair = Arc::new(Pair {
        url: clients.url(),
        failed_over: AtomicBool::new(false),
        replication,
        primary,
        replica,
        options: options.to_string(),
    });
    pair.url.set(pair.primary_url());
    // The table reaches the replica through replication, as a DBA's migration would.
    connect(&pair.primary_url())
        .await?
        .migrate()
        .await
        .or_fail("migrate the primary")?;
    Ok((pair, clients))
}

struct Failover(Arc<Pair>);

impl Failover {
    async fn on_current(
        &self,
        f: impl FnOnce(&MariaDbServer) -> leasehold_servers::Result<()> + Send + 'static,
    ) -> leasehold_core::Result<()> {
        let pair = self.0.clone();
        harness_call(move || f(pair.current())).await
    }
}

/// Every fault of the suite acts on the server clients reach now (the primary, then the
/// promoted replica), so the whole suite runs on the replicated deployment.
#[async_trait]
impl Faults for Failover {
    /// A restart is over when the deployment takes writes again: with a semi-synchronous
    /// replica, when the replica acknowledges again (until then every commit waits for it,
    /// as it would in production).
    async fn restart(&self) -> leasehold_core::Result<()> {
        self.on_current(|s| s.restart()).await?;
        if self.0.replication == Replication::SemiSynchronous
            && !self.0.failed_over.load(Ordering::Acquire)
        {
            let pair = self.0.clone();
            harness_call(move || {
                let started = Instant::now();
                while !pair.primary.semi_sync_active()? {
                    if started.elapsed() > Duration::from_secs(20) {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                Ok(())
            })
            .await?;
        }
        Ok(())
    }

    async fn pause(&self) -> leasehold_core::Result<()> {
        self.on_current(|s| s.pause()).await
    }

    async fn resume(&self) -> leasehold_core::Result<()> {
        self.on_current(|s| s.resume()).await
    }

    /// An operator ends the lease by hand (keeping the row and its fence counter).
    async fn revoke(&self, key: &LockKey) -> leasehold_core::Result<()> {
        suite::revoke(&self.0.url.get(), key).await
    }

    /// Lets the replica catch up, then stops its replication: the primary (asynchronous) still
    /// commits, and the replica never sees it; a semi-synchronous primary waits.
    async fn begin_failover(&self) -> leasehold_core::Result<()> {
        let pair = self.0.clone();
        harness_call(move || {
            pair.replica.wait_caught_up(Duration::from_secs(10))?;
            pair.replica.command("STOP SLAVE").map(drop)
        })
        .await
    }

    /// The old primary dies; the replica is promoted by hand and clients connect to it.
    async fn complete_failover(&self) -> leasehold_core::Result<()> {
        let pair = self.0.clone();
        harness_call(move || {
            pair.primary.kill()?;
            pair.replica.promote()
        })
        .await?;
        self.0.url.set(self.0.replica_url());
        self.0.failed_over.store(true, Ordering::Release);
        Ok(())
    }
}

/// What a run on the pair found: the declared fence safety, the report's failures, and the
/// failover scenario's outcome.
type Found = (
    FenceSafety,
    Vec<String>,
    std::result::Result<Verdict, String>,
);

/// The whole suite (or only the failover scenario) on a primary with a replica of the given
/// kind, the replica's promotion as the failover fault.
async fn run_on_pair(replication: Replication, options: &str, whole: bool) -> Result<Found> {
    let (pair, clients) = pair_with(options, replication).await?;
    let ctx = Context::new(Arc::new(clients))
        .await
        .or_fail("the suite's context")?
        .with_faults(Arc::new(Failover(pair.clone())));
    let title = format!("mysql, {replication:?} replica{options}");
    let report = if whole {
        run_all(&title, &ctx).await
    } else {
        let selected: Vec<_> = scenarios::all()
            .into_iter()
            .filter(|s| s.name == "fences_survive_failover")
            .collect();
        if selected.len() != 1 {
            return Err(format!("{} failover scenarios, one expected", selected.len()).into());
        }
        run_selected(&title, &ctx, &selected).await
    };
    println!("{report}");
    let failures = report
        .lines
        .iter()
        .filter(|l| l.scenario != "fences_survive_failover")
        .filter_map(|l| {
            l.outcome
                .as_ref()
                .err()
                .map(|f| format!("{}: {f}", l.scenario))
        })
        .collect();
    let failover = report
        .lines
        .iter()
        .find(|l| l.scenario == "fences_survive_failover")
        .or_fail("the suite's failover scenario")?
        .outcome
        .clone()
        .map_err(|f| f.to_string());
    Ok((ctx.capabilities().fence_safety, failures, failover))
}

/// The whole suite on a primary with an asynchronous replica: everything passes, and the
/// failover to the replica promoted by hand, which reissues a fence, shows as the declared
/// weakness it is. The same setup declared linearizable (an overclaim) is caught.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_to_an_async_replica_reissues_a_fence_as_declared() -> Result {
    let (safety, failures, outcome) = run_on_pair(Replication::Asynchronous, "", true).await?;
    if safety != FenceSafety::FailoverUnsafe {
        return Err(format!("declared {safety:?} with an asynchronous replica").into());
    }
    if !failures.is_empty() {
        return Err(format!("conformance failed: {failures:#?}").into());
    }
    if !matches!(outcome, Ok(Verdict::Declared(_))) {
        return Err(format!(
            "the failover must reissue a fence, and it must be declared: {outcome:?}"
        )
        .into());
    }
    let (safety, _, outcome) = run_on_pair(
        Replication::Asynchronous,
        "&fence_safety=linearizable",
        false,
    )
    .await?;
    if safety != FenceSafety::Linearizable {
        return Err(format!("declared {safety:?} with fence_safety=linearizable").into());
    }
    if outcome.is_ok() {
        return Err(format!("an overclaim must fail: {outcome:?}").into());
    }
    Ok(())
}

/// With a semi-synchronous replica that the primary never stops waiting for, every
/// acquisition the primary confirmed is on the replica, so after the promotion the next fence
/// is greater than every fence handed out before: `auto` reads the settings and declares
/// linearizable fences, and the scenario passes. (The old primary, cut off from its replica,
/// cannot confirm the acquisition tried during the failover: it waits until the request times
/// out.) The whole suite runs on the pair.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_to_a_semi_sync_replica_keeps_fences_growing() -> Result {
    let (safety, failures, outcome) = run_on_pair(Replication::SemiSynchronous, "", true).await?;
    if safety != FenceSafety::Linearizable {
        return Err(format!("declared {safety:?} with a semi-synchronous replica").into());
    }
    if !failures.is_empty() {
        return Err(format!("conformance failed: {failures:#?}").into());
    }
    if !matches!(outcome, Ok(Verdict::Passed)) {
        return Err(format!(
            "fences must survive a failover to a semi-synchronous replica: {outcome:?}"
        )
        .into());
    }
    Ok(())
}

/// Semi-synchronous replication with MariaDB's default timeout falls back to asynchronous
/// silently, so `auto` does not count it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semi_sync_that_can_fall_back_is_declared_failover_unsafe() -> Result {
    let primary = start_server().await?;
    let _replica = {
        let primary = primary.clone();
        tokio::task::spawn_blocking(move || {
            MariaDbServer::start_semi_sync_replica_of(&primary, Duration::from_secs(10))
        })
        .await
        .or_fail("the task starting the replica")?
        .or_fail("the replica must start for this test")?
    };
    let a = connect(&format!("{}?timeout_ms=1000", primary.url())).await?;
    let safety = leasehold_core::Authority::capabilities(&a).fence_safety;
    if safety != FenceSafety::FailoverUnsafe {
        return Err(format!("declared {safety:?} with a 10 s semi-sync timeout").into());
    }
    Ok(())
}
