//! Renewal: conditional on ownership; a lease that is kept renewed outlives its TTL; loss is
//! reported at once.

use leasehold_core::{Error, Instant, Lease, LeaseOptions, LostReason};

use super::helpers::{acquire_within, outlive, still_held, take};
use crate::context::Context;
use crate::ensure;
use crate::verdict::{Failure, OrFail, Outcome, Verdict};

/// After A's lease expired and B took the key, A's renewal fails with `LeaseLost` and does not
/// extend B's lease: B's lease still ends on its own schedule.
pub async fn renew_after_expiry_is_refused(ctx: &Context) -> Outcome {
    let (a, b, c) = (
        ctx.connect().await?,
        ctx.connect().await?,
        ctx.connect().await?,
    );
    let key = ctx.key("late-renew");
    let ttl = ctx.ttl();
    let stale = take(&*a, &key, ttl, "A acquires").await?;
    outlive(ctx, &stale).await;
    let (fresh, b_at) = acquire_within(ctx, &*b, &key, ttl, Instant::now(), ctx.tolerance())
        .await?
        .ok_or_else(|| Failure::new("B could not take the key after A's lease expired"))?;
    match a.renew(&stale, ttl).await {
        Err(Error::LeaseLost { .. }) => {}
        Ok(deadline) => {
            return Err(Failure::new(format!(
                "A renewed a lease that expired and went to B (new deadline in {:?})",
                deadline.saturating_duration_since(Instant::now())
            )))
        }
        Err(other) => {
            return Err(Failure::new(format!(
                "A's late renewal failed with {other} instead of LeaseLost"
            )))
        }
    }
    let by_c = c.try_acquire(&key, ttl).await.or_fail("C tries")?;
    ensure!(by_c.is_none(), "A's refused renewal freed B's lease");
    // B does not renew, so its lease must end within its TTL (plus tolerance) of its grant.
    let freed = acquire_within(ctx, &*c, &key, ttl, b_at, ttl + ctx.tolerance()).await?;
    ensure!(
        freed.is_some(),
        "B's lease outlived its TTL by more than the tolerance: was it extended by A's renewal?"
    );
    drop(fresh);
    Ok(Verdict::Passed)
}

/// A `Lease` renews in the background: after three TTLs it is still valid and still excludes
/// others, with the same fence; after release the key is free.
pub async fn lease_renews_past_ttl(ctx: &Context) -> Outcome {
    let (a, b) = (ctx.connect().await?, ctx.connect().await?);
    let key = ctx.key("renews");
    let ttl = ctx.ttl();
    let lease = Lease::try_acquire(a, &key, ttl, LeaseOptions::default())
        .await
        .or_fail("A acquires")?
        .ok_or_else(|| Failure::new("A could not acquire a free key"))?;
    let fence = lease.fence();
    let first_deadline = lease.deadline();
    tokio::time::sleep(ttl * 3).await;
    still_held(&lease, "A's lease after 3 TTLs").await?;
    ensure!(
        lease.deadline() > first_deadline,
        "renewals did not move the deadline"
    );
    ensure!(lease.fence() == fence, "the fence changed on renewal");
    let by_b = b.try_acquire(&key, ttl).await.or_fail("B tries")?;
    ensure!(
        by_b.is_none(),
        "B acquired the key while A's lease was being renewed"
    );
    let _ = lease.release().await.or_fail("A releases")?;
    let after = b
        .try_acquire(&key, ttl)
        .await
        .or_fail("B tries after release")?;
    ensure!(
        after.is_some(),
        "the key was not free after the lease was released"
    );
    Ok(Verdict::Passed)
}

