//! A reader-writer lock: many readers or one writer per name, writer-preferring, with one fence
//! domain for both modes, built on exclusive leases so every backend has it.
//!
//! # How it is built
//! Three kinds of lock key under the name `n`:
//! * the **gate** `n/rw/gate`. Every reader and every writer passes it, so its fences order
//!   them all: a reader's fence is the gate fence it passed with, and a writer's is the gate
//!   fence it holds, greater than every fence any reader or writer got before it.
//! * the **read slots** `n/rw/readers/0` .. `n/rw/readers/{N-1}`. A reader takes the gate, takes
//!   the lowest free slot, checks that it still held the gate when the slot was granted, and
//!   gives the gate back; it holds the slot, renewed, until it releases.
//! * the **upgrade key** `n/rw/upgrade`, held by a writer and by the one upgradeable reader.
//!
//! A writer takes the upgrade key, then the gate, and keeps both; holding the gate it waits for
//! every read slot to drain. A waiting writer thus holds the gate, and new readers wait behind
//! it: the lock prefers writers. The writer sees held slots by listing the keys under
//! `n/rw/readers/` and inspecting each, so readers that disagree on N are drained as well. No
//! reader can take a slot while a writer holds the gate: a reader's slot counts only if its
//! gate lease was still valid (by its local deadline, which ends before the authority's) when
//! the slot's grant came back.
//!
//! # Upgrade
//! An upgradeable reader ([`RwLock::upgradeable_read`]) takes the upgrade key, then the gate,
//! then a slot, and gives the gate back; it reads beside plain readers. [`UpgradeableRead::upgrade`]
//! takes the gate again (its new fence greater than every earlier one) and waits for the other
//! slots to drain. No deadlock: the upgrade key is always taken before the gate, by writers and
//! upgradeable readers alike; plain readers hold the gate only while they take a slot, and hold
//! a slot without waiting for anything. So nobody holds the gate while waiting for the upgrade
//! key, and the upgrader, which holds the upgrade key, waits only for plain readers.
//!
//! Every wait is bounded by `max_wait`; a dropped acquisition gives back whatever it took.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::backend::backoff::Backoff;
use crate::contract::authority::{Authority, Released};
use crate::contract::capabilities::WaitStrategy;
use crate::contract::error::{Error, Result};
use crate::contract::fence::Fence;
use crate::contract::key::LockKey;
use crate::contract::key_prefix::KeyPrefix;
use crate::contract::lost::LostReason;
use crate::lease::{Lease, LeaseOptions};
use crate::recipes::taken::{release_all, Taken};
use crate::time::saturating_add;
use tokio::time::Instant;

/// The most readers an [`RwLock`] admits at once: a reader's try looks at each held slot.
pub const MAX_READERS: u32 = 1024;

/// How many readers an [`RwLock`] admits at once unless told otherwise.
pub const DEFAULT_MAX_READERS: u32 = 16;

/// Many readers or one writer on a name, shared by every process that uses the name.
#[derive(Debug, Clone)]
pub struct RwLock {
    authority: Arc<dyn Authority>,
    name: LockKey,
    gate: LockKey,
    upgrade: LockKey,
    readers: KeyPrefix,
    slots: Vec<LockKey>,
    options: LeaseOptions,
}

/// A read hold: a read slot's lease, and the gate fence it passed with.
#[derive(Debug)]
pub struct ReadGuard {
    slot: Lease,
    fence: Fence,
}

/// A write hold: the gate's lease (its fence is the writer's) and the upgrade key's.
#[derive(Debug)]
pub struct WriteGuard {
    gate: Lease,
    upgrade: Lease,
}

/// The one upgradeable read hold: the upgrade key, a read slot, and the gate fence it passed with.
#[derive(Debug)]
pub struct UpgradeableRead {
    lock: RwLock,
    upgrade: Lease,
    slot: Lease,
    fence: Fence,
}

impl ReadGuard {
    /// The gate fence this reader passed with: greater than the fence of every writer before it
    /// and less than every later writer's. A resource that keeps the last writer's fence can
    /// refuse a read under an older one: a reader that paused past its lease while a writer
    /// wrote.
    pub fn fence(&self) -> Fence {
        self.fence
    }

    /// The read slot's lock key.
    pub fn slot(&self) -> &LockKey {
        self.slot.key()
    }

    /// The read slot's lease, which is what keeps writers out.
    pub fn lease(&self) -> &Lease {
        &self.slot
    }

