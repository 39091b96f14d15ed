//! Scheduled work with ShedLock's options, each fenced: how long a run's claim lasts at most
//! (`at_most`: it ends even if the job hangs), how long at least (`at_least`: a fast run keeps
//! the period from a second instance whose timer fires late), and whether a held period is
//! skipped or waited for (bounded).
//!
//! # The period boundary
//! A claim must be over before the next period starts, or the next period's tick finds it held
//! and skips. A claim counted from the moment the timer fired ends late whenever the timer
//! fired late: with a claim of nine tenths of a period, a tick a fifth of a period late held
//! the key past the next tick. So [`Schedule::claim`] takes the instant the tick was *due* (what
//! `tokio::time::Interval::tick` returns) and ends the claim a tenth of a period (and the
//! backend's expiry slack) before the next period's due instant, however late this tick fired:
//! the tenth is the time the claim's request may take to reach the authority. A tick that fires
//! after that point has missed its period ([`Claim::Missed`]): running it would hold the key
//! into the next period.
//!
//! # What the claim cannot do
//! It cannot make the job's effects happen once. A job that outlives `at_most` loses its claim
//! (another instance may then run the period, with a greater fence), and a paused instance may
//! act late; send [`ScheduledRun::fence`] with every write, so the resource refuses the hung
//! run's late writes once the next run's fence has reached it, and check
//! [`ScheduledRun::ensure_valid`] before each side effect.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::backoff::Backoff;
use crate::contract::authority::{Authority, Released};
use crate::contract::error::{Error, Result};
use crate::contract::fence::Fence;
use crate::contract::key::LockKey;
use crate::lease::{Lease, LeaseOptions};
use crate::time::saturating_add;

/// What a claim does when another instance holds the period.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum WhenHeld {
    /// Give up at once: [`Claim::Held`] (the cron case, and the default).
    #[default]
    Skip,
    /// Wait at most this long for the holder's claim to end (released after `at_least`, or run
    /// out at `at_most`), then give up with [`Claim::Held`]. For work that must not run twice
    /// at once but should run on every instance that fires (a migration each node checks).
    Wait(Duration),
}

/// What [`Schedule::claim`] found.
#[derive(Debug)]
#[must_use]
pub enum Claim {
    /// This instance runs the period.
    Run(ScheduledRun),
    /// Another instance holds the period (after waiting, with [`WhenHeld::Wait`]).
    Held,
    /// The tick fired too late in its period for a claim to end before the next one: skipped,
    /// so that the next period is not skipped instead.
    Missed,
}

/// A job scheduled every `period` on many instances, run by one instance per period.
///
/// ```
/// # use std::{sync::Arc, time::Duration};
/// # use leasehold_core::{Authority, Claim, LockKey, Schedule, WhenHeld};
/// # async fn job(_fence: u64) {}
/// # async fn demo(authority: Arc<dyn Authority>) -> leasehold_core::Result<()> {
/// let period = Duration::from_secs(3600);
/// let schedule = Schedule::new(authority, &LockKey::new("report:hourly")?, period)
///     .at_most(Duration::from_secs(600))  // a hung run frees the period after 10 minutes
///     .at_least(Duration::from_secs(30))  // a fast run keeps it 30 s: timers 30 s apart agree
///     .when_held(WhenHeld::Skip);
/// let mut ticks = tokio::time::interval(period);
/// # let mut ticks = tokio::time::interval(Duration::from_millis(1)); let mut n = 0;
/// loop {
///     let due = ticks.tick().await;       // the instant the tick was due, not when it fired
///     if let Claim::Run(run) = schedule.claim(due).await? {
///         run.ensure_valid()?;             // before each side effect
///         job(run.fence().value()).await;  // the fence goes with every write
///         run.finish();                    // released once at_least has passed
///     }
/// #   n += 1; if n == 2 { break; }
/// }
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Schedule {
    authority: Arc<dyn Authority>,
    key: LockKey,
    period: Duration,
    at_most: Option<Duration>,
    at_least: Option<Duration>,
    when_held: WhenHeld,
}

impl Schedule {
    /// A job on `key` that runs once per `period`. Its claims last until shortly before the
    /// next period (see the module's notes on the boundary) unless [`Schedule::at_most`] says
    /// less, and are released only by [`ScheduledRun::finish`] after [`Schedule::at_least`].
    pub fn new(authority: Arc<dyn Authority>, key: &LockKey, period: Duration) -> Self {
        Schedule {
            authority,
            key: key.clone(),
            period,
            at_most: None,
            at_least: None,
            when_held: WhenHeld::Skip,
        }
    }

    /// The claim ends this long after it was taken, even if the job still runs (ShedLock's
    /// `lockAtMostFor`): a hung or crashed run frees the period for another instance, whose
    /// greater fence then refuses the hung run's late writes. Capped at the end of the
    /// period's window; a value below the backend's shortest TTL is [`Error::InvalidTtl`].
    pub fn at_most(mut self, at_most: Duration) -> Self {
        self.at_most = Some(at_most);
        self
    }

    /// The claim is kept at least this long after it was taken, even if the job finished
    /// sooner (ShedLock's `lockAtLeastFor`): an instance whose timer fires later in the same
    /// period (its clock skewed, its process busy) finds it held and skips. Make it longer
    /// than the instances' timers disagree. It cannot outlast the claim: at most `at_most`.
    pub fn at_least(mut self, at_least: Duration) -> Self {
        self.at_least = Some(at_least);
        self
    }

