//! Patterns built on leases, for every backend: they use only the [`Authority`](crate::Authority)
//! contract, so each works wherever a lock does.
//!
//! [`Election`] (a leader whose epoch is its fence), [`Semaphore`] (N fenced slots),
//! [`RwLock`] (many readers or one writer, fenced in one order), [`acquire_all`] (several keys,
//! all or nothing), [`claim_period`] and [`Schedule`] (scheduled work that runs once per period
//! across processes, with ShedLock's options), and [`acquire_or`] (failing open or closed when
//! the authority is unavailable, declared).

pub(crate) mod election;
pub(crate) mod election_handoff;
pub(crate) mod epoch_guard;
pub(crate) mod if_unavailable;
pub(crate) mod multi_key;
pub(crate) mod rw_lock;
pub(crate) mod schedule;
pub(crate) mod scheduled_claim;
pub(crate) mod semaphore;
pub(crate) mod semaphore_status;
pub(crate) mod taken;

pub use election::{Election, Leader, Leadership, Observer, DEFAULT_OBSERVE_INTERVAL};
pub use epoch_guard::EpochGuard;
pub use if_unavailable::{acquire_or, is_unavailable, Admission, IfUnavailable, Unlocked};
pub use multi_key::{acquire_all, canonical, check_canonical, MultiLease, MAX_KEYS};
pub use rw_lock::{
    ReadGuard, RwLock, UpgradeableRead, WriteGuard, DEFAULT_MAX_READERS, MAX_READERS,
};
pub use schedule::{claim_period, claim_ttl};
pub use scheduled_claim::{Claim, Schedule, ScheduledRun, WhenHeld};
pub use semaphore::{Permit, Semaphore, MAX_PERMITS};
pub use semaphore_status::{PermitHolder, SemaphoreStatus};
