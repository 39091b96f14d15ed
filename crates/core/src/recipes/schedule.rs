//! Scheduled work: at most one run per period across instances, the cron case.
//!
//! Several instances fire the same job on the same schedule; one should run it. The first to
//! claim the period runs; the others skip. The claim is a lease that is neither renewed nor
//! released: it runs out by itself, so an instance whose clock fires a little later in the
//! same period still finds it held and skips (releasing at the end of a short job would let it
//! run the job a second time).
//!
//! The claim must also be over when the next period starts, though it starts late: after the
//! timer fired (a timer wakes late on a loaded machine) and once the request reached the
//! authority. A claim as long as the period would still be held at the next period's first
//! tick, which would then skip, and every other period would go unrun. So the claim lasts the
//! period less a tenth of it and less the authority's declared expiry slack ([`claim_ttl`]):
//! the next tick finds it over as long as this one fired and claimed within that tenth, and an
//! instance whose timer fires up to nine tenths of a period late still finds it held.
//!
//! That tenth is counted from the moment of the call, so a timer that fires more than a tenth
//! of a period late still holds the claim when the next period's tick comes, and that period
//! is skipped. [`crate::Schedule::claim`] takes the instant the tick was due instead and ends
//! the claim before the next period whatever the timer did; it also has ShedLock's options
//! (`at_most`, `at_least`, waiting when held). `claim_period` is its shortcut for a timer that
//! fires on time.
//!
//! What the claim cannot do: make the job's effects happen once. A job that outlives its claim
//! loses exclusivity then (another instance may start the next run), and a paused instance may
//! act late. So send the fence with every write the job makes, check
//! [`Lease::ensure_valid`] before each side effect, and make the job's writes idempotent (an
//! upsert keyed by the period, not an append) so that a second run in the same period is
//! harmless.

use std::sync::Arc;
use std::time::Duration;

use crate::contract::authority::Authority;
use crate::contract::capabilities::Capabilities;
use crate::contract::error::{Error, Result};
use crate::contract::key::LockKey;
use crate::lease::{Lease, LeaseOptions};

/// Claims `key` for one `period`, without waiting: `Some(lease)` when this instance should run
/// the job now, `None` when another instance has this period (skip).
///
/// The lease is not renewed and is not released when dropped: it runs out before the next
/// period starts ([`claim_ttl`]). Its fence is the run's fence. A period too short for the
/// backend's TTLs is [`Error::InvalidTtl`].
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
    let ttl = claim_ttl(authority.capabilities(), period)?;
    Lease::try_acquire(authority, key, ttl, options).await
}

/// How long [`claim_period`]'s claim on `period` lasts on an authority with `capabilities`: the
/// period less a tenth of it (the time the claim may start late: a timer woken late, the
/// request) and less the authority's declared expiry slack (the time it may end late), rounded
/// down to a TTL the backend grants. [`Error::InvalidTtl`] when no TTL the backend grants fits.
pub fn claim_ttl(capabilities: &Capabilities, period: Duration) -> Result<Duration> {
    let want = period
        .saturating_sub(period / 10)
        .saturating_sub(capabilities.expiry_slack);
    capabilities
        .ttl
        .at_most(want)
        .ok_or_else(|| Error::InvalidTtl {
            ttl: period,
            reason: format!(
            "a claim on a period of {period:?} must end within {want:?} (the period less a tenth \
             and the backend's expiry slack of {:?}), shorter than the backend's shortest TTL \
             of {:?}",
            capabilities.expiry_slack, capabilities.ttl.min
        ),
        })
}
