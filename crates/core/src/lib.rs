//! # leasehold-core
//!
//! The vocabulary of leasehold, shared by every backend.
//!
//! Separate processes ask an **authority** (etcd, ZooKeeper, PostgreSQL, Redis) for a
//! time-limited **lease** on a key. A lease cannot stop a holder that paused (a GC pause, a
//! stopped VM, a slow disk) from acting after its lease ran out. So every **grant** carries a
//! **fencing token**, a number that only grows, and the protected resource refuses writes
//! carrying an older one than it has seen. The lease decides who may *try*; the resource decides
//! which writes *count*.
//!
//! The pieces:
//! * [`Authority`]: try-acquire, acquire with a bounded wait, conditional renew,
//!   compare-and-release. Each method documents its `# Contract`.
//! * [`Inspection`]: a read-only snapshot of a key ([`Authority::inspect`]), for status and
//!   diagnostics, never for deciding to act.
//! * [`Grant`]: key, [`OwnerToken`] (128 random bits), [`Fence`], and a local deadline on the
//!   monotonic clock.
//! * [`Lease`]: a grant that renews itself in the background and tells you the moment it is
//!   lost ([`Lease::lost`], [`Lease::ensure_valid`]).
//! * [`FencingToken`] and [`Fence`]: ordered tokens with a declared [`FenceSafety`] and a
//!   deployment [`Epoch`].
//! * [`FencedResource`] and [`FencedRegister`]: the resource side, which refuses stale writes.
//! * Patterns built on leases, for every backend: [`Election`] (a leader whose epoch is its
//!   fence), [`Semaphore`] (N fenced slots), [`RwLock`] (readers or a writer, one fence order),
//!   [`acquire_all`] (several keys, all or nothing), [`claim_period`] (scheduled work),
//!   [`acquire_or`] (failing open or closed, declared).
//! * [`Capabilities`]: what a backend promises, read by the conformance suite.
//! * [`Error`]: one `#[non_exhaustive]` enum that separates bad input, contention and outages.
//!
//! Applications normally depend on the `leasehold` facade crate, which re-exports the user API
//! by name (never the [`backend`] module, which is for backend authors) and adds `connect(url)`.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod backend;
mod contract;
mod instrument;
mod lease;
mod recipes;
pub mod telemetry;
pub mod time;

pub use contract::{
    ArcError, Authority, BoxError, Capabilities, ClientOptions, Epoch, Error, ExclusionSafety,
    Fence, FenceSafety, FencedRegister, FencedResource, FencingToken, Grant, Guarded, Inspection,
    KeyPrefix, LockKey, LostReason, OwnerId, OwnerToken, Released, Result, RevocationNotice,
    Revoked, SafetyMargin, TtlRange, WaitStrategy, MAX_KEY_LEN, MAX_VALUE_LEN,
};
pub use instrument::Instrumented;
pub use lease::{Lease, LeaseOptions, LeaseState, LeaseWatch, LossSignal};
pub use recipes::{
    acquire_all, acquire_or, canonical, claim_period, claim_ttl, is_unavailable, Admission, Claim,
    Election, EpochGuard, IfUnavailable, Leader, Leadership, MultiLease, Observer, Permit,
    PermitHolder, ReadGuard, RwLock, Schedule, ScheduledRun, Semaphore, SemaphoreStatus, Unlocked,
    UpgradeableRead, WhenHeld, WriteGuard, DEFAULT_MAX_READERS, DEFAULT_OBSERVE_INTERVAL, MAX_KEYS,
    MAX_PERMITS, MAX_READERS,
};

/// Re-exported so backends and tests use the same monotonic clock type (tokio's, which
/// `tokio::time::pause()` controls in tests).
pub use tokio::time::Instant;
