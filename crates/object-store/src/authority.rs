//! The [`Authority`] on an object store.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use leasehold_core::backend::{claim_or_give_back, Backoff, Left, SmallestKeys};
use leasehold_core::time::saturating_add;
use leasehold_core::{
    Authority, Capabilities, Error, Fence, FenceSafety, Grant, Inspection, Instant, KeyPrefix,
    LockKey, LostReason, OwnerId, OwnerToken, Released, Result, Revoked, WaitStrategy,
};
use object_store::{ObjectStore, UpdateVersion};
use tokio::sync::Notify;

use crate::config::ObjectStoreConfig;
use crate::names::Names;
use crate::objects::{Objects, Put, Seen};
use crate::record::{Record, State};
use crate::store_clock::{expired, remaining, ClockCache};
use crate::{BACKEND, EXPIRY_SLACK, TTL};

/// How many times one step reads and decides again when the object changed between its read
/// and its conditional write.
const ATTEMPTS: u32 = 8;

/// A grant's last write that this client knows landed: the version a renewal, proclaim or
/// release writes over, and the record it holds.
#[derive(Clone, Debug)]
struct Mine {
    version: UpdateVersion,
    record: Record,
    /// Before the last landed write was sent plus its TTL: past it, this client no longer
    /// counts the lease as its own (the store's expiry comes later still).
    valid_until: Instant,
}

/// What one acquisition step found.
#[derive(Debug)]
enum Step {
    /// The key is ours: the record written and its version.
    Won(Record, UpdateVersion),
    /// Someone holds it; it cannot expire sooner than this (by the store's clock, as last read).
    Held(Duration),
}

/// What one acquisition attempt gave the caller.
#[derive(Debug)]
enum Attempt {
    Won(Grant),
    /// Held by someone else, whose lease cannot end sooner than this.
    Held(Duration),
}

fn won(answer: &Result<Step>) -> Option<(Record, UpdateVersion)> {
    match answer {
        Ok(Step::Won(record, version)) => Some((record.clone(), version.clone())),
        _ => None,
    }
}

#[derive(Debug)]
struct Inner {
    objects: Objects,
    config: ObjectStoreConfig,
    capabilities: Capabilities,
    mine: Mutex<HashMap<(LockKey, OwnerToken), Mine>>,
    /// Released or proclaimed through this client: wakes its own waiters early.
    changed: Notify,
}

/// An [`Authority`] whose leases are objects in an object store (S3, Azure Blob, GCS, or any
/// [`ObjectStore`] with conditional puts). See the crate's documentation.
#[derive(Clone)]
pub struct ObjectStoreAuthority {
    inner: Arc<Inner>,
}

