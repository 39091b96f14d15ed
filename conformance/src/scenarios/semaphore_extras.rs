//! The semaphore's extras: an inspection that counts free permits and names their holders, a
//! permit's own lease extended by hand or given back early, and a permit revoked by an operator
//! and fenced out.

use std::collections::BTreeSet;
use std::time::Duration;

use leasehold_core::{
    Error, Guarded, Instant, LeaseOptions, LostReason, RevocationNotice, Revoked, Semaphore,
};

use crate::context::Context;
use crate::ensure;
use crate::verdict::{Failure, OrFail, Outcome, Verdict};

/// A semaphore of 3 read by a third client: 3 free; with A and B each holding a permit, 1 free,
/// and the holders are A's and B's slots with their fences, two distinct owner ids and at most
/// a TTL left; once A gives its permit back early, 2 free and A's slot among them.
pub async fn semaphore_inspect_counts_free_permits_and_holders(ctx: &Context) -> Outcome {
    let name = ctx.key("semaphore-inspect");
    let ttl = ctx.ttl();
    let watcher = Semaphore::new(ctx.connect().await?, &name, 3).or_fail("a semaphore")?;
    let a = Semaphore::new(ctx.connect().await?, &name, 3).or_fail("A's semaphore")?;
    let b = Semaphore::new(ctx.connect().await?, &name, 3).or_fail("B's semaphore")?;
    let empty = watcher
        .inspect()
        .await
        .or_fail("inspect an unused semaphore")?;
    ensure!(
        empty.free() == 3 && empty.holders().is_empty() && empty.slots.len() == 3,
        "an unused semaphore of 3 shows {} free and holders {:?}",
        empty.free(),
        empty.holders()
    );
    let pa = a
        .try_acquire(ttl)
        .await
        .or_fail("A takes a permit")?
        .ok_or_else(|| Failure::new("A found no free permit"))?;
    let pb = b
        .try_acquire(ttl)
        .await
        .or_fail("B takes a permit")?
        .ok_or_else(|| Failure::new("B found no free permit"))?;
    let seen = watcher.inspect().await.or_fail("inspect with two held")?;
    ensure!(
        seen.free() == 1,
        "{} free with two of three held",
        seen.free()
    );
    let holders = seen.holders();
    let slots: BTreeSet<u32> = holders.iter().map(|h| h.slot).collect();
    let expected: BTreeSet<u32> = [pa.slot(), pb.slot()].into_iter().collect();
    ensure!(
        slots == expected,
        "the holders are slots {slots:?}, A and B hold {expected:?}"
    );
    for (who, permit) in [("A", &pa), ("B", &pb)] {
        let holder = holders
            .iter()
            .find(|h| h.slot == permit.slot())
            .ok_or_else(|| Failure::new(format!("{who}'s slot is not among the holders")))?;
        ensure!(
            holder.fence == Some(permit.fence()) && &holder.key == permit.key(),
            "{who} holds {} with fence {}, the inspection shows {holder:?}",
            permit.key(),
            permit.fence()
        );
        ensure!(
            holder.remaining.is_none_or(|left| left <= ttl),
            "{who}'s permit shows {:?} left of a {ttl:?} lease",
            holder.remaining
        );
    }
    let owners: std::collections::HashSet<_> =
        holders.iter().filter_map(|h| h.owner.clone()).collect();
    ensure!(
        owners.len() == 2,
        "two holders on two clients show owner ids {owners:?}"
    );
    let freed = pa.slot();
    let _ = pa.release().await.or_fail("A gives its permit back")?;
    let after = watcher
        .inspect()
        .await
        .or_fail("inspect after A's release")?;
    ensure!(
        after.free() == 2 && after.holders().iter().all(|h| h.slot != freed),
        "after A released slot {freed}: {} free, holders {:?}",
        after.free(),
        after.holders()
    );
    let _ = pb.release().await.or_fail("B releases")?;
    Ok(Verdict::Passed)
}

