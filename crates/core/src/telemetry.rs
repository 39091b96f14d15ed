//! What leasehold records through the [`metrics`] facade: what an operator of a lock service
//! needs to see (hand-offs, losses, renewal outcomes, waits, hold times), recorded here, in
//! core, for every backend. The application installs the exporter it wants
//! (Prometheus, StatsD, OpenTelemetry); with none installed each record is a check of a global
//! and nothing more. `docs/observability.md` says how to read each one and what to alert on.
//!
//! | metric | type | labels | what it counts |
//! |---|---|---|---|
//! | `leasehold_acquire_total` | counter | backend, outcome, key | acquire attempts: `acquired`, `busy` (a `try_acquire` that found the key held), `timed_out` (`max_wait` ran out), `error` |
//! | `leasehold_acquire_wait_seconds` | histogram | backend, key | from the call to the grant, for attempts that acquired |
//! | `leasehold_owner_changes_total` | counter | backend, key | grants: each one hands the key to a new owner (a fresh owner token and fence) |
//! | `leasehold_renewals_total` | counter | backend, outcome, key | a [`crate::Lease`]'s renewals: `renewed`, `refused` (not the owner any more), `unknown` (no answer yet: suspended, retried), `failed` (a permanent error), `late` (no answer by the deadline) |
//! | `leasehold_leases_lost_total` | counter | backend, reason, key | leases lost, by [`LostReason::kind`] (a release is not a loss) |
//! | `leasehold_lease_held_seconds` | histogram | backend, key | how long a lease was held: from the grant to its release or loss |
//! | `leasehold_lease_held_ttl_ratio` | histogram | backend, key | the same divided by the TTL: the critical section against the lease |
//! | `leasehold_leases_held` | gauge | backend, key | leases this process holds now |
//! | `leasehold_fence_rejections_total` | counter | resource | claims and writes a fenced resource refused as stale |
//! | `leasehold_unlocked_total` | counter | backend, key | work that proceeded without a lock because the authority was unavailable and the caller chose to fail open ([`crate::acquire_or`]) |
//!
//! The `key` label is there only when the application asks for it with [`set_key_labels`]:
//! one time series per lock key breaks Prometheus when keys are unbounded (`invoice:<id>`).
//!
//! Acquire attempts and owner changes are recorded by [`crate::Instrumented`], the layer
//! `leasehold::connect` puts around every backend (wrap an authority built by hand in it to get
//! them); renewals, losses and hold times by [`crate::Lease`]; fence rejections by each fenced
//! resource ([`crate::FencedRegister`], PostgreSQL's `FencedTable`, etcd's `guarded_txn`), and by
//! yours through [`fence_rejected`].

use std::sync::RwLock;
use std::time::Duration;

use metrics::{Label, Unit};

use crate::contract::key::LockKey;
use crate::contract::lost::LostReason;

/// `leasehold_acquire_total`.
pub const ACQUIRE_TOTAL: &str = "leasehold_acquire_total";
/// `leasehold_acquire_wait_seconds`.
pub const ACQUIRE_WAIT_SECONDS: &str = "leasehold_acquire_wait_seconds";
/// `leasehold_owner_changes_total`.
pub const OWNER_CHANGES_TOTAL: &str = "leasehold_owner_changes_total";
/// `leasehold_renewals_total`.
pub const RENEWALS_TOTAL: &str = "leasehold_renewals_total";
/// `leasehold_leases_lost_total`.
pub const LEASES_LOST_TOTAL: &str = "leasehold_leases_lost_total";
/// `leasehold_lease_held_seconds`.
pub const LEASE_HELD_SECONDS: &str = "leasehold_lease_held_seconds";
/// `leasehold_lease_held_ttl_ratio`.
pub const LEASE_HELD_TTL_RATIO: &str = "leasehold_lease_held_ttl_ratio";
/// `leasehold_leases_held`.
pub const LEASES_HELD: &str = "leasehold_leases_held";
/// `leasehold_fence_rejections_total`.
pub const FENCE_REJECTIONS_TOTAL: &str = "leasehold_fence_rejections_total";
/// `leasehold_unlocked_total`.
pub const UNLOCKED_TOTAL: &str = "leasehold_unlocked_total";

/// Whether, and how much of, the lock key goes into the `key` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum KeyLabels {
    /// No `key` label (the default): safe whatever the keys are.
    #[default]
    None,
    /// The key up to its first `separator` (`invoice` for `invoice:inv_72` with `:`), so a
    /// family of keys is one series; a key without the separator is labelled `other`.
    UpTo(char),
    /// The whole key: only for a small, fixed set of keys (`nightly-report`, `leader`).
    Full,
}

