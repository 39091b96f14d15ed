//! The whole conformance suite against real Redis servers started by the harness, with faults
//! (restart, pause, revoke, and a failover from primary to replica), and a lying variant that
//! the failover scenario must fail.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use leasehold_conformance::kit::{
    ErrOrFail, FailoverFaults, OrFail, ReplicatedPair, SharedUrl, TestResult, UrlConnector,
};
use leasehold_conformance::scenarios::{self, run_all};
use leasehold_conformance::{harness_call, harness_error, Context, Residue, Verdict};
use leasehold_core::{
    Authority, Capabilities, Fence, FenceSafety, Grant, Instant, LockKey, Released,
};
use leasehold_redis::{KeyLayout, RedisAuthority};
use leasehold_servers::RedisServer;

mod common;

use common::{blocking, clients, start_pair, url, wait_in_sync};

/// A Redis primary and its replica for the kit's [`FailoverFaults`]: the failover promotes the
/// replica, in sync, while the old primary keeps serving the clients connected to it, so what
/// they write then never reaches the promoted server.
struct Pair {
    primary: Arc<RedisServer>,
    replica: Arc<RedisServer>,
}

#[async_trait]
impl ReplicatedPair for Pair {
    type Server = RedisServer;

    fn primary(&self) -> &RedisServer {
        &self.primary
    }

    fn replica(&self) -> &RedisServer {
        &self.replica
    }

    fn replica_url(&self) -> String {
        url(&self.replica)
    }

    /// An operator deletes the lock key on the server clients reach at `at` (the promoted
    /// replica's URL once the failover completed); the fence counter stays.
    async fn revoke(&self, at: &str, key: &LockKey) -> leasehold_core::Result<()> {
        let server = if at == self.replica_url() {
            self.replica.clone()
        } else {
            self.primary.clone()
        };
        let lock_key = KeyLayout::default().lock_key(key);
        harness_call(move || server.command(&["DEL", &lock_key]).map(drop)).await
    }

    /// Lets the replica catch up, then promotes it (`REPLICAOF NO ONE` ends its replication);
    /// clients still reach the old primary, which goes on serving them.
    async fn cut_replication(&self) -> leasehold_core::Result<()> {
        let (primary, replica) = (self.primary.clone(), self.replica.clone());
        blocking(move || {
            wait_in_sync(&*primary, &*replica)?;
            replica.promote().map_err(|e| e.to_string())
        })
        .await
        .map_err(harness_error)
    }

    /// The replica was promoted when its replication was cut; the old primary stays up, as a
    /// Redis primary that no one told of the failover does.
    async fn promote_replica(&self) -> leasehold_core::Result<()> {
        Ok(())
    }
}

/// Faults on a primary and its replica whose clients follow `url`, which the failover moves to
/// the promoted replica.
fn failover_faults(
    primary: Arc<RedisServer>,
    replica: Arc<RedisServer>,
    url: SharedUrl,
) -> FailoverFaults<Pair> {
    FailoverFaults::new(Arc::new(Pair { primary, replica }), url)
}

/// What is left in Redis for a key: a lock key (the fence counter stays on purpose).
struct RedisResidue(SharedUrl);

#[async_trait]
impl Residue for RedisResidue {
    async fn leftovers(&self, key: &LockKey) -> leasehold_core::Result<Vec<String>> {
        let url = self.0.get();
        let plain = url.split('?').next().unwrap_or(&url).to_string();
        let mut conn = redis::Client::open(plain)
            .map_err(harness_error)?
            .get_multiplexed_async_connection()
            .await
            .map_err(harness_error)?;
        let lock_key = KeyLayout::default().lock_key(key);
        let pttl: i64 = redis::cmd("PTTL")
            .arg(&lock_key)
            .query_async(&mut conn)
            .await
            .map_err(harness_error)?;
        Ok(match pttl {
            -2 => vec![],
            ttl => vec![format!("lock key {lock_key} with PTTL {ttl}")],
        })
    }
}

/// With `LEASEHOLD_REDIS_URL` set (external mode, e.g. docker compose), the suite runs against
/// that server without faults, which then show as not applicable; otherwise against a managed
/// primary and replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_the_conformance_suite_with_faults() -> TestResult {
    if let Some(external) = leasehold_servers::external::redis_url() {
        let sep = if external.contains('?') { '&' } else { '?' };
        let url = format!("{external}{sep}timeout_ms=1000");
        let ctx = Context::new(Arc::new(clients(&url)))
            .await
            .or_fail("connect the first client")?;
        let report = run_all("redis (external)", &ctx).await;
        println!("{report}");
        report.assert_passed();
        return Ok(());
    }
    let (primary, replica) = start_pair().await?;
    let clients = clients(&url(&primary));
    let url = clients.url();
    let ctx = Context::new(Arc::new(clients))
        .await
        .or_fail("connect the first client")?
        .with_residue(Arc::new(RedisResidue(url.clone())))
        .with_faults(Arc::new(failover_faults(primary, replica, url)));
    let report = run_all("redis", &ctx).await;
    println!("{report}");
    report.assert_passed();
    for line in &report.lines {
        let expected = match line.scenario {
            // Declared in the capabilities, and shown: a restart without persistence resets the
            // counter (and so the election's epochs); a failover reissues a fence.
            "fences_survive_restart"
            | "election_epochs_survive_restart"
            | "fences_survive_failover" => {
                assert!(
                    matches!(line.outcome, Ok(Verdict::Declared(_))),
                    "{}:\n{report}",
                    line.scenario
                );
                continue;
            }
            _ => Ok(Verdict::Passed),
        };
        assert_eq!(line.outcome, expected, "{}:\n{report}", line.scenario);
    }
    Ok(())
}

