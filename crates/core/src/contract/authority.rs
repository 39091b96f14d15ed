//! The `Authority` trait: what every backend implements.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::contract::capabilities::Capabilities;
use crate::contract::error::Error;
use crate::contract::error::Result;
use crate::contract::fence::Fence;
use crate::contract::grant::Grant;
use crate::contract::inspection::Inspection;
use crate::contract::key::LockKey;
use crate::contract::key_prefix::KeyPrefix;

/// The longest value [`Authority::proclaim`] attaches to a grant, in bytes: enough for an
/// address or a node name, small enough for every backend to store beside a lease.
pub const MAX_VALUE_LEN: usize = 4096;

/// [`Error::InvalidConfig`] for a value longer than [`MAX_VALUE_LEN`]: what every
/// [`Authority::proclaim`] checks before sending anything.
pub fn check_proclaimed(value: &[u8]) -> Result<()> {
    if value.len() > MAX_VALUE_LEN {
        return Err(Error::InvalidConfig {
            reason: format!(
                "a proclaimed value is at most {MAX_VALUE_LEN} bytes, not {}",
                value.len()
            ),
        });
    }
    Ok(())
}

/// What [`Authority::release`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub enum Released {
    /// The lease was ours and is now free.
    Released,
    /// The lease was no longer ours (it expired, or was already released, and may now belong to
    /// someone else, who still holds it). Nothing was changed.
    AlreadyGone,
}

/// What [`Authority::revoke`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
#[must_use]
pub enum Revoked {
    /// The key had a live holder, whose lease is now ended: this was its fence. The next grant
    /// on the key carries a greater one, so the resource refuses the revoked holder's late
    /// writes once the next holder's fence has reached it.
    Revoked {
        /// The revoked holder's fence.
        fence: Fence,
    },
    /// Nobody held the key (it was free, or its lease had expired). Nothing was changed.
    WasFree,
}

/// A service that grants time-limited, fenced leases on keys: etcd, ZooKeeper, PostgreSQL, Redis,
/// or the in-memory reference.
///
/// Applications hold it as `Arc<dyn Authority>` (see `leasehold::connect`) and usually go through
/// [`crate::Lease`], which renews in the background and reports loss. The trait is object safe.
///
/// # Contract
/// Every implementation promises, and the conformance suite checks against a real server:
/// * **Exclusion**: while a grant on a key is unexpired at the authority, no other grant on that
///   key is handed out.
/// * **Atomic steps**: acquire is one atomic step at the authority; renew and release compare
///   ownership (owner token and fence) atomically. Nothing is ever deleted or extended
///   unconditionally.
/// * **Fences**: every grant's fence is greater than every fence granted before on that key,
///   across release, expiry and (where [`Capabilities::durable_fences`]) server restarts, and as
///   far as [`Capabilities::fence_safety`] declares across failover.
/// * **The authority's clock**: only the authority decides expiry. A grant's local deadline is
///   taken from a monotonic clock read before the request was sent, minus the safety margin.
/// * **Input**: an invalid key or TTL is rejected with its typed error before anything is sent.
#[async_trait]
pub trait Authority: Send + Sync + fmt::Debug {
    /// What this backend promises.
    ///
    /// # Contract
    /// Constant for the authority's lifetime.
    fn capabilities(&self) -> &Capabilities;

    /// Tries once to take `key` for `ttl`.
    ///
    /// # Contract
    /// * One atomic step at the authority: `Ok(Some(grant))` when the key was free (or its lease
    ///   had expired) and is now ours; `Ok(None)` when someone else holds it right now.
    /// * An error means nothing is known about the holder; where the request may have reached the
    ///   authority, any lease it created for us is released or left to expire within `ttl`.
    /// * `ttl` outside [`Capabilities::ttl`] is [`crate::Error::InvalidTtl`], checked before any
    ///   request.
    async fn try_acquire(&self, key: &LockKey, ttl: Duration) -> Result<Option<Grant>>;

    /// Tries once to take every key of `keys` for `ttl`, all or none, in one atomic step at the
    /// authority. [`crate::acquire_all`] calls it first where
    /// [`Capabilities::atomic_acquire_all`] says the backend has it.
    ///
    /// # Contract
    /// * `keys` are distinct and in the canonical order ([`crate::canonical`], checked by [`crate::backend::check_canonical`]); anything
    ///   else is [`Error::InvalidConfig`] before any request.
    /// * One atomic step: `Ok(Some(grants))`, one grant per key in the order given, each with a
    ///   fence greater than every fence issued before on its own key, when every key was free
    ///   (or its lease had expired); `Ok(None)`, with nothing taken, extended or woken, when any
    ///   key is held. Never some keys without the others.
    /// * Errors, deadlines and cancellation as [`Authority::try_acquire`]: every grant's
    ///   deadline counts from before the request was sent, and where a request may have reached
    ///   the authority, whatever it took is given back or expires within `ttl`.
    /// * A set the backend cannot take in one step (more keys than one transaction holds, keys
    ///   on different Redis Cluster slots) is [`Error::Unsupported`] before any request: the
    ///   caller then takes the keys one by one.
    /// * The default answers [`Error::Unsupported`]; a backend with the atomic step declares
    ///   [`Capabilities::atomic_acquire_all`].
    async fn try_acquire_all(&self, keys: &[LockKey], ttl: Duration) -> Result<Option<Vec<Grant>>> {
        let _ = (keys, ttl);
        Err(Error::Unsupported {
            backend: self.capabilities().backend,
            operation: "taking several keys in one atomic step".to_string(),
        })
    }