/// A permit of a 1-permit semaphore with auto-renew off, extended by hand half a TTL in: to
/// three TTLs where the backend renews with another TTL (elsewhere to its own TTL, and three is
/// refused as `InvalidTtl`). Past the end of its first TTL it is still valid and a second client
/// finds the slot held; given back early, the slot is free at once for the second client with a
/// greater fence. A permit left to run out cannot be renewed (`LeaseLost`), and a permit renewed
/// in the background refuses a renewal by hand (`InvalidConfig`).
pub async fn semaphore_permit_lease_renews_by_hand(ctx: &Context) -> Outcome {
    let name = ctx.key("semaphore-renew");
    let ttl = ctx.ttl();
    let manual = LeaseOptions::default().with_auto_renew(false);
    let own = Semaphore::new(ctx.connect().await?, &name, 1)
        .or_fail("a semaphore")?
        .with_lease_options(manual.clone());
    let other = Semaphore::new(ctx.connect().await?, &name, 1).or_fail("a second semaphore")?;
    let taken = Instant::now();
    let mut permit = own
        .try_acquire(ttl)
        .await
        .or_fail("take the permit")?
        .ok_or_else(|| Failure::new("no free permit"))?;
    // Half of what is left of the permit's lease, not half the TTL: on a loaded machine the
    // acquisition itself can take most of a short TTL, and a renewal after the local deadline
    // is rightly refused.
    tokio::time::sleep(permit.lease().remaining() / 2).await;
    let longer = if ctx.capabilities().renew_with_other_ttl {
        ttl * 3
    } else {
        match permit.renew(ttl * 3).await {
            Err(Error::InvalidTtl { .. }) => {}
            other => {
                return Err(Failure::new(format!(
                    "renewing with another TTL on a backend that declares it fixed gave {other:?}"
                )))
            }
        }
        ttl
    };
    let mut deadline = permit
        .renew(longer)
        .await
        .or_fail(format!("renew the permit to {longer:?}"))?;
    // A fixed TTL extends the permit one TTL from each renewal, less the safety margin: renewed
    // again half way through what is left, until its deadline lies well past the first TTL,
    // so the check below has room however long each request took on a loaded machine.
    let mut renewals = 1;
    while deadline < taken + ttl * 3 / 2 && renewals < 8 {
        tokio::time::sleep(deadline.saturating_duration_since(Instant::now()) / 2).await;
        deadline = permit
            .renew(longer)
            .await
            .or_fail(format!("renew the permit again (renewal {renewals})"))?;
        renewals += 1;
    }
    let check_at = (taken + ttl * 2 + ctx.tolerance()).min(deadline - ttl / 4);
    ensure!(
        check_at > taken + ttl,
        "the renewed permit's deadline {:?} after taking it leaves no time past its first TTL",
        deadline - taken
    );
    tokio::time::sleep_until(check_at).await;
    permit.ensure_valid().or_fail(format!(
        "the permit {:?} after it was taken",
        taken.elapsed()
    ))?;
    if let Some(p) = other
        .try_acquire(ttl)
        .await
        .or_fail("the second client tries")?
    {
        return Err(Failure::new(format!(
            "the second client took slot {} (fence {}) {:?} after the first permit was taken \
             and renewed to {longer:?}",
            p.slot(),
            p.fence(),
            taken.elapsed()
        )));
    }
    let first = permit.fence();
    let released = permit
        .release()
        .await
        .or_fail("give the permit back early")?;
    ensure!(
        released == leasehold_core::Released::Released,
        "giving back a held permit answered {released:?}"
    );
    let next = other
        .try_acquire(ttl)
        .await
        .or_fail("the second client after the early release")?
        .ok_or_else(|| Failure::new("the slot was not free right after the early release"))?;
    ensure!(
        next.fence() > first,
        "the next permit's fence {} is not above the released one's {first}",
        next.fence()
    );
    let _ = next.release().await.or_fail("release")?;

    let mut lapsing = own
        .try_acquire(ttl)
        .await
        .or_fail("take a permit to let run out")?
        .ok_or_else(|| Failure::new("no free permit to let run out"))?;
    let lost = lapsing.lost();
    let reason = tokio::time::timeout(ttl + ctx.tolerance(), lost)
        .await
        .map_err(|_| Failure::new("a permit not renewed was not lost at its deadline"))?;
    ensure!(
        matches!(reason, LostReason::DeadlinePassed),
        "a permit not renewed was lost with {reason:?}"
    );
    match lapsing.renew(ttl).await {
        Err(Error::LeaseLost { .. }) => {}
        other => {
            return Err(Failure::new(format!(
                "renewing a permit that ran out gave {other:?}"
            )))
        }
    }
    drop(lapsing);
    let mut renewed = other
        .acquire(ttl, ttl + ctx.tolerance())
        .await
        .or_fail("take a permit renewed in the background after the last one ran out")?;
    match renewed.renew(ttl).await {
        Err(Error::InvalidConfig { .. }) => {}
        other => {
            return Err(Failure::new(format!(
                "renewing by hand a permit renewed in the background gave {other:?}"
            )))
        }
    }
    renewed
        .ensure_valid()
        .or_fail("the background-renewed permit after a refused renewal")?;
    let _ = renewed.release().await.or_fail("release")?;
    Ok(Verdict::Passed)
}

