//! The lease: a grant that renews itself and says when it is lost ([`Lease`]), its state as
//! the holder sees it ([`LeaseState`], [`LeaseWatch`]), the loss signal a backend fires when it
//! learns of a loss first ([`LossSignal`]), and the batches in which the leases of one client
//! renew together.

pub(crate) mod batched_renewal;
pub(crate) mod loss_signal;
pub(crate) mod state;

pub use loss_signal::LossSignal;
pub use state::{LeaseState, LeaseWatch};

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::Instrument;

use crate::backend::backoff::Backoff;
use crate::contract::authority::{Authority, Released};
use crate::contract::error::{Error, Result};
use crate::contract::fence::Fence;
use crate::contract::grant::Grant;
use crate::contract::key::LockKey;
use crate::contract::lost::LostReason;
use crate::lease::batched_renewal::Renewals;
use crate::lease::state::Published;
use crate::telemetry::{HoldRecord, RenewalOutcome};
use crate::time::saturating_add;

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

/// A held lease: the [`Grant`] plus background renewal and loss detection.
///
/// * It renews every [`LeaseOptions::with_renew_fraction`] of the TTL (default 1/3), each time
///   conditionally on still being the owner.
/// * A renewal refused by the authority loses the lease at once ([`LostReason::Refused`]). A
///   renewal whose outcome is unknown (no answer, a broken connection) *suspends* it
///   ([`LeaseState::Suspended`]): [`Lease::ensure_valid`] fails at once, renewal is retried with
///   jittered backoff, and the lease is held again if a renewal lands before the local deadline,
///   or lost ([`LostReason::RenewalFailed`]) when the deadline passes first.
/// * A backend that learns its session ended (an etcd lease revoked, a ZooKeeper session
///   expired) loses every lease on it at once ([`LostReason::SessionEnded`]).
/// * [`Lease::lost`] resolves the moment the lease is lost; [`Lease::watch`] follows every
///   change of [`LeaseState`].
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
    state: Arc<watch::Sender<Published>>,
    task: Option<JoinHandle<()>>,
    release_on_drop: bool,
    auto_renew: bool,
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
        let record = HoldRecord::start(
            authority.capabilities().backend,
            grant.key().clone(),
            grant.ttl(),
        );
        let (tx, _) = watch::channel(Published {
            deadline: grant.deadline(),
            state: LeaseState::Held,
            record: Arc::new(record),
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
            auto_renew: options.auto_renew,
        }
    }

    /// The authority that granted the lease.
    pub fn authority(&self) -> &Arc<dyn Authority> {
        &self.authority
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
        if self.lost_now().is_some() {
            return Duration::ZERO;
        }
        self.deadline().saturating_duration_since(Instant::now())
    }

    /// Where the lease stands now. The local deadline and the backend's loss signal are checked
    /// here too, so the answer is right even before the renewal task has run.
    pub fn state(&self) -> LeaseState {
        match self.lost_now() {
            Some(reason) => LeaseState::Lost(reason),
            None => self.state.borrow().state.clone(),
        }
    }

    /// A watch of the lease's state as the renewal task publishes it (held, suspended, lost),
    /// for a task that must stop starting work while the lease is suspended. Changes in quick
    /// succession may reach it as one; [`Lease::state`] is the authoritative answer at any
    /// instant.
    pub fn watch(&self) -> LeaseWatch {
        LeaseWatch::new(self.state.subscribe())
    }

    /// `Ok` while the lease is held: not lost, not suspended, the local deadline still ahead, and
    /// the backend's session not reported ended.
    ///
    /// Call it right before each protected side effect, and send [`Lease::fence`] along so the
    /// resource can refuse the write if, despite the check, a newer holder got there first (a
    /// pause between this check and the write is exactly what fencing is for).
    pub fn ensure_valid(&self) -> Result<()> {
        let key = self.grant.key().as_str();
        match self.state() {
            LeaseState::Held => Ok(()),
            LeaseState::Suspended => Err(Error::LeaseSuspended {
                key: key.to_string(),
            }),
            LeaseState::Lost(reason) => Err(Error::lease_lost(key, reason)),
        }
    }

    /// Lost, from what is known this instant: the published state, the backend's signal, the
    /// local deadline. Never waits for the renewal task, and records what it finds, so a loss
    /// seen here is final: a renewal answered later cannot make the lease held again.
    fn lost_now(&self) -> Option<LostReason> {
        let found = {
            let published = self.state.borrow();
            if let LeaseState::Lost(reason) = &published.state {
                return Some(reason.clone());
            }
            if let Some(reason) = self.grant.loss_signal().and_then(|s| s.fired()) {
                reason
            } else if Instant::now() >= published.deadline {
                LostReason::DeadlinePassed
            } else {
                return None;
            }
        };
        mark_lost(&self.state, found.clone());
        Some(found)
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
            let lost = match rx.wait_for(|p| p.state.is_lost()).await {
                Ok(p) => match &p.state {
                    LeaseState::Lost(reason) => Some(reason.clone()),
                    _ => None,
                },
                Err(_) => None,
            };
            lost.unwrap_or(LostReason::Released)
        }
    }

    /// Whether the lease is lost (reported, or its deadline passed, or its session ended).
    pub fn is_lost(&self) -> bool {
        self.lost_now().is_some()
    }

    /// Extends the lease to `ttl` from now, by hand: for a lease that does not renew in the
    /// background ([`LeaseOptions::with_auto_renew`] false), whose holder decides when it needs
    /// more time (a permit with its own lease time). Returns the new local deadline, counted
    /// from before the request, which may also be sooner than the old one (a shorter `ttl`).
    ///
    /// * Conditional on still holding the lease, as every renewal is: a lease that is lost
    ///   (expired, revoked, released) gets [`Error::LeaseLost`] and stays lost.
    /// * A `ttl` other than the grant's is [`Error::InvalidTtl`] where the backend cannot change
    ///   it ([`crate::Capabilities::renew_with_other_ttl`]).
    /// * A lease renewed in the background is [`Error::InvalidConfig`]: two renewers would race
    ///   over which deadline the authority kept.
    /// * An error that leaves the outcome unknown keeps the old deadline (the authority may
    ///   have extended the lease; it cannot have shortened it below the old one unless asked
    ///   for a shorter `ttl`, so ask again before relying on a shorter one).
    pub async fn renew(&mut self, ttl: Duration) -> Result<Instant> {
        if self.auto_renew {
            return Err(Error::InvalidConfig {
                reason: format!(
                    "the lease on `{}` renews in the background; renew by hand only a lease \
                     made with auto-renew off",
                    self.grant.key()
                ),
            });
        }
        self.ensure_valid()?;
        let answer = self.authority.renew(&self.grant, ttl).await;
        let key = self.grant.key().as_str();
        match answer {
            Ok(deadline) => {
                if let Some(reason) = self.lost_now() {
                    // Answered after the old deadline passed here: the loss was final then.
                    let _ = self.authority.release(&self.grant).await;
                    return Err(Error::lease_lost(key, reason));
                }
                let kept = self.state.send_if_modified(|p| {
                    if p.state.is_lost() {
                        false
                    } else {
                        p.deadline = deadline;
                        true
                    }
                });
                match (kept, self.lost_now()) {
                    (true, None) => Ok(deadline),
                    (_, reason) => Err(Error::lease_lost(
                        key,
                        reason.unwrap_or(LostReason::DeadlinePassed),
                    )),
                }
            }
            Err(Error::LeaseLost { reason, .. }) => {
                mark_lost(&self.state, reason.clone());
                Err(Error::lease_lost(key, reason))
            }
            Err(other) => Err(other),
        }
    }

    /// Stops renewing and releases the lease at the authority (compare-and-release).
    pub async fn release(mut self) -> Result<Released> {
        self.stop(LostReason::Released);
        let outcome = self.authority.release(&self.grant).await;
        self.release_on_drop = false;
        outcome
    }

    fn stop(&mut self, reason: LostReason) {
        // Publish first: the aborted task may be dropped at once on another worker thread, and
        // its exit guard would otherwise report "the renewal task ended unexpectedly" as the
        // loss of a lease that was simply released.
        self.state.send_if_modified(|p| {
            if p.state.is_lost() {
                false
            } else {
                p.record.ended(&reason);
                p.state = LeaseState::Lost(reason);
                true
            }
        });
        if let Some(task) = self.task.take() {
            task.abort();
        }
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
            .field("state", &state.state)
            .finish_non_exhaustive()
    }
}