    /// `Ok` while the read hold is valid: call it right before each read that must not
    /// overlap a write.
    pub fn ensure_valid(&self) -> Result<()> {
        self.slot.ensure_valid()
    }

    /// Resolves when the read hold is lost (see [`Lease::lost`]).
    pub fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        self.slot.lost()
    }

    /// Gives the read slot back.
    pub async fn release(self) -> Result<Released> {
        self.slot.release().await
    }
}

impl WriteGuard {
    /// The writer's fence (the gate's): greater than every fence a reader or a writer got
    /// before it on this name.
    pub fn fence(&self) -> Fence {
        self.gate.fence()
    }

    /// The gate's lease, which is what keeps readers and other writers out.
    pub fn lease(&self) -> &Lease {
        &self.gate
    }

    /// `Ok` while the write hold is valid: call it right before each write.
    pub fn ensure_valid(&self) -> Result<()> {
        self.gate.ensure_valid()?;
        self.upgrade.ensure_valid()
    }

    /// Resolves when the gate or the upgrade key is lost.
    pub fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        let (gate, upgrade) = (self.gate.lost(), self.upgrade.lost());
        async move {
            tokio::select! {
                reason = gate => reason,
                reason = upgrade => reason,
            }
        }
    }

    /// Gives the gate and the upgrade key back.
    pub async fn release(self) -> Result<()> {
        release_all(vec![self.gate, self.upgrade]).await
    }
}

impl UpgradeableRead {
    /// The gate fence this reader passed with, as [`ReadGuard::fence`].
    pub fn fence(&self) -> Fence {
        self.fence
    }

    /// `Ok` while the upgradeable read hold is valid.
    pub fn ensure_valid(&self) -> Result<()> {
        self.slot.ensure_valid()?;
        self.upgrade.ensure_valid()
    }

    /// Resolves when the read slot or the upgrade key is lost.
    pub fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        let (slot, upgrade) = (self.slot.lost(), self.upgrade.lost());
        async move {
            tokio::select! {
                reason = slot => reason,
                reason = upgrade => reason,
            }
        }
    }

    /// Becomes the writer: takes the gate (a fence greater than every earlier one), blocking
    /// new readers, and waits at most `max_wait` for the other readers to go. On failure
    /// everything is given back, the read hold too, and the error returned.
    pub async fn upgrade(self, ttl: Duration, max_wait: Duration) -> Result<WriteGuard> {
        let started = Instant::now();
        let give_up = saturating_add(started, max_wait);
        let UpgradeableRead {
            lock,
            upgrade,
            slot,
            ..
        } = self;
        let mut taken = Taken::default();
        taken.push(upgrade);
        taken.push(slot);
        let gate = lock.take_gate(ttl, started, give_up).await;
        let gate = taken.or_give_back(gate).await?;
        taken.push(gate);
        let own = taken.leases().get(1).map(|l| l.key().clone());
        let drained = lock.drain(own.as_ref(), ttl, started, give_up).await;
        taken.or_give_back(drained).await?;
        let mut leases = taken.finish().into_iter();
        let (Some(upgrade), Some(slot), Some(gate)) = (leases.next(), leases.next(), leases.next())
        else {
            return Err(missing());
        };
        // The write hold stands whatever this answer: a slot whose release is lost runs out
        // within its TTL, and until then it only delays the next writer, never admits anyone.
        let _ = slot.release().await;
        Ok(WriteGuard { gate, upgrade })
    }

    /// Gives the read slot and the upgrade key back.
    pub async fn release(self) -> Result<()> {
        release_all(vec![self.slot, self.upgrade]).await
    }
}

fn missing() -> Error {
    Error::Backend {
        backend: "leasehold",
        message: "a reader-writer hold lost track of a lease it took".into(),
        retryable: false,
        source: None,
    }
}

impl RwLock {
    /// A reader-writer lock named `name`, admitting [`DEFAULT_MAX_READERS`] readers at once.
    pub fn new(authority: Arc<dyn Authority>, name: &LockKey) -> Result<Self> {
        let readers = KeyPrefix::new(format!("{name}/rw/readers/"))?;
        let mut lock = RwLock {
            authority,
            name: name.clone(),
            gate: LockKey::new(format!("{name}/rw/gate"))?,
            upgrade: LockKey::new(format!("{name}/rw/upgrade"))?,
            readers,
            slots: Vec::new(),
            options: LeaseOptions::default(),
        };
        lock.slots = lock.slot_keys(DEFAULT_MAX_READERS)?;
        Ok(lock)
    }

