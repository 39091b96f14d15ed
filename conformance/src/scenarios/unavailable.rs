//! The authority unavailable: failing open or closed is the caller's declared choice.

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{
    acquire_or, is_unavailable, Admission, Authority, Error, IfUnavailable, Instant, Lease,
    LeaseOptions, LockKey,
};

use super::helpers::{paused, NO_PAUSE};
use crate::context::Context;
use crate::ensure;
use crate::verdict::{Failure, OrFail, Outcome, Verdict};

/// `acquire_or` without waiting (and without renewals), bounded: a stopped server must not make
/// it hang.
async fn admit(
    client: &Arc<dyn Authority>,
    key: &LockKey,
    ttl: Duration,
    max_wait: Duration,
    policy: IfUnavailable,
) -> Result<leasehold_core::Result<Admission>, Failure> {
    let options = LeaseOptions::default().with_auto_renew(false);
    let admitted = acquire_or(client.clone(), key, ttl, max_wait, options, policy);
    tokio::time::timeout(Duration::from_secs(30), admitted)
        .await
        .map_err(|_| Failure::new(format!("{policy:?}: acquire_or hung for 30 s")))
}

/// A key A holds is never a reason to proceed: B's `acquire_or` is `Timeout` under both
/// policies. With the server stopped (SIGSTOP), fail-closed is an unavailable error and
/// fail-open proceeds `Unlocked` (with no fence); once the server resumes, fail-open takes a
/// real lease again. Where the pause is contention instead (`Faults::pause_is_contention`:
/// SQLite's write lock held by another connection), the authority answered, busy: both
/// policies return a retryable error that is not unavailable, and neither proceeds.
pub async fn fail_open_and_closed_are_explicit(ctx: &Context) -> Outcome {
    let (a, b) = (ctx.connect().await?, ctx.connect().await?);
    let key = ctx.key("if-unavailable");
    let ttl = ctx.ttl();
    let still = LeaseOptions::default().with_auto_renew(false);
    let held = Lease::acquire(a, &key, ttl, Duration::ZERO, still)
        .await
        .or_fail("A acquires")?;
    for policy in [IfUnavailable::FailOpen, IfUnavailable::FailClosed] {
        match admit(&b, &key, ttl, Duration::ZERO, policy).await? {
            Err(Error::Timeout { .. }) => {}
            Ok(admission) => {
                return Err(Failure::new(format!(
                    "{policy:?}: B was admitted ({admission:?}) to a key A holds"
                )))
            }
            Err(e) => return Err(Failure::new(format!("{policy:?}: B got {e}, not Timeout"))),
        }
    }
    let _ = held.release().await.or_fail("A releases")?;
    if !paused(ctx).await? {
        return Ok(Verdict::NotApplicable(NO_PAUSE.into()));
    }
    let contention = ctx.faults().pause_is_contention();
    let result = async {
        if contention {
            for policy in [IfUnavailable::FailClosed, IfUnavailable::FailOpen] {
                match admit(&b, &key, ttl, Duration::ZERO, policy).await? {
                    Err(e) if e.is_retryable() && !is_unavailable(&e) => {}
                    other => {
                        return Err(Failure::new(format!(
                            "{policy:?} against an authority kept busy by another writer gave \
                             {other:?}, not a retryable error that is not unavailable"
                        )))
                    }
                }
            }
            return Ok(());
        }
        match admit(&b, &key, ttl, Duration::ZERO, IfUnavailable::FailClosed).await? {
            Err(e) if is_unavailable(&e) => {}
            other => {
                return Err(Failure::new(format!(
                    "fail-closed against a stopped server gave {other:?}, not an unavailable error"
                )))
            }
        }
        match admit(&b, &key, ttl, Duration::ZERO, IfUnavailable::FailOpen).await? {
            Ok(Admission::Unlocked(unlocked)) => {
                ensure!(unlocked.key() == &key, "unlocked names {}", unlocked.key());
                ensure!(
                    is_unavailable(unlocked.cause()),
                    "unlocked because of {}",
                    unlocked.cause()
                );
            }
            other => {
                return Err(Failure::new(format!(
                    "fail-open against a stopped server gave {other:?}, not Unlocked"
                )))
            }
        }
        Ok(())
    }
    .await;
    ctx.faults().resume().await.or_fail("resume the server")?;
    result?;
    // Back to normal: fail-open takes a real lease (within two TTLs, as clients reconnect).
    let since = Instant::now();
    loop {
        match admit(&b, &key, ttl, ttl, IfUnavailable::FailOpen).await? {
            Ok(Admission::Leased(lease)) => {
                let _ = lease.release().await.or_fail("B releases")?;
                return Ok(Verdict::Passed);
            }
            Ok(Admission::Unlocked(_)) | Err(_)
                if since.elapsed() < ttl * 2 + ctx.tolerance() * 2 =>
            {
                tokio::time::sleep(ttl / 10).await;
            }
            other => {
                return Err(Failure::new(format!(
                    "after the server resumed, fail-open still gave {other:?}"
                )))
            }
        }
    }
}