    /// Skip a held period (the default) or wait for it, bounded ([`WhenHeld`]).
    pub fn when_held(mut self, when_held: WhenHeld) -> Self {
        self.when_held = when_held;
        self
    }

    /// The job's key.
    pub fn key(&self) -> &LockKey {
        &self.key
    }

    /// The period.
    pub fn period(&self) -> Duration {
        self.period
    }

    /// The instant by which a claim for the period due at `due` must have ended at the
    /// authority: a tenth of a period and the backend's expiry slack before the next period is
    /// due.
    pub fn window_end(&self, due: Instant) -> Instant {
        let slack = self.authority.capabilities().expiry_slack;
        saturating_add(due, self.period)
            .checked_sub(self.period / 10 + slack)
            .unwrap_or(due)
    }

    /// Claims the period due at `due` (the instant its tick was due: what
    /// `tokio::time::Interval::tick` returns; `Instant::now()` for a timer that never fires
    /// late). See [`Claim`] for the answers.
    ///
    /// [`Error::InvalidConfig`] when `at_least` exceeds `at_most`; [`Error::InvalidTtl`] when
    /// `at_most` is shorter than the backend's shortest TTL.
    pub async fn claim(&self, due: Instant) -> Result<Claim> {
        self.check()?;
        let started = Instant::now();
        let give_up = match self.when_held {
            WhenHeld::Skip => started,
            WhenHeld::Wait(max_wait) => saturating_add(started, max_wait),
        };
        // A claim's end is announced only when it is released; one that runs out at `at_most`
        // is found by reading again, so the wait reads at least every 200 ms.
        let mut backoff = Backoff::new(Duration::from_millis(5), Duration::from_millis(200));
        loop {
            let now = Instant::now();
            let Some(ttl) = self.ttl_at(due, now) else {
                return Ok(Claim::Missed);
            };
            let options = LeaseOptions::default()
                .with_auto_renew(false)
                .with_release_on_drop(false);
            if let Some(lease) =
                Lease::try_acquire(self.authority.clone(), &self.key, ttl, options).await?
            {
                // Counted from the answer, which came after the claim began at the authority,
                // so the claim is kept at least this long there.
                let keep_until = self
                    .at_least
                    .map(|least| saturating_add(Instant::now(), least));
                return Ok(Claim::Run(ScheduledRun { lease, keep_until }));
            }
            let now = Instant::now();
            if now >= give_up {
                return Ok(Claim::Held);
            }
            let next = saturating_add(now, backoff.next_delay()).min(give_up);
            self.authority
                .wait_for_change(&self.key, next - now)
                .await?;
        }
    }

    fn check(&self) -> Result<()> {
        let ttl = &self.authority.capabilities().ttl;
        if let Some(most) = self.at_most {
            if ttl.at_most(most).is_none() {
                return Err(Error::InvalidTtl {
                    ttl: most,
                    reason: format!(
                        "at_most {most:?} is shorter than the backend's shortest TTL of {:?}",
                        ttl.min
                    ),
                });
            }
        }
        if let (Some(least), Some(most)) = (self.at_least, self.at_most) {
            if least > most {
                return Err(Error::InvalidConfig {
                    reason: format!(
                        "at_least {least:?} exceeds at_most {most:?}: a claim cannot be kept \
                         longer than it lasts"
                    ),
                });
            }
        }
        Ok(())
    }

    /// The claim's TTL if it is taken at `now` for the period due at `due`: until the window's
    /// end, at most `at_most`, rounded down to a TTL the backend grants; `None` when none fits.
    fn ttl_at(&self, due: Instant, now: Instant) -> Option<Duration> {
        let window = self.window_end(due).saturating_duration_since(now);
        let want = self.at_most.map_or(window, |most| most.min(window));
        self.authority.capabilities().ttl.at_most(want)
    }
}

/// A claimed period: a lease on the job's key, neither renewed nor released on drop, whose
/// fence is the run's fence.
#[derive(Debug)]
pub struct ScheduledRun {
    lease: Lease,
    keep_until: Option<Instant>,
}

impl ScheduledRun {
    /// The run's fence: send it with every write the job makes.
    pub fn fence(&self) -> Fence {
        self.lease.fence()
    }

    /// `Ok` while the claim lasts: check it right before each side effect.
    pub fn ensure_valid(&self) -> Result<()> {
        self.lease.ensure_valid()
    }

    /// The claim's lease.
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// The claim's lease, for [`crate::claim_period`]'s callers.
    pub fn into_lease(self) -> Lease {
        self.lease
    }

    /// The job is done. With [`Schedule::at_least`], the claim is released once that long has
    /// passed since it was taken (at once if it has; otherwise by a task that waits for it,
    /// and if this process exits first the claim runs out at `at_most`). Without it, the claim
    /// is kept until it runs out, just before the next period.
    pub fn finish(self) {
        let Some(keep_until) = self.keep_until else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let lease = self.lease;
        runtime.spawn(async move {
            tokio::time::sleep_until(keep_until).await;
            match lease.release().await {
                Ok(Released::Released | Released::AlreadyGone) => {}
                Err(error) => {
                    tracing::debug!(%error, "releasing a finished run's claim failed; it runs out by itself");
                }
            }
        });
    }
}
