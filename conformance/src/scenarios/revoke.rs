//! Revocation: an operator ends a holder's lease, and the fence keeps the holder's late writes
//! out.

use std::time::Duration;

use leasehold_core::{
    Authority, Error, FencedResource, Guarded, Instant, Lease, LeaseOptions, LockKey, LostReason,
    RevocationNotice, Revoked,
};

use super::helpers::acquire_within;
use crate::context::Context;
use crate::ensure;
use crate::resource::{check_history, Recorder};
use crate::verdict::{Failure, OrFail, Outcome, Verdict};

/// How soon a holder whose backend pushes the loss must hear of a revoke.
const PUSHED_WITHIN: Duration = Duration::from_secs(1);

/// `admin.revoke(key)`; `Ok(None)` when the backend declares it unsupported.
async fn revoke(
    admin: &dyn Authority,
    key: &LockKey,
    what: &str,
) -> Result<Option<Revoked>, Failure> {
    match admin.revoke(key).await {
        Err(Error::Unsupported { .. }) => Ok(None),
        other => other.or_fail(what).map(Some),
    }
}

/// A revoke of a free key changes nothing and says so. A holds the key and writes; an admin
/// client revokes it and is told A's fence; A's `lost()` fires within a second where the
/// backend pushes the loss, within one renewal period (and the tolerance) elsewhere; B then
/// takes the key with a greater fence and claims the resource, and A's late write is refused.
/// Revoking again once B has released is a no-op again.
pub async fn revoke_ends_the_holder_and_fences_it_out(ctx: &Context) -> Outcome {
    let (a, admin, b) = (
        ctx.connect().await?,
        ctx.connect().await?,
        ctx.connect().await?,
    );
    let key = ctx.key("revoke");
    let ttl = ctx.ttl();
    let Some(free) = revoke(&*admin, &key, "revoke a key nobody took").await? else {
        return Ok(Verdict::NotApplicable(
            "the backend does not implement revoke".into(),
        ));
    };
    ensure!(
        free == Revoked::WasFree,
        "revoking a key nobody took answered {free:?}"
    );

    let resource = Recorder::new(ctx.resource().await?);
    let lease = Lease::try_acquire(a, &key, ttl, LeaseOptions::default())
        .await
        .or_fail("A acquires")?
        .ok_or_else(|| Failure::new("A could not acquire a free key"))?;
    let a_fence = lease.fence();
    ensure!(
        resource
            .write(a_fence, "A, holding")
            .await
            .or_fail("A writes")?
            .is_accepted(),
        "A's write while holding the lease was refused"
    );
    let lost = lease.lost();
    let revoked = revoke(&*admin, &key, "revoke A's lease")
        .await?
        .ok_or_else(|| Failure::new("revoke was unsupported for a held key only"))?;
    let at = Instant::now();
    ensure!(
        revoked == Revoked::Revoked { fence: a_fence },
        "revoking A's lease (fence {a_fence}) answered {revoked:?}"
    );

    let bound = match ctx.capabilities().revocation {
        RevocationNotice::Pushed => PUSHED_WITHIN,
        _ => ttl / 3 + ctx.tolerance(),
    };
    let reason = tokio::time::timeout(bound, lost).await.map_err(|_| {
        Failure::new(format!(
            "A's lost() did not fire within {bound:?} of the revoke ({:?} declared)",
            ctx.capabilities().revocation
        ))
    })?;
    ensure!(
        matches!(reason, LostReason::Refused | LostReason::SessionEnded),
        "A's lost() fired with {reason:?} {:?} after the revoke, expected a refusal",
        at.elapsed()
    );

    let (fresh, _) = acquire_within(ctx, &*b, &key, ttl, Instant::now(), ctx.tolerance())
        .await?
        .ok_or_else(|| Failure::new("B could not take the key after A's lease was revoked"))?;
    ensure!(
        fresh.fence() > a_fence,
        "B's fence {} after the revoke is not above A's {a_fence}",
        fresh.fence()
    );
    let claim = resource.claim(fresh.fence()).await.or_fail("B claims")?;
    ensure!(claim.is_accepted(), "B's claim was refused: {claim:?}");
    let late = resource
        .write(a_fence, "A, revoked")
        .await
        .or_fail("A's late write")?;
    ensure!(
        late == Guarded::Stale {
            newest: fresh.fence().value()
        },
        "the revoked holder's write with fence {a_fence} was not refused as stale: {late:?}"
    );
    check_history(&resource.history()).map_err(Failure::new)?;

    let _ = b.release(&fresh).await.or_fail("B releases")?;
    let again = revoke(&*admin, &key, "revoke a released key")
        .await?
        .ok_or_else(|| Failure::new("revoke became unsupported"))?;
    ensure!(
        again == Revoked::WasFree,
        "revoking a released key answered {again:?}"
    );
    drop(lease);
    Ok(Verdict::Passed)
}