impl fmt::Debug for ObjectStoreAuthority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ObjectStoreAuthority")
            .field(
                "store",
                &leasehold_gate_object::redact(&self.inner.objects.store.to_string()),
            )
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl ObjectStoreAuthority {
    /// An authority on the caller's own `store`: lease objects under `config`'s prefix. No
    /// request is made; the bucket must exist. The store must support conditional puts
    /// (`PutMode::Create` and `PutMode::Update`; for S3 build it with
    /// `S3ConditionalPut::ETagMatch`), and its client's own retries should end well within the
    /// request timeout.
    pub fn new(store: Arc<dyn ObjectStore>, config: ObjectStoreConfig) -> Self {
        let capabilities = Capabilities::new(
            BACKEND,
            FenceSafety::Linearizable,
            config.durable_fences,
            TTL,
        )
        .with_wait(WaitStrategy::Polling)
        .with_expiry_slack(EXPIRY_SLACK);
        ObjectStoreAuthority {
            inner: Arc::new(Inner {
                objects: Objects {
                    store,
                    names: Names::new(&config.prefix),
                    timeout: config.client.request_timeout,
                    clock: ClockCache::default(),
                },
                config,
                capabilities,
                mine: Mutex::new(HashMap::new()),
                changed: Notify::new(),
            }),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &ObjectStoreConfig {
        &self.inner.config
    }

    fn fence(&self, raw: u64) -> Result<Fence> {
        Fence::compose(
            BACKEND,
            self.inner.config.client.epoch,
            raw,
            self.inner.capabilities.fence_safety,
        )
    }

    /// One acquisition attempt, waited for up to the request timeout; a win that arrives after
    /// the caller left is given back (see [`claim_or_give_back`]).
    async fn attempt(&self, key: &LockKey, ttl: Duration) -> Result<Attempt> {
        let owner = OwnerToken::generate()?;
        // Read before anything is sent: the grant's deadline counts from here.
        let sent = Instant::now();
        let timeout = self.inner.config.client.request_timeout;
        // A step may take several requests; each is bounded, the whole by twice the timeout.
        let give_up = saturating_add(sent, timeout.saturating_mul(2));
        let request = {
            let (inner, key) = (self.inner.clone(), key.clone());
            move |left: Left| async move {
                inner
                    .acquire_step(&key, owner, ttl, move || left.get())
                    .await
            }
        };
        let give_back = {
            let (inner, key) = (self.inner.clone(), key.clone());
            move |(record, version): (Record, UpdateVersion)| {
                let (inner, key) = (inner.clone(), key.clone());
                async move {
                    let _ = inner.release_over(&key, &record, version).await;
                }
            }
        };
        let answer = claim_or_give_back(request, give_up, won, give_back)
            .await
            .map_err(|why| why.into_error(BACKEND, "acquire", timeout.saturating_mul(2)))?;
        match answer? {
            Step::Held(left) => Ok(Attempt::Held(left)),
            Step::Won(record, version) => {
                let fence = self.fence(record.fence)?;
                self.inner.remember(
                    key,
                    owner,
                    Mine {
                        version,
                        record,
                        valid_until: saturating_add(sent, ttl),
                    },
                );
                let deadline = self.inner.config.client.safety_margin.deadline(sent, ttl);
                Ok(Attempt::Won(leasehold_core::backend::grant(
                    key.clone(),
                    owner,
                    fence,
                    ttl,
                    deadline,
                )))
            }
        }
    }

    /// The grant's last landed write, from this client's memory or read from the store (a
    /// grant made by another client of the same store); `None` when the object no longer names
    /// the grant's holder.
    async fn mine(&self, grant: &Grant) -> Result<Option<Mine>> {
        let remembered = self.inner.lookup(grant);
        if remembered.is_some() {
            return Ok(remembered);
        }
        Ok(self
            .inner
            .objects
            .read(grant.key())
            .await?
            .filter(|seen| seen.record.names(grant.owner(), grant.fence().raw()))
            .map(|seen| Mine {
                version: seen.version,
                record: seen.record,
                valid_until: grant.deadline(),
            }))
    }

    /// Writes `change(record)` over the grant's last landed write: renew and proclaim. A
    /// conflict is read: if the object still names the grant (a write of ours landed whose
    /// answer was lost), the write is made again over that version; otherwise the grant is
    /// lost, at once.
    async fn rewrite(
        &self,
        grant: &Grant,
        ttl: Duration,
        change: impl Fn(&Record) -> Record,
    ) -> Result<Instant> {
        let lost = || Error::lease_lost(grant.key().as_str(), LostReason::Refused);
        let sent = Instant::now();
        let Some(mut mine) = self.mine(grant).await? else {
            self.inner.forget(grant);
            return Err(lost());
        };
        for _ in 0..ATTEMPTS {
            if Instant::now() >= mine.valid_until {
                self.inner.forget(grant);
                return Err(lost());
            }
            let record = change(&mine.record);
            match self
                .inner
                .objects
                .put(grant.key(), &record, Some(&mine.version))
                .await?
            {
                Put::Done(version) => {
                    // Counted from this write alone: a renewal to a shorter TTL shortens it.
                    let valid_until = saturating_add(sent, Duration::from_millis(record.ttl_ms));
                    self.inner.remember(
                        grant.key(),
                        grant.owner(),
                        Mine {
                            version,
                            record,
                            valid_until,
                        },
                    );
                    return Ok(self.inner.config.client.safety_margin.deadline(sent, ttl));
                }
                Put::Conflict => match self.inner.objects.read(grant.key()).await? {
                    Some(seen) if seen.record.names(grant.owner(), grant.fence().raw()) => {
                        mine.version = seen.version;
                        mine.record = seen.record;
                    }
                    _ => {
                        self.inner.forget(grant);
                        return Err(lost());
                    }
                },
            }
        }
        Err(Error::Unavailable {
            backend: BACKEND,
            message: format!(
                "{} changed under every one of {ATTEMPTS} conditional writes in a row",
                grant.key()
            ),
            source: None,
        })
    }
}

impl Inner {
    fn remember(&self, key: &LockKey, owner: OwnerToken, mine: Mine) {
        let mut all = self.mine.lock().unwrap_or_else(|e| e.into_inner());
        // Grants dropped without a release would stay forever: forget those long over.
        let now = Instant::now();
        all.retain(|_, m| saturating_add(m.valid_until, Duration::from_secs(60)) > now);
        all.insert((key.clone(), owner), mine);
    }

    fn lookup(&self, grant: &Grant) -> Option<Mine> {
        let all = self.mine.lock().unwrap_or_else(|e| e.into_inner());
        all.get(&(grant.key().clone(), grant.owner())).cloned()
    }

    fn forget(&self, grant: &Grant) {
        let mut all = self.mine.lock().unwrap_or_else(|e| e.into_inner());
        all.remove(&(grant.key().clone(), grant.owner()));
    }

    /// One acquisition step for `owner`: create the object, take it over when free or expired
    /// by the store's clock, or report it held. A conflict (someone wrote between the read and
    /// the write) is read again; a record naming `owner` is our own write landing (the store's
    /// client may have sent it twice).
    ///
    /// Once the caller has left (`left()`), it writes nothing more: an attempt nobody waits for
    /// must not take a key later, after others have come and gone (a write already sent may
    /// still land, and is given back).
    async fn acquire_step(
        &self,
        key: &LockKey,
        owner: OwnerToken,
        ttl: Duration,
        left: impl Fn() -> bool,
    ) -> Result<Step> {
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        for _ in 0..ATTEMPTS {
            let seen = self.objects.read(key).await?;
            let (record, over) = match seen {
                None => (Record::first(owner, ttl_ms), None),
                Some(Seen {
                    record, version, ..
                }) if record.state == State::Free => {
                    (record.taken_by(owner, ttl_ms), Some(version))
                }
                Some(seen) => {
                    if seen.record.owner == owner.to_hex() {
                        return Ok(Step::Won(seen.record, seen.version));
                    }
                    let (last, held_ttl) = (seen.last_modified, seen.record.ttl_ms);
                    let wait = self.objects.clock.wait_before_probe(last, held_ttl);
                    if !wait.is_zero() {
                        return Ok(Step::Held(wait));
                    }
                    let now = self.objects.store_now(key).await?;
                    if !expired(last, held_ttl, now) {
                        return Ok(Step::Held(remaining(last, held_ttl, now)));
                    }
                    (seen.record.taken_by(owner, ttl_ms), Some(seen.version))
                }
            };
            if left() {
                return Ok(Step::Held(Duration::ZERO));
            }
            if let Put::Done(version) = self.objects.put(key, &record, over.as_ref()).await? {
                return Ok(Step::Won(record, version));
            }
        }
        Err(Error::Unavailable {
            backend: BACKEND,
            message: format!("{key} changed under every one of {ATTEMPTS} acquisitions in a row"),
            source: None,
        })
    }

    /// Frees the lease whose last landed write is `record` at `version`: `Released` if this
    /// write (or a copy of it the store's client sent again) freed it, `AlreadyGone` if the
    /// object went on to name someone else.
    async fn release_over(
        &self,
        key: &LockKey,
        record: &Record,
        mut version: UpdateVersion,
    ) -> Result<Released> {
        let owner = record.owner.clone();
        let mut current = record.clone();
        for _ in 0..ATTEMPTS {
            let free = current.released();
            match self.objects.put(key, &free, Some(&version)).await? {
                Put::Done(_) => {
                    self.changed.notify_waiters();
                    return Ok(Released::Released);
                }
                Put::Conflict => match self.objects.read(key).await? {
                    Some(seen)
                        if seen.record.state == State::Held
                            && seen.record.owner == owner
                            && seen.record.fence == record.fence =>
                    {
                        version = seen.version;
                        current = seen.record;
                    }
                    // Our own release, sent again by the store's client after a lost answer.
                    Some(seen)
                        if seen.record.state == State::Free
                            && seen.record.fence == free.fence
                            && seen.record.seq == free.seq =>
                    {
                        return Ok(Released::Released)
                    }
                    _ => return Ok(Released::AlreadyGone),
                },
            }
        }
        Err(Error::Unavailable {
            backend: BACKEND,
            message: format!("{key} changed under every one of {ATTEMPTS} releases in a row"),
            source: None,
        })
    }
}

#[async_trait]
impl Authority for ObjectStoreAuthority {
    fn capabilities(&self) -> &Capabilities {
        &self.inner.capabilities
    }

    async fn try_acquire(&self, key: &LockKey, ttl: Duration) -> Result<Option<Grant>> {
        TTL.check(ttl)?;
        Ok(match self.attempt(key, ttl).await? {
            Attempt::Won(grant) => Some(grant),
            Attempt::Held(_) => None,
        })
    }

    /// Polls: each attempt reads the object (one request), and probes the store's clock only
    /// once the holder's lease may have run out. Between attempts it sleeps a jittered delay
    /// between the configured bounds (at least [`crate::POLL_FLOOR`]), shorter when the
    /// holder's lease ends sooner; a release through this same client wakes it at once.
    async fn acquire(&self, key: &LockKey, ttl: Duration, max_wait: Duration) -> Result<Grant> {
        TTL.check(ttl)?;
        let start = Instant::now();
        let give_up = saturating_add(start, max_wait);
        let (min, max) = (self.inner.config.poll_min, self.inner.config.poll_max);
        let mut poll = Backoff::new(min, max);
        loop {
            let released = self.inner.changed.notified();
            let left = match self.attempt(key, ttl).await? {
                Attempt::Won(grant) => return Ok(grant),
                Attempt::Held(left) => left,
            };
            let now = Instant::now();
            if now >= give_up {
                return Err(Error::Timeout {
                    key: key.to_string(),
                    waited: now - start,
                });
            }
            // Sooner when the holder's lease may end sooner, never below the floor.
            let delay = poll.next_delay().min(left).max(min);
            tokio::select! {
                _ = released => {}
                _ = tokio::time::sleep_until(saturating_add(now, delay).min(give_up)) => {}
            }
        }
    }

    async fn renew(&self, grant: &Grant, ttl: Duration) -> Result<Instant> {
        TTL.check(ttl)?;
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        self.rewrite(grant, ttl, |record| Record {
            ttl_ms,
            ..record.rewritten()
        })
        .await
    }

    /// One renewal after another: an object store has no write that spans objects.
    async fn renew_many(&self, grants: &[Grant]) -> Vec<Result<Instant>> {
        let mut answers = Vec::with_capacity(grants.len());
        for grant in grants {
            answers.push(self.renew(grant, grant.ttl()).await);
        }
        answers
    }

    /// A conditional write of the freed record (fence kept) over the grant's last write; never
    /// an unconditional write or a delete.
    async fn release(&self, grant: &Grant) -> Result<Released> {
        let Some(mine) = self.mine(grant).await? else {
            self.inner.forget(grant);
            return Ok(Released::AlreadyGone);
        };
        let over = Instant::now() >= mine.valid_until;
        let released = self
            .inner
            .release_over(grant.key(), &mine.record, mine.version)
            .await?;
        self.inner.forget(grant);
        // Past its TTL by this client's count, the lease was no longer ours to release, even
        // if nobody had taken it yet (the freed object then just saves the next one a probe).
        Ok(if over {
            Released::AlreadyGone
        } else {
            released
        })
    }

    /// Reads the object and, while it is held, the store's clock (a write to this key's clock
    /// object, which no lease depends on: nothing a holder or a waiter reads changes).
    async fn inspect(&self, key: &LockKey) -> Result<Inspection> {
        let objects = &self.inner.objects;
        let Some(seen) = objects.read(key).await? else {
            return Ok(Inspection::free(BACKEND, key.clone()));
        };
        let last = Some(self.fence(seen.record.fence)?);
        if seen.record.state == State::Free {
            return Ok(Inspection::free(BACKEND, key.clone()).with_last_fence(last));
        }
        let now = objects.store_now(key).await?;
        let (modified, ttl_ms) = (seen.last_modified, seen.record.ttl_ms);
        if expired(modified, ttl_ms, now) {
            return Ok(Inspection::free(BACKEND, key.clone()).with_last_fence(last));
        }
        Ok(Inspection::held(
            BACKEND,
            key.clone(),
            OwnerId::from_stored(&seen.record.owner),
        )
        .with_fence(last)
        // At most the TTL: the store's whole seconds would otherwise add up to one.
        .with_remaining(Some(
            remaining(modified, ttl_ms, now).min(Duration::from_millis(ttl_ms)),
        ))
        .with_last_fence(last)
        .with_value(seen.record.value_bytes()))
    }

    /// Reads the object and, while it is held, the store's clock (as inspect does); a live
    /// holder's object is then rewritten free as its own release would (a conditional put on
    /// the version read, sent again only while the same owner and fence hold it), so a holder
    /// that arrived in between is never freed. The fence stays in the object, so the next
    /// grant's is greater; the holder's next renewal (a conditional put) is refused.
    async fn revoke(&self, key: &LockKey) -> Result<Revoked> {
        let objects = &self.inner.objects;
        let Some(seen) = objects.read(key).await? else {
            return Ok(Revoked::WasFree);
        };
        if seen.record.state == State::Free {
            return Ok(Revoked::WasFree);
        }
        let now = objects.store_now(key).await?;
        if expired(seen.last_modified, seen.record.ttl_ms, now) {
            return Ok(Revoked::WasFree);
        }
        let fence = self.fence(seen.record.fence)?;
        match self
            .inner
            .release_over(key, &seen.record, seen.version)
            .await?
        {
            Released::Released => Ok(Revoked::Revoked { fence }),
            Released::AlreadyGone => Ok(Revoked::WasFree),
        }
    }

    /// Lists the lease objects under the prefix (every key ever taken: objects outlive
    /// release).
    async fn list_keys(&self, prefix: &KeyPrefix, limit: usize) -> Result<Vec<LockKey>> {
        let names = &self.inner.objects.names;
        let mut smallest = SmallestKeys::new(limit);
        for path in self.inner.objects.list().await? {
            if let Some(key) = names.key_of(&path).filter(|k| prefix.matches(k)) {
                smallest.offer(key);
            }
        }
        Ok(smallest.into_sorted())
    }

    /// A conditional write of the value into the holder's record (which counts as a renewal
    /// by the store's clock: the object's last-modified time moves).
    async fn proclaim(&self, grant: &Grant, value: &[u8]) -> Result<()> {
        leasehold_core::backend::check_proclaimed(value)?;
        let hex = hex::encode(value);
        self.rewrite(grant, grant.ttl(), |record| Record {
            value: Some(hex.clone()),
            ..record.rewritten()
        })
        .await?;
        self.inner.changed.notify_waiters();
        Ok(())
    }

    /// Polling, as declared: sleeps for `max_wait`, cut short by a release or proclaim through
    /// this same client.
    async fn wait_for_change(&self, key: &LockKey, max_wait: Duration) -> Result<()> {
        let _ = key;
        let until = saturating_add(Instant::now(), max_wait);
        tokio::select! {
            _ = self.inner.changed.notified() => {}
            _ = tokio::time::sleep_until(until) => {}
        }
        Ok(())
    }
}
