//! Faults on a replicated deployment (a primary and the replica a failover promotes), for the
//! SQL backends' failover tests: every fault acts on the server clients reach now, so the
//! whole suite runs on the deployment, and the failover scenario's outcome is read apart.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use leasehold_core::{FenceSafety, LockKey, Result};

use super::{HarnessServer, SharedUrl, TestResult};
use crate::scenarios::{self, run_all, run_selected};
use crate::{harness_call, Context, Failure, Faults, OrFail, Verdict};

/// A primary and its replica as a backend's test runs them: what differs between databases.
#[async_trait]
pub trait ReplicatedPair: Send + Sync + 'static {
    /// The harness's server type.
    type Server: HarnessServer;

    /// The primary, where clients connect first.
    fn primary(&self) -> &Self::Server;

    /// The replica, which the failover promotes.
    fn replica(&self) -> &Self::Server;

    /// Where clients connect once the replica is promoted.
    fn replica_url(&self) -> String;

    /// Waits, after the primary restarted, until the deployment takes writes again (a
    /// synchronous replica streams from it once more: until then every commit waits for it, as
    /// it would in production). Default: at once.
    async fn primary_restarted(&self) -> Result<()> {
        Ok(())
    }

    /// An operator ends the lease on `key` by hand, connected at `url` (the server clients
    /// reach now), keeping the row and its fence counter.
    async fn revoke(&self, url: &str, key: &LockKey) -> Result<()>;

    /// Lets the replica catch up, then cuts its replication: an asynchronous primary still
    /// commits, and the replica never sees it.
    async fn cut_replication(&self) -> Result<()>;

    /// The old primary dies and the replica is promoted (clients are moved to it afterwards).
    async fn promote_replica(&self) -> Result<()>;
}

/// [`Faults`] on a [`ReplicatedPair`]: restart, pause and resume act on the primary until the
/// failover completes and on the promoted replica after it; the failover is
/// [`ReplicatedPair::cut_replication`], then [`ReplicatedPair::promote_replica`] with clients
/// moved to the replica's URL.
pub struct FailoverFaults<P> {
    pair: Arc<P>,
    url: SharedUrl,
    failed_over: Arc<AtomicBool>,
}

impl<P> std::fmt::Debug for FailoverFaults<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FailoverFaults")
            .field("url", &self.url)
            .field("failed_over", &self.failed_over.load(Ordering::Acquire))
            .finish_non_exhaustive()
    }
}

impl<P: ReplicatedPair> FailoverFaults<P> {
    /// Faults on `pair`, whose clients connect at `url` (set to the primary's by the caller).
    pub fn new(pair: Arc<P>, url: SharedUrl) -> Self {
        FailoverFaults {
            pair,
            url,
            failed_over: Arc::default(),
        }
    }

    /// Whether the replica was promoted.
    pub fn failed_over(&self) -> bool {
        self.failed_over.load(Ordering::Acquire)
    }

    async fn on_current(&self, f: fn(&P::Server) -> crate::servers::Result<()>) -> Result<()> {
        let (pair, failed_over) = (self.pair.clone(), self.failed_over());
        harness_call(move || {
            if failed_over {
                f(pair.replica())
            } else {
                f(pair.primary())
            }
        })
        .await
    }
}

#[async_trait]
impl<P: ReplicatedPair> Faults for FailoverFaults<P> {
    /// A restart is over when the deployment takes writes again (see
    /// [`ReplicatedPair::primary_restarted`]).
    async fn restart(&self) -> Result<()> {
        self.on_current(HarnessServer::restart).await?;
        if !self.failed_over() {
            self.pair.primary_restarted().await?;
        }
        Ok(())
    }

    async fn pause(&self) -> Result<()> {
        self.on_current(HarnessServer::pause).await
    }

    async fn resume(&self) -> Result<()> {
        self.on_current(HarnessServer::resume).await
    }

    async fn revoke(&self, key: &LockKey) -> Result<()> {
        self.pair.revoke(&self.url.get(), key).await
    }

