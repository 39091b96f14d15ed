//! The `Lease` handle: a grant that renews itself and says when it is lost.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::Instrument;

use crate::authority::{Authority, Released};
use crate::error::{Error, Result};
use crate::fence::Fence;
use crate::grant::Grant;
use crate::key::LockKey;
use crate::lost::LostReason;

/// How a [`Lease`] renews and ends.
#[derive(Clone, Debug)]
pub struct LeaseOptions {
    renew_fraction: f64,
    auto_renew: bool,
    max_hold: Option<Duration>,
    release_on_drop: bool,
}

impl Default for LeaseOptions {
    /// Renew every third of the TTL, no maximum hold time, release on drop.
    fn default() -> Self {
        LeaseOptions {
            renew_fraction: 1.0 / 3.0,
            auto_renew: true,
            max_hold: None,
            release_on_drop: true,
        }
    }
}

impl LeaseOptions {
    /// Renew after this fraction of the TTL has passed since the last renewal was sent
    /// (default 1/3, as Redisson's watchdog does). Must be in (0, 1).
    pub fn with_renew_fraction(mut self, fraction: f64) -> Result<Self> {
        if !(fraction > 0.0 && fraction < 1.0) {
            return Err(Error::InvalidConfig {
                reason: format!("renew fraction {fraction} is not between 0 and 1"),
            });
        }
        self.renew_fraction = fraction;
        Ok(self)
    }

    /// Whether to renew in the background at all (default true). Without renewal the lease
    /// simply runs out at its deadline, and `lost()` fires then.
    pub fn with_auto_renew(mut self, yes: bool) -> Self {
        self.auto_renew = yes;
        self
    }

    /// Stop renewing once the lease has been held this long, so a stuck holder cannot keep a
    /// lock forever (a complaint about unlimited auto-extension in other libraries). The lease
    /// then runs out at the end of its last renewal and `lost()` reports
    /// [`LostReason::MaxHoldReached`]. Default: no limit.
    pub fn with_max_hold(mut self, max_hold: Duration) -> Self {
        self.max_hold = Some(max_hold);
        self
    }

    /// Whether dropping an unreleased lease releases it in the background (default true).
    pub fn with_release_on_drop(mut self, yes: bool) -> Self {
        self.release_on_drop = yes;
        self
    }
}

#[derive(Clone, Debug)]
struct State {
    deadline: Instant,
    lost: Option<LostReason>,
}

/// A held lease: the [`Grant`] plus background renewal and loss detection.
///
/// * It renews every [`LeaseOptions::with_renew_fraction`] of the TTL (default 1/3), each time
///   conditionally on still being the owner.
/// * [`Lease::lost`] resolves the moment the lease stops being ours: a renewal refused by the
///   authority ([`LostReason::Refused`]), a renewal that failed at all
///   ([`LostReason::RenewalFailed`]: when ownership is unknown it is treated as lost, at once), or
///   the local deadline passing ([`LostReason::DeadlinePassed`]).
/// * [`Lease::ensure_valid`] is the check to make right before every protected side effect;
///   [`Lease::fence`] is the token to send with it.
/// * [`Lease::release`] frees it. Dropping a lease without releasing it releases it in the
///   background, best effort: if that fails (no runtime, authority unreachable) the authority's
///   TTL is the safety net and the key frees itself when the lease expires.
///
/// ```
/// # use std::{sync::Arc, time::Duration};
/// # use leasehold_core::{Authority, Lease, LeaseOptions, LockKey};
/// # async fn demo(authority: Arc<dyn Authority>) -> leasehold_core::Result<()> {
/// let key = LockKey::new("invoice:inv_72")?;
/// let lease = Lease::acquire(authority, &key, Duration::from_secs(10), Duration::from_secs(5),
///                            LeaseOptions::default()).await?;
/// lease.ensure_valid()?;          // right before the side effect
/// let fence = lease.fence();      // and present this to the resource
/// # let _ = fence;
/// lease.release().await?;
/// # Ok(()) }
/// ```
pub struct Lease {
    authority: Arc<dyn Authority>,
    grant: Grant,
    state: Arc<watch::Sender<State>>,
    task: Option<JoinHandle<()>>,
    release_on_drop: bool,
}

