//! `Duration::MAX` means "no limit", never a panic.

use std::time::Duration;

use leasehold_core::{Lease, LeaseOptions};

use super::helpers::{still_held, take};
use crate::context::Context;
use crate::ensure;
use crate::verdict::{Failure, OrFail, Outcome, Verdict};

/// `acquire` with `max_wait = Duration::MAX` takes a free key at once and waits for a held one
/// until it is released; a lease with `max_hold = Duration::MAX` keeps renewing. `Instant +
/// Duration::MAX` overflows, so every deadline inside must saturate.
pub async fn duration_max_means_no_limit(ctx: &Context) -> Outcome {
    let (a, b) = (ctx.connect().await?, ctx.connect().await?);
    let key = ctx.key("duration-max");
    let ttl = ctx.ttl();
    let free = tokio::time::timeout(ttl * 4, a.acquire(&key, ttl, Duration::MAX))
        .await
        .map_err(|_| Failure::new("acquire(max_wait = MAX) of a free key hung"))?
        .or_fail("acquire(max_wait = MAX) of a free key")?;
    let waiter = {
        let (b, key) = (b.clone(), key.clone());
        tokio::spawn(async move { b.acquire(&key, ttl, Duration::MAX).await })
    };
    tokio::time::sleep(ttl / 4).await;
    ensure!(
        !waiter.is_finished(),
        "acquire(max_wait = MAX) returned while the key was held"
    );
    let _ = a.release(&free).await.or_fail("A releases")?;
    let got = tokio::time::timeout(ttl * 2 + ctx.tolerance(), waiter)
        .await
        .map_err(|_| Failure::new("the MAX waiter did not get the released key"))?
        .or_fail("the MAX waiter's task (a panic shows here)")?
        .or_fail("acquire(max_wait = MAX) of a released key")?;
    ensure!(got.fence() > free.fence(), "fences did not grow");
    let _ = b.release(&got).await.or_fail("B releases")?;
    let forever = LeaseOptions::default().with_max_hold(Duration::MAX);
    let lease = Lease::try_acquire(a.clone(), &key, ttl, forever)
        .await
        .or_fail("A acquires with max_hold = MAX")?
        .ok_or_else(|| Failure::new("the key was not free"))?;
    tokio::time::sleep(ttl * 2).await;
    still_held(&lease, "a lease with max_hold = MAX two TTLs later").await?;
    let _ = lease.release().await.or_fail("A releases the lease")?;
    let again = take(&*b, &key, ttl, "B after the release").await?;
    let _ = b.release(&again).await.or_fail("B releases")?;
    Ok(Verdict::Passed)
}
