//! Waiting: bounded, woken by the release, and leaving nothing behind when abandoned.

use std::time::Duration;

use leasehold_core::{Error, Instant, Lease, LeaseOptions, WaitStrategy};

use super::helpers::{still_held, take};
use crate::context::Context;
use crate::ensure;
use crate::verdict::{Failure, OrFail, Outcome, Verdict};

/// How soon after a release a waiter must hold the key: a fraction of the TTL for backends that
/// notify, the tolerance for those that poll.
pub(super) fn handoff_bound(ctx: &Context) -> Duration {
    match ctx.capabilities().wait {
        WaitStrategy::Notification => ctx.ttl() / 4 + ctx.capabilities().expiry_slack,
        _ => ctx.tolerance(),
    }
}

/// A waiter blocked in `acquire` gets the key soon after the holder releases, with a greater
/// fence, and its grant is really valid: while its deadline is ahead, nobody else gets the key.
pub async fn acquire_waits_for_release(ctx: &Context) -> Outcome {
    let (a, b, c) = (
        ctx.connect().await?,
        ctx.connect().await?,
        ctx.connect().await?,
    );
    let key = ctx.key("handoff");
    let ttl = ctx.ttl();
    // The holder keeps its lease renewed, so only the release can free the key.
    let holder = Lease::try_acquire(a, &key, ttl, LeaseOptions::default())
        .await
        .or_fail("A acquires")?
        .ok_or_else(|| Failure::new("A could not acquire a free key"))?;
    let holder_fence = holder.fence();
    let max_wait = ttl * 4 + ctx.tolerance();
    let waiter = {
        let (b, key) = (b.clone(), key.clone());
        tokio::spawn(async move {
            let r = b.acquire(&key, ttl, max_wait).await;
            (r, Instant::now())
        })
    };
    tokio::time::sleep(ttl / 2).await;
    ensure!(
        !waiter.is_finished(),
        "the waiter returned while the key was held"
    );
    let _ = holder.release().await.or_fail("A releases")?;
    let released = Instant::now();
    let (got, got_at) = waiter.await.or_fail("waiter task")?;
    let grant = got.or_fail("the waiter's acquire")?;
    let handoff = got_at.saturating_duration_since(released);
    ensure!(
        handoff <= handoff_bound(ctx),
        "the waiter got the key {handoff:?} after the release (bound {:?})",
        handoff_bound(ctx)
    );
    ensure!(
        grant.fence() > holder_fence,
        "the waiter's fence {} is not above {holder_fence}",
        grant.fence()
    );
    // The grant must be what it claims: while its deadline is ahead, the key is held.
    if grant.is_valid() {
        let probe = c.try_acquire(&key, ttl).await.or_fail("C probes")?;
        ensure!(
            probe.is_none() || !grant.is_valid(),
            "C acquired the key while the waiter's grant claimed {:?} of validity",
            grant.remaining()
        );
    } else {
        return Err(Failure::new(
            "the waiter's grant was already expired when acquire returned",
        ));
    }
    let _ = b.release(&grant).await.or_fail("the waiter releases")?;
    Ok(Verdict::Passed)
}

/// `acquire` on a key that stays held gives up after `max_wait` with the typed, retryable
/// `Timeout` error, neither much earlier nor much later.
pub async fn acquire_times_out(ctx: &Context) -> Outcome {
    let (a, b) = (ctx.connect().await?, ctx.connect().await?);
    let key = ctx.key("timeout");
    let ttl = ctx.ttl();
    let holder = Lease::try_acquire(a, &key, ttl, LeaseOptions::default())
        .await
        .or_fail("A acquires")?
        .ok_or_else(|| Failure::new("A could not acquire a free key"))?;
    let max_wait = ttl;
    let start = Instant::now();
    let result = b.acquire(&key, ttl, max_wait).await;
    let waited = start.elapsed();
    match result {
        Err(e @ Error::Timeout { .. }) => {
            ensure!(e.is_retryable(), "Timeout must be retryable");
        }
        Err(other) => return Err(Failure::new(format!("expected Timeout, got {other}"))),
        Ok(g) => return Err(Failure::new(format!("acquired a held key: {g:?}"))),
    }
    ensure!(
        waited >= max_wait,
        "gave up after {waited:?}, before max_wait {max_wait:?}"
    );
    ensure!(
        waited <= max_wait + ctx.tolerance(),
        "gave up only after {waited:?} (max_wait {max_wait:?})"
    );
    still_held(&holder, "the holder after the waiter timed out").await?;
    let _ = holder.release().await.or_fail("A releases")?;
    Ok(Verdict::Passed)
}

/// A waiter that is cancelled (its `acquire` future dropped, or timed out) leaves no trace: when
/// the holder releases, a third client gets the key at once, not after some orphan's TTL.
pub async fn cancelled_waiter_leaves_no_trace(ctx: &Context) -> Outcome {
    let (a, b, c) = (
        ctx.connect().await?,
        ctx.connect().await?,
        ctx.connect().await?,
    );
    let key = ctx.key("cancelled");
    let ttl = ctx.ttl();
    let holder = take(&*a, &key, ttl, "A acquires").await?;
    // Cancelled by dropping the future mid-wait.
    let dropped = tokio::time::timeout(ttl / 4, b.acquire(&key, ttl, ttl * 10)).await;
    ensure!(
        dropped.is_err(),
        "the cancelled waiter was not waiting: {dropped:?}"
    );
    // Gave up by itself.
    let timed_out = b.acquire(&key, ttl, ttl / 4).await;
    ensure!(
        matches!(timed_out, Err(Error::Timeout { .. })),
        "expected the short wait to time out: {timed_out:?}"
    );
    // Let any cleanup the backend does in the background run.
    tokio::time::sleep(ttl / 10).await;
    let _ = a.release(&holder).await.or_fail("A releases")?;
    let got = c.try_acquire(&key, ttl).await.or_fail("C acquires")?;
    ensure!(
        got.is_some(),
        "the key stayed held after the holder released: a cancelled waiter left something behind"
    );
    if let Some(g) = got {
        let _ = c.release(&g).await.or_fail("C releases")?;
    }
    Ok(Verdict::Passed)
}
