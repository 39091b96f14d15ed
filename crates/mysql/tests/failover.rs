//! MariaDB failovers against real servers: a replica promoted by hand while the old primary
//! may still grant once more. An asynchronous replica reissues a fence, which the conformance
//! scenario shows as declared (and as a failure when linearizable fences are claimed for the
//! same setup); a semi-synchronous replica whose primary never stops waiting for it keeps
//! fences growing, and is declared so at connect.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use leasehold_conformance::kit::{
    self, run_with_failover, FailoverFaults, FailoverRun, ReplicatedPair, UrlConnector,
};
use leasehold_conformance::{harness_call, Context};
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
    replica: Arc<MariaDbServer>,
    replication: Replication,
    options: String,
}

impl Pair {
    fn primary_url(&self) -> String {
        format!("{}?timeout_ms=1000{}", self.primary.url(), self.options)
    }
}

/// The pair, and its clients: they connect at the pair's URL, which the failover moves from the
/// primary to the promoted replica.
async fn pair_with(options: &str, replication: Replication) -> Result<(Arc<Pair>, UrlConnector)> {
    let primary = start_server().await?;
    let replica = {
        let primary = primary.clone();
        kit::start("the replica", move || match replication {
            Replication::Asynchronous => MariaDbServer::start_replica_of(&primary),
            Replication::SemiSynchronous => {
                MariaDbServer::start_semi_sync_replica_of(&primary, NEVER)
            }
        })
        .await?
    };
    let clients = suite::clients("");
    let pair = Arc::new(Pair {
        replication,
        primary,
        replica,
        options: options.to_string(),
    });
    clients.url().set(pair.primary_url());
    // The table reaches the replica through replication, as a DBA's migration would.
    connect(&pair.primary_url())
        .await?
        .migrate()
        .await
        .or_fail("migrate the primary")?;
    Ok((pair, clients))
}

/// The replica is promoted by hand.
#[async_trait]
impl ReplicatedPair for Pair {
    type Server = MariaDbServer;

    fn primary(&self) -> &MariaDbServer {
        &self.primary
    }

    fn replica(&self) -> &MariaDbServer {
        &self.replica
    }

    fn replica_url(&self) -> String {
        format!("{}?timeout_ms=1000{}", self.replica.url(), self.options)
    }

    /// With a semi-synchronous replica, the deployment takes writes again when the replica
    /// acknowledges again (until then every commit waits for it).
    async fn primary_restarted(&self) -> leasehold_core::Result<()> {
        if self.replication != Replication::SemiSynchronous {
            return Ok(());
        }
        let primary = self.primary.clone();
        harness_call(move || {
            let started = Instant::now();
            while !primary.semi_sync_active()? {
                if started.elapsed() > Duration::from_secs(20) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            Ok(())
        })
        .await
    }

    async fn revoke(&self, url: &str, key: &LockKey) -> leasehold_core::Result<()> {
        suite::revoke(url, key).await
    }

    /// Lets the replica catch up, then stops its replication: the primary (asynchronous) still
    /// commits, and the replica never sees it; a semi-synchronous primary waits.
    async fn cut_replication(&self) -> leasehold_core::Result<()> {
        let replica = self.replica.clone();
        harness_call(move || {
            replica.wait_caught_up(Duration::from_secs(10))?;
            replica.command("STOP SLAVE").map(drop)
        })
        .await
    }

    /// The old primary dies; the replica is promoted by hand.
    async fn promote_replica(&self) -> leasehold_core::Result<()> {
        let (primary, replica) = (self.primary.clone(), self.replica.clone());
        harness_call(move || {
            primary.kill()?;
            replica.promote()
        })
        .await
    }
}

/// The whole suite (or only the failover scenario) on a primary with a replica of the given
/// kind, the replica's promotion as the failover fault.
async fn run_on_pair(replication: Replication, options: &str, whole: bool) -> Result<FailoverRun> {
    let (pair, clients) = pair_with(options, replication).await?;
    let faults = FailoverFaults::new(pair, clients.url());
    let ctx = Context::new(Arc::new(clients))
        .await
        .or_fail("the suite's context")?
        .with_faults(Arc::new(faults));
    run_with_failover(
        &format!("mysql, {replication:?} replica{options}"),
        &ctx,
        whole,
    )
    .await
}

/// The whole suite on a primary with an asynchronous replica: everything passes, and the
/// failover to the replica promoted by hand, which reissues a fence, shows as the declared
/// weakness it is. The same setup declared linearizable (an overclaim) is caught.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_to_an_async_replica_reissues_a_fence_as_declared() -> Result {
    run_on_pair(Replication::Asynchronous, "", true)
        .await?
        .reissue_declared("an asynchronous replica")?;
    run_on_pair(
        Replication::Asynchronous,
        "&fence_safety=linearizable",
        false,
    )
    .await?
    .overclaim_caught()
}

/// With a semi-synchronous replica that the primary never stops waiting for, every
/// acquisition the primary confirmed is on the replica, so after the promotion the next fence
/// is greater than every fence handed out before: `auto` reads the settings and declares
/// linearizable fences, and the scenario passes. (The old primary, cut off from its replica,
/// cannot confirm the acquisition tried during the failover: it waits until the request times
/// out.) The whole suite runs on the pair.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_to_a_semi_sync_replica_keeps_fences_growing() -> Result {
    run_on_pair(Replication::SemiSynchronous, "", true)
        .await?
        .fences_survived("a semi-synchronous replica")
}

/// Semi-synchronous replication with MariaDB's default timeout falls back to asynchronous
/// silently, so `auto` does not count it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semi_sync_that_can_fall_back_is_declared_failover_unsafe() -> Result {
    let primary = start_server().await?;
    let _replica = {
        let primary = primary.clone();
        kit::start("the replica", move || {
            MariaDbServer::start_semi_sync_replica_of(&primary, Duration::from_secs(10))
        })
        .await?
    };
    let a = connect(&format!("{}?timeout_ms=1000", primary.url())).await?;
    let safety = leasehold_core::Authority::capabilities(&a).fence_safety;
    if safety != FenceSafety::FailoverUnsafe {
        return Err(format!("declared {safety:?} with a 10 s semi-sync timeout").into());
    }
    Ok(())
}