    /// Takes `key` for `ttl`, waiting at most `max_wait` for the current holder to go.
    ///
    /// # Contract
    /// * Waits by notification where the backend has it, by jittered backoff otherwise
    ///   ([`Capabilities::wait`]); never longer than `max_wait` plus one request.
    /// * When the key stays held, fails with [`crate::Error::Timeout`]; when the authority cannot
    ///   be reached, with [`crate::Error::Unavailable`].
    /// * Dropping the future (cancellation) leaves nothing behind that would delay other
    ///   contenders: no orphan contender node, key or row (a request already in flight may still
    ///   create a lease, which then expires within `ttl`).
    /// * The returned grant's deadline is counted from the request that won, so a grant that
    ///   arrives late is already short, never longer than the authority's lease.
    async fn acquire(&self, key: &LockKey, ttl: Duration, max_wait: Duration) -> Result<Grant>;

    /// Extends `grant` to `ttl` from now, if it is still ours.
    ///
    /// # Contract
    /// * Conditional on the owner token and fence still matching at the authority: a grant that
    ///   expired (and perhaps went to someone else) gets [`crate::Error::LeaseLost`], and the
    ///   current holder's lease is left untouched.
    /// * Returns the new local deadline, counted from before the renewal was sent.
    /// * A backend whose TTL is fixed per session
    ///   ([`Capabilities::renew_with_other_ttl`] false) answers a different `ttl` with
    ///   [`crate::Error::InvalidTtl`].
    async fn renew(&self, grant: &Grant, ttl: Duration) -> Result<Instant>;

    /// Renews each of `grants` to its TTL from now, as [`Authority::renew`] would, in as few
    /// requests as the backend can: one, where [`Capabilities::batch_renewal`].
    ///
    /// # Contract
    /// * One result per grant, in order, each what `renew` would have answered for it alone: a
    ///   grant no longer ours is [`Error::LeaseLost`] and changes nothing, while the others in
    ///   the batch are renewed.
    /// * An error that leaves the whole batch's outcome unknown (no answer) is that error for
    ///   every grant.
    /// * Deadlines count from before the batch was sent.
    /// * A backend without a batch form renews one grant after another.
    async fn renew_many(&self, grants: &[Grant]) -> Vec<Result<Instant>>;

    /// Frees `grant`, if it is still ours.
    ///
    /// # Contract
    /// * Compare-and-release: never frees a lease that another owner holds now.
    /// * Returns [`Released::Released`] or [`Released::AlreadyGone`]; releasing twice is
    ///   harmless.
    /// * Wakes waiters where the backend waits by notification.
    async fn release(&self, grant: &Grant) -> Result<Released>;

    /// Reads what the authority knows about `key` now: held or free, the remaining TTL, the
    /// holder's fence, the last fence issued, a short owner id. For `leasehold status`,
    /// operators and diagnostics.
    ///
    /// # Contract
    /// * Read-only: it never creates, extends, renews or frees anything, never takes a lock at
    ///   the authority that a holder or a waiter would wait on, and never wakes waiters.
    /// * "Held" and "remaining" are the authority's reckoning on the authority's clock (the
    ///   database's, the Redis server's, the etcd leader's), not this process's: a lease the
    ///   authority has not yet noticed as expired may still show as held within
    ///   [`Capabilities::expiry_slack`].
    /// * A snapshot, stale the moment it returns: never use it to decide to act (to write to the
    ///   protected resource, or to skip acquiring). Only a grant's lease and its fence decide.
    /// * When held, the holder's fence equals the fence its grant carries; the last fence, when
    ///   reported, is at least every fence issued on the key so far.
    /// * The owner id never reveals an owner token (see [`crate::OwnerId`]).
    /// * A backend that cannot read a key without changing it answers [`Error::Unsupported`].
    async fn inspect(&self, key: &LockKey) -> Result<Inspection>;

