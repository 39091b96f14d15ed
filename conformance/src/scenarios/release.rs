//! Release: frees at once, and only ever frees our own lease.

use leasehold_core::{Instant, Lease, LeaseOptions, Released};

use super::helpers::{acquire_within, outlive, still_held, take};
use crate::context::Context;
use crate::ensure;
use crate::verdict::{Failure, OrFail, Outcome, Verdict};

/// Release frees the key at once for another client; releasing again finds it already gone.
pub async fn release_frees_at_once(ctx: &Context) -> Outcome {
    let (a, b) = (ctx.connect().await?, ctx.connect().await?);
    let key = ctx.key("release-frees");
    let grant = take(&*a, &key, ctx.ttl(), "A acquires").await?;
    let first = a.release(&grant).await.or_fail("A releases")?;
    ensure!(
        first == Released::Released,
        "release of a held lease said {first:?}"
    );
    let next = b
        .try_acquire(&key, ctx.ttl())
        .await
        .or_fail("B acquires right after")?;
    ensure!(next.is_some(), "the key was not free right after release");
    let again = a.release(&grant).await.or_fail("A releases twice")?;
    ensure!(
        again == Released::AlreadyGone,
        "a second release said {again:?}"
    );
    if let Some(g) = next {
        let _ = b.release(&g).await.or_fail("B releases")?;
    }
    Ok(Verdict::Passed)
}

/// A's lease expires and B takes the key; A's late release must leave B holding it
/// (compare-and-release, never an unconditional delete).
pub async fn release_after_expiry_keeps_new_holder(ctx: &Context) -> Outcome {
    let (a, b, c) = (
        ctx.connect().await?,
        ctx.connect().await?,
        ctx.connect().await?,
    );
    let key = ctx.key("late-release");
    let ttl = ctx.ttl();
    let stale = take(&*a, &key, ttl, "A acquires").await?;
    outlive(ctx, &stale).await;
    let (fresh, _) = acquire_within(ctx, &*b, &key, ttl, Instant::now(), ctx.tolerance())
        .await?
        .ok_or_else(|| Failure::new("B could not take the key after A's lease expired"))?;
    let late = a.release(&stale).await.or_fail("A's late release")?;
    ensure!(
        late == Released::AlreadyGone,
        "A's release after expiry said {late:?} although B holds the key now"
    );
    let by_c = c.try_acquire(&key, ttl).await.or_fail("C tries")?;
    ensure!(
        by_c.is_none(),
        "A's late release freed B's lease: C acquired the key"
    );
    let own = b.release(&fresh).await.or_fail("B releases")?;
    ensure!(own == Released::Released, "B's own release said {own:?}");
    Ok(Verdict::Passed)
}

/// A's first grant expires unrenewed, A (the same client) takes the key again, and then releases
/// the first grant late: the second grant must still hold. A release compared only on what a
/// client reuses (an etcd key named after the client's session lease, a node name) would free it.
pub async fn stale_release_after_reacquire_keeps_new_grant(ctx: &Context) -> Outcome {
    let (a, c) = (ctx.connect().await?, ctx.connect().await?);
    let key = ctx.key("stale-release-same-client");
    let ttl = ctx.ttl();
    let first = take(&*a, &key, ttl, "A acquires").await?;
    outlive(ctx, &first).await;
    let (second, _) = acquire_within(ctx, &*a, &key, ttl, Instant::now(), ctx.tolerance())
        .await?
        .ok_or_else(|| Failure::new("A could not take the key again after its grant expired"))?;
    ensure!(
        second.fence() > first.fence(),
        "A's second fence {} is not above its first {}",
        second.fence(),
        first.fence()
    );
    // The second grant is kept renewed (same TTL, so on backends with a session per TTL it sits
    // on the same session and may reuse the first one's name): only the stale release can end it.
    let second = Lease::from_grant(a.clone(), second, LeaseOptions::default());
    let late = a
        .release(&first)
        .await
        .or_fail("A releases its first grant late")?;
    ensure!(
        late == Released::AlreadyGone,
        "A's late release of its expired first grant said {late:?}"
    );
    let by_c = c.try_acquire(&key, ttl).await.or_fail("C tries")?;
    if let Some(g) = by_c {
        let _ = c.release(&g).await;
        return Err(Failure::new(
            "A's late release of its first grant freed its second: C acquired the key",
        ));
    }
    still_held(
        &second,
        "A's second grant after the stale release of its first",
    )
    .await?;
    let own = second
        .release()
        .await
        .or_fail("A releases its second grant")?;
    ensure!(own == Released::Released, "A's own release said {own:?}");
    Ok(Verdict::Passed)
}

/// Dropping a `Lease` without releasing it releases it in the background, long before the TTL.
pub async fn dropped_lease_releases(ctx: &Context) -> Outcome {
    let (a, b) = (ctx.connect().await?, ctx.connect().await?);
    let key = ctx.key("dropped-lease");
    let ttl = ctx.ttl();
    let lease = Lease::try_acquire(a, &key, ttl, LeaseOptions::default())
        .await
        .or_fail("A acquires")?
        .ok_or_else(|| Failure::new("A could not acquire a free key"))?;
    let dropped = Instant::now();
    drop(lease);
    let got = acquire_within(ctx, &*b, &key, ttl, dropped, ttl / 2).await?;
    ensure!(
        got.is_some(),
        "the key stayed held for {:?} after the lease was dropped; drop must release in the background",
        dropped.elapsed()
    );
    if let Some((g, _)) = got {
        let _ = b.release(&g).await.or_fail("B releases")?;
    }
    Ok(Verdict::Passed)
}