static KEY_LABELS: RwLock<KeyLabels> = RwLock::new(KeyLabels::None);

/// Chooses, for the whole process, how lock keys appear in the `key` label. Takes effect for
/// records made afterwards.
pub fn set_key_labels(policy: KeyLabels) {
    *KEY_LABELS.write().unwrap_or_else(|e| e.into_inner()) = policy;
}

/// The policy in force.
pub fn key_labels() -> KeyLabels {
    *KEY_LABELS.read().unwrap_or_else(|e| e.into_inner())
}

impl KeyLabels {
    /// The `key` label's value for `key`, or `None` for no label.
    pub fn value(self, key: &LockKey) -> Option<String> {
        match self {
            KeyLabels::None => None,
            KeyLabels::UpTo(separator) => Some(
                key.as_str()
                    .split_once(separator)
                    .map_or("other", |(family, _)| family)
                    .to_string(),
            ),
            KeyLabels::Full => Some(key.as_str().to_string()),
        }
    }
}

/// Registers each metric's unit and help text with the installed recorder (an exporter shows
/// them as `# HELP`). Call it once, after installing the recorder.
pub fn describe() {
    metrics::describe_counter!(ACQUIRE_TOTAL, Unit::Count, "Acquire attempts, by outcome.");
    metrics::describe_histogram!(
        ACQUIRE_WAIT_SECONDS,
        Unit::Seconds,
        "Time from an acquire call to the grant."
    );
    metrics::describe_counter!(
        OWNER_CHANGES_TOTAL,
        Unit::Count,
        "Grants: each hands a key to a new owner."
    );
    metrics::describe_counter!(RENEWALS_TOTAL, Unit::Count, "Lease renewals, by outcome.");
    metrics::describe_counter!(LEASES_LOST_TOTAL, Unit::Count, "Leases lost, by reason.");
    metrics::describe_histogram!(
        LEASE_HELD_SECONDS,
        Unit::Seconds,
        "How long a lease was held, grant to release or loss."
    );
    metrics::describe_histogram!(
        LEASE_HELD_TTL_RATIO,
        "How long a lease was held, as a fraction of its TTL."
    );
    metrics::describe_gauge!(LEASES_HELD, Unit::Count, "Leases held by this process now.");
    metrics::describe_counter!(
        UNLOCKED_TOTAL,
        Unit::Count,
        "Work that proceeded without a lock: the authority was unavailable and the caller failed open."
    );
    metrics::describe_counter!(
        FENCE_REJECTIONS_TOTAL,
        Unit::Count,
        "Claims and writes refused by a fenced resource as stale."
    );
}

/// `backend` and, by the policy, `key`.
fn labels(backend: &'static str, key: &LockKey) -> Vec<Label> {
    let mut labels = Vec::with_capacity(3);
    labels.push(Label::new("backend", backend));
    if let Some(value) = key_labels().value(key) {
        labels.push(Label::new("key", value));
    }
    labels
}

fn with(mut labels: Vec<Label>, name: &'static str, value: &'static str) -> Vec<Label> {
    labels.push(Label::new(name, value));
    labels
}

/// How an acquire attempt ended, for `leasehold_acquire_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AcquireOutcome {
    Acquired,
    Busy,
    TimedOut,
    Error,
}

impl AcquireOutcome {
    fn as_str(self) -> &'static str {
        match self {
            AcquireOutcome::Acquired => "acquired",
            AcquireOutcome::Busy => "busy",
            AcquireOutcome::TimedOut => "timed_out",
            AcquireOutcome::Error => "error",
        }
    }
}

/// One acquire attempt; `waited` is the time from the call to its end.
pub(crate) fn acquire(
    backend: &'static str,
    key: &LockKey,
    outcome: AcquireOutcome,
    waited: Duration,
) {
    let base = labels(backend, key);
    if outcome == AcquireOutcome::Acquired {
        metrics::histogram!(ACQUIRE_WAIT_SECONDS, base.clone()).record(waited.as_secs_f64());
        metrics::counter!(OWNER_CHANGES_TOTAL, base.clone()).increment(1);
    }
    metrics::counter!(ACQUIRE_TOTAL, with(base, "outcome", outcome.as_str())).increment(1);
}

/// How a renewal ended, for `leasehold_renewals_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RenewalOutcome {
    Renewed,
    Refused,
    Unknown,
    Failed,
    Late,
}