fn mark_lost(state: &watch::Sender<Published>, reason: LostReason) {
    state.send_if_modified(|p| {
        if p.state.is_lost() {
            false
        } else {
            tracing::info!(%reason, "lease lost");
            p.record.ended(&reason);
            p.state = LeaseState::Lost(reason);
            true
        }
    });
}

fn mark(state: &watch::Sender<Published>, next: LeaseState) {
    state.send_if_modified(|p| {
        let changed = !p.state.is_lost() && p.state.is_held() != next.is_held();
        if changed {
            match next {
                LeaseState::Suspended => {
                    tracing::warn!("lease suspended: renewal outcome unknown")
                }
                _ => tracing::info!("lease held again: renewal landed"),
            }
            p.state = next;
        }
        changed
    });
}

/// The background task: renew on schedule, and report loss the moment it happens, whether the
/// renewal task finds it or the backend pushes it.
async fn keep(
    authority: Arc<dyn Authority>,
    grant: Grant,
    state: Arc<watch::Sender<Published>>,
    options: LeaseOptions,
) {
    let session_ended = {
        let signal = grant.loss_signal().cloned();
        async move {
            match signal {
                Some(signal) => signal.wait().await,
                None => std::future::pending().await,
            }
        }
    };
    // If the task ends without having published a loss (a backend's renew panicked, the runtime
    // shut down), `lost()` must still resolve: nobody renews this lease any more.
    let _guard = LostOnExit(state.clone());
    let renewals = Renewals::of(&authority);
    tokio::select! {
        reason = session_ended => mark_lost(&state, reason),
        () = renew_until_lost(&*authority, renewals.as_ref(), &grant, &state, &options) => {}
    }
}