impl Lease {
    /// Acquires `key` (waiting at most `max_wait`) and starts renewing it.
    pub async fn acquire(
        authority: Arc<dyn Authority>,
        key: &LockKey,
        ttl: Duration,
        max_wait: Duration,
        options: LeaseOptions,
    ) -> Result<Lease> {
        let grant = authority.acquire(key, ttl, max_wait).await?;
        Ok(Lease::from_grant(authority, grant, options))
    }

    /// Tries once to acquire `key`; `Ok(None)` when someone else holds it.
    pub async fn try_acquire(
        authority: Arc<dyn Authority>,
        key: &LockKey,
        ttl: Duration,
        options: LeaseOptions,
    ) -> Result<Option<Lease>> {
        Ok(authority
            .try_acquire(key, ttl)
            .await?
            .map(|grant| Lease::from_grant(authority, grant, options)))
    }

    /// Wraps a grant obtained directly from an authority. Must be called inside a tokio runtime.
    pub fn from_grant(authority: Arc<dyn Authority>, grant: Grant, options: LeaseOptions) -> Lease {
        let (tx, _) = watch::channel(State {
            deadline: grant.deadline(),
            lost: None,
        });
        let state = Arc::new(tx);
        let span = tracing::debug_span!(
            "leasehold.lease",
            key = %grant.key(),
            fence = grant.fence().value(),
        );
        let task = tokio::spawn(
            keep(
                authority.clone(),
                grant.clone(),
                state.clone(),
                options.clone(),
            )
            .instrument(span),
        );
        Lease {
            authority,
            grant,
            state,
            task: Some(task),
            release_on_drop: options.release_on_drop,
        }
    }

    /// The key this lease holds.
    pub fn key(&self) -> &LockKey {
        self.grant.key()
    }

    /// The fencing token to present to the protected resource with every write.
    pub fn fence(&self) -> Fence {
        self.grant.fence()
    }

    /// The grant as first handed out (its deadline is not updated by renewals; see
    /// [`Lease::deadline`]).
    pub fn grant(&self) -> &Grant {
        &self.grant
    }

    /// The current local deadline, moved forward by every successful renewal.
    pub fn deadline(&self) -> Instant {
        self.state.borrow().deadline
    }

    /// Time left until the local deadline, zero once lost.
    pub fn remaining(&self) -> Duration {
        let state = self.state.borrow();
        if state.lost.is_some() {
            return Duration::ZERO;
        }
        state.deadline.saturating_duration_since(Instant::now())
    }

    /// `Ok` while the lease is ours: not reported lost and the local deadline still ahead.
    ///
    /// Call it right before each protected side effect, and send [`Lease::fence`] along so the
    /// resource can refuse the write if, despite the check, a newer holder got there first (a
    /// pause between this check and the write is exactly what fencing is for).
    pub fn ensure_valid(&self) -> Result<()> {
        let state = self.state.borrow();
        if let Some(reason) = &state.lost {
            return Err(Error::lease_lost(self.grant.key().as_str(), reason.clone()));
        }
        if Instant::now() >= state.deadline {
            return Err(Error::lease_lost(
                self.grant.key().as_str(),
                LostReason::DeadlinePassed,
            ));
        }
        Ok(())
    }