    /// Lists the keys under `prefix` that the authority knows of: the first `limit` of them in
    /// ascending byte order. For `leasehold status --prefix`; [`Authority::inspect`] each one to
    /// see who holds it.
    ///
    /// # Contract
    /// * Read-only, as [`Authority::inspect`] is.
    /// * Every key held for the whole call is listed (if it is among the first `limit`). A key
    ///   that is free may be listed too, where the authority keeps something of it after release
    ///   (a fence counter, a row, an empty parent node): inspect tells held from free.
    /// * Only keys that start with `prefix`, each once, sorted, at most `limit`. Ask for one more
    ///   than you show to know whether there are more.
    /// * A snapshot, as inspect is: never a reason to act.
    /// * A backend that cannot list keys answers [`Error::Unsupported`].
    async fn list_keys(&self, prefix: &KeyPrefix, limit: usize) -> Result<Vec<LockKey>>;

    /// Attaches `value` (at most [`MAX_VALUE_LEN`] bytes: an address, a node name) to `grant`
    /// at the authority, for others to read in [`Inspection::value`]. Leader election
    /// ([`crate::Election`]) uses it so observers learn who leads; etcd's `Proclaim` is the same
    /// thing.
    ///
    /// # Contract
    /// * Conditional on ownership, as renew is: a grant that is no longer ours gets
    ///   [`Error::LeaseLost`] and the current holder's value is left untouched.
    /// * The value belongs to this grant: while the grant holds the key, inspect shows the value
    ///   last proclaimed; a later grant on the key (ours or anyone's) starts with none.
    /// * A value longer than [`MAX_VALUE_LEN`] is [`Error::InvalidConfig`], before any request.
    async fn proclaim(&self, grant: &Grant, value: &[u8]) -> Result<()>;

    /// Waits until `key` may have changed at the authority (a release, a new grant, a
    /// proclaimed value), or `max_wait` has passed, whichever comes first. Observers of an
    /// election and waiters of a semaphore call it between reads, so they learn of a change by
    /// notification where the backend has one.
    ///
    /// # Contract
    /// * A hint, never proof: it may return early with nothing changed, and callers read again
    ///   (with [`Authority::inspect`] or a try) to see what did.
    /// * Returns within `max_wait` plus one request; `Ok` both when woken and when the time ran
    ///   out. `Duration::MAX` means no bound but a change.
    /// * A change that happens while it waits wakes it, as far as the backend announces
    ///   changes: etcd and ZooKeeper watches see every grant, release and expiry; Redis and
    ///   PostgreSQL announce releases and proclaimed values (announcing every grant would send
    ///   each acquisition to every listening process); the rest is found by the caller's next
    ///   read. A change before the call may be missed (read first, then wait with a bounded
    ///   `max_wait`).
    /// * Dropping the future leaves nothing behind at the authority that holds, blocks or
    ///   changes any lease (PostgreSQL leaves the waiter's mark on the key, which only makes
    ///   its releases notify until the mark runs out).
    /// * A backend without notification sleeps for `max_wait`, or polls the key and returns
    ///   when it turned free or held (SQLite, whose reads are cheap and local).
    async fn wait_for_change(&self, key: &LockKey, max_wait: Duration) -> Result<()>;

    /// Ends the lease of whoever holds `key` now, for an operator taking a key away from a
    /// stuck holder. Safe only because of fences: the revoked holder may not have noticed yet
    /// and may still write, and its writes are refused once the next holder's fence has
    /// reached the resource. See docs/revocation.md.
    ///
    /// # Contract
    /// * Conditional on the holder it ends: one atomic step at the authority, or a compare
    ///   against the holder it read (its fence, its node or key), so a holder that arrived in
    ///   between is never ended. Never an unconditional delete.
    /// * [`Revoked::Revoked`] carries the ended holder's fence; [`Revoked::WasFree`] means
    ///   nobody held the key, and nothing changed.
    /// * The next grant's fence on the key is greater than the revoked one's.
    /// * The holder learns of it as [`Capabilities::revocation`] declares: at once where the
    ///   backend pushes the loss, at its next renewal elsewhere; its renewals are refused from
    ///   the moment revoke returns.
    /// * Waiters are woken where the backend waits by notification.
    /// * The authority's own permissions decide who may revoke: a client without them gets
    ///   the authority's error (not retryable), and the holder keeps its lease.
    /// * A backend that cannot revoke answers [`Error::Unsupported`].
    async fn revoke(&self, key: &LockKey) -> Result<Revoked>;

    /// Ends what this client keeps at the authority on behalf of all its leases (an etcd
    /// session lease, say), and waits for the answer. Call it before a process exits: dropping
    /// an authority cleans up from a background task, which an exiting runtime may never run.
    ///
    /// # Contract
    /// * Afterwards nothing of this client remains at the authority, or (when the authority did
    ///   not answer: the error says so) it ends within its TTL by itself.
    /// * Leases held through this client are lost (their loss signal fires, where they have one).
    /// * The client stays usable; a later acquire starts afresh.
    /// * The default does nothing: a backend whose leases are plain keys or rows with a TTL has
    ///   nothing beyond them to end. A wrapper forwards it (wrappers deny
    ///   `clippy::missing_trait_methods`, so a default cannot hide a method they must pass on).
    async fn close(&self) -> Result<()> {
        Ok(())
    }
}