struct LostOnExit(Arc<watch::Sender<Published>>);

impl Drop for LostOnExit {
    fn drop(&mut self) {
        let ended = Error::Backend {
            backend: "leasehold",
            message: "the lease's renewal task ended unexpectedly".into(),
            retryable: false,
            source: None,
        };
        mark_lost(&self.0, LostReason::RenewalFailed(Arc::new(ended)));
    }
}

async fn renew_until_lost(
    authority: &dyn Authority,
    renewals: Option<&Arc<Renewals>>,
    grant: &Grant,
    state: &watch::Sender<Published>,
    options: &LeaseOptions,
) {
    let ttl = grant.ttl();
    let interval = ttl.mul_f64(options.renew_fraction);
    let hold_until = options.max_hold.map(|h| saturating_add(Instant::now(), h));
    // Retries of a renewal with unknown outcome: a few per TTL, jittered so a crowd of leases on
    // one recovering authority does not retry in lockstep.
    let mut retry = Backoff::new(
        (ttl / 50).clamp(Duration::from_millis(2), Duration::from_millis(50)),
        (ttl / 8).clamp(Duration::from_millis(5), Duration::from_millis(500)),
    );
    let mut last_sent = Instant::now();
    let mut last_error: Option<Error> = None;
    loop {
        let (deadline, suspended) = {
            let p = state.borrow();
            (p.deadline, matches!(p.state, LeaseState::Suspended))
        };
        if options.auto_renew && ended(state) {
            // The deadline passed while this task could not run (a blocked runtime, a paused
            // process), and `lost_now()` may have reported it already: a lost lease renews
            // nothing, and gives back what the authority may still hold for the margin.
            lose_and_give_back(authority, grant, state, last_error.take()).await;
            return;
        }
        let now = Instant::now();
        let mut next = if suspended {
            saturating_add(now, retry.next_delay())
        } else {
            saturating_add(last_sent, interval)
        };
        if next >= deadline {
            // The last renewal did not move the deadline far (a backend whose session keep-alive
            // lags behind): try again at half the time left instead of giving up on the lease.
            let left = deadline.saturating_duration_since(now);
            if left >= Duration::from_millis(4) {
                next = now + left / 2;
            }
        }
        let may_renew = options.auto_renew && hold_until.is_none_or(|until| next < until);
        if !options.auto_renew {
            // Renewed by hand only ([`Lease::renew`]): wait for the deadline, unless a renewal
            // moves it first.
            let mut rx = state.subscribe();
            tokio::select! {
                () = tokio::time::sleep_until(deadline) => {}
                changed = rx.wait_for(|p| p.deadline != deadline || p.state.is_lost()) => {
                    if changed.map_or(true, |p| p.state.is_lost()) {
                        return;
                    }
                    continue;
                }
            }
        }
        if !may_renew || next >= deadline {
            tokio::time::sleep_until(deadline).await;
            let reason = if options.auto_renew && !may_renew {
                LostReason::MaxHoldReached
            } else if let Some(error) = last_error.take() {
                LostReason::RenewalFailed(Arc::new(error))
            } else {
                LostReason::DeadlinePassed
            };
            let unknown = suspended;
            mark_lost(state, reason);
            if unknown {
                give_back(authority, grant).await;
            }
            return;
        }
        match renewals {
            // Renewing early, with a batch that goes out anyway, is free and always safe.
            Some(batch) if !suspended => batch.sleep_until(next, interval / 2).await,
            _ => tokio::time::sleep_until(next).await,
        }
        if ended(state) {
            // Woken late: the lease may have been reported lost meanwhile.
            lose_and_give_back(authority, grant, state, last_error.take()).await;
            return;
        }
        let sent = Instant::now();
        let outcome = attempt(authority, renewals, grant, state, ttl, sent, deadline).await;
        let in_time = Instant::now() < deadline;
        let record = state.borrow().record.clone();
        record.renewal(match &outcome {
            Attempt::Renewed(_) if in_time => RenewalOutcome::Renewed,
            Attempt::Renewed(_) | Attempt::NoAnswer => RenewalOutcome::Late,
            Attempt::Failed(Error::LeaseLost { .. }) => RenewalOutcome::Refused,
            Attempt::Failed(error) if !error.is_retryable() => RenewalOutcome::Failed,
            Attempt::Failed(_) => RenewalOutcome::Unknown,
        });
        match outcome {
            Attempt::Renewed(new_deadline) if in_time => {
                last_sent = sent;
                last_error = None;
                retry.reset();
                // Only a lease nobody reported lost takes the new deadline: `lost_now()` may
                // have seen the old one pass between the answer and here, and loss is final.
                let kept = state.send_if_modified(|p| {
                    if p.state.is_lost() {
                        false
                    } else {
                        p.deadline = new_deadline;
                        true
                    }
                });
                if !kept {
                    give_back(authority, grant).await;
                    return;
                }
                mark(state, LeaseState::Held);
            }
            Attempt::Renewed(_) | Attempt::NoAnswer => {
                // Answered only after the local deadline, or not at all: the lease was already
                // reported lost by then (loss is final), so give the key back.
                let reason = match last_error.take() {
                    Some(error) => LostReason::RenewalFailed(Arc::new(error)),
                    None => LostReason::DeadlinePassed,
                };
                mark_lost(state, reason);
                give_back(authority, grant).await;
                return;
            }
            Attempt::Failed(Error::LeaseLost { reason, .. }) => {
                mark_lost(state, reason);
                return;
            }
            Attempt::Failed(error) if !error.is_retryable() => {
                tracing::warn!(%error, "renewal failed for good; the lease is lost");
                mark_lost(state, LostReason::RenewalFailed(Arc::new(error)));
                give_back(authority, grant).await;
                return;
            }
            Attempt::Failed(error) => {
                tracing::debug!(%error, "renewal outcome unknown; retrying until the deadline");
                last_error = Some(error);
                mark(state, LeaseState::Suspended);
            }
        }
    }
}

