//! Small steps several scenarios share.

use std::time::Duration;

use leasehold_core::{Authority, Error, Grant, Instant, Lease, LeaseState, LockKey};

use crate::context::{poll_until, Context};
use crate::verdict::{Failure, OrFail};

/// Polls `client.try_acquire(key)` until it succeeds, for at most `within` from `start`.
/// Returns the grant and when it was obtained.
pub async fn acquire_within(
    ctx: &Context,
    client: &dyn Authority,
    key: &LockKey,
    ttl: Duration,
    start: Instant,
    within: Duration,
) -> Result<Option<(Grant, Instant)>, Failure> {
    let every = (ctx.ttl() / 20).max(Duration::from_millis(5));
    poll_until(start, within, every, || async {
        let got = client.try_acquire(key, ttl).await.or_fail("try_acquire")?;
        Ok(got.map(|g| (g, Instant::now())))
    })
    .await
}

/// [`acquire_within`] for a client that meets the authority right after a fault (a failover):
/// until the authority has settled, a retryable error (a client still routed to the old primary,
/// say) is looked at again like a held key, within the same window; anything else still fails.
pub async fn acquire_after_fault(
    ctx: &Context,
    client: &dyn Authority,
    key: &LockKey,
    ttl: Duration,
    start: Instant,
    within: Duration,
) -> Result<Option<(Grant, Instant)>, Failure> {
    let every = (ctx.ttl() / 20).max(Duration::from_millis(5));
    poll_until(start, within, every, || async {
        match client.try_acquire(key, ttl).await {
            Ok(got) => Ok(got.map(|g| (g, Instant::now()))),
            Err(e) if e.is_retryable() => Ok(None),
            Err(e) => Err(Failure::new(format!("try_acquire: {e}"))),
        }
    })
    .await
}

/// Takes `key`, which must be free, or fails with `what`.
pub async fn take(
    client: &dyn Authority,
    key: &LockKey,
    ttl: Duration,
    what: &str,
) -> Result<Grant, Failure> {
    client
        .try_acquire(key, ttl)
        .await
        .or_fail(what)?
        .ok_or_else(|| Failure::new(format!("{what}: the key was not free")))
}

/// Waits until `grant`'s lease has certainly expired at the authority: its TTL from now plus the
/// tolerance (the grant was obtained before now, so this is conservative).
pub async fn outlive(ctx: &Context, grant: &Grant) {
    tokio::time::sleep(grant.ttl() + ctx.tolerance()).await;
}

/// `lease` is still ours: held now, or held again within half its TTL if a slow renewal (a
/// loaded machine, an fsync stall) suspended it for a moment. Lost, or suspended for longer,
/// fails with `what`.
pub async fn still_held(lease: &Lease, what: &str) -> Result<(), Failure> {
    let patience = lease.grant().ttl() / 2;
    let until = Instant::now() + patience;
    let mut watch = lease.watch();
    loop {
        match lease.state() {
            LeaseState::Held => return Ok(()),
            LeaseState::Lost(reason) => {
                return Err(Failure::new(format!(
                    "{what}: the lease was lost: {reason}"
                )))
            }
            _ => {
                if tokio::time::timeout_at(until, watch.changed())
                    .await
                    .is_err()
                {
                    return Err(Failure::new(format!(
                        "{what}: the lease stayed suspended for {patience:?}"
                    )));
                }
            }
        }
    }
}

/// Why a scenario that needs the pause fault does not apply.
pub const NO_PAUSE: &str = "the harness cannot pause the server";

/// Makes the server unresponsive (SIGSTOP). `Ok(false)` when the harness cannot: the scenario
/// then reports "not applicable" with [`NO_PAUSE`].
pub async fn paused(ctx: &Context) -> Result<bool, Failure> {
    match ctx.faults().pause().await {
        Err(Error::Unsupported { .. }) => Ok(false),
        other => other.or_fail("pause the server").map(|()| true),
    }
}