    /// At most `readers` readers at once (1 to [`MAX_READERS`]). Processes may disagree on it:
    /// writers drain every slot they find, whoever's count made it.
    pub fn with_max_readers(mut self, readers: u32) -> Result<Self> {
        if readers == 0 || readers > MAX_READERS {
            return Err(Error::InvalidConfig {
                reason: format!(
                    "a reader-writer lock admits 1 to {MAX_READERS} readers at once, not {readers}"
                ),
            });
        }
        self.slots = self.slot_keys(readers)?;
        Ok(self)
    }

    fn slot_keys(&self, readers: u32) -> Result<Vec<LockKey>> {
        (0..readers)
            .map(|i| LockKey::new(format!("{}{i}", self.readers)))
            .collect()
    }

    /// The options the holds' leases get (renewal, release on drop).
    pub fn with_lease_options(mut self, options: LeaseOptions) -> Self {
        self.options = options;
        self
    }

    /// The gate's lock key, whose fences order every reader and writer.
    pub fn gate(&self) -> &LockKey {
        &self.gate
    }

    /// The upgrade key's lock key, held by a writer and by the upgradeable reader.
    pub fn upgrade_key(&self) -> &LockKey {
        &self.upgrade
    }

    /// The read slots' lock keys, slot 0 first.
    pub fn slots(&self) -> &[LockKey] {
        &self.slots
    }

    /// Takes a read hold for `ttl`, waiting at most `max_wait` behind a writer (or a waiting
    /// one) and for a free slot; [`Error::Timeout`] when none came.
    pub async fn read(&self, ttl: Duration, max_wait: Duration) -> Result<ReadGuard> {
        let started = Instant::now();
        let give_up = saturating_add(started, max_wait);
        let (slot, fence) = self.take_slot(ttl, started, give_up).await?;
        Ok(ReadGuard { slot, fence })
    }

    /// Takes the write hold for `ttl`, waiting at most `max_wait` for the writer or the
    /// upgradeable reader before it and then for the readers to go; [`Error::Timeout`] when
    /// they stayed. While it waits for readers, new readers wait behind it.
    pub async fn write(&self, ttl: Duration, max_wait: Duration) -> Result<WriteGuard> {
        let started = Instant::now();
        let give_up = saturating_add(started, max_wait);
        let mut taken = Taken::default();
        taken.push(self.take(&self.upgrade, ttl, started, give_up).await?);
        let gate = self.take_gate(ttl, started, give_up).await;
        let gate = taken.or_give_back(gate).await?;
        taken.push(gate);
        let drained = self.drain(None, ttl, started, give_up).await;
        taken.or_give_back(drained).await?;
        let mut leases = taken.finish().into_iter();
        let (Some(upgrade), Some(gate)) = (leases.next(), leases.next()) else {
            return Err(missing());
        };
        Ok(WriteGuard { gate, upgrade })
    }

    /// Takes the one upgradeable read hold for `ttl`, waiting at most `max_wait`: it reads
    /// beside plain readers, excludes writers and other upgradeable readers, and can become the
    /// writer without letting another writer in between ([`UpgradeableRead::upgrade`]).
    pub async fn upgradeable_read(
        &self,
        ttl: Duration,
        max_wait: Duration,
    ) -> Result<UpgradeableRead> {
        let started = Instant::now();
        let give_up = saturating_add(started, max_wait);
        let mut taken = Taken::default();
        taken.push(self.take(&self.upgrade, ttl, started, give_up).await?);
        let slot = self.take_slot(ttl, started, give_up).await;
        let (slot, fence) = taken.or_give_back(slot).await?;
        let Some(upgrade) = taken.finish().into_iter().next() else {
            return Err(missing());
        };
        Ok(UpgradeableRead {
            lock: self.clone(),
            upgrade,
            slot,
            fence,
        })
    }

    /// Takes `key` with the holds' options, waiting until `give_up`.
    async fn take(
        &self,
        key: &LockKey,
        ttl: Duration,
        started: Instant,
        give_up: Instant,
    ) -> Result<Lease> {
        let left = give_up.saturating_duration_since(Instant::now());
        Lease::acquire(self.authority.clone(), key, ttl, left, self.options.clone())
            .await
            .map_err(|e| self.waited(e, started))
    }

    async fn take_gate(&self, ttl: Duration, started: Instant, give_up: Instant) -> Result<Lease> {
        self.take(&self.gate, ttl, started, give_up).await
    }

    /// A timeout on one of the keys, reported as a wait for the lock's name since the start.
    fn waited(&self, error: Error, started: Instant) -> Error {
        match error {
            Error::Timeout { .. } => self.timeout(started),
            other => other,
        }
    }

