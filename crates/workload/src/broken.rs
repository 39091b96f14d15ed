//! A deliberately broken authority for process runs: it grants a key to every worker that asks,
//! at once, while its fences keep rising. The workload's proof that its headline is about the
//! lock: with fences the resource still loses nothing under such an authority (it refuses every
//! older fence), so only the lock's own evidence, keys granted while another lease was valid,
//! can fail the run, and must.
//!
//! It wraps a real authority. Each acquire takes the key's *fence key* (`<key>/fence`) and gives
//! it straight back, which yields a fence above every one granted before; then it takes a key
//! of the caller's own (`<key>/holder/<n>`), which nobody else contends, for the lease the worker
//! renews and releases. The grant the worker sees names the original key with the fence key's
//! fence.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use leasehold_core::{
    Authority, Capabilities, Grant, Inspection, Instant, KeyPrefix, LockKey, Released, Result,
};

/// Grants every key to everyone, fences rising. See the module docs.
pub struct IgnoresHolder {
    inner: Arc<dyn Authority>,
    /// Tells this client's holder keys apart.
    next: AtomicU64,
    /// Tells this process's holder keys apart from other workers'.
    tag: u32,
}

impl std::fmt::Debug for IgnoresHolder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IgnoresHolder").finish_non_exhaustive()
    }
}

impl IgnoresHolder {
    /// Wraps `inner`; `tag` is unique per worker process.
    pub fn new(inner: Arc<dyn Authority>, tag: u32) -> Self {
        IgnoresHolder {
            inner,
            next: AtomicU64::new(0),
            tag,
        }
    }

    fn derived(key: &LockKey, suffix: &str) -> Result<LockKey> {
        LockKey::new(format!("{}/{suffix}", key.as_str()))
    }

    /// The real grant behind one this wrapper handed out.
    fn inner_grant(grant: &Grant) -> &Grant {
        grant.backend_state::<Grant>().unwrap_or(grant)
    }

    async fn grant(&self, key: &LockKey, ttl: Duration, max_wait: Duration) -> Result<Grant> {
        let fence_key = Self::derived(key, "fence")?;
        let counter = self.inner.acquire(&fence_key, ttl, max_wait).await?;
        let fence = counter.fence();
        let _ = self.inner.release(&counter).await;
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let holder_key = Self::derived(key, &format!("holder/{}-{n}", self.tag))?;
        let held = self.inner.acquire(&holder_key, ttl, max_wait).await?;
        Ok(leasehold_core::backend::grant(
            key.clone(),
            held.owner(),
            fence,
            held.ttl(),
            held.deadline(),
        )
        .with_backend_state(held))
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl Authority for IgnoresHolder {
    fn capabilities(&self) -> &Capabilities {
        self.inner.capabilities()
    }

    async fn try_acquire(&self, key: &LockKey, ttl: Duration) -> Result<Option<Grant>> {
        // Never busy: that is the defect.
        self.grant(key, ttl, Duration::from_secs(1)).await.map(Some)
    }

    /// Every key granted, held or not: the same defect, a set at a time.
    async fn try_acquire_all(&self, keys: &[LockKey], ttl: Duration) -> Result<Option<Vec<Grant>>> {
        let mut grants = Vec::with_capacity(keys.len());
        for key in keys {
            grants.push(self.grant(key, ttl, Duration::from_secs(1)).await?);
        }
        Ok(Some(grants))
    }

    async fn acquire(&self, key: &LockKey, ttl: Duration, max_wait: Duration) -> Result<Grant> {
        self.grant(key, ttl, max_wait.max(Duration::from_secs(1)))
            .await
    }

    async fn renew(&self, grant: &Grant, ttl: Duration) -> Result<Instant> {
        self.inner.renew(Self::inner_grant(grant), ttl).await
    }

    async fn renew_many(&self, grants: &[Grant]) -> Vec<Result<Instant>> {
        let inner: Vec<Grant> = grants
            .iter()
            .map(|g| Self::inner_grant(g).clone())
            .collect();
        self.inner.renew_many(&inner).await
    }

    async fn release(&self, grant: &Grant) -> Result<Released> {
        self.inner.release(Self::inner_grant(grant)).await
    }

    async fn inspect(&self, key: &LockKey) -> Result<Inspection> {
        self.inner.inspect(key).await
    }

    async fn list_keys(&self, prefix: &KeyPrefix, limit: usize) -> Result<Vec<LockKey>> {
        self.inner.list_keys(prefix, limit).await
    }

    async fn proclaim(&self, grant: &Grant, value: &[u8]) -> Result<()> {
        self.inner.proclaim(Self::inner_grant(grant), value).await
    }

    async fn revoke(&self, key: &LockKey) -> leasehold_core::Result<leasehold_core::Revoked> {
        self.inner.revoke(key).await
    }

    async fn wait_for_change(&self, key: &LockKey, max_wait: Duration) -> Result<()> {
        self.inner.wait_for_change(key, max_wait).await
    }

    async fn close(&self) -> Result<()> {
        self.inner.close().await
    }
}
