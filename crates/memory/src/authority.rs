//! A client of a [`MemoryServer`].

use std::fmt;
use std::pin::pin;
use std::time::Duration;

use async_trait::async_trait;
use leasehold_core::backend::SmallestKeys;
use leasehold_core::{
    Authority, Capabilities, ClientOptions, Error, Fence, FenceSafety, Grant, Inspection, Instant,
    KeyPrefix, LockKey, LostReason, OwnerId, OwnerToken, Released, Result, Revoked, TtlRange,
};

use crate::server::{MemoryServer, BACKEND};

/// The TTLs the reference authority grants: 1 ms to 24 h, in whole milliseconds.
const TTL: TtlRange = TtlRange::new(
    Duration::from_millis(1),
    Duration::from_secs(24 * 3600),
    Duration::from_millis(1),
);

/// A client of a [`MemoryServer`]: the reference [`Authority`].
#[derive(Clone)]
pub struct MemoryAuthority {
    server: MemoryServer,
    options: ClientOptions,
    capabilities: Capabilities,
}

impl fmt::Debug for MemoryAuthority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryAuthority")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl MemoryAuthority {
    /// A client of `server`.
    pub fn new(server: MemoryServer, options: ClientOptions) -> Self {
        MemoryAuthority {
            server,
            options,
            capabilities: Capabilities::new(BACKEND, FenceSafety::Linearizable, true, TTL)
                .with_batch_renewal(true)
                .with_atomic_acquire_all(true),
        }
    }

    /// Declares (and stamps on its fences) another fence safety. The reference server itself is
    /// linearizable; this lets tests model a backend whose standby replicates asynchronously
    /// (see the conformance suite's failover scenario).
    pub fn declaring(mut self, safety: FenceSafety) -> Self {
        self.capabilities.fence_safety = safety;
        self
    }

    /// A client of a fresh, private server.
    pub fn standalone() -> Self {
        MemoryServer::new().authority(ClientOptions::default())
    }

    /// The server this client talks to (for fault injection in tests).
    pub fn server(&self) -> &MemoryServer {
        &self.server
    }

    /// The client options (epoch, safety margin, request timeout).
    pub fn options(&self) -> &ClientOptions {
        &self.options
    }

    fn fence(&self, raw: u64) -> Result<Fence> {
        Fence::compose(
            BACKEND,
            self.options.epoch,
            raw,
            self.capabilities.fence_safety,
        )
    }

    fn owns(grant: &Grant, owner: OwnerToken, fence: u64) -> bool {
        grant.owner() == owner && grant.fence().raw() == fence
    }
}

#[async_trait]
impl Authority for MemoryAuthority {
    fn capabilities(&self) -> &Capabilities {
        &self.capabilities
    }

    async fn try_acquire(&self, key: &LockKey, ttl: Duration) -> Result<Option<Grant>> {
        TTL.check(ttl)?;
        let owner = OwnerToken::generate()?;
        let sent = Instant::now();
        let raw = self
            .server
            .request(&self.options, "acquire", |state, now| {
                if state.live(key, now).is_some() {
                    None
                } else {
                    Some(state.grant(key, owner, ttl, now))
                }
            })
            .await?;
        let Some(raw) = raw else { return Ok(None) };
        let deadline = self.options.safety_margin.deadline(sent, ttl);
        Ok(Some(leasehold_core::backend::grant(
            key.clone(),
            owner,
            self.fence(raw)?,
            ttl,
            deadline,
        )))
    }

    /// One request checks every key and takes them all, or none.
    async fn try_acquire_all(&self, keys: &[LockKey], ttl: Duration) -> Result<Option<Vec<Grant>>> {
        TTL.check(ttl)?;
        leasehold_core::backend::check_canonical(keys)?;
        let owners = OwnerToken::generate_many(keys.len())?;
        let sent = Instant::now();
        let raws = self
            .server
            .request(&self.options, "acquire_all", |state, now| {
                if keys.iter().any(|key| state.live(key, now).is_some()) {
                    return None;
                }
                let raws = keys
                    .iter()
                    .zip(&owners)
                    .map(|(key, owner)| state.grant(key, *owner, ttl, now));
                Some(raws.collect::<Vec<_>>())
            })
            .await?;
        let Some(raws) = raws else { return Ok(None) };
        let deadline = self.options.safety_margin.deadline(sent, ttl);
        let grants = keys
            .iter()
            .zip(owners)
            .zip(raws)
            .map(|((key, owner), raw)| {
                Ok(leasehold_core::backend::grant(
                    key.clone(),
                    owner,
                    self.fence(raw)?,
                    ttl,
                    deadline,
                ))
            });
        grants.collect::<Result<Vec<_>>>().map(Some)
    }

