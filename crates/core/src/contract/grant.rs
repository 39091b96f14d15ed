//! What an authority hands out: a grant.

use std::any::Any;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::contract::fence::Fence;
use crate::contract::key::LockKey;
use crate::contract::owner::OwnerToken;
use crate::lease::loss_signal::LossSignal;

/// One successful acquisition: who holds which key, with which fence, until when.
///
/// A grant is the proof an authority handed out. It carries:
/// * the [`LockKey`];
/// * the [`OwnerToken`], compared by the authority on every renewal and release;
/// * the [`Fence`], to be presented to the protected resource with every write;
/// * the TTL asked for, and a local *deadline* on the monotonic clock: started before the request
///   was sent, TTL minus the [`crate::SafetyMargin`]. Past it, the grant must be treated as lost
///   even if nobody said so.
///
/// Only an authority makes one ([`crate::backend::grant`], plumbing the `leasehold` facade does
/// not re-export), so a grant an application holds is one an authority handed out.
///
/// Backends attach their own bookkeeping (an etcd contender key and lease id, a ZooKeeper node
/// path) with [`Grant::with_backend_state`]; applications never need it.
#[derive(Clone)]
pub struct Grant {
    key: LockKey,
    owner: OwnerToken,
    fence: Fence,
    ttl: Duration,
    deadline: Instant,
    backend: Option<Arc<dyn Any + Send + Sync>>,
    loss: Option<LossSignal>,
}

impl Grant {
    /// A grant; authorities make one with [`crate::backend::grant`].
    pub(crate) fn new(
        key: LockKey,
        owner: OwnerToken,
        fence: Fence,
        ttl: Duration,
        deadline: Instant,
    ) -> Self {
        Grant {
            key,
            owner,
            fence,
            ttl,
            deadline,
            backend: None,
            loss: None,
        }
    }

    /// Attaches the backend's own bookkeeping for this grant.
    pub fn with_backend_state<T: Any + Send + Sync>(mut self, state: T) -> Self {
        self.backend = Some(Arc::new(state));
        self
    }

    /// The backend's bookkeeping, if it is a `T`.
    pub fn backend_state<T: Any + Send + Sync>(&self) -> Option<&T> {
        self.backend.as_deref().and_then(|s| s.downcast_ref::<T>())
    }

    /// Attaches the signal the backend fires when the session carrying this grant ends, so a
    /// [`crate::Lease`] learns of the loss at once instead of at its next renewal.
    pub fn with_loss_signal(mut self, signal: LossSignal) -> Self {
        self.loss = Some(signal);
        self
    }

    /// The backend's loss signal for this grant, if it has one.
    pub fn loss_signal(&self) -> Option<&LossSignal> {
        self.loss.as_ref()
    }

    /// The locked key.
    pub fn key(&self) -> &LockKey {
        &self.key
    }

    /// The owner token the authority compares on renew and release.
    pub fn owner(&self) -> OwnerToken {
        self.owner
    }

    /// The fencing token to present to the protected resource.
    pub fn fence(&self) -> Fence {
        self.fence
    }

    /// The TTL this grant was made with.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The local deadline: after it, this grant must not be relied on.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Whether the local deadline is still ahead and the backend has not reported the session
    /// carrying this grant as ended.
    pub fn is_valid(&self) -> bool {
        Instant::now() < self.deadline && self.loss.as_ref().is_none_or(|l| l.fired().is_none())
    }

    /// How long until the local deadline (zero once it passed).
    pub fn remaining(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }
}

impl fmt::Debug for Grant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Grant")
            .field("key", &self.key)
            .field("owner", &self.owner)
            .field("fence", &self.fence)
            .field("ttl", &self.ttl)
            .field("remaining", &self.remaining())
            .finish_non_exhaustive()
    }
}
