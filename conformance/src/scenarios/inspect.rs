//! Inspect: a read-only snapshot that tells the truth about the holder and changes nothing.

use std::time::Duration;

use leasehold_core::{Authority, Error, Inspection, Instant, LockKey, OwnerId};

use super::helpers::take;
use crate::context::Context;
use crate::ensure;
use crate::verdict::{Failure, OrFail, Outcome, Verdict};

/// Why the inspect scenarios do not apply.
const NO_INSPECT: &str = "the backend does not implement inspect";

/// `client.inspect(key)`; `Ok(None)` when the backend declares it unsupported.
async fn inspect(
    client: &dyn Authority,
    key: &LockKey,
    what: &str,
) -> Result<Option<Inspection>, Failure> {
    match client.inspect(key).await {
        Err(Error::Unsupported { .. }) => Ok(None),
        other => other.or_fail(what).map(Some),
    }
}

/// A free key is reported free; a held one held, with the grant's fence, the grant's owner (as
/// a short id, never the token), and a remaining TTL within (0, ttl] where the backend reports
/// one; a released one free again, with a last fence (where reported) no lower than the
/// released grant's. Inspected from another client, as an operator's `status` would.
pub async fn inspect_reports_holder_and_fence(ctx: &Context) -> Outcome {
    let (a, b) = (ctx.connect().await?, ctx.connect().await?);
    let key = ctx.key("inspect-reports");
    let ttl = ctx.ttl();
    let Some(before) = inspect(&*b, &key, "inspect a free key").await? else {
        return Ok(Verdict::NotApplicable(NO_INSPECT.into()));
    };
    ensure!(
        !before.held && before.fence.is_none() && before.owner.is_none(),
        "a key nobody ever took was reported as {before:?}"
    );
    ensure!(
        before.backend == ctx.capabilities().backend,
        "inspect named backend `{}`, the authority declares `{}`",
        before.backend,
        ctx.capabilities().backend
    );

    let grant = take(&*a, &key, ttl, "A acquires").await?;
    let held = inspect(&*b, &key, "inspect a held key")
        .await?
        .unwrap_or(before);
    ensure!(held.held, "a key A holds was reported free: {held:?}");
    ensure!(
        held.fence == Some(grant.fence()),
        "inspect reported fence {:?}, A's grant carries {}",
        held.fence,
        grant.fence()
    );
    let owner = OwnerId::of(&grant.owner());
    ensure!(
        held.owner.as_ref() == Some(&owner),
        "inspect reported owner {:?}, A's grant is {owner}",
        held.owner
    );
    let token = grant.owner().to_hex();
    ensure!(
        !format!("{held:?} {held}").contains(&token),
        "inspect revealed A's whole owner token"
    );
    if let Some(left) = held.remaining {
        ensure!(
            left > Duration::ZERO && left <= ttl,
            "inspect reported {left:?} remaining on a fresh {ttl:?} lease"
        );
    }
    if let Some(last) = held.last_fence {
        ensure!(
            last >= grant.fence(),
            "the last fence {last} is below the holder's {}",
            grant.fence()
        );
    }

    let _ = a.release(&grant).await.or_fail("A releases")?;
    let after = inspect(&*b, &key, "inspect a released key")
        .await?
        .unwrap_or(held);
    ensure!(
        !after.held && after.fence.is_none() && after.owner.is_none() && after.remaining.is_none(),
        "a released key was reported as {after:?}"
    );
    if let Some(last) = after.last_fence {
        ensure!(
            last >= grant.fence(),
            "after release the last fence {last} is below the released grant's {}",
            grant.fence()
        );
    }
    Ok(Verdict::Passed)
}

