//! The `Authority` trait: what every backend implements.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::capabilities::Capabilities;
use crate::error::Error;
use crate::error::Result;
use crate::grant::Grant;
use crate::inspection::Inspection;
use crate::key::LockKey;
use crate::key_prefix::KeyPrefix;

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
    /// * The default answers [`Error::Unsupported`]: it exists so wrappers written before this
    ///   method keep compiling. Every backend in this workspace implements it, and a wrapper
    ///   should delegate it.
    async fn inspect(&self, key: &LockKey) -> Result<Inspection> {
        let _ = key;
        Err(Error::Unsupported {
            backend: self.capabilities().backend,
            operation: "inspect".into(),
        })
    }

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
    /// * The default answers [`Error::Unsupported`], as for inspect.
    async fn list_keys(&self, prefix: &KeyPrefix, limit: usize) -> Result<Vec<LockKey>> {
        let _ = (prefix, limit);
        Err(Error::Unsupported {
            backend: self.capabilities().backend,
            operation: "list_keys".into(),
        })
    }

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
    ///   nothing beyond them to end.
    async fn close(&self) -> Result<()> {
        Ok(())
    }
}