/// Whether the lease is over as far as this task can tell: reported lost, or its local
/// deadline passed.
fn ended(state: &watch::Sender<Published>) -> bool {
    let p = state.borrow();
    p.state.is_lost() || Instant::now() >= p.deadline
}

/// Loses the lease (the last renewal's error as the reason, if there was one; a loss already
/// reported stands) and gives the key back.
async fn lose_and_give_back(
    authority: &dyn Authority,
    grant: &Grant,
    state: &watch::Sender<Published>,
    last_error: Option<Error>,
) {
    let reason = match last_error {
        Some(error) => LostReason::RenewalFailed(Arc::new(error)),
        None => LostReason::DeadlinePassed,
    };
    mark_lost(state, reason);
    give_back(authority, grant).await;
}

/// How one renewal attempt ended.
enum Attempt {
    Renewed(Instant),
    Failed(Error),
    /// No answer by the local deadline.
    NoAnswer,
}

/// One renewal, awaited until the local deadline at most. If it has not answered by half the
/// time left (but at least a tenth of the TTL, so a loaded machine's slow answer is not taken for
/// none), its outcome is unknown: the lease is suspended while the request stays in flight, and
/// an answer that lands before the deadline makes it held again.
async fn attempt(
    authority: &dyn Authority,
    renewals: Option<&Arc<Renewals>>,
    grant: &Grant,
    state: &watch::Sender<Published>,
    ttl: Duration,
    sent: Instant,
    deadline: Instant,
) -> Attempt {
    let left = deadline.saturating_duration_since(sent);
    let suspect_at = sent + (left / 2).max(left.min(ttl / 10));
    let renewal = async {
        match renewals {
            Some(batch) => batch.renew(grant).await,
            None => authority.renew(grant, ttl).await,
        }
    };
    tokio::pin!(renewal);
    let mut suspected = false;
    loop {
        tokio::select! {
            biased;
            result = &mut renewal => {
                return match result {
                    Ok(new_deadline) => Attempt::Renewed(new_deadline),
                    Err(error) => Attempt::Failed(error),
                };
            }
            () = tokio::time::sleep_until(deadline) => return Attempt::NoAnswer,
            () = tokio::time::sleep_until(suspect_at), if !suspected => {
                suspected = true;
                mark(state, LeaseState::Suspended);
            }
        }
    }
}

/// After a loss whose cause is unknown, free the key if it is still ours so others need not wait
/// out the TTL. Compare-and-release makes this safe either way; bounded, best effort.
async fn give_back(authority: &dyn Authority, grant: &Grant) {
    let _ = tokio::time::timeout(grant.ttl(), authority.release(grant)).await;
}
