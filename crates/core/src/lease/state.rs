//! Where a lease stands: held, suspended, or lost.

use std::fmt;

use tokio::sync::watch;

use crate::contract::lost::LostReason;

/// The state of a [`crate::Lease`], as its renewal task last learned it.
///
/// The model is Curator's connection states applied to one lease:
/// * **Held**: the last renewal succeeded (or none was due yet) and the local deadline is ahead.
/// * **Suspended**: a renewal's outcome is unknown (the authority did not answer, or the request
///   failed on the way). The lease may still be ours, but nobody can say, so
///   [`crate::Lease::ensure_valid`] fails at once and no new protected side effect may start.
///   Renewal goes on with jittered backoff until the local deadline. A renewal that lands in time
///   makes the lease held again, with the same fence.
/// * **Lost**: final. The authority refused a renewal, the backend's session ended, the local
///   deadline passed while suspended, or the holder released it.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum LeaseState {
    /// Ours, as far as anyone can know.
    Held,
    /// The last renewal's outcome is unknown: do not start side effects, renewal goes on.
    Suspended,
    /// No longer ours, for good.
    Lost(LostReason),
}

impl LeaseState {
    /// Whether this is [`LeaseState::Held`].
    pub fn is_held(&self) -> bool {
        matches!(self, LeaseState::Held)
    }

    /// Whether this is [`LeaseState::Lost`].
    pub fn is_lost(&self) -> bool {
        matches!(self, LeaseState::Lost(_))
    }

    fn same_kind(&self, other: &LeaseState) -> bool {
        std::mem::discriminant(self) == std::mem::discriminant(other)
    }
}

impl fmt::Display for LeaseState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LeaseState::Held => f.write_str("held"),
            LeaseState::Suspended => f.write_str("suspended: renewal outcome unknown"),
            LeaseState::Lost(reason) => write!(f, "lost: {reason}"),
        }
    }
}

/// What the renewal task publishes: the state and the current local deadline.
#[derive(Clone, Debug)]
pub(crate) struct Published {
    pub(crate) deadline: tokio::time::Instant,
    pub(crate) state: LeaseState,
    /// What the lease's end is recorded against (`leasehold_leases_held` and the rest).
    pub(crate) record: std::sync::Arc<crate::telemetry::HoldRecord>,
}

/// A watch of a lease's state changes, from [`crate::Lease::watch`]. It does not borrow the
/// lease, so it can live in another task.
#[derive(Debug)]
pub struct LeaseWatch {
    rx: watch::Receiver<Published>,
    seen: LeaseState,
}

impl LeaseWatch {
    pub(crate) fn new(rx: watch::Receiver<Published>) -> Self {
        let seen = rx.borrow().state.clone();
        LeaseWatch { rx, seen }
    }

    /// The state now.
    pub fn current(&self) -> LeaseState {
        self.rx.borrow().state.clone()
    }

    /// The local deadline as the renewal task last published it: moved forward by every
    /// renewal that lands.
    pub fn deadline(&self) -> tokio::time::Instant {
        self.rx.borrow().deadline
    }

    /// Waits for the renewal task's next publication (a renewal landed, or the state changed)
    /// and returns the local deadline it carries; `None` once the lease and its task are gone.
    /// For a watch kept only for this; [`LeaseWatch::changed`] shares its place in the stream.
    pub async fn deadline_changed(&mut self) -> Option<tokio::time::Instant> {
        self.rx.changed().await.ok()?;
        Some(self.rx.borrow_and_update().deadline)
    }

    /// Waits for the state to change from the one this watch last returned (or saw when made),
    /// and returns the new one. Once lost, returns the lost state at once.
    pub async fn changed(&mut self) -> LeaseState {
        if self.seen.is_lost() {
            return self.seen.clone();
        }
        let seen = self.seen.clone();
        let next = match self.rx.wait_for(|p| !p.state.same_kind(&seen)).await {
            Ok(p) => p.state.clone(),
            // The lease and its task are gone: it was released or dropped.
            Err(_) => LeaseState::Lost(LostReason::Released),
        };
        self.seen = next.clone();
        next
    }
}
