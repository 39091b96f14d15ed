//! What a backend can and cannot promise, declared so tests and reports can read it.

use std::time::Duration;

use crate::contract::exclusion::ExclusionSafety;
use crate::contract::fence::FenceSafety;
use crate::contract::ttl::TtlRange;

/// How a backend waits for a held lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum WaitStrategy {
    /// The authority notifies waiters (etcd and ZooKeeper watches, Redis pub/sub, PostgreSQL
    /// LISTEN/NOTIFY), with a timer at the holder's expiry as a fallback.
    Notification,
    /// Waiters retry with jittered backoff.
    Polling,
}

/// How a holder learns that its lease was revoked ([`crate::Authority::revoke`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RevocationNotice {
    /// The authority pushes it (an etcd watch on the holder's key, a ZooKeeper watch on the
    /// holder's node): the holder's
    /// [`crate::Lease::lost`] fires within a round trip.
    Pushed,
    /// The holder finds out when its next renewal is refused: within one renewal period
    /// ([`crate::LeaseOptions::with_renew_fraction`] of the TTL).
    NextRenewal,
}

/// A backend's declared behaviour.
///
/// The conformance suite reads it to decide which scenarios apply and what they may expect, and
/// the conformance report prints it, so a backend's weaknesses are stated, not discovered.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// The backend's name (`"etcd"`, `"redis"`, ...).
    pub backend: &'static str,
    /// Whether fences can repeat after a failover.
    pub fence_safety: FenceSafety,
    /// Whether fences keep growing across a restart of the server (false for Redis without
    /// persistence).
    pub durable_fences: bool,
    /// Whether the authority can end a live lease before its TTL (a server defect, found at
    /// connect).
    pub exclusion: ExclusionSafety,
    /// How `acquire` waits.
    pub wait: WaitStrategy,
    /// The TTLs the backend grants exactly.
    pub ttl: TtlRange,
    /// Whether `renew` may ask for a different TTL than the grant had. False where the TTL is a
    /// property of a shared session (ZooKeeper, etcd sessions).
    pub renew_with_other_ttl: bool,
    /// How late after a TTL ends the authority may notice it (its expiry sweep or session
    /// tick). Zero where expiry is checked on every access.
    pub expiry_slack: Duration,
    /// Whether [`crate::Authority::renew_many`] renews many grants in one request. When it
    /// does, [`crate::Lease`]s on one authority renew together, a batch per renewal tick.
    pub batch_renewal: bool,
    /// How a revoked holder learns of it.
    pub revocation: RevocationNotice,
    /// Whether [`crate::Authority::inspect`] counts the contenders waiting for a held key
    /// ([`crate::Inspection::waiters`]): true where waiters queue in the authority itself
    /// (etcd keys, ZooKeeper nodes), so the count is read, not guessed.
    pub counts_waiters: bool,
    /// Whether [`crate::Authority::try_acquire_all`] takes a set of keys in one atomic step
    /// (an etcd transaction, one SQL transaction, one Redis script). Where it does,
    /// [`crate::acquire_all`] tries that first and takes the keys one by one only while some are
    /// held.
    pub atomic_acquire_all: bool,
}

impl Capabilities {
    /// Declares a backend: notification-based waiting, renewal with any valid TTL and no expiry
    /// slack unless changed with the `with_*` methods.
    pub fn new(
        backend: &'static str,
        fence_safety: FenceSafety,
        durable_fences: bool,
        ttl: TtlRange,
    ) -> Self {
        Capabilities {
            backend,
            fence_safety,
            durable_fences,
            exclusion: ExclusionSafety::Exclusive,
            wait: WaitStrategy::Notification,
            ttl,
            renew_with_other_ttl: true,
            expiry_slack: Duration::ZERO,
            batch_renewal: false,
            revocation: RevocationNotice::NextRenewal,
            counts_waiters: false,
            atomic_acquire_all: false,
        }
    }

    /// Declares that the authority can end a live lease before its TTL.
    pub fn with_exclusion(mut self, exclusion: ExclusionSafety) -> Self {
        self.exclusion = exclusion;
        self
    }

    /// Sets how `acquire` waits.
    pub fn with_wait(mut self, wait: WaitStrategy) -> Self {
        self.wait = wait;
        self
    }

    /// Sets whether `renew` accepts another TTL.
    pub fn with_renew_with_other_ttl(mut self, yes: bool) -> Self {
        self.renew_with_other_ttl = yes;
        self
    }

    /// Declares that `renew_many` renews a batch in one request.
    pub fn with_batch_renewal(mut self, yes: bool) -> Self {
        self.batch_renewal = yes;
        self
    }

    /// Sets how a revoked holder learns of it.
    pub fn with_revocation(mut self, notice: RevocationNotice) -> Self {
        self.revocation = notice;
        self
    }

    /// Declares that `inspect` counts a held key's waiters.
    pub fn with_counts_waiters(mut self, yes: bool) -> Self {
        self.counts_waiters = yes;
        self
    }

    /// Declares that `try_acquire_all` takes a set of keys in one atomic step.
    pub fn with_atomic_acquire_all(mut self, yes: bool) -> Self {
        self.atomic_acquire_all = yes;
        self
    }

    /// Sets how late the authority may notice an expiry.
    pub fn with_expiry_slack(mut self, slack: Duration) -> Self {
        self.expiry_slack = slack;
        self
    }
}
