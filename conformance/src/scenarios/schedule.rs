//! Scheduled work: `claim_period` gives one run per period, and every period its run.

use std::time::Duration;

use leasehold_core::{claim_period, claim_ttl};

use crate::context::Context;
use crate::ensure;
use crate::verdict::{Failure, OrFail, Outcome, Verdict};

/// How many periods the scenario runs.
const TICKS: usize = 10;

/// One instance on `tokio::time::interval(period)` claims the period at each tick, and a second
/// instance tries right after it. The second never gets a period the first has; the first gets
/// at least 9 of 10 periods (one tick may come so late on a loaded machine that the claim
/// before it has not run out), with fences that grow. The period is the suite's TTL, or the
/// first multiple of it whose claim is a TTL the backend grants.
pub async fn claim_period_claims_every_period(ctx: &Context) -> Outcome {
    let capabilities = ctx.capabilities();
    let period = [1, 2, 4, 8]
        .into_iter()
        .map(|k| ctx.ttl() * k)
        .find(|&p| claim_ttl(capabilities, p).is_ok())
        .ok_or_else(|| {
            Failure::new(format!(
                "no period up to 8 TTLs of {:?} has a claim the backend grants",
                ctx.ttl()
            ))
        })?;
    let (a, b) = (ctx.connect().await?, ctx.connect().await?);
    let key = ctx.key("every-period");
    let mut ticks = tokio::time::interval(period);
    let mut fences = Vec::new();
    let mut skipped = Vec::new();
    let mut last_a = None;
    for tick in 0..TICKS {
        ticks.tick().await;
        match claim_period(a.clone(), &key, period)
            .await
            .or_fail(format!("A claims at tick {tick}"))?
        {
            Some(run) => {
                fences.push(run.fence().value());
                last_a = Some(run);
            }
            None => skipped.push(tick),
        }
        let second = claim_period(b.clone(), &key, period)
            .await
            .or_fail(format!("B claims at tick {tick}"))?;
        // B's claim breaks the rule only while A's claim still stands: on a machine slow enough
        // that A's claim ran out before B asked, the period was free again, as it may be.
        let a_still_holds = last_a
            .as_ref()
            .is_some_and(|run| run.ensure_valid().is_ok());
        ensure!(
            second.is_none() || !a_still_holds,
            "tick {tick}: B claimed a period of {period:?} that A claimed just before"
        );
    }
    ensure!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "fences of successive periods did not grow: {fences:?}"
    );
    ensure!(
        fences.len() + 1 >= TICKS,
        "{} claims in {TICKS} ticks of {period:?} (claims of {:?}): ticks {skipped:?} found the \
         last period's claim still held",
        fences.len(),
        claim_ttl(capabilities, period).unwrap_or(Duration::ZERO)
    );
    Ok(Verdict::Passed)
}
