//! Deliberately broken authorities: the suite must catch every one.
//!
//! Each mutant wraps the reference [`MemoryAuthority`] and breaks exactly one rule that a real
//! backend could plausibly get wrong. A suite that passes a mutant has no teeth for that rule.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use leasehold_core::{
    Authority, Capabilities, ClientOptions, Error, Fence, FenceSafety, Grant, Inspection, Instant,
    KeyPrefix, LockKey, OwnerToken, Released, Result, Revoked,
};
use leasehold_memory::{MemoryAuthority, MemoryServer};

use crate::context::{Connector, Context};
use crate::memory::{MemoryFaults, MemoryResidue, Replication};

/// The ways an authority can be broken.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mutant {
    /// Release deletes the key whoever holds it (a plain `DEL`).
    UnconditionalRelease,
    /// Acquire takes the key even when someone holds it.
    AcquireIgnoresHolder,
    /// The fence counter restarts when a key is released (a counter kept with the lease).
    FenceRestartsAfterRelease,
    /// Renew extends whatever lease the key has, without checking the owner (a plain `PEXPIRE`).
    RenewWithoutOwnerCheck,
    /// A grant's local deadline is counted from the response instead of from before the request
    /// (with a round trip shorter than the safety margin).
    DeadlineAfterResponse,
    /// A renewal's local deadline is counted from the response.
    RenewalDeadlineAfterResponse,
    /// A batched renewal extends every key it names without checking the owner (a
    /// `renew_many` script that sends `PEXPIRE` for each key): lone renewals still compare.
    BatchRenewWithoutOwnerCheck,
    /// A batched renewal's local deadlines are counted from the response (with a round trip
    /// shorter than the safety margin): lone renewals still count from before the request.
    BatchRenewalDeadlineAfterResponse,
    /// A waiter is told it holds the key after its lease already expired (a grant delivered late
    /// with a fresh deadline).
    ExpiredWaiterTold,
    /// Declares linearizable fences while its standby replicates asynchronously.
    LiesAboutFailoverSafety,
    /// A `try_acquire` dropped after the authority granted it keeps the lease alive for the
    /// client's lifetime (a session that renews every key it booked), so the key stays blocked.
    CancelledAttemptKeepsKey,
    /// Release compares only what the same client reuses (a key named after its session), not
    /// the grant: a client's late release of its expired grant frees its newer grant.
    ReleaseComparesClientOnly,
    /// The fence counter is cleaned up when a key sits idle (a container parent reaped), so
    /// fences restart after a quiet period.
    FenceRestartsAfterIdle,
    /// Revoke ends the holder's lease but the next grant on the key reuses the revoked fence
    /// (a revoke that deletes the fence counter along with the lease): the revoked holder's
    /// late writes then pass every gate.
    RevokeReusesFence,
    /// A renewal that asks for another TTL extends the lease by the TTL it was granted with
    /// (a renew script that reuses the stored TTL), while answering with the deadline asked
    /// for: a permit extended by hand runs out at the authority long before its holder's
    /// deadline.
    RenewKeepsTheFirstTtl,
    /// The one-step multi-key acquire takes each key of a set in turn and stops at the first
    /// held one, answering "held" but keeping the keys before it (a script that sets each key
    /// `NX` and returns on the first refusal): a set it did not get blocks others for a TTL.
    AcquireAllKeepsPartOfASet,
}

impl Mutant {
    /// Every mutant.
    pub const ALL: [Mutant; 16] = [
        Mutant::UnconditionalRelease,
        Mutant::AcquireIgnoresHolder,
        Mutant::FenceRestartsAfterRelease,
        Mutant::RenewWithoutOwnerCheck,
        Mutant::DeadlineAfterResponse,
        Mutant::RenewalDeadlineAfterResponse,
        Mutant::BatchRenewWithoutOwnerCheck,
        Mutant::BatchRenewalDeadlineAfterResponse,
        Mutant::ExpiredWaiterTold,
        Mutant::LiesAboutFailoverSafety,
        Mutant::CancelledAttemptKeepsKey,
        Mutant::ReleaseComparesClientOnly,
        Mutant::FenceRestartsAfterIdle,
        Mutant::RevokeReusesFence,
        Mutant::RenewKeepsTheFirstTtl,
        Mutant::AcquireAllKeepsPartOfASet,
    ];