    fn timeout(&self, started: Instant) -> Error {
        Error::Timeout {
            key: self.name.to_string(),
            waited: started.elapsed(),
        }
    }

    /// Passes the gate and takes a read slot; the slot's lease and the gate fence.
    async fn take_slot(
        &self,
        ttl: Duration,
        started: Instant,
        give_up: Instant,
    ) -> Result<(Lease, Fence)> {
        let mut backoff = self.backoff(ttl);
        loop {
            let gate = self.take_gate(ttl, started, give_up).await?;
            let fence = gate.fence();
            let mut passing = Taken::default();
            passing.push(gate);
            let slot = self.free_slot(ttl, &mut backoff, started, give_up).await;
            let slot = passing.or_give_back(slot).await?;
            // The slot counts only if the gate was still ours when the slot was granted: the
            // gate's local deadline ends before the authority's, so a valid gate now means no
            // writer could have taken it before the slot existed, and every writer after will
            // find the slot held.
            let mut holding = Taken::default();
            holding.push(slot);
            if passing.leases().iter().all(|g| g.ensure_valid().is_ok()) {
                passing.give_back().await?;
                let slot = holding.finish().pop().ok_or_else(missing)?;
                return Ok((slot, fence));
            }
            let _ = holding.give_back().await;
            let _ = passing.give_back().await;
            if Instant::now() >= give_up {
                return Err(self.timeout(started));
            }
        }
    }

    /// Takes the lowest free read slot, waiting until `give_up` for one to free.
    async fn free_slot(
        &self,
        ttl: Duration,
        backoff: &mut Backoff,
        started: Instant,
        give_up: Instant,
    ) -> Result<Lease> {
        loop {
            for key in &self.slots {
                let taken =
                    Lease::try_acquire(self.authority.clone(), key, ttl, self.options.clone())
                        .await?;
                if let Some(lease) = taken {
                    return Ok(lease);
                }
            }
            self.pause(&self.slots, backoff, started, give_up).await?;
        }
    }

    /// Waits until no read slot but `own` is held, or fails with [`Error::Timeout`] at
    /// `give_up`.
    async fn drain(
        &self,
        own: Option<&LockKey>,
        ttl: Duration,
        started: Instant,
        give_up: Instant,
    ) -> Result<()> {
        let mut backoff = self.backoff(ttl);
        loop {
            let held = self.held_slots(own).await?;
            if held.is_empty() {
                return Ok(());
            }
            self.pause(&held, &mut backoff, started, give_up).await?;
        }
    }

    /// The read slots the authority holds now, found by listing every slot key of this name
    /// (whatever count made it) and inspecting each.
    async fn held_slots(&self, own: Option<&LockKey>) -> Result<Vec<LockKey>> {
        let listed = self.authority.list_keys(&self.readers, usize::MAX).await?;
        let mut held = Vec::new();
        for key in listed.into_iter().filter(|k| Some(k) != own) {
            if self.authority.inspect(&key).await?.held {
                held.push(key);
            }
        }
        Ok(held)
    }

    /// Where the backend notifies, a release wakes a wait at once and the timer only finds
    /// holders that vanished (their slot frees when its lease runs out); where it polls, the
    /// timer is the wait.
    fn backoff(&self, ttl: Duration) -> Backoff {
        let cap = match self.authority.capabilities().wait {
            WaitStrategy::Notification => (ttl / 2).max(Duration::from_millis(200)),
            _ => Duration::from_millis(200),
        };
        Backoff::new(Duration::from_millis(5), cap)
    }

    /// Waits for any of `keys` to change, for the next backoff step, or fails with
    /// [`Error::Timeout`] once `give_up` has passed.
    async fn pause(
        &self,
        keys: &[LockKey],
        backoff: &mut Backoff,
        started: Instant,
        give_up: Instant,
    ) -> Result<()> {
        let now = Instant::now();
        if now >= give_up {
            return Err(self.timeout(started));
        }
        let next = saturating_add(now, backoff.next_delay()).min(give_up);
        let wait = next.saturating_duration_since(now);
        if keys.is_empty() {
            tokio::time::sleep(wait).await;
            return Ok(());
        }
        let waits = keys.iter().map(|key| {
            let authority = self.authority.clone();
            Box::pin(async move { authority.wait_for_change(key, wait).await })
        });
        let (first, _, _) = futures_util::future::select_all(waits).await;
        first
    }
}
