//! Why a lease stopped being ours.

use std::fmt;
use std::sync::Arc;

use crate::contract::error::Error;

/// Why a lease is no longer valid. Delivered by [`crate::Lease::lost`] and carried by
/// [`Error::LeaseLost`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum LostReason {
    /// The authority said we are not the owner any more: the lease expired there (and may
    /// already belong to someone else), or it was deleted by an operator.
    Refused,
    /// Renewal failed: either with a permanent error (credentials, configuration), or with
    /// errors of unknown outcome (the authority unreachable) until the local deadline passed.
    /// Carries the last error, behind an `Arc`: [`Error::LeaseLost`] carries a `LostReason` in
    /// turn, and everyone waiting on [`crate::Lease::lost`] gets a clone of this one.
    RenewalFailed(Arc<Error>),
    /// The local deadline (monotonic clock, started before the request, minus the safety
    /// margin) passed without a successful renewal.
    DeadlinePassed,
    /// The backend's session ended (a ZooKeeper session expired, an etcd session lease was
    /// revoked or expired), taking every lease on it along.
    SessionEnded,
    /// The holder released the lease.
    Released,
    /// Renewal stopped on purpose because the lease reached its configured maximum hold time
    /// ([`crate::LeaseOptions::with_max_hold`]), and the last renewal's validity ran out.
    MaxHoldReached,
}

impl LostReason {
    /// A short, stable name for the reason: the `reason` label of
    /// `leasehold_leases_lost_total`.
    pub fn kind(&self) -> &'static str {
        match self {
            LostReason::Refused => "refused",
            LostReason::RenewalFailed(_) => "renewal_failed",
            LostReason::DeadlinePassed => "deadline_passed",
            LostReason::SessionEnded => "session_ended",
            LostReason::Released => "released",
            LostReason::MaxHoldReached => "max_hold_reached",
        }
    }
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LostReason::Refused => f.write_str("the authority refused the renewal: not the owner"),
            LostReason::RenewalFailed(e) => write!(f, "renewal failed: {e}"),
            LostReason::DeadlinePassed => f.write_str("the local deadline passed"),
            LostReason::SessionEnded => f.write_str("the backend session ended"),
            LostReason::Released => f.write_str("released by the holder"),
            LostReason::MaxHoldReached => f.write_str("the maximum hold time was reached"),
        }
    }
}
