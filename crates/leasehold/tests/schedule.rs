//! Scheduled work: `claim_period` gives one instance per period the run, on a real
//! cross-process authority (SQLite) and on the in-memory reference.

use std::time::Duration;

use leasehold::{claim_period, connect, Authority, LockKey};
use leasehold_conformance::kit::{OrFail, TestResult};

/// Two instances in one period: the first runs, the second skips, and still skips after the
/// first finished and dropped its claim (the claim lasts the period); after the period the next
/// claim runs with a greater fence.
async fn one_run_per_period(
    a: std::sync::Arc<dyn Authority>,
    b: std::sync::Arc<dyn Authority>,
) -> TestResult {
    let key = LockKey::new("report:nightly").or_fail("the key")?;
    let period = Duration::from_millis(600);
    let first = claim_period(a.clone(), &key, period)
        .await
        .or_fail("the first claim")?;
    let first = first.or_fail("the first instance claims the period")?;
    let fence = first.fence();
    assert!(claim_period(b.clone(), &key, period)
        .await
        .or_fail("the second instance's claim")?
        .is_none());
    drop(first); // a short job ends early in its period
    tokio::time::sleep(period / 4).await;
    assert!(
        claim_period(b.clone(), &key, period)
            .await
            .or_fail("the second instance's claim after the first ended")?
            .is_none(),
        "a second run in the same period"
    );
    tokio::time::sleep(period).await;
    let next = claim_period(b, &key, period)
        .await
        .or_fail("the claim in the next period")?
        .or_fail("the next period is claimed")?;
    assert!(next.fence() > fence, "{} after {fence}", next.fence());
    Ok(())
}

#[tokio::test]
async fn memory() -> TestResult {
    let a = connect("memory://schedule").await.or_fail("connect")?;
    one_run_per_period(a.clone(), a).await
}

#[cfg(feature = "sqlite")]
#[tokio::test]
async fn sqlite_across_clients() -> TestResult {
    let dir = tempfile::tempdir().or_fail("a temporary directory")?;
    let url = format!("sqlite://{}", dir.path().join("locks.db").display());
    let (a, b) = (
        connect(&url).await.or_fail("connect a")?,
        connect(&url).await.or_fail("connect b")?,
    );
    one_run_per_period(a, b).await
}

/// One instance on `interval(period)`: each tick claims the period that tick starts, so 10
/// ticks give at least 9 claims (one tick may come so late under load that the claim before it
/// has not run out), each with a greater fence.
async fn every_tick_claims(a: std::sync::Arc<dyn Authority>) -> Result<(), String> {
    const TICKS: usize = 10;
    let key = LockKey::new("report:every-tick").map_err(|e| format!("key: {e}"))?;
    let period = Duration::from_millis(300);
    let mut ticks = tokio::time::interval(period);
    let mut fences = Vec::new();
    let mut skipped = Vec::new();
    for tick in 0..TICKS {
        ticks.tick().await;
        match claim_period(a.clone(), &key, period)
            .await
            .map_err(|e| format!("tick {tick}: {e}"))?
        {
            Some(run) => fences.push(run.fence().value()),
            None => skipped.push(tick),
        }
    }
    if fences.windows(2).any(|w| w[0] >= w[1]) {
        return Err(format!("fences did not grow: {fences:?}"));
    }
    if fences.len() + 1 < TICKS {
        return Err(format!(
            "{} claims in {TICKS} ticks of {period:?}: ticks {skipped:?} found the last \
             period's claim still held",
            fences.len()
        ));
    }
    Ok(())
}

#[tokio::test]
async fn memory_claims_every_period() -> Result<(), String> {
    let a = connect("memory://every-period")
        .await
        .map_err(|e| format!("connect: {e}"))?;
    every_tick_claims(a).await
}

#[cfg(feature = "sqlite")]
#[tokio::test]
async fn sqlite_claims_every_period() -> Result<(), String> {
    let dir = tempfile::tempdir().map_err(|e| format!("a temporary directory: {e}"))?;
    let url = format!("sqlite://{}", dir.path().join("locks.db").display());
    let a = connect(&url).await.map_err(|e| format!("connect: {e}"))?;
    every_tick_claims(a).await
}