    /// The scenarios written to catch this mutant. The suite has teeth for a rule only if one of
    /// these fails: another scenario failing by accident proves nothing about the rule.
    pub fn aimed_at(&self) -> &'static [&'static str] {
        match self {
            Mutant::UnconditionalRelease => &["release_after_expiry_keeps_new_holder"],
            Mutant::AcquireIgnoresHolder => &["exclusion"],
            Mutant::FenceRestartsAfterRelease => &["fences_increase"],
            Mutant::RenewWithoutOwnerCheck => &["renew_after_expiry_is_refused"],
            Mutant::DeadlineAfterResponse => &[
                "deadline_counts_from_the_request",
                "delayed_reply_shortens_the_grant",
            ],
            Mutant::RenewalDeadlineAfterResponse => &["deadline_counts_from_the_request"],
            Mutant::BatchRenewWithoutOwnerCheck => &["batch_renew_after_expiry_is_refused"],
            Mutant::BatchRenewalDeadlineAfterResponse => &[
                "batch_deadline_counts_from_the_request",
                "delayed_batch_reply_shortens_the_renewals",
            ],
            Mutant::ExpiredWaiterTold => &["acquire_waits_for_release"],
            Mutant::LiesAboutFailoverSafety => &["fences_survive_failover"],
            Mutant::CancelledAttemptKeepsKey => &["cancelled_try_acquire_leaves_nothing"],
            Mutant::ReleaseComparesClientOnly => &["stale_release_after_reacquire_keeps_new_grant"],
            Mutant::FenceRestartsAfterIdle => &["fences_grow_after_idle_cleanup"],
            Mutant::RevokeReusesFence => &[
                "revoke_ends_the_holder_and_fences_it_out",
                "semaphore_revoked_permit_is_lost_and_fenced_out",
            ],
            Mutant::RenewKeepsTheFirstTtl => &["semaphore_permit_lease_renews_by_hand"],
            Mutant::AcquireAllKeepsPartOfASet => &["try_acquire_all_takes_all_or_none"],
        }
    }
}

impl fmt::Display for Mutant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// A client of a mutated authority.
pub struct Mutated {
    mutant: Mutant,
    inner: MemoryAuthority,
    /// Per-key counters for [`Mutant::FenceRestartsAfterRelease`], shared by all clients.
    counters: Arc<Mutex<HashMap<LockKey, u64>>>,
    /// Per-key (counter, last release) for [`Mutant::FenceRestartsAfterIdle`].
    idle: Arc<Mutex<HashMap<LockKey, (u64, Instant)>>>,
    /// The fence a revoke ended, per key, handed to the next grant by
    /// [`Mutant::RevokeReusesFence`]; shared by all clients.
    revoked: Arc<Mutex<HashMap<LockKey, Fence>>>,
    /// This client's latest grant per key, for [`Mutant::ReleaseComparesClientOnly`].
    latest: Mutex<HashMap<LockKey, Grant>>,
    capabilities: Capabilities,
}

impl fmt::Debug for Mutated {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mutated")
            .field("mutant", &self.mutant)
            .finish_non_exhaustive()
    }
}

/// The grant the reference authority issued, wrapped inside a mutated one.
fn original(grant: &Grant) -> &Grant {
    grant.backend_state::<Grant>().unwrap_or(grant)
}

impl Mutated {
    fn options(&self) -> &ClientOptions {
        self.inner.options()
    }

    /// The simulated round trip of the deadline mutants: half the safety margin.
    fn latency(&self, ttl: Duration) -> Duration {
        self.options().safety_margin.for_ttl(ttl) / 2
    }

    fn counters(&self) -> std::sync::MutexGuard<'_, HashMap<LockKey, u64>> {
        self.counters.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn rewrap(&self, grant: &Grant, fence: Fence, deadline: Instant) -> Grant {
        leasehold_core::backend::grant(
            grant.key().clone(),
            grant.owner(),
            fence,
            grant.ttl(),
            deadline,
        )
        .with_backend_state(grant.clone())
    }