/// Inspecting is read-only: a holder that stops renewing still loses the key on time although
/// another client inspects it over and over, a waiter still gets it then (not before the
/// holder's deadline, not after its TTL), and inspect then reports the waiter's grant.
pub async fn inspect_changes_nothing(ctx: &Context) -> Outcome {
    let (a, b, c) = (
        ctx.connect().await?,
        ctx.connect().await?,
        ctx.connect().await?,
    );
    let key = ctx.key("inspect-read-only");
    let ttl = ctx.ttl();
    if inspect(&*b, &key, "inspect a free key").await?.is_none() {
        return Ok(Verdict::NotApplicable(NO_INSPECT.into()));
    }
    let sent = Instant::now();
    let grant = take(&*a, &key, ttl, "A acquires").await?;
    // An inspect that renewed would keep the key held for ever: any finite bound catches it, so
    // this one is generous (two tolerances: expiry noise, then a polling waiter's hand-off).
    let limit = ttl + ctx.tolerance() * 2;
    let waiter = {
        let (c, key) = (c.clone(), key.clone());
        tokio::spawn(async move {
            let r = c.acquire(&key, ttl, limit * 2).await;
            (r, Instant::now())
        })
    };
    // Inspect as fast as an impatient operator's watch loop would, until the waiter is through.
    let every = (ttl / 20).max(Duration::from_millis(5));
    let mut inspections = 0u32;
    while !waiter.is_finished() && sent.elapsed() < limit * 2 {
        let _ = inspect(&*b, &key, "inspect while held").await?;
        inspections += 1;
        tokio::time::sleep(every).await;
    }
    let (got, got_at) = waiter.await.or_fail("waiter task")?;
    let next = got.or_fail("the waiter's acquire while another client inspected")?;
    ensure!(
        got_at >= grant.deadline(),
        "the waiter got the key {:?} before A's deadline: inspect freed it",
        grant.deadline().saturating_duration_since(got_at)
    );
    ensure!(
        got_at.saturating_duration_since(sent) <= limit,
        "A's unrenewed lease ended only {:?} after it was taken ({inspections} inspections); \
         inspect must not renew it (bound {limit:?})",
        got_at.saturating_duration_since(sent)
    );
    ensure!(
        next.fence() > grant.fence(),
        "the waiter's fence {} is not above A's {}",
        next.fence(),
        grant.fence()
    );
    let now = inspect(&*b, &key, "inspect the waiter's lease")
        .await?
        .ok_or_else(|| Failure::new("inspect stopped being supported"))?;
    ensure!(
        now.held && now.fence == Some(next.fence()),
        "after the hand-off inspect reported {now:?}, the waiter holds fence {}",
        next.fence()
    );
    let _ = c.release(&next).await.or_fail("the waiter releases")?;
    Ok(Verdict::Passed)
}

#[cfg(test)]
mod tests {
    //! The inspect scenarios have teeth: an inspect that renews, or one that lies about the
    //! holder, fails them. (Kept here rather than in `Mutant::ALL`, which the workload's own
    //! teeth test also walks, and which no workload history could show.)

    use crate::kit::{OrFail, TestResult};
    use std::sync::Arc;

    use async_trait::async_trait;
    use leasehold_core::{Capabilities, ClientOptions, Grant, Released, Result};
    use leasehold_memory::{MemoryAuthority, MemoryServer};

    use super::*;
    use crate::context::Connector;

    #[derive(Debug, Clone, Copy, PartialEq)]
    enum Flaw {
        None,
        /// Inspect extends the lease it looks at (a `GET` + `PEXPIRE` "refresh").
        Renews,
        /// Inspect reports a fence one above the holder's (the counter, not the holder's row).
        CounterAsFence,
    }

    #[derive(Debug)]
    struct Flawed(MemoryAuthority, Flaw);

