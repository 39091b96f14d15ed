//! The resource refuses a paused holder's late write, once the new holder has claimed it.

use leasehold_core::{FencedResource, Guarded, Instant};

use super::helpers::{acquire_within, outlive, take};
use crate::context::Context;
use crate::ensure;
use crate::resource::{check_history, Recorder};
use crate::verdict::{Failure, OrFail, Outcome, Verdict};

/// A acquires, then "pauses" (stops renewing) past its TTL; B acquires and claims the resource
/// with its fence; A wakes up and writes with its old fence: the resource refuses it.
pub async fn stale_write_refused_after_claim(ctx: &Context) -> Outcome {
    let (a, b) = (ctx.connect().await?, ctx.connect().await?);
    let key = ctx.key("stale-claimed");
    let ttl = ctx.ttl();
    let resource = Recorder::new(ctx.resource().await?);
    let paused = take(&*a, &key, ttl, "A acquires").await?;
    ensure!(
        resource
            .write(paused.fence(), "A, on time")
            .await
            .or_fail("A writes")?
            .is_accepted(),
        "A's write while holding the lease was refused"
    );
    outlive(ctx, &paused).await;
    ensure!(
        !paused.is_valid(),
        "A's grant still claims validity after its TTL"
    );
    let (fresh, _) = acquire_within(ctx, &*b, &key, ttl, Instant::now(), ctx.tolerance())
        .await?
        .ok_or_else(|| Failure::new("B could not take the key after A's lease expired"))?;
    ensure!(
        fresh.fence() > paused.fence(),
        "B's fence {} is not above A's {}",
        fresh.fence(),
        paused.fence()
    );
    let claim = resource.claim(fresh.fence()).await.or_fail("B claims")?;
    ensure!(claim.is_accepted(), "B's claim was refused: {claim:?}");
    let late = resource
        .write(paused.fence(), "A, late")
        .await
        .or_fail("A's late write")?;
    ensure!(
        late == Guarded::Stale {
            newest: fresh.fence().value()
        },
        "A's late write with fence {} was not refused as stale: {late:?}",
        paused.fence()
    );
    let ok = resource
        .write(fresh.fence(), "B")
        .await
        .or_fail("B writes")?;
    ensure!(ok.is_accepted(), "B's write was refused: {ok:?}");
    check_history(&resource.history()).map_err(Failure::new)?;
    let _ = b.release(&fresh).await.or_fail("B releases")?;
    Ok(Verdict::Passed)
}

/// Why claiming matters: without B's claim, A's late write reaches the resource before any write
/// with B's newer fence, and the resource, having seen nothing newer, accepts it. The fence only
/// protects from the moment the new holder's fence has reached the resource.
pub async fn stale_write_first_is_accepted_without_claim(ctx: &Context) -> Outcome {
    let (a, b) = (ctx.connect().await?, ctx.connect().await?);
    let key = ctx.key("stale-unclaimed");
    let ttl = ctx.ttl();
    let resource = Recorder::new(ctx.resource().await?);
    let paused = take(&*a, &key, ttl, "A acquires").await?;
    outlive(ctx, &paused).await;
    let (fresh, _) = acquire_within(ctx, &*b, &key, ttl, Instant::now(), ctx.tolerance())
        .await?
        .ok_or_else(|| Failure::new("B could not take the key after A's lease expired"))?;
    let late = resource
        .write(paused.fence(), "A, late")
        .await
        .or_fail("A's late write")?;
    ensure!(
        late.is_accepted(),
        "expected the unclaimed resource to accept A's late write (it has seen no newer fence): {late:?}"
    );
    let b_write = resource
        .write(fresh.fence(), "B")
        .await
        .or_fail("B writes")?;
    ensure!(
        b_write.is_accepted(),
        "B's write after A's was refused: {b_write:?}"
    );
    let again = resource
        .write(paused.fence(), "A, later still")
        .await
        .or_fail("A again")?;
    ensure!(
        !again.is_accepted(),
        "A's write after B's fence arrived was accepted"
    );
    check_history(&resource.history()).map_err(Failure::new)?;
    let _ = b.release(&fresh).await.or_fail("B releases")?;
    Ok(Verdict::Passed)
}