impl RenewalOutcome {
    fn as_str(self) -> &'static str {
        match self {
            RenewalOutcome::Renewed => "renewed",
            RenewalOutcome::Refused => "refused",
            RenewalOutcome::Unknown => "unknown",
            RenewalOutcome::Failed => "failed",
            RenewalOutcome::Late => "late",
        }
    }
}

/// One renewal of a lease.
pub(crate) fn renewal(backend: &'static str, key: &LockKey, outcome: RenewalOutcome) {
    metrics::counter!(
        RENEWALS_TOTAL,
        with(labels(backend, key), "outcome", outcome.as_str())
    )
    .increment(1);
}

/// A lease began: one more held.
pub(crate) fn lease_started(backend: &'static str, key: &LockKey) {
    metrics::gauge!(LEASES_HELD, labels(backend, key)).increment(1.0);
}

/// A lease ended (released or lost) after `held` of its `ttl`.
pub(crate) fn lease_ended(
    backend: &'static str,
    key: &LockKey,
    reason: &LostReason,
    held: Duration,
    ttl: Duration,
) {
    let base = labels(backend, key);
    metrics::gauge!(LEASES_HELD, base.clone()).decrement(1.0);
    metrics::histogram!(LEASE_HELD_SECONDS, base.clone()).record(held.as_secs_f64());
    if !ttl.is_zero() {
        metrics::histogram!(LEASE_HELD_TTL_RATIO, base.clone())
            .record(held.as_secs_f64() / ttl.as_secs_f64());
    }
    if !matches!(reason, LostReason::Released) {
        metrics::counter!(LEASES_LOST_TOTAL, with(base, "reason", reason.kind())).increment(1);
    }
}

/// A fenced resource refused a claim or a write with fence `refused` as stale, having accepted
/// `newest`: a stale holder caught. Counts it and logs a `WARN` event. Call it from your own
/// [`crate::FencedResource`]; `resource` names the kind of resource (`orders_table`), never a
/// row or a key (it is a label).
pub fn fence_rejected(resource: &'static str, refused: u64, newest: u64) {
    metrics::counter!(FENCE_REJECTIONS_TOTAL, "resource" => resource).increment(1);
    tracing::warn!(resource, refused, newest, "stale fence refused");
}

/// Work on `key` proceeded without a lock: the authority was unavailable and the caller chose
/// to fail open. [`crate::acquire_or`] records it; record it yourself if you decide elsewhere.
pub fn proceeded_unlocked(backend: &str, key: &LockKey) {
    let mut labels = vec![Label::new("backend", backend.to_string())];
    if let Some(value) = key_labels().value(key) {
        labels.push(Label::new("key", value));
    }
    metrics::counter!(UNLOCKED_TOTAL, labels).increment(1);
}

/// What a lease's end is recorded against: kept from the grant until the lease ends.
#[derive(Debug)]
pub(crate) struct HoldRecord {
    backend: &'static str,
    key: LockKey,
    ttl: Duration,
    since: tokio::time::Instant,
}

impl HoldRecord {
    /// A lease on `key` began now: one more held.
    pub(crate) fn start(backend: &'static str, key: LockKey, ttl: Duration) -> Self {
        lease_started(backend, &key);
        HoldRecord {
            backend,
            key,
            ttl,
            since: tokio::time::Instant::now(),
        }
    }

    /// The lease ended for `reason` (called once, where the lease's state turns lost).
    pub(crate) fn ended(&self, reason: &LostReason) {
        lease_ended(
            self.backend,
            &self.key,
            reason,
            self.since.elapsed(),
            self.ttl,
        );
    }

    /// One renewal of this lease.
    pub(crate) fn renewal(&self, outcome: RenewalOutcome) {
        renewal(self.backend, &self.key, outcome);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type TestResult<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

    #[test]
    fn key_labels_follow_the_policy() -> TestResult {
        let key =
            LockKey::new("invoice:inv_72").map_err(|e| format!("the key invoice:inv_72: {e}"))?;
        assert_eq!(KeyLabels::None.value(&key), None);
        assert_eq!(KeyLabels::UpTo(':').value(&key).as_deref(), Some("invoice"));
        assert_eq!(KeyLabels::UpTo('/').value(&key).as_deref(), Some("other"));
        assert_eq!(
            KeyLabels::Full.value(&key).as_deref(),
            Some("invoice:inv_72")
        );
        assert_eq!(KeyLabels::default(), KeyLabels::None);
        Ok(())
    }
}