    async fn acquire(&self, key: &LockKey, ttl: Duration, max_wait: Duration) -> Result<Grant> {
        TTL.check(ttl)?;
        let start = Instant::now();
        let give_up = leasehold_core::time::saturating_add(start, max_wait);
        let notify = self.server.waiter(key);
        loop {
            // Register for the release notification before trying, so a release between the
            // attempt and the wait is not missed.
            let mut released = pin!(notify.notified());
            released.as_mut().enable();
            if let Some(grant) = self.try_acquire(key, ttl).await? {
                return Ok(grant);
            }
            let now = Instant::now();
            if now >= give_up {
                return Err(Error::Timeout {
                    key: key.to_string(),
                    waited: now - start,
                });
            }
            // Fallback: the holder may vanish without releasing; its lease ends at expiry.
            let expiry = self
                .server
                .lock()
                .live(key, now)
                .map_or(now, |e| e.expires_at);
            tokio::select! {
                _ = released => {}
                _ = tokio::time::sleep_until(expiry.min(give_up)) => {}
            }
        }
    }

    async fn renew(&self, grant: &Grant, ttl: Duration) -> Result<Instant> {
        TTL.check(ttl)?;
        let sent = Instant::now();
        let renewed = self
            .server
            .request(&self.options, "renew", |state, now| {
                match state.leases.get_mut(grant.key()) {
                    Some(e) if Self::owns(grant, e.owner, e.fence) && e.expires_at > now => {
                        e.expires_at = now + ttl;
                        true
                    }
                    _ => false,
                }
            })
            .await?;
        if !renewed {
            return Err(Error::lease_lost(grant.key().as_str(), LostReason::Refused));
        }
        Ok(self.options.safety_margin.deadline(sent, ttl))
    }

    /// One request renews the whole batch, each grant checked as `renew` checks it.
    async fn renew_many(&self, grants: &[Grant]) -> Vec<Result<Instant>> {
        if let Err(refused) = leasehold_core::backend::check_batch_ttls(grants, &TTL) {
            return refused;
        }
        let sent = Instant::now();
        let renewed = self
            .server
            .request(&self.options, "renew", |state, now| {
                grants
                    .iter()
                    .map(|grant| match state.leases.get_mut(grant.key()) {
                        Some(e) if Self::owns(grant, e.owner, e.fence) && e.expires_at > now => {
                            e.expires_at = now + grant.ttl();
                            true
                        }
                        _ => false,
                    })
                    .collect::<Vec<bool>>()
            })
            .await;
        match renewed {
            Err(e) => leasehold_core::backend::batch_failed(e, grants.len()),
            Ok(renewed) => leasehold_core::backend::batch_answers(
                grants,
                sent,
                &self.options.safety_margin,
                |i, _| renewed.get(i) == Some(&true),
            ),
        }
    }

    async fn release(&self, grant: &Grant) -> Result<Released> {
        self.server
            .request(&self.options, "release", |state, now| {
                match state.leases.get(grant.key()).copied() {
                    Some(e) if Self::owns(grant, e.owner, e.fence) => {
                        state.remove(grant.key());
                        if e.expires_at > now {
                            Released::Released
                        } else {
                            Released::AlreadyGone
                        }
                    }
                    _ => Released::AlreadyGone,
                }
            })
            .await
    }

    /// Reads the server's entry for `key` and its fence counter, as one request (so a paused or
    /// killed server fails it like any other), changing nothing. The counter is global, so the
    /// last fence issued *for this key* is the live entry's, or else unknown (`None`).
    async fn inspect(&self, key: &LockKey) -> Result<Inspection> {
        let live = self
            .server
            .request(&self.options, "inspect", |state, now| {
                state.live(key, now).map(|e| {
                    let value = state
                        .values
                        .get(key)
                        .filter(|(fence, _)| *fence == e.fence)
                        .map(|(_, v)| v.clone());
                    (
                        e.owner,
                        e.fence,
                        e.expires_at.saturating_duration_since(now),
                        value,
                    )
                })
            })
            .await?;
        Ok(match live {
            None => Inspection::free(BACKEND, key.clone()),
            Some((owner, raw, remaining, value)) => {
                let fence = self.fence(raw)?;
                Inspection::held(BACKEND, key.clone(), OwnerId::of(&owner))
                    .with_fence(Some(fence))
                    .with_remaining(Some(remaining))
                    .with_last_fence(Some(fence))
                    .with_value(value)
            }
        })
    }