/// The Redis authority, claiming linearizable fences it does not have.
#[derive(Debug)]
struct Liar {
    inner: RedisAuthority,
    capabilities: Capabilities,
}

impl Liar {
    async fn connect(url: &str) -> leasehold_core::Result<Self> {
        let inner = RedisAuthority::connect(url).await?;
        let mut capabilities = inner.capabilities().clone();
        capabilities.fence_safety = FenceSafety::Linearizable;
        Ok(Liar {
            inner,
            capabilities,
        })
    }

    fn lie(grant: Grant) -> leasehold_core::Result<Grant> {
        let fence = Fence::from_value(grant.fence().value(), FenceSafety::Linearizable)?;
        Ok(leasehold_core::backend::grant(
            grant.key().clone(),
            grant.owner(),
            fence,
            grant.ttl(),
            grant.deadline(),
        ))
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl Authority for Liar {
    fn capabilities(&self) -> &Capabilities {
        &self.capabilities
    }

    async fn try_acquire(
        &self,
        key: &LockKey,
        ttl: Duration,
    ) -> leasehold_core::Result<Option<Grant>> {
        self.inner
            .try_acquire(key, ttl)
            .await?
            .map(Liar::lie)
            .transpose()
    }

    async fn try_acquire_all(
        &self,
        keys: &[LockKey],
        ttl: Duration,
    ) -> leasehold_core::Result<Option<Vec<Grant>>> {
        let Some(grants) = self.inner.try_acquire_all(keys, ttl).await? else {
            return Ok(None);
        };
        grants
            .into_iter()
            .map(Liar::lie)
            .collect::<leasehold_core::Result<Vec<_>>>()
            .map(Some)
    }

    async fn acquire(
        &self,
        key: &LockKey,
        ttl: Duration,
        max_wait: Duration,
    ) -> leasehold_core::Result<Grant> {
        Liar::lie(self.inner.acquire(key, ttl, max_wait).await?)
    }

    async fn renew(&self, grant: &Grant, ttl: Duration) -> leasehold_core::Result<Instant> {
        self.inner.renew(grant, ttl).await
    }

    async fn release(&self, grant: &Grant) -> leasehold_core::Result<Released> {
        self.inner.release(grant).await
    }

    async fn renew_many(&self, grants: &[Grant]) -> Vec<leasehold_core::Result<Instant>> {
        self.inner.renew_many(grants).await
    }

    async fn inspect(&self, key: &LockKey) -> leasehold_core::Result<leasehold_core::Inspection> {
        self.inner.inspect(key).await
    }

    async fn list_keys(
        &self,
        prefix: &leasehold_core::KeyPrefix,
        limit: usize,
    ) -> leasehold_core::Result<Vec<LockKey>> {
        self.inner.list_keys(prefix, limit).await
    }

    async fn proclaim(&self, grant: &Grant, value: &[u8]) -> leasehold_core::Result<()> {
        self.inner.proclaim(grant, value).await
    }

    async fn revoke(&self, key: &LockKey) -> leasehold_core::Result<leasehold_core::Revoked> {
        self.inner.revoke(key).await
    }

    async fn wait_for_change(
        &self,
        key: &LockKey,
        max_wait: Duration,
    ) -> leasehold_core::Result<()> {
        self.inner.wait_for_change(key, max_wait).await
    }

    async fn close(&self) -> leasehold_core::Result<()> {
        self.inner.close().await
    }
}

/// The same failover, against a Redis authority that declares linearizable fences: the
/// scenario must fail it (the honest one gets DECLARED in the suite above). Its fences are
/// otherwise consistent with what it declares, so it is the failover that catches it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_authority_that_claims_linearizable_fences_fails_the_failover_scenario(
) -> TestResult {
    let (primary, replica) = start_pair().await?;
    let liars = UrlConnector::new(
        url(&primary),
        |url| async move { Liar::connect(&url).await },
    );
    let faults = failover_faults(primary, replica, liars.url());
    let ctx = Context::new(Arc::new(liars))
        .await
        .or_fail("connect the first client")?
        .with_faults(Arc::new(faults));
    assert_eq!(ctx.capabilities().fence_safety, FenceSafety::Linearizable);
    assert_eq!(scenarios::fences_increase(&ctx).await, Ok(Verdict::Passed));
    let outcome = scenarios::fences_survive_failover(&ctx).await;
    println!("lying redis, fences_survive_failover: {outcome:?}");
    let failure = outcome
        .err_or_fail("a failover-unsafe backend that claims linearizable fences must fail")?;
    assert!(failure.0.contains("declared linearizable"), "{failure}");
    Ok(())
}
