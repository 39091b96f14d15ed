//! The conformance suite run with its scenarios side by side: each one waits mostly on the
//! store's clock (a 2 s TTL judged in whole store seconds), so run one after another they spend
//! minutes asleep. Scenarios that stop or restart the server, or read the process's one metrics
//! recorder, would disturb the others, so they run one after another on a server of their own,
//! beside the rest. Every scenario gets a context of its own (its own run id, so keys of its
//! own) and asserts exactly what it asserts when run alone.

use std::sync::Arc;

use leasehold_conformance::kit::{OrFail, TestResult};
use leasehold_conformance::scenarios::{run_one, Scenario};
use leasehold_conformance::{Connector, Context, Faults, Report};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

/// The scenarios that pause or restart the whole server (or ask it to fail over), and the one
/// that installs and reads the process-wide metrics recorder.
pub const ALONE: [&str; 10] = [
    "metrics_count_what_happened",
    "delayed_reply_shortens_the_grant",
    "delayed_batch_reply_shortens_the_renewals",
    "unresponsive_authority",
    "fail_open_and_closed_are_explicit",
    "short_outage_suspends_then_holds",
    "long_outage_loses_at_the_deadline",
    "fences_survive_restart",
    "election_epochs_survive_restart",
    "fences_survive_failover",
];

/// How many scenarios run at once: enough that the suite is bounded by its longest scenarios,
/// few enough that one emulator on a shared two-core machine answers within the scenarios'
/// tolerances.
pub const WIDTH: usize = 12;

/// The scenario that runs longest by far (ten periods of twice the TTL, 36 s): it starts first,
/// so that it is not what the suite waits for last.
const LONGEST: &str = "claim_period_claims_every_period";

/// Clients of one server and its faults.
pub struct Server {
    pub clients: Arc<dyn Connector>,
    pub faults: Arc<dyn Faults>,
}

impl Server {
    /// A context of its own: a run id of its own, so keys no other scenario uses.
    async fn context(&self) -> TestResult<Context> {
        Context::new(self.clients.clone())
            .await
            .map(|ctx| ctx.with_faults(self.faults.clone()).with_ttl(SUITE_TTL))
            .or_fail("connect a scenario's first client")
    }
}

/// The scenarios' TTL: twice the stores' 2 s floor. A scenario expects its requests to take well
/// under a TTL, and Azurite (one Node process) has taken seconds to answer while a full run
/// kept both cores busy: at 2 s a fresh lease ran out before the scenario could use it.
const SUITE_TTL: std::time::Duration = std::time::Duration::from_secs(4);

/// Runs `scenarios`: those not in [`ALONE`] on `shared`, up to [`WIDTH`] at a time, and beside
/// them those in [`ALONE`] on `faulted`, one by one. The report lists them in the given order.
pub async fn run(
    subject: &str,
    shared: Server,
    faulted: Server,
    scenarios: &[Scenario],
) -> TestResult<Report> {
    let (alone, mut together): (Vec<_>, Vec<_>) = scenarios
        .iter()
        .copied()
        .enumerate()
        .partition(|(_, s)| ALONE.contains(&s.name));
    together.sort_by_key(|(_, s)| s.name != LONGEST);
    let width = Arc::new(Semaphore::new(WIDTH));
    let mut running = JoinSet::new();
    for (at, scenario) in together {
        let ctx = shared.context().await?;
        let width = width.clone();
        running.spawn(async move {
            let _turn = width.acquire_owned().await;
            (at, run_one(&ctx, scenario).await)
        });
    }
    let first = faulted.context().await?;
    let one_by_one = async {
        let mut lines = Vec::new();
        for (at, scenario) in alone {
            lines.push((at, run_one(&first, scenario).await));
        }
        lines
    };
    let side_by_side = async {
        let mut lines = Vec::new();
        while let Some(done) = running.join_next().await {
            lines.push(done.or_fail("a scenario's task")?);
        }
        TestResult::Ok(lines)
    };
    let (mut lines, others) = tokio::join!(one_by_one, side_by_side);
    lines.extend(others?);
    lines.sort_by_key(|(at, _)| *at);
    Ok(Report {
        subject: subject.to_string(),
        capabilities: first.capabilities().clone(),
        lines: lines.into_iter().map(|(_, line)| line).collect(),
    })
}