    async fn begin_failover(&self) -> Result<()> {
        self.pair.cut_replication().await
    }

    async fn complete_failover(&self) -> Result<()> {
        self.pair.promote_replica().await?;
        self.url.set(self.pair.replica_url());
        self.failed_over.store(true, Ordering::Release);
        Ok(())
    }
}

/// The failover scenario's name in the suite.
const FAILOVER: &str = "fences_survive_failover";

/// What a run on a replicated deployment found.
#[derive(Debug)]
pub struct FailoverRun {
    /// The fence safety the backend declared at connect.
    pub fence_safety: FenceSafety,
    /// Every other scenario that failed, with its failure.
    pub failures: Vec<String>,
    /// The failover scenario's outcome (a failure as its text).
    pub failover: std::result::Result<Verdict, String>,
}

impl FailoverRun {
    /// What a run on `setup` (say "a synchronous standby") must find when every commit the
    /// primary confirmed is on the replica: linearizable fences declared, every scenario
    /// passed, the failover one included (the next fence is greater than every fence handed
    /// out before).
    pub fn fences_survived(&self, setup: &str) -> TestResult {
        if self.fence_safety != FenceSafety::Linearizable {
            return Err(format!("declared {:?} with {setup}", self.fence_safety).into());
        }
        self.others_passed()?;
        if !matches!(self.failover, Ok(Verdict::Passed)) {
            return Err(format!(
                "fences must survive a failover to {setup}: {:?}",
                self.failover
            )
            .into());
        }
        Ok(())
    }

    /// What a run on `setup` (say "an asynchronous replica") must find when the replica may
    /// lack the last commits: failover-unsafe fences declared, every other scenario passed, and
    /// the failover's reissued fence shown as that declared weakness.
    pub fn reissue_declared(&self, setup: &str) -> TestResult {
        if self.fence_safety != FenceSafety::FailoverUnsafe {
            return Err(format!("declared {:?} with {setup}", self.fence_safety).into());
        }
        self.others_passed()?;
        if !matches!(self.failover, Ok(Verdict::Declared(_))) {
            return Err(format!(
                "the failover must reissue a fence, and it must be declared: {:?}",
                self.failover
            )
            .into());
        }
        Ok(())
    }

    /// What a run must find when the URL claims linearizable fences for a replica that may lack
    /// the last commits (an overclaim): linearizable declared, and the failover scenario fails.
    pub fn overclaim_caught(&self) -> TestResult {
        if self.fence_safety != FenceSafety::Linearizable {
            return Err(format!(
                "declared {:?} with fence_safety=linearizable",
                self.fence_safety
            )
            .into());
        }
        if self.failover.is_ok() {
            return Err(format!("an overclaim must fail: {:?}", self.failover).into());
        }
        Ok(())
    }

    fn others_passed(&self) -> TestResult {
        if !self.failures.is_empty() {
            return Err(format!("conformance failed: {:#?}", self.failures).into());
        }
        Ok(())
    }
}

/// Runs the whole suite (`whole`) or only the failover scenario on `ctx` (whose faults are
/// [`FailoverFaults`]), printing the report.
pub async fn run_with_failover(
    title: &str,
    ctx: &Context,
    whole: bool,
) -> std::result::Result<FailoverRun, Failure> {
    let report = if whole {
        run_all(title, ctx).await
    } else {
        let selected: Vec<_> = scenarios::all()
            .into_iter()
            .filter(|s| s.name == FAILOVER)
            .collect();
        if selected.len() != 1 {
            return Err(format!("{} failover scenarios, one expected", selected.len()).into());
        }
        run_selected(title, ctx, &selected).await
    };
    println!("{report}");
    let failures = report
        .lines
        .iter()
        .filter(|l| l.scenario != FAILOVER)
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
        .find(|l| l.scenario == FAILOVER)
        .or_fail("the suite's failover scenario")?
        .outcome
        .clone()
        .map_err(|f| f.to_string());
    Ok(FailoverRun {
        fence_safety: ctx.capabilities().fence_safety,
        failures,
        failover,
    })
}
