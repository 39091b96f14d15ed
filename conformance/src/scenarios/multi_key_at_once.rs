//! Several keys in one atomic step (`Authority::try_acquire_all`), where the backend declares
//! it: all of a set or none of it, never a part; a fence per key that grows as its key's
//! fences do; deadlines counted from before the request; attempts dropped part way leave
//! nothing that outlives their TTL.

use std::time::Duration;

use leasehold_core::time::saturating_add;
use leasehold_core::{acquire_all, canonical, Authority, Error, Instant, LeaseOptions, LockKey};

use super::helpers::take;
use crate::context::Context;
use crate::ensure;
use crate::verdict::{Failure, OrFail, Outcome, Verdict};

/// How many drops the cancellation part makes.
const DROPS: usize = 40;

/// Four keys, the third held by B. A's one-step try of the four answers "held" and has taken
/// none of the others (another client sees them free) nor disturbed B (B renews with its
/// fence). A set out of the canonical order is refused before anything is sent. Once B has
/// released, the step takes all four: one grant per key in order, each held with the fence it
/// carries, each fence above its key's earlier ones, deadlines counted from before the request.
/// Then attempts dropped at random points leave the set free again within two TTLs.
pub async fn try_acquire_all_takes_all_or_none(ctx: &Context) -> Outcome {
    if !ctx.capabilities().atomic_acquire_all {
        return Ok(Verdict::NotApplicable(
            "the backend takes a set of keys one by one (no atomic_acquire_all)".to_string(),
        ));
    }
    let (a, b, c) = (
        ctx.connect().await?,
        ctx.connect().await?,
        ctx.connect().await?,
    );
    let ttl = ctx.ttl();
    let named: Vec<LockKey> = (0..4).map(|i| ctx.key(&format!("at-once-{i}"))).collect();
    let keys = canonical(&named).or_fail("order the keys")?;
    // A fence on the first key before anything else, which the set's grant must exceed.
    let earlier = take(&*b, &keys[0], ttl, "B takes the first key").await?;
    let _ = b
        .release(&earlier)
        .await
        .or_fail("B releases the first key")?;
    let blocker = take(&*b, &keys[2], ttl, "B takes the third key").await?;

    let mut reversed = keys.clone();
    reversed.reverse();
    match a.try_acquire_all(&reversed, ttl).await {
        Err(Error::InvalidConfig { .. }) => {}
        other => {
            return Err(Failure::new(format!(
                "a set out of the canonical order gave {:?}, not InvalidConfig",
                other.map(|g| g.map(|g| g.len()))
            )))
        }
    }
    let busy = a
        .try_acquire_all(&keys, ttl)
        .await
        .or_fail("A tries the set")?;
    ensure!(
        busy.is_none(),
        "A's one-step try took the set while B held {}",
        keys[2]
    );
    for key in [&keys[0], &keys[1], &keys[3]] {
        let seen = c.inspect(key).await.or_fail("C inspects")?;
        ensure!(
            !seen.held,
            "{key} is held after A's one-step try of the set found {} held: the step took part \
             of the set",
            keys[2]
        );
    }
    let _ = b
        .renew(&blocker, ttl)
        .await
        .or_fail("B renews after A's refused try")?;
    let _ = b.release(&blocker).await.or_fail("B releases")?;

    let sent = Instant::now();
    let grants = a
        .try_acquire_all(&keys, ttl)
        .await
        .or_fail("A takes the free set")?
        .ok_or_else(|| Failure::new("A's one-step try found a free set held"))?;
    ensure!(
        grants.len() == keys.len(),
        "the step answered {} grants for {} keys",
        grants.len(),
        keys.len()
    );
    for (grant, key) in grants.iter().zip(&keys) {
        ensure!(
            grant.key() == key,
            "grant for {} where {key} was asked, in that place",
            grant.key()
        );
        ensure!(
            grant.deadline() <= saturating_add(sent, ttl),
            "{key}'s deadline ends {:?} after the request was sent, past its TTL {ttl:?}",
            grant.deadline().saturating_duration_since(sent)
        );
        let seen = c.inspect(key).await.or_fail("C inspects")?;
        ensure!(
            seen.held && seen.fence == Some(grant.fence()),
            "{key} taken by the step shows held {} with fence {:?}, the grant carries {}",
            seen.held,
            seen.fence,
            grant.fence()
        );
        ensure!(
            c.try_acquire(key, ttl).await.or_fail("C tries")?.is_none(),
            "C took {key} while A's step held it"
        );
    }
    ensure!(
        grants[0].fence() > earlier.fence(),
        "the step's fence on {} is {}, not above the earlier {}",
        keys[0],
        grants[0].fence(),
        earlier.fence()
    );
    ensure!(
        grants[2].fence() > blocker.fence(),
        "the step's fence on {} is {}, not above B's {}",
        keys[2],
        grants[2].fence(),
        blocker.fence()
    );
    for grant in &grants {
        let _ = a.release(grant).await.or_fail("A releases")?;
    }

    dropped_attempts_leave_nothing(ctx, &*a, &c, &keys).await
}

/// One-step tries of a free set, dropped at random points around one round trip: a try that
/// was granted before it was dropped holds at most its TTL, so the whole set is C's within two
/// TTLs (plus the tolerance).
async fn dropped_attempts_leave_nothing(
    ctx: &Context,
    dropper: &dyn Authority,
    c: &std::sync::Arc<dyn Authority>,
    keys: &[LockKey],
) -> Outcome {
    let ttl = ctx.ttl();
    let started = Instant::now();
    c.inspect(&keys[0]).await.or_fail("inspect")?;
    let rtt = started.elapsed().max(Duration::from_micros(100));
    for _ in 0..DROPS {
        let attempt = dropper.try_acquire_all(keys, ttl);
        if let Some(Ok(Some(grants))) = super::cancellation::cut_short(attempt, rtt * 3).await {
            for grant in &grants {
                let _ = dropper
                    .release(grant)
                    .await
                    .or_fail("release a completed try")?;
            }
        }
    }
    let within = ttl * 2 + ctx.tolerance();
    let all = acquire_all(c.clone(), keys, ttl, within, LeaseOptions::default())
        .await
        .or_fail("C takes the set after the dropped tries")?;
    all.release().await.or_fail("C releases the set")?;
    Ok(Verdict::Passed)
}
