//! A semaphore: up to N holders of one name at once, each holding a fenced lease on one of N
//! slots, so a resource keyed by the slot's lock key ([`Permit::key`]) can refuse a stale
//! holder of that slot as it refuses a stale lock holder.
//!
//! # How N is agreed
//! Slot `i` of a semaphore named `jobs` with 3 permits is the lock key `jobs/permits-3/i`: the
//! permit count is part of every slot's name. Two processes that disagree on N would use
//! different slot keys and, unchecked, admit up to N + N' holders. So each acquisition looks,
//! before and again right after taking a slot, for slots of the same name with another count
//! ([`crate::Authority::list_keys`] and [`crate::Authority::inspect`]): if one is held, it
//! gives its slot back and fails with [`Error::InvalidConfig`]. When two processes with
//! different counts race, each sees the other's slot on its second look and both fail: neither
//! hands out a permit. A count changed while nobody holds a permit takes effect at once.
//!
//! Waiting is by notification where the backend has it ([`Authority::wait_for_change`] on
//! every slot: a release wakes the waiter), with a timer fallback that finds a slot freed by a
//! holder that never released once its lease runs out; by jittered polling elsewhere. Each try
//! costs one request per slot; the whole wait is bounded by `max_wait`.

use std::sync::Arc;
use std::time::Duration;

use rand::seq::SliceRandom;

use crate::backend::backoff::Backoff;
use crate::contract::authority::{Authority, Released, Revoked};
use crate::contract::capabilities::WaitStrategy;
use crate::contract::error::{Error, Result};
use crate::contract::fence::Fence;
use crate::contract::key::LockKey;
use crate::contract::key_prefix::KeyPrefix;
use crate::contract::lost::LostReason;
use crate::lease::{Lease, LeaseOptions};
use crate::recipes::semaphore_status::SemaphoreStatus;
use crate::time::saturating_add;

/// The most permits a semaphore may have: each try looks at every slot.
pub const MAX_PERMITS: u32 = 1024;

/// N permits on a name, shared by every process that uses the same name and the same N.
#[derive(Debug, Clone)]
pub struct Semaphore {
    authority: Arc<dyn Authority>,
    name: LockKey,
    permits: u32,
    slots: Vec<LockKey>,
    options: LeaseOptions,
}

/// One permit: a fenced lease on one slot. Renewed in the background like any [`Lease`].
#[derive(Debug)]
pub struct Permit {
    lease: Lease,
    slot: u32,
}

impl Permit {
    /// Which slot (0 to N-1) this permit holds.
    pub fn slot(&self) -> u32 {
        self.slot
    }

    /// The slot's lock key (`name/permits-N/slot`): key the protected resource by this, not by
    /// the slot number. Fences grow per lock key, and the key carries the permit count, so after
    /// the count changes slot `i` is another key whose fences start again.
    pub fn key(&self) -> &LockKey {
        self.lease.key()
    }

    /// The slot lease's fence: greater than every earlier fence of the same slot key.
    pub fn fence(&self) -> Fence {
        self.lease.fence()
    }

    /// The slot's lease.
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// `Ok` while the permit is held: call it right before each side effect.
    pub fn ensure_valid(&self) -> Result<()> {
        self.lease.ensure_valid()
    }

    /// Resolves when the permit is lost (see [`Lease::lost`]).
    pub fn lost(&self) -> impl std::future::Future<Output = LostReason> + Send + 'static {
        self.lease.lost()
    }

    /// Extends the permit's own lease to `ttl` from now, for permits made with auto-renew off
    /// ([`Semaphore::with_lease_options`]): a permit with a lease time of its own, which its
    /// holder extends when it needs longer (see [`Lease::renew`] for what is refused: a lost
    /// permit, another TTL where the backend's is fixed). Returns the new local deadline.
    pub async fn renew(&mut self, ttl: Duration) -> Result<tokio::time::Instant> {
        self.lease.renew(ttl).await
    }

    /// Gives the permit back before its lease ends: the slot is free at once.
    pub async fn release(self) -> Result<Released> {
        self.lease.release().await
    }
}

impl Semaphore {
    /// A semaphore of `permits` slots named `name` (1 to [`MAX_PERMITS`]; the slot keys must
    /// fit in a lock key).
    pub fn new(authority: Arc<dyn Authority>, name: &LockKey, permits: u32) -> Result<Self> {
        if permits == 0 || permits > MAX_PERMITS {
            return Err(Error::InvalidConfig {
                reason: format!("a semaphore has 1 to {MAX_PERMITS} permits, not {permits}"),
            });
        }
        let slots = (0..permits)
            .map(|i| LockKey::new(format!("{name}/permits-{permits}/{i}")))
            .collect::<Result<Vec<_>>>()?;
        Ok(Semaphore {
            authority,
            name: name.clone(),
            permits,
            slots,
            options: LeaseOptions::default(),
        })
    }