    async fn proclaim(&self, grant: &Grant, value: &[u8]) -> Result<()> {
        leasehold_core::backend::check_proclaimed(value)?;
        let stored = self
            .server
            .request(&self.options, "proclaim", |state, now| {
                match state.live(grant.key(), now) {
                    Some(e) if Self::owns(grant, e.owner, e.fence) => {
                        let fence = e.fence;
                        state
                            .values
                            .insert(grant.key().clone(), (fence, value.to_vec()));
                        state.changed(grant.key());
                        true
                    }
                    _ => false,
                }
            })
            .await?;
        if !stored {
            return Err(Error::lease_lost(grant.key().as_str(), LostReason::Refused));
        }
        Ok(())
    }

    /// Woken by every grant, release and proclaim on `key`; an expiry is found by the caller's
    /// next read, within `max_wait`.
    async fn wait_for_change(&self, key: &LockKey, max_wait: Duration) -> Result<()> {
        let notify = self.server.waiter(key);
        let until = leasehold_core::time::saturating_add(Instant::now(), max_wait);
        tokio::select! {
            _ = notify.notified() => {}
            _ = tokio::time::sleep_until(until) => {}
        }
        Ok(())
    }

    /// Removes the live entry of `key`, whoever holds it, in the same request that reads it:
    /// nothing can arrive in between. The fence counter is the server's and untouched, so the
    /// next grant's fence is greater.
    async fn revoke(&self, key: &LockKey) -> Result<Revoked> {
        let ended = self
            .server
            .request(&self.options, "revoke", |state, now| {
                let fence = state.live(key, now).map(|e| e.fence);
                if fence.is_some() {
                    state.remove(key);
                }
                fence
            })
            .await?;
        Ok(match ended {
            Some(raw) => Revoked::Revoked {
                fence: self.fence(raw)?,
            },
            None => Revoked::WasFree,
        })
    }

    /// The keys with a live lease, as one request: the server forgets a key when its lease
    /// is released, and an expired entry is free.
    async fn list_keys(&self, prefix: &KeyPrefix, limit: usize) -> Result<Vec<LockKey>> {
        self.server
            .request(&self.options, "list_keys", |state, now| {
                let mut keys = SmallestKeys::new(limit);
                for key in state.leases.keys() {
                    if prefix.matches(key) && state.live(key, now).is_some() {
                        keys.offer(key.clone());
                    }
                }
                keys.into_sorted()
            })
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type TestResult<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

    fn key(s: &str) -> LockKey {
        LockKey::new(s).expect("the key")
    }

    const TTL_1S: Duration = Duration::from_secs(1);

    #[tokio::test(start_paused = true)]
    async fn pause_times_out_and_kill_is_unavailable() -> TestResult {
        let a = MemoryAuthority::standalone();
        a.server().pause();
        let err = a
            .try_acquire(&key("k"), TTL_1S)
            .await
            .err()
            .ok_or("acquiring under a stale epoch: it succeeded")?;
        assert!(matches!(err, Error::Unavailable { .. }), "{err}");
        a.server().kill();
        let err = a
            .try_acquire(&key("k"), TTL_1S)
            .await
            .err()
            .ok_or("acquiring under a stale epoch: it succeeded")?;
        assert!(matches!(err, Error::Unavailable { .. }), "{err}");
        a.server().resume();
        assert!(a
            .try_acquire(&key("k"), TTL_1S)
            .await
            .map_err(|e| format!("acquiring k under the current epoch: {e}"))?
            .is_some());
        Ok(())
    }

    #[tokio::test(start_paused = true)]
    async fn restart_keeps_the_counter_and_drops_leases() -> TestResult {
        let a = MemoryAuthority::standalone();
        let g1 = a
            .try_acquire(&key("k"), TTL_1S)
            .await
            .map_err(|e| format!("trying to acquire k: {e}"))?
            .ok_or("acquiring k")?;
        a.server().restart();
        let g2 = a
            .try_acquire(&key("k"), TTL_1S)
            .await
            .map_err(|e| format!("trying to acquire k again: {e}"))?
            .ok_or("acquiring k again")?;
        assert!(g2.fence() > g1.fence());
        Ok(())
    }

    #[tokio::test]
    async fn named_servers_are_shared() -> TestResult {
        let a = MemoryServer::named("shared-test").authority(ClientOptions::default());
        let b = MemoryServer::named("shared-test").authority(ClientOptions::default());
        let c = MemoryServer::named("other-test").authority(ClientOptions::default());
        let _g = a
            .try_acquire(&key("k"), TTL_1S)
            .await
            .map_err(|e| format!("A tries to acquire k: {e}"))?
            .ok_or("A acquires k")?;
        assert!(b
            .try_acquire(&key("k"), TTL_1S)
            .await
            .map_err(|e| format!("B tries to acquire k while A holds it: {e}"))?
            .is_none());
        assert!(c
            .try_acquire(&key("k"), TTL_1S)
            .await
            .map_err(|e| format!("C acquires k in another server: {e}"))?
            .is_some());
        Ok(())
    }
}
