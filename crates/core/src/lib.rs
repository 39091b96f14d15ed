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
//!   fence), [`Semaphore`] (N fenced slots), [`claim_period`] (scheduled work), [`acquire_or`]
//!   (failing open or closed, declared).
//! * [`Capabilities`]: what a backend promises, read by the conformance suite.
//! * [`Error`]: one `#[non_exhaustive]` enum that separates bad input, contention and outages.
//!
//! Applications normally depend on the `leasehold` facade crate, which re-exports all of this and
//! adds `connect(url)`.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod authority;
mod backoff;
mod batch_answers;
mod batched_renewal;
mod capabilities;
mod connection_url;
mod election;
mod error;
mod exclusion;
mod fence;
mod grant;
mod if_unavailable;
mod inspection;
mod instrument;
mod key;
mod key_prefix;
mod lease;
mod lease_state;
mod loss_signal;
mod lost;
mod margin;
mod options;
mod owner;
mod redact;
mod resource;
mod schedule;
mod semaphore;
pub mod telemetry;
pub mod time;
mod ttl;
mod unclaimed;

pub use authority::{check_proclaimed, Authority, Released, MAX_VALUE_LEN};
pub use backoff::{poll_acquire, Backoff};
pub use batch_answers::{batch_answers, batch_failed, check_batch_ttls};
pub use capabilities::{Capabilities, WaitStrategy};
pub use connection_url::{ConnectionUrl, UrlHost};
pub use election::{Election, Leader, Leadership, Observer, DEFAULT_OBSERVE_INTERVAL};
pub use error::{ArcError, BoxError, Error, Result};
pub use exclusion::ExclusionSafety;
pub use fence::{Epoch, Fence, FenceSafety, FencingToken};
pub use grant::Grant;
pub use if_unavailable::{acquire_or, is_unavailable, Admission, IfUnavailable, Unlocked};
pub use inspection::{Inspection, OwnerId};
pub use instrument::Instrumented;
pub use key::{LockKey, MAX_KEY_LEN};
pub use key_prefix::{KeyPrefix, SmallestKeys};
pub use lease::{Lease, LeaseOptions};
pub use lease_state::{LeaseState, LeaseWatch};
pub use loss_signal::LossSignal;
pub use lost::LostReason;
pub use margin::SafetyMargin;
pub use options::{percent_decode, ClientOptions, UrlParams};
pub use owner::OwnerToken;
pub use redact::{is_secret_param, redact_url, Secret};
pub use resource::{FencedRegister, FencedResource, Guarded};
pub use schedule::{claim_period, claim_ttl};
pub use semaphore::{Permit, Semaphore, MAX_PERMITS};
pub use ttl::TtlRange;
pub use unclaimed::{claim_or_give_back, Left, Unanswered};

/// Re-exported so backends and tests use the same monotonic clock type (tokio's, which
/// `tokio::time::pause()` controls in tests).
pub use tokio::time::Instant;