    /// Resolves when the lease is lost (or released), with the reason.
    ///
    /// The future does not borrow the lease, so it can sit in a `select!` next to the protected
    /// work and cancel it:
    /// ```
    /// # async fn demo(lease: leasehold_core::Lease) {
    /// let lost = lease.lost();
    /// tokio::select! {
    ///     reason = lost => eprintln!("stop: {reason}"),
    ///     _ = async { /* protected work */ } => {}
    /// }
    /// # }
    /// ```
    pub fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        let mut rx = self.state.subscribe();
        async move {
            match rx.wait_for(|s| s.lost.is_some()).await {
                Ok(state) => state.lost.clone().unwrap_or(LostReason::Released),
                Err(_) => LostReason::Released,
            }
        }
    }

    /// Whether the lease has been reported lost.
    pub fn is_lost(&self) -> bool {
        self.state.borrow().lost.is_some()
    }

    /// Stops renewing and releases the lease at the authority (compare-and-release).
    pub async fn release(mut self) -> Result<Released> {
        self.stop(LostReason::Released);
        let outcome = self.authority.release(&self.grant).await;
        self.release_on_drop = false;
        outcome
    }

    fn stop(&mut self, reason: LostReason) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
        self.state.send_if_modified(|s| {
            if s.lost.is_none() {
                s.lost = Some(reason);
                true
            } else {
                false
            }
        });
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.stop(LostReason::Released);
        if !self.release_on_drop {
            return;
        }
        // Best effort: without a runtime, or if the authority is unreachable, the lease simply
        // expires at the authority after its TTL.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let authority = self.authority.clone();
            let grant = self.grant.clone();
            runtime.spawn(async move {
                if let Err(error) = authority.release(&grant).await {
                    tracing::debug!(key = %grant.key(), %error, "release on drop failed; the TTL will free the key");
                }
            });
        }
    }
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.state.borrow();
        f.debug_struct("Lease")
            .field("grant", &self.grant)
            .field("lost", &state.lost)
            .finish_non_exhaustive()
    }
}

fn mark_lost(state: &watch::Sender<State>, reason: LostReason) {
    state.send_if_modified(|s| {
        if s.lost.is_none() {
            tracing::info!(%reason, "lease lost");
            s.lost = Some(reason);
            true
        } else {
            false
        }
    });
}

/// The background task: renew on schedule, and report loss the moment it happens.
async fn keep(
    authority: Arc<dyn Authority>,
    grant: Grant,
    state: Arc<watch::Sender<State>>,
    options: LeaseOptions,
) {
    let ttl = grant.ttl();
    let interval = ttl.mul_f64(options.renew_fraction);
    let hold_until = options.max_hold.map(|h| Instant::now() + h);
    let mut last_sent = Instant::now();
    loop {
        let deadline = state.borrow().deadline;
        let mut next = last_sent + interval;
        if next >= deadline {
            // The last renewal did not move the deadline far (a backend whose session keep-alive
            // lags behind): try again at half the time left instead of giving up on the lease.
            let left = deadline.saturating_duration_since(Instant::now());
            if left >= Duration::from_millis(4) {
                next = Instant::now() + left / 2;
            }
        }
        let may_renew = options.auto_renew && hold_until.is_none_or(|until| next < until);
        if !may_renew || next >= deadline {
            tokio::time::sleep_until(deadline).await;
            let reason = if options.auto_renew && !may_renew {
                LostReason::MaxHoldReached
            } else {
                LostReason::DeadlinePassed
            };
            mark_lost(&state, reason);
            return;
        }
        tokio::time::sleep_until(next).await;
        let sent = Instant::now();
        match tokio::time::timeout_at(deadline, authority.renew(&grant, ttl)).await {
            Ok(Ok(new_deadline)) => {
                last_sent = sent;
                state.send_modify(|s| s.deadline = new_deadline);
            }
            Ok(Err(Error::LeaseLost { reason, .. })) => {
                mark_lost(&state, reason);
                return;
            }
            Ok(Err(error)) => {
                tracing::warn!(%error, "renewal failed; treating the lease as lost");
                mark_lost(&state, LostReason::RenewalFailed(Arc::new(error)));
                // Ownership is unknown: free the key if it is still ours so others need not wait
                // out the TTL. Compare-and-release makes this safe either way.
                let _ = authority.release(&grant).await;
                return;
            }
            Err(_elapsed) => {
                mark_lost(&state, LostReason::DeadlinePassed);
                let _ = authority.release(&grant).await;
                return;
            }
        }
    }
}