/// How soon a holder whose backend pushes the loss must hear of a revoke.
const PUSHED_WITHIN: Duration = Duration::from_secs(1);

/// A holds a permit of 2 and writes to a resource with its fence; B holds the other. An admin
/// client revokes A's slot (`Semaphore::revoke`) and is told A's fence; A's permit is lost
/// (within a second where the backend pushes the loss, a renewal period elsewhere); C then gets
/// the revoked slot (B still holds the other) with a greater fence and claims the resource, and
/// A's late write is refused.
pub async fn semaphore_revoked_permit_is_lost_and_fenced_out(ctx: &Context) -> Outcome {
    let name = ctx.key("semaphore-revoke");
    let ttl = ctx.ttl();
    let a = Semaphore::new(ctx.connect().await?, &name, 2).or_fail("A's semaphore")?;
    let b = Semaphore::new(ctx.connect().await?, &name, 2).or_fail("B's semaphore")?;
    let c = Semaphore::new(ctx.connect().await?, &name, 2).or_fail("C's semaphore")?;
    let admin = Semaphore::new(ctx.connect().await?, &name, 2).or_fail("the admin's semaphore")?;
    let resource = ctx.resource().await?;
    let pa = a
        .try_acquire(ttl)
        .await
        .or_fail("A takes a permit")?
        .ok_or_else(|| Failure::new("A found no free permit"))?;
    let pb = b
        .try_acquire(ttl)
        .await
        .or_fail("B takes a permit")?
        .ok_or_else(|| Failure::new("B found no free permit"))?;
    let a_fence = pa.fence();
    ensure!(
        resource
            .write(a_fence, "A, holding")
            .await
            .or_fail("A writes")?
            .is_accepted(),
        "A's write with its permit's fence was refused"
    );
    let lost = pa.lost();
    let revoked = match admin.revoke(pa.slot()).await {
        Err(Error::Unsupported { .. }) => {
            return Ok(Verdict::NotApplicable(
                "the backend does not implement revoke".into(),
            ))
        }
        other => other.or_fail("revoke A's slot")?,
    };
    ensure!(
        revoked == Revoked::Revoked { fence: a_fence },
        "revoking A's slot (fence {a_fence}) answered {revoked:?}"
    );
    let bound = match ctx.capabilities().revocation {
        RevocationNotice::Pushed => PUSHED_WITHIN,
        _ => ttl / 3 + ctx.tolerance(),
    };
    let reason = tokio::time::timeout(bound, lost).await.map_err(|_| {
        Failure::new(format!(
            "A's permit was not lost within {bound:?} of the revoke"
        ))
    })?;
    ensure!(
        matches!(reason, LostReason::Refused | LostReason::SessionEnded),
        "A's permit was lost with {reason:?} after the revoke, expected a refusal"
    );
    ensure!(
        pa.ensure_valid().is_err(),
        "A's permit is still valid after the revoke"
    );
    let pc = c
        .try_acquire(ttl)
        .await
        .or_fail("C takes a permit")?
        .ok_or_else(|| Failure::new("C found no free permit after A's was revoked"))?;
    ensure!(
        pc.slot() == pa.slot() && pc.fence() > a_fence,
        "C got slot {} with fence {}; the revoked slot was {} with fence {a_fence}",
        pc.slot(),
        pc.fence(),
        pa.slot()
    );
    let claim = resource.claim(pc.fence()).await.or_fail("C claims")?;
    ensure!(claim.is_accepted(), "C's claim was refused: {claim:?}");
    let late = resource
        .write(a_fence, "A, revoked")
        .await
        .or_fail("A's late write")?;
    ensure!(
        late == Guarded::Stale {
            newest: pc.fence().value()
        },
        "the revoked permit's write with fence {a_fence} was not refused: {late:?}"
    );
    let _ = pc.release().await.or_fail("C releases")?;
    let _ = pb.release().await.or_fail("B releases")?;
    drop(pa);
    Ok(Verdict::Passed)
}