    #[async_trait]
    #[deny(clippy::missing_trait_methods)]
    impl Authority for Flawed {
        fn capabilities(&self) -> &Capabilities {
            self.0.capabilities()
        }
        async fn try_acquire(&self, key: &LockKey, ttl: Duration) -> Result<Option<Grant>> {
            self.0.try_acquire(key, ttl).await
        }
        async fn try_acquire_all(
            &self,
            keys: &[LockKey],
            ttl: Duration,
        ) -> Result<Option<Vec<Grant>>> {
            self.0.try_acquire_all(keys, ttl).await
        }
        async fn acquire(&self, key: &LockKey, ttl: Duration, wait: Duration) -> Result<Grant> {
            self.0.acquire(key, ttl, wait).await
        }
        async fn renew(&self, grant: &Grant, ttl: Duration) -> Result<Instant> {
            self.0.renew(grant, ttl).await
        }
        async fn release(&self, grant: &Grant) -> Result<Released> {
            self.0.release(grant).await
        }
        async fn inspect(&self, key: &LockKey) -> Result<Inspection> {
            let mut seen = self.0.inspect(key).await?;
            match self.1 {
                Flaw::None => {}
                Flaw::Renews => {
                    if seen.held {
                        let ttl = self
                            .0
                            .capabilities()
                            .ttl
                            .at_least(Duration::from_millis(500));
                        self.0.server().unchecked().extend(key, ttl);
                    }
                }
                Flaw::CounterAsFence => {
                    if let Some(f) = seen.fence {
                        let raw = f.raw() + 1;
                        seen.fence = Some(leasehold_core::Fence::compose(
                            "t",
                            f.epoch(),
                            raw,
                            f.safety(),
                        )?);
                    }
                }
            }
            Ok(seen)
        }
        async fn renew_many(&self, grants: &[Grant]) -> Vec<Result<Instant>> {
            self.0.renew_many(grants).await
        }
        async fn list_keys(
            &self,
            prefix: &leasehold_core::KeyPrefix,
            limit: usize,
        ) -> Result<Vec<LockKey>> {
            self.0.list_keys(prefix, limit).await
        }
        async fn proclaim(&self, grant: &Grant, value: &[u8]) -> Result<()> {
            self.0.proclaim(grant, value).await
        }
        async fn revoke(&self, key: &LockKey) -> leasehold_core::Result<leasehold_core::Revoked> {
            self.0.revoke(key).await
        }
        async fn wait_for_change(&self, key: &LockKey, max_wait: Duration) -> Result<()> {
            self.0.wait_for_change(key, max_wait).await
        }
        async fn close(&self) -> Result<()> {
            self.0.close().await
        }
    }

    struct FlawedConnector(MemoryServer, Flaw);

    #[async_trait]
    impl Connector for FlawedConnector {
        async fn connect(&self) -> Result<Arc<dyn Authority>> {
            let inner = self.0.authority(ClientOptions::default());
            Ok(Arc::new(Flawed(inner, self.1)))
        }
    }

    async fn context(flaw: Flaw) -> TestResult<Context> {
        Context::new(Arc::new(FlawedConnector(MemoryServer::new(), flaw)))
            .await
            .or_fail("a context for the flawed authority")
    }

    #[tokio::test(start_paused = true)]
    async fn the_reference_passes_both() -> TestResult {
        let ctx = context(Flaw::None).await?;
        assert_eq!(
            inspect_reports_holder_and_fence(&ctx).await,
            Ok(Verdict::Passed)
        );
        assert_eq!(inspect_changes_nothing(&ctx).await, Ok(Verdict::Passed));
        Ok(())
    }

    #[tokio::test(start_paused = true)]
    async fn an_inspect_that_renews_is_caught() -> TestResult {
        let ctx = context(Flaw::Renews).await?;
        let outcome = inspect_changes_nothing(&ctx).await;
        assert!(outcome.is_err(), "{outcome:?}");
        Ok(())
    }

    #[tokio::test(start_paused = true)]
    async fn an_inspect_that_misreports_the_fence_is_caught() -> TestResult {
        let ctx = context(Flaw::CounterAsFence).await?;
        let outcome = inspect_reports_holder_and_fence(&ctx).await;
        assert!(outcome.is_err(), "{outcome:?}");
        Ok(())
    }
}
