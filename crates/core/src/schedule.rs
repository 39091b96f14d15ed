//! Scheduled work: at most one run per period across instances, the cron case.
//!
//! Several instances fire the same job on the same schedule; one should run it. The first to
//! claim the period runs; the others skip. The claim is a lease whose TTL is the period, which
//! is neither renewed nor released: it ends when the period does, so an instance whose clock
//! fires a little later in the same period still finds it held and skips (releasing at the end
//! of a short job would let it run the job a second time).
//!
//! What the claim cannot do: make the job's effects happen once. A job that outlives its period
//! loses exclusivity then (another instance may start the next run), and a paused instance may
//! act late. So send the fence with every write the job makes, check
//! [`Lease::ensure_valid`] before each side effect, and make the job's writes idempotent (an
//! upsert keyed by the period, not an append) so that a second run in the same period is
//! harmless.

use std::sync::Arc;
use std::time::Duration;

use crate::authority::Authority;
use crate::error::Result;
use crate::key::LockKey;
use crate::lease::{Lease, LeaseOptions};

/// Claims `key` for one `period`, without waiting: `Some(lease)` when this instance should run
/// the job now, `None` when another instance has this period (skip).
///
/// The lease is not renewed and is not released when dropped: it runs out with the period.
/// Its fence is the run's fence.
///
/// ```
/// # use std::{sync::Arc, time::Duration};
/// # use leasehold_core::{claim_period, Authority, LockKey};
/// # async fn job(_fence: u64) {}
/// # async fn demo(authority: Arc<dyn Authority>) -> leasehold_core::Result<()> {
/// let key = LockKey::new("report:nightly")?;
/// match claim_period(authority, &key, Duration::from_secs(3600)).await? {
///     Some(run) => job(run.fence().value()).await, // check run.ensure_valid() before effects
///     None => {}                                   // another instance has this period
/// }
/// # Ok(()) }
/// ```
pub async fn claim_period(
    authority: Arc<dyn Authority>,
    key: &LockKey,
    period: Duration,
) -> Result<Option<Lease>> {
    let options = LeaseOptions::default()
        .with_auto_renew(false)
        .with_release_on_drop(false);
    Lease::try_acquire(authority, key, period, options).await
}