    /// Applies the mutation to a grant the reference authority just issued.
    async fn mutate(&self, grant: Grant, waited: bool) -> Result<Grant> {
        let ttl = grant.ttl();
        if self.mutant == Mutant::ReleaseComparesClientOnly {
            lock(&self.latest).insert(grant.key().clone(), grant.clone());
        }
        match self.mutant {
            Mutant::RevokeReusesFence => match lock(&self.revoked).remove(grant.key()) {
                Some(fence) => Ok(self.rewrap(&grant, fence, grant.deadline())),
                None => Ok(grant),
            },
            Mutant::FenceRestartsAfterIdle => {
                let n = {
                    let mut idle = lock(&self.idle);
                    let now = Instant::now();
                    let entry = idle.entry(grant.key().clone()).or_insert((0, now));
                    if now.saturating_duration_since(entry.1) >= ttl * 2 {
                        entry.0 = 0;
                    }
                    entry.0 += 1;
                    entry.1 = now;
                    entry.0
                };
                let fence =
                    Fence::compose("mutant", self.options().epoch, n, FenceSafety::Linearizable)?;
                Ok(self.rewrap(&grant, fence, grant.deadline()))
            }
            Mutant::CancelledAttemptKeepsKey if !waited => {
                // The reply is on its way back; a caller that drops the future now leaves the
                // grant booked, and the "session" renews it for as long as the client lives.
                let mut booked = Booked {
                    grant: Some(grant.clone()),
                    inner: self.inner.clone(),
                };
                tokio::time::sleep(ttl / 100).await;
                booked.grant = None;
                Ok(grant)
            }
            Mutant::FenceRestartsAfterRelease => {
                let n = {
                    let mut counters = self.counters();
                    let n = counters.entry(grant.key().clone()).or_insert(0);
                    *n += 1;
                    *n
                };
                let fence =
                    Fence::compose("mutant", self.options().epoch, n, FenceSafety::Linearizable)?;
                Ok(self.rewrap(&grant, fence, grant.deadline()))
            }
            Mutant::DeadlineAfterResponse if !waited => {
                // Simulated network latency, shorter than the safety margin (so only a bound
                // with the margin catches it), then the deadline counted from the response.
                tokio::time::sleep(self.latency(ttl)).await;
                let deadline = self.options().safety_margin.deadline(Instant::now(), ttl);
                Ok(self.rewrap(&grant, grant.fence(), deadline))
            }
            Mutant::ExpiredWaiterTold if waited => {
                // The grant reaches the waiter after the lease is over, dressed as fresh.
                tokio::time::sleep(ttl + ttl / 2).await;
                let deadline = self.options().safety_margin.deadline(Instant::now(), ttl);
                Ok(self.rewrap(&grant, grant.fence(), deadline))
            }
            _ => Ok(grant),
        }
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl Authority for Mutated {
    fn capabilities(&self) -> &Capabilities {
        &self.capabilities
    }

    async fn try_acquire(&self, key: &LockKey, ttl: Duration) -> Result<Option<Grant>> {
        if self.mutant == Mutant::AcquireIgnoresHolder {
            self.capabilities.ttl.check(ttl)?;
            let owner = OwnerToken::generate()?;
            let sent = Instant::now();
            let raw = self.inner.server().unchecked().grant(key, owner, ttl);
            let fence = Fence::compose(
                "mutant",
                self.options().epoch,
                raw,
                FenceSafety::Linearizable,
            )?;
            let deadline = self.options().safety_margin.deadline(sent, ttl);
            return Ok(Some(leasehold_core::backend::grant(
                key.clone(),
                owner,
                fence,
                ttl,
                deadline,
            )));
        }
        match self.inner.try_acquire(key, ttl).await? {
            Some(g) => Ok(Some(self.mutate(g, false).await?)),
            None => Ok(None),
        }
    }

    async fn try_acquire_all(&self, keys: &[LockKey], ttl: Duration) -> Result<Option<Vec<Grant>>> {
        if self.mutant == Mutant::AcquireAllKeepsPartOfASet {
            leasehold_core::backend::check_canonical(keys)?;
            let mut grants = Vec::with_capacity(keys.len());
            for key in keys {
                match self.inner.try_acquire(key, ttl).await? {
                    Some(grant) => grants.push(grant),
                    None => return Ok(None),
                }
            }
            return Ok(Some(grants));
        }
        let Some(grants) = self.inner.try_acquire_all(keys, ttl).await? else {
            return Ok(None);
        };
        let mut mutated = Vec::with_capacity(grants.len());
        for grant in grants {
            mutated.push(self.mutate(grant, false).await?);
        }
        Ok(Some(mutated))
    }

    async fn acquire(&self, key: &LockKey, ttl: Duration, max_wait: Duration) -> Result<Grant> {
        let grant = self.inner.acquire(key, ttl, max_wait).await?;
        self.mutate(grant, true).await
    }

    async fn renew(&self, grant: &Grant, ttl: Duration) -> Result<Instant> {
        if self.mutant == Mutant::RenewWithoutOwnerCheck {
            self.capabilities.ttl.check(ttl)?;
            let sent = Instant::now();
            self.inner.server().unchecked().extend(grant.key(), ttl);
            return Ok(self.options().safety_margin.deadline(sent, ttl));
        }
        if self.mutant == Mutant::RenewKeepsTheFirstTtl {
            self.capabilities.ttl.check(ttl)?;
            let sent = Instant::now();
            self.inner.renew(original(grant), grant.ttl()).await?;
            return Ok(self.options().safety_margin.deadline(sent, ttl));
        }
        if self.mutant == Mutant::RenewalDeadlineAfterResponse {
            self.inner.renew(original(grant), ttl).await?;
            tokio::time::sleep(self.latency(ttl)).await;
            return Ok(self.options().safety_margin.deadline(Instant::now(), ttl));
        }
        self.inner.renew(original(grant), ttl).await
    }

    /// The batch path of its own: a mutant of `renew` leaves batches correct, and a batch
    /// mutant leaves lone renewals correct, so each is caught only by scenarios that take its
    /// path.
    async fn renew_many(&self, grants: &[Grant]) -> Vec<Result<Instant>> {
        let originals: Vec<Grant> = grants.iter().map(|g| original(g).clone()).collect();
        match self.mutant {
            Mutant::BatchRenewWithoutOwnerCheck => {
                // The batch goes to the server as the reference sends it (so a paused or dead
                // server answers nothing), but every grant it refused is extended anyway where
                // its key has a live lease, whoever holds it, and answered as renewed: what a
                // `PEXPIRE` per key without the owner's `GET` would do.
                let sent = Instant::now();
                let answers = self.inner.renew_many(&originals).await;
                answers
                    .into_iter()
                    .zip(grants)
                    .map(|(answer, g)| match answer {
                        Err(Error::LeaseLost { .. })
                            if self.inner.server().holder(g.key()).is_some()
                                && self.inner.server().unchecked().extend(g.key(), g.ttl()) =>
                        {
                            Ok(self.options().safety_margin.deadline(sent, g.ttl()))
                        }
                        other => other,
                    })
                    .collect()
            }
            Mutant::BatchRenewalDeadlineAfterResponse => {
                let answers = self.inner.renew_many(&originals).await;
                // Simulated network latency, shorter than every grant's safety margin (so only
                // a bound with the margin catches it), then each deadline counted from the
                // response.
                let shortest = grants.iter().map(Grant::ttl).min().unwrap_or_default();
                tokio::time::sleep(self.latency(shortest)).await;
                let now = Instant::now();
                answers
                    .into_iter()
                    .zip(grants)
                    .map(|(answer, g)| {
                        answer.map(|_| self.options().safety_margin.deadline(now, g.ttl()))
                    })
                    .collect()
            }
            _ => self.inner.renew_many(&originals).await,
        }
    }

    async fn release(&self, grant: &Grant) -> Result<Released> {
        match self.mutant {
            Mutant::ReleaseComparesClientOnly => {
                // Releases whatever this client holds on the key now.
                let current = lock(&self.latest).get(grant.key()).cloned();
                let target = current.unwrap_or_else(|| grant.clone());
                self.inner.release(original(&target)).await
            }
            Mutant::FenceRestartsAfterIdle => {
                if let Some(entry) = lock(&self.idle).get_mut(grant.key()) {
                    entry.1 = Instant::now();
                }
                self.inner.release(original(grant)).await
            }
            Mutant::UnconditionalRelease => {
                self.inner.server().unchecked().remove(grant.key());
                Ok(Released::Released)
            }
            Mutant::FenceRestartsAfterRelease => {
                let released = self.inner.release(original(grant)).await?;
                self.counters().remove(grant.key());
                Ok(released)
            }
            _ => self.inner.release(original(grant)).await,
        }
    }

    /// Unmutated: the reference's own view (a mutant that rewrote a fence shows the reference's
    /// fence here, which the inspect scenario may flag too; that proves nothing about the rule
    /// the mutant breaks, and its own scenario still has to catch it).
    async fn inspect(&self, key: &LockKey) -> Result<Inspection> {
        self.inner.inspect(key).await
    }

    async fn list_keys(&self, prefix: &KeyPrefix, limit: usize) -> Result<Vec<LockKey>> {
        self.inner.list_keys(prefix, limit).await
    }

    async fn revoke(&self, key: &LockKey) -> Result<Revoked> {
        let revoked = self.inner.revoke(key).await?;
        if let (Mutant::RevokeReusesFence, Revoked::Revoked { fence }) = (self.mutant, revoked) {
            lock(&self.revoked).insert(key.clone(), fence);
        }
        Ok(revoked)
    }

    async fn proclaim(&self, grant: &Grant, value: &[u8]) -> Result<()> {
        self.inner.proclaim(original(grant), value).await
    }

    async fn wait_for_change(&self, key: &LockKey, max_wait: Duration) -> Result<()> {
        self.inner.wait_for_change(key, max_wait).await
    }

    async fn close(&self) -> Result<()> {
        self.inner.close().await
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A grant a dropped `try_acquire` left booked: renewed in the background forever.
struct Booked {
    grant: Option<Grant>,
    inner: MemoryAuthority,
}

impl Drop for Booked {
    fn drop(&mut self) {
        let Some(grant) = self.grant.take() else {
            return;
        };
        let inner = self.inner.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(grant.ttl() / 3).await;
                if inner.renew(&grant, grant.ttl()).await.is_err() {
                    return;
                }
            }
        });
    }
}

/// Makes clients of one mutated server.
#[derive(Debug, Clone)]
pub struct MutantConnector {
    mutant: Mutant,
    server: MemoryServer,
    counters: Arc<Mutex<HashMap<LockKey, u64>>>,
    idle: Arc<Mutex<HashMap<LockKey, (u64, Instant)>>>,
    revoked: Arc<Mutex<HashMap<LockKey, Fence>>>,
}

impl MutantConnector {
    /// Clients of a fresh server, mutated as `mutant` says.
    pub fn new(mutant: Mutant, server: MemoryServer) -> Self {
        MutantConnector {
            mutant,
            server,
            counters: Arc::default(),
            idle: Arc::default(),
            revoked: Arc::default(),
        }
    }
}

#[async_trait]
impl Connector for MutantConnector {
    async fn connect(&self) -> Result<Arc<dyn Authority>> {
        let inner = self.server.authority(ClientOptions::default());
        let capabilities = inner.capabilities().clone();
        Ok(Arc::new(Mutated {
            mutant: self.mutant,
            inner,
            counters: self.counters.clone(),
            idle: self.idle.clone(),
            revoked: self.revoked.clone(),
            latest: Mutex::default(),
            capabilities,
        }))
    }
}

/// The suite's context for `mutant`: a fresh memory server with fault injection. The
/// failover-lying mutant gets an asynchronous standby while declaring linearizable fences.
pub async fn context(mutant: Mutant) -> Result<Context> {
    let server = MemoryServer::new();
    let replication = if mutant == Mutant::LiesAboutFailoverSafety {
        Replication::Asynchronous
    } else {
        Replication::Synchronous
    };
    let connector = Arc::new(MutantConnector::new(mutant, server.clone()));
    Ok(Context::new(connector)
        .await?
        .with_residue(Arc::new(MemoryResidue::new(server.clone())))
        .with_faults(Arc::new(MemoryFaults::new(server, replication))))
}