/// When the authority refuses a renewal (the lease was deleted behind the holder's back),
/// `lost()` fires at that renewal, before the local deadline, and `ensure_valid` fails.
pub async fn lost_fires_on_refused_renewal(ctx: &Context) -> Outcome {
    let a = ctx.connect().await?;
    let key = ctx.key("lost-refused");
    let ttl = ctx.ttl();
    let lease = Lease::try_acquire(a, &key, ttl, LeaseOptions::default())
        .await
        .or_fail("A acquires")?
        .ok_or_else(|| Failure::new("A could not acquire a free key"))?;
    let lost = lease.lost();
    match ctx.faults().revoke(&key).await {
        Err(Error::Unsupported { .. }) => {
            return Ok(Verdict::NotApplicable(
                "the harness cannot revoke a lease".into(),
            ))
        }
        other => other.or_fail("revoke the lease at the server")?,
    }
    let revoked = Instant::now();
    // The next renewal is due within a third of the TTL; allow the tolerance on top.
    let bound = ttl / 3 + ctx.tolerance();
    let reason = tokio::time::timeout(bound, lost).await.map_err(|_| {
        Failure::new(format!(
            "lost() did not fire within {bound:?} of the lease being revoked"
        ))
    })?;
    ensure!(
        matches!(reason, LostReason::Refused | LostReason::SessionEnded),
        "lost() fired with {reason:?}, expected a refusal (fired {:?} after the revoke)",
        revoked.elapsed()
    );
    ensure!(
        lease.ensure_valid().is_err(),
        "ensure_valid passed after the lease was lost"
    );
    Ok(Verdict::Passed)
}

/// Eight leases on one client (renewed together where the backend batches renewals); one is
/// revoked at the server. It is lost within a renewal tick and the tolerance, with a refusal;
/// the other seven stay held for two more TTLs, and another client finds all seven keys taken.
pub async fn renewal_refusal_loses_only_that_lease(ctx: &Context) -> Outcome {
    let a = ctx.connect().await?;
    let ttl = ctx.ttl();
    let mut leases = Vec::new();
    for i in 0..8 {
        let key = ctx.key(&format!("crowd-{i}"));
        leases.push(
            Lease::try_acquire(a.clone(), &key, ttl, LeaseOptions::default())
                .await
                .or_fail("A acquires")?
                .ok_or_else(|| Failure::new("A could not acquire a free key"))?,
        );
    }
    let victim = leases.remove(3);
    let lost = victim.lost();
    match ctx.faults().revoke(victim.key()).await {
        Err(Error::Unsupported { .. }) => {
            return Ok(Verdict::NotApplicable(
                "the harness cannot revoke a lease".into(),
            ))
        }
        other => other.or_fail("revoke one lease at the server")?,
    }
    let bound = ttl / 3 + ctx.tolerance();
    let reason = tokio::time::timeout(bound, lost).await.map_err(|_| {
        Failure::new(format!(
            "the revoked lease was not reported lost within {bound:?}"
        ))
    })?;
    ensure!(
        matches!(reason, LostReason::Refused | LostReason::SessionEnded),
        "the revoked lease was lost with {reason:?}, expected a refusal"
    );
    let until = Instant::now() + ttl * 2;
    while Instant::now() < until {
        for lease in &leases {
            still_held(lease, "a lease renewed beside the revoked one").await?;
        }
        tokio::time::sleep(ttl / 4).await;
    }
    let b = ctx.connect().await?;
    for lease in &leases {
        let probe = b.try_acquire(lease.key(), ttl).await.or_fail("B probes")?;
        ensure!(
            probe.is_none(),
            "B took {} while its lease claimed to be held",
            lease.key()
        );
    }
    for lease in leases {
        let _ = lease.release().await.or_fail("release")?;
    }
    Ok(Verdict::Passed)
}

/// A lease that is not renewed reports `DeadlinePassed` when its local deadline passes, which is
/// before the authority's TTL ends (the deadline counts from before the request, minus the
/// margin).
pub async fn lost_fires_at_deadline(ctx: &Context) -> Outcome {
    let a = ctx.connect().await?;
    let key = ctx.key("lost-deadline");
    let ttl = ctx.ttl();
    let sent = Instant::now();
    let lease = Lease::try_acquire(a, &key, ttl, LeaseOptions::default().with_auto_renew(false))
        .await
        .or_fail("A acquires")?
        .ok_or_else(|| Failure::new("A could not acquire a free key"))?;
    lease.ensure_valid().or_fail("fresh lease")?;
    let reason = tokio::time::timeout(ttl + ctx.tolerance(), lease.lost())
        .await
        .map_err(|_| Failure::new("lost() never fired for a lease that was not renewed"))?;
    let at = Instant::now();
    ensure!(
        matches!(reason, LostReason::DeadlinePassed),
        "lost() fired with {reason:?} instead of DeadlinePassed"
    );
    ensure!(
        at <= sent + ttl + ctx.tolerance(),
        "lost() fired {:?} after the request, well after the TTL of {ttl:?}",
        at - sent
    );
    ensure!(
        lease.ensure_valid().is_err(),
        "ensure_valid passed after the deadline"
    );
    Ok(Verdict::Passed)
}
