//! An unresponsive authority: typed errors, loss reported, and recovery.

use std::time::Duration;

use leasehold_core::{is_unavailable, Error, Instant, Lease, LeaseOptions, LostReason};

use super::helpers::{acquire_within, paused, NO_PAUSE};
use crate::context::Context;
use crate::ensure;
use crate::verdict::{Failure, OrFail, Outcome, Verdict};

/// The server stops answering (SIGSTOP) while A holds a renewed lease: another client's
/// try-acquire fails with the retryable `Unavailable` (not "someone holds it"), A's `lost()`
/// fires by its deadline, and after the server resumes the key is free again within a TTL.
/// Where the pause is contention instead (`Faults::pause_is_contention`), the try-acquire
/// fails with a retryable error that is not `Unavailable`: the authority answered, busy.
pub async fn unresponsive_authority(ctx: &Context) -> Outcome {
    let (a, b) = (ctx.connect().await?, ctx.connect().await?);
    let key = ctx.key("unresponsive");
    let ttl = ctx.ttl();
    let lease = Lease::try_acquire(a, &key, ttl, LeaseOptions::default())
        .await
        .or_fail("A acquires")?
        .ok_or_else(|| Failure::new("A could not acquire a free key"))?;
    if !paused(ctx).await? {
        return Ok(Verdict::NotApplicable(NO_PAUSE.into()));
    }
    let result = async {
        let probe = {
            let (b, key) = (b.clone(), key.clone());
            tokio::spawn(async move { b.try_acquire(&key, ttl).await })
        };
        let deadline = lease.deadline();
        let bound = deadline.saturating_duration_since(Instant::now()) + ctx.tolerance();
        let reason = tokio::time::timeout(bound, lease.lost())
            .await
            .map_err(|_| {
                Failure::new(format!(
                    "lost() did not fire within {bound:?} while the server was unresponsive"
                ))
            })?;
        ensure!(
            matches!(
                reason,
                LostReason::RenewalFailed(_)
                    | LostReason::DeadlinePassed
                    | LostReason::SessionEnded
            ),
            "lost() fired with {reason:?}"
        );
        ensure!(
            lease.ensure_valid().is_err(),
            "ensure_valid passed with the server unresponsive"
        );
        let answer = tokio::time::timeout(Duration::from_secs(30), probe)
            .await
            .map_err(|_| Failure::new("try_acquire hung for 30 s against an unresponsive server"))?
            .or_fail("probe task")?;
        let contention = ctx.faults().pause_is_contention();
        match answer {
            Err(e) if contention => {
                ensure!(
                    e.is_retryable() && !is_unavailable(&e),
                    "try_acquire against an authority kept busy gave {e}, expected a retryable \
                     error that is not Unavailable"
                );
            }
            Err(e @ Error::Unavailable { .. }) => {
                ensure!(e.is_retryable(), "Unavailable must be retryable");
            }
            other => {
                return Err(Failure::new(format!(
                "try_acquire against an unresponsive server gave {other:?}, expected Unavailable"
            )))
            }
        }
        Ok(())
    }
    .await;
    ctx.faults().resume().await.or_fail("resume the server")?;
    result?;
    drop(lease);
    let resumed = Instant::now();
    let within = ttl * 2 + ctx.tolerance() * 2;
    let got = acquire_within(ctx, &*b, &key, ttl, resumed, within).await?;
    let (g, _) = got.ok_or_else(|| {
        Failure::new(format!(
            "the key was still held {within:?} after the server resumed"
        ))
    })?;
    let _ = b.release(&g).await.or_fail("B releases")?;
    Ok(Verdict::Passed)
}
