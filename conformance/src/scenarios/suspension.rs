//! Held, suspended, lost: what a lease does while its authority does not answer.

use std::time::Duration;

use leasehold_core::{Instant, Lease, LeaseOptions, LeaseState};

use super::helpers::{paused, NO_PAUSE};
use crate::context::Context;
use crate::ensure;
use crate::verdict::{Failure, OrFail, Outcome, Verdict};

/// Waits (polling, a fiftieth of the TTL at a time) until a renewal moves `lease`'s deadline, so
/// a fault can start at a known point of the renewal schedule.
async fn after_a_renewal(lease: &Lease, ttl: Duration) -> Result<(), Failure> {
    let before = lease.deadline();
    let give_up = Instant::now() + ttl;
    while lease.deadline() == before {
        ensure!(
            Instant::now() < give_up,
            "no renewal within a TTL ({ttl:?})"
        );
        tokio::time::sleep(ttl / 50).await;
    }
    Ok(())
}

/// The server stops answering for three quarters of the time the lease has left, starting right
/// after a renewal: A's lease is suspended (`ensure_valid` fails) before its deadline, and held
/// again, with the same fence and a later deadline, once a renewal lands after the server
/// resumes. A renewal with unknown outcome is not a loss.
///
/// The schedule, with L the time left at the pause (the TTL minus the margin, less on backends
/// that shorten deadlines further): renewals every tenth of the TTL; the one after the pause
/// hangs and is suspected at half the time it has left, about L/2 + TTL/20 in; the server
/// resumes at 3L/4, leaving L/4 for the answer. The TTL is four times the suite's, so these
/// windows are hundreds of milliseconds even on a loaded machine.
pub async fn short_outage_suspends_then_holds(ctx: &Context) -> Outcome {
    let a = ctx.connect().await?;
    let key = ctx.key("short-outage");
    // A longer TTL than the suite's, so the windows around the pause are wide in absolute time.
    let ttl = ctx.capabilities().ttl.at_least(ctx.ttl() * 4);
    let options = LeaseOptions::default()
        .with_renew_fraction(0.1)
        .or_fail("renew fraction")?;
    let lease = Lease::try_acquire(a, &key, ttl, options)
        .await
        .or_fail("A acquires")?
        .ok_or_else(|| Failure::new("A could not acquire a free key"))?;
    let fence = lease.fence();
    after_a_renewal(&lease, ttl).await?;
    if !paused(ctx).await? {
        return Ok(Verdict::NotApplicable(NO_PAUSE.into()));
    }
    let paused = Instant::now();
    let mut states = lease.watch();
    let outage = lease.deadline().saturating_duration_since(paused) * 3 / 4;
    let suspended = tokio::time::timeout(outage, async {
        let state = states.changed().await;
        (state, lease.ensure_valid().is_ok())
    })
    .await;
    tokio::time::sleep_until(paused + outage).await;
    // Nothing could renew while the server was paused: this is the deadline to beat. Read before
    // resuming, as a renewal in flight may land the moment the server answers again.
    let deadline = lease.deadline();
    ctx.faults().resume().await.or_fail("resume the server")?;
    match suspended {
        Ok((LeaseState::Suspended, valid)) => {
            ensure!(!valid, "ensure_valid passed while the lease was suspended")
        }
        Ok((other, _)) => {
            return Err(Failure::new(format!(
                "the lease went {other} during the outage, not suspended"
            )))
        }
        Err(_) => {
            return Err(Failure::new(format!(
                "the lease was not suspended within {outage:?} of the server stopping (TTL \
                 {ttl:?})"
            )))
        }
    }
    let held =
        tokio::time::timeout_at(deadline + ctx.capabilities().expiry_slack, states.changed()).await;
    match held {
        Ok(LeaseState::Held) => {}
        Ok(other) => {
            return Err(Failure::new(format!(
                "after the server resumed the lease went {other}, not held again"
            )))
        }
        Err(_) => {
            return Err(Failure::new(format!(
                "the lease was still suspended at its deadline, {:?} after the server resumed",
                deadline.saturating_duration_since(paused + outage)
            )))
        }
    }
    lease
        .ensure_valid()
        .or_fail("ensure_valid once held again")?;
    ensure!(
        lease.fence() == fence,
        "the fence changed across the outage"
    );
    ensure!(
        lease.deadline() > deadline,
        "held again but the deadline did not move"
    );
    let _ = lease.release().await.or_fail("A releases")?;
    Ok(Verdict::Passed)
}

/// The server stops answering for longer than the TTL: the lease is suspended first, and lost
/// only once its local deadline passed, never before (an unknown outcome is not a refusal).
pub async fn long_outage_loses_at_the_deadline(ctx: &Context) -> Outcome {
    let a = ctx.connect().await?;
    let key = ctx.key("long-outage");
    let ttl = ctx.ttl();
    let lease = Lease::try_acquire(a, &key, ttl, LeaseOptions::default())
        .await
        .or_fail("A acquires")?
        .ok_or_else(|| Failure::new("A could not acquire a free key"))?;
    let mut states = lease.watch();
    if !paused(ctx).await? {
        return Ok(Verdict::NotApplicable(NO_PAUSE.into()));
    }
    let result = async {
        let bound = lease.deadline() + ctx.tolerance();
        let first = tokio::time::timeout_at(bound, states.changed())
            .await
            .map_err(|_| Failure::new("the lease neither suspended nor lost by its deadline"))?;
        ensure!(
            matches!(first, LeaseState::Suspended),
            "the first change during the outage was {first}, not suspended"
        );
        let lost = tokio::time::timeout_at(bound, lease.lost())
            .await
            .map_err(|_| Failure::new("lost() did not fire by the deadline plus tolerance"))?;
        let at = Instant::now();
        // Read after the loss: a renewal answered just before the pause may have moved it.
        let deadline = lease.deadline();
        ensure!(
            at >= deadline,
            "lost ({lost}) {:?} before the local deadline: an unknown outcome ended the lease",
            deadline - at
        );
        ensure!(
            lease.ensure_valid().is_err(),
            "ensure_valid passed after the loss"
        );
        Ok(())
    }
    .await;
    ctx.faults().resume().await.or_fail("resume the server")?;
    result?;
    Ok(Verdict::Passed)
}
