//! Fences only grow: over release, expiry, restart and failover.

use leasehold_core::{Error, FenceSafety, Instant};

use super::helpers::{acquire_after_fault, acquire_within, outlive, take};
use crate::context::Context;
use crate::ensure;
use crate::verdict::{Failure, OrFail, Outcome, Verdict};

/// Fences strictly increase over acquire -> release -> acquire (the same and another client), and
/// over expiry -> acquire.
pub async fn fences_increase(ctx: &Context) -> Outcome {
    let (a, b) = (ctx.connect().await?, ctx.connect().await?);
    let key = ctx.key("fences");
    let ttl = ctx.ttl();
    let g1 = take(&*a, &key, ttl, "first acquire").await?;
    let _ = a.release(&g1).await.or_fail("release")?;
    let g2 = take(&*a, &key, ttl, "second acquire, same client").await?;
    ensure!(
        g2.fence() > g1.fence(),
        "fence {} after release is not above {}",
        g2.fence(),
        g1.fence()
    );
    let _ = a.release(&g2).await.or_fail("release")?;
    let g3 = take(&*b, &key, ttl, "third acquire, other client").await?;
    ensure!(
        g3.fence() > g2.fence(),
        "fence {} (other client) is not above {}",
        g3.fence(),
        g2.fence()
    );
    outlive(ctx, &g3).await;
    let (g4, _) = acquire_within(ctx, &*a, &key, ttl, Instant::now(), ctx.tolerance())
        .await?
        .ok_or_else(|| Failure::new("the key did not free after expiry"))?;
    ensure!(
        g4.fence() > g3.fence(),
        "fence {} after expiry is not above {}",
        g4.fence(),
        g3.fence()
    );
    ensure!(
        g4.fence().safety() == ctx.capabilities().fence_safety,
        "fences declare {} but the backend declares {}",
        g4.fence().safety(),
        ctx.capabilities().fence_safety
    );
    let _ = a.release(&g4).await.or_fail("release")?;
    Ok(Verdict::Passed)
}

/// After the key sat idle long enough for the backend's own cleanup to run (ZooKeeper reaps an
/// empty container parent, and a new parent's sequence numbers restart at zero), the next fence
/// is still greater than the last.
pub async fn fences_grow_after_idle_cleanup(ctx: &Context) -> Outcome {
    let (a, b) = (ctx.connect().await?, ctx.connect().await?);
    let key = ctx.key("fences-idle");
    let ttl = ctx.ttl();
    let before = take(&*a, &key, ttl, "A acquires").await?;
    let _ = a.release(&before).await.or_fail("A releases")?;
    tokio::time::sleep(ctx.idle_cleanup()).await;
    let after = take(&*b, &key, ttl, "B acquires after the idle time").await?;
    let _ = b.release(&after).await.or_fail("B releases")?;
    ensure!(
        after.fence() > before.fence(),
        "after {:?} idle the fence went from {} to {}: the backend's cleanup restarted it",
        ctx.idle_cleanup(),
        before.fence(),
        after.fence()
    );
    Ok(Verdict::Passed)
}

/// Across a crash and restart of the server, fences keep increasing where the backend declares
/// them durable; where it declares they are not, the reset is shown as declared.
pub async fn fences_survive_restart(ctx: &Context) -> Outcome {
    let a = ctx.connect().await?;
    let key = ctx.key("fences-restart");
    let ttl = ctx.ttl();
    // Two grants before the restart, so that a counter that restarts shows as going back.
    for _ in 0..2 {
        let g = take(&*a, &key, ttl, "acquire before the restart").await?;
        let _ = a.release(&g).await.or_fail("release before the restart")?;
    }
    let before = take(&*a, &key, ttl, "last acquire before the restart").await?;
    let _ = a
        .release(&before)
        .await
        .or_fail("release before the restart")?;
    match ctx.faults().restart().await {
        Err(Error::Unsupported { .. }) => {
            return Ok(Verdict::NotApplicable(
                "the harness cannot restart the server".into(),
            ))
        }
        other => other.or_fail("restart the server")?,
    }
    // A fresh client: the old one may take a while to notice the new server.
    let b = ctx.connect().await?;
    let within = ttl * 4 + ctx.tolerance() * 4;
    let (after, _) = acquire_after_fault(ctx, &*b, &key, ttl, Instant::now(), within)
        .await?
        .ok_or_else(|| Failure::new("could not acquire after the restart"))?;
    let _ = b
        .release(&after)
        .await
        .or_fail("release after the restart")?;
    if after.fence() > before.fence() {
        return Ok(Verdict::Passed);
    }
    ensure!(
        !ctx.capabilities().durable_fences,
        "fence {} after the restart is not above {} before it, yet fences are declared durable",
        after.fence(),
        before.fence()
    );
    Ok(Verdict::Declared(format!(
        "fences restarted ({} after, {} before), as declared: not durable across restart",
        after.fence(),
        before.fence()
    )))
}

/// A failover: the standby takes over while the old primary may still grant one more lease that
/// the standby never sees. Linearizable backends must still hand out a greater fence afterwards;
/// a failover-unsafe backend may reissue one, and the report shows it.
pub async fn fences_survive_failover(ctx: &Context) -> Outcome {
    let a = ctx.connect().await?;
    let key = ctx.key("fences-failover");
    let ttl = ctx.ttl();
    let first = take(&*a, &key, ttl, "acquire before the failover").await?;
    let _ = a
        .release(&first)
        .await
        .or_fail("release before the failover")?;
    let mut highest = first.fence();
    match ctx.faults().begin_failover().await {
        Err(Error::Unsupported { .. }) => {
            return Ok(Verdict::NotApplicable(
                "the harness has no standby to fail over to".into(),
            ))
        }
        other => other.or_fail("begin the failover")?,
    }
    // The old primary may still answer; a consensus system will refuse or be unreachable.
    if let Ok(Some(during)) = a.try_acquire(&key, ttl).await {
        highest = highest.max(during.fence());
        drop(during);
    }
    ctx.faults()
        .complete_failover()
        .await
        .or_fail("complete the failover")?;
    let b = ctx.connect().await?;
    let within = ttl * 4 + ctx.tolerance() * 4;
    // A cluster may still redirect the first requests after the failover (its slot map
    // settling): retryable, and no evidence about fences.
    let (after, _) = acquire_after_fault(ctx, &*b, &key, ttl, Instant::now(), within)
        .await?
        .ok_or_else(|| Failure::new("could not acquire after the failover"))?;
    let _ = b.release(&after).await;
    if after.fence() > highest {
        return Ok(Verdict::Passed);
    }
    ensure!(
        ctx.capabilities().fence_safety == FenceSafety::FailoverUnsafe,
        "fence {} after the failover is not above {highest} handed out before it, yet fences are declared linearizable",
        after.fence()
    );
    Ok(Verdict::Declared(format!(
        "fence {} reissued after failover (already handed out: {highest}), as declared: failover-unsafe",
        after.fence()
    )))
}