    /// The options each permit's lease gets (renewal, release on drop).
    pub fn with_lease_options(mut self, options: LeaseOptions) -> Self {
        self.options = options;
        self
    }

    /// How many permits.
    pub fn permits(&self) -> u32 {
        self.permits
    }

    /// The slot keys, slot 0 first.
    pub fn slots(&self) -> &[LockKey] {
        &self.slots
    }

    /// Every slot as the authority sees it now: how many permits are free, and each holder's
    /// owner id, fence and time left ([`SemaphoreStatus`]). One [`Authority::inspect`] per
    /// slot; read-only; a snapshot, never a reason to act.
    pub async fn inspect(&self) -> Result<SemaphoreStatus> {
        let mut slots = Vec::with_capacity(self.slots.len());
        for key in &self.slots {
            slots.push(self.authority.inspect(key).await?);
        }
        Ok(SemaphoreStatus {
            permits: self.permits,
            slots,
        })
    }

    /// Ends whoever holds permit `slot` now, through [`Authority::revoke`] of the slot's key
    /// (an operator freeing a stuck permit; see docs/revocation.md). The holder loses its
    /// permit (at once or at its next renewal, as the backend declares), and the next permit
    /// on that slot carries a greater fence, so a resource keyed by the slot refuses the
    /// revoked holder's late writes once the next holder has reached it.
    pub async fn revoke(&self, slot: u32) -> Result<Revoked> {
        let key = self
            .slots
            .get(slot as usize)
            .ok_or_else(|| Error::InvalidConfig {
                reason: format!(
                    "semaphore `{}` has slots 0 to {}, not {slot}",
                    self.name,
                    self.permits.saturating_sub(1)
                ),
            })?;
        self.authority.revoke(key).await
    }

    /// Takes a free slot for `ttl` if there is one now; `Ok(None)` when all N are held.
    pub async fn try_acquire(&self, ttl: Duration) -> Result<Option<Permit>> {
        self.check_agreement().await?;
        let mut order: Vec<u32> = (0..self.permits).collect();
        order.shuffle(&mut rand::rng());
        for slot in order {
            let key = &self.slots[slot as usize];
            let taken =
                Lease::try_acquire(self.authority.clone(), key, ttl, self.options.clone()).await?;
            if let Some(lease) = taken {
                if let Err(e) = self.check_agreement().await {
                    let _ = lease.release().await;
                    return Err(e);
                }
                return Ok(Some(Permit { lease, slot }));
            }
        }
        Ok(None)
    }

    /// Takes a slot for `ttl`, waiting at most `max_wait` for one to free;
    /// [`Error::Timeout`] when all N stayed held.
    pub async fn acquire(&self, ttl: Duration, max_wait: Duration) -> Result<Permit> {
        let started = tokio::time::Instant::now();
        let give_up = saturating_add(started, max_wait);
        // Where the backend notifies, a release wakes the wait at once and the timer is only the
        // fallback for holders that never release (their slot frees when its lease runs out);
        // where it polls, the timer is the wait.
        let cap = match self.authority.capabilities().wait {
            WaitStrategy::Notification => (ttl / 2).max(Duration::from_millis(200)),
            _ => Duration::from_millis(200),
        };
        let mut backoff = Backoff::new(Duration::from_millis(5), cap);
        loop {
            if let Some(permit) = self.try_acquire(ttl).await? {
                return Ok(permit);
            }
            let now = tokio::time::Instant::now();
            if now >= give_up {
                return Err(Error::Timeout {
                    key: self.name.to_string(),
                    waited: now - started,
                });
            }
            let next = saturating_add(now, backoff.next_delay()).min(give_up);
            self.wait_for_a_slot(next - now).await?;
        }
    }

    /// Waits until any slot may have changed, or `max_wait`.
    async fn wait_for_a_slot(&self, max_wait: Duration) -> Result<()> {
        let waits = self.slots.iter().map(|slot| {
            let authority = self.authority.clone();
            Box::pin(async move { authority.wait_for_change(slot, max_wait).await })
        });
        let (first, _, _) = futures_util::future::select_all(waits).await;
        first
    }

    /// Fails if a slot of this name with another permit count is held now.
    async fn check_agreement(&self) -> Result<()> {
        let prefix = KeyPrefix::new(format!("{}/permits-", self.name))?;
        let ours = format!("{}/permits-{}/", self.name, self.permits);
        let listed = self.authority.list_keys(&prefix, usize::MAX).await?;
        for key in listed.iter().filter(|k| !k.as_str().starts_with(&ours)) {
            let seen = self.authority.inspect(key).await?;
            if seen.held {
                return Err(Error::InvalidConfig {
                    reason: format!(
                        "semaphore `{}` is used with {} permits here, but `{key}` (another \
                         count) is held: every user of a semaphore must agree on its permits",
                        self.name, self.permits
                    ),
                });
            }
        }
        Ok(())
    }
}
