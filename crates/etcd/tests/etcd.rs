//! The etcd authority against a real single-node etcd started by the harness: the whole
//! conformance suite with faults, the hot path's writes, the etcd #22082 stale release, keys that
//! look nested, guarded etcd transactions, and the etcd-io/etcd#15247 declaration. Sessions,
//! waiters, bad input, proclaimed values, `wait_for_change` and etcd's own clients have test
//! files of their own.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{GetOptions, Txn, TxnOp};
use leasehold_conformance::harness_error;
use leasehold_conformance::kit::ServerFaults;
use leasehold_conformance::scenarios::run_all;
use leasehold_conformance::{Context, Residue, Verdict};
use leasehold_core::{Authority, Guarded, Instant, LockKey, Released};
use leasehold_etcd::guarded::{contender_key, guarded_txn, still_holds};
use leasehold_etcd::EtcdAuthority;
use leasehold_servers::{self as servers, EtcdServer};

mod common;

use common::{clients, connect, key, keys_under, raw_client, start, url, OrFail, Result};

/// Crash and freeze faults on the harness's etcd, and an operator deleting the holder's
/// contender key.
fn faults(server: Arc<EtcdServer>, url: String) -> ServerFaults<EtcdServer> {
    ServerFaults::new(server).with_revoke(move |key| {
        let url = url.clone();
        async move { revoke(&url, &key).await }
    })
}

/// An operator deletes the holder's contender key (`etcdctl del`), leaving its session alive.
async fn revoke(url: &str, key: &LockKey) -> leasehold_core::Result<()> {
    let admin = EtcdAuthority::connect(url).await?;
    let prefix = admin.prefix(key);
    let holder = keys_under(admin.client(), &prefix)
        .await
        .map_err(harness_error)?;
    let (name, _) = holder
        .first()
        .ok_or_else(|| harness_error("no holder to revoke"))?;
    admin
        .client()
        .kv_client()
        .delete(name.as_str(), None)
        .await
        .map_err(harness_error)?;
    Ok(())
}

/// Contender keys of ours left under a key's prefix, with the lease each is attached to.
struct EtcdResidue(String);

#[async_trait]
impl Residue for EtcdResidue {
    async fn leftovers(&self, key: &LockKey) -> leasehold_core::Result<Vec<String>> {
        let authority = EtcdAuthority::connect(&self.0).await?;
        let prefix = authority.prefix(key);
        let mut kv = authority.client().kv_client();
        let found = kv
            .get(prefix.as_str(), Some(GetOptions::new().with_prefix()))
            .await
            .map_err(harness_error)?;
        let left = found
            .kvs()
            .iter()
            .map(|kv| {
                format!(
                    "{} (lease {:x}, create revision {})",
                    kv.key_str().unwrap_or("?"),
                    kv.lease(),
                    kv.create_revision()
                )
            })
            .collect();
        authority.close().await?;
        Ok(left)
    }
}

/// With `LEASEHOLD_ETCD_ENDPOINTS` set (external mode, e.g. docker compose) the suite runs there
/// without faults; otherwise against a managed single node with restart, pause and revoke.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_the_conformance_suite_with_faults() -> Result {
    if let Some(endpoints) = servers::external::etcd_endpoints() {
        let url = format!("etcd://{endpoints}?timeout_ms=1000");
        let ctx = Context::new(Arc::new(clients(&url)))
            .await
            .or_fail("the suite's context")?;
        let report = run_all("etcd (external)", &ctx).await;
        println!("{report}");
        report.assert_passed();
        return Ok(());
    }
    let server = start().await?;
    let url = url(&server);
    let ctx = Context::new(Arc::new(clients(&url)))
        .await
        .or_fail("the suite's context")?
        .with_residue(Arc::new(EtcdResidue(url.clone())))
        .with_faults(Arc::new(faults(server, url)));
    assert_eq!(
        ctx.ttl(),
        Duration::from_secs(1),
        "the harness etcd grants 1 s leases"
    );
    let report = run_all("etcd", &ctx).await;
    println!("{report}");
    report.assert_passed();
    for line in &report.lines {
        // Failover needs a cluster: see tests/failover.rs.
        if line.scenario != "fences_survive_failover" {
            assert_eq!(
                line.outcome,
                Ok(Verdict::Passed),
                "{}:\n{report}",
                line.scenario
            );
        }
    }
    Ok(())
}

/// etcd-io/etcd#15247: before 3.4.31 and 3.5.13, a leader that stalls and resumes revokes
/// leases the new leader kept alive. The fault workload met it (a paused leader, then a second
/// holder granted while the first lease was valid); a server with the defect must be declared.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_whose_stalled_leader_revokes_live_leases_is_declared() -> Result {
    let server = start().await?;
    let mut raw = raw_client(&server).await?;
    let version = raw
        .status()
        .await
        .or_fail("the server's status")?
        .version()
        .to_string();
    let patch = |line: &str| {
        version
            .strip_prefix(line)
            .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|p| p.parse::<u64>().ok())
    };
    let affected = patch("3.4.").is_some_and(|p| p < 31) || patch("3.5.").is_some_and(|p| p < 13);
    let a = connect(&url(&server)).await?;
    let exclusion = &a.capabilities().exclusion;
    assert_eq!(
        exclusion.can_end_early(),
        affected,
        "etcd {version}: {exclusion}"
    );
    if affected {
        let shown = exclusion.to_string();
        assert!(
            shown.contains(&version) && shown.contains("15247"),
            "{shown}"
        );
    }
    Ok(())
}

/// The hot path is one write each: after the session exists, an acquire and a release move
/// etcd's revision by exactly one each (no lease grant, no extra key), and no lease is granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_and_release_are_one_write_each() -> Result {
    let server = start().await?;
    let raw = raw_client(&server).await?;
    let a = connect(&url(&server)).await?;
    let key = key("hot-path")?;
    let ttl = Duration::from_secs(5);
    let warm = a
        .try_acquire(&key, ttl)
        .await
        .or_fail("the warm-up acquisition")?
        .or_fail("the warm-up acquisition: a fresh key was held")?;
    let _ = a.release(&warm).await.or_fail("the warm-up release")?;
    let leases = || async {
        raw.lease_client()
            .leases()
            .await
            .or_fail("list the leases")
            .map(|l| l.leases().len())
    };
    let revision = || async {
        let read = raw.kv_client().get("x", None).await.or_fail("a read")?;
        Ok::<_, common::Failure>(read.header().or_fail("the read's header")?.revision())
    };
    let leases_before = leases().await?;
    let before = revision().await?;
    let mut fences = Vec::new();
    for _ in 0..10 {
        let g = a
            .try_acquire(&key, ttl)
            .await
            .or_fail("acquire")?
            .or_fail("acquire: the released key was held")?;
        fences.push(g.fence().raw());
        assert_eq!(a.release(&g).await.or_fail("release")?, Released::Released);
    }
    let after = revision().await?;
    assert_eq!(
        after - before,
        20,
        "10 acquires + 10 releases are 20 writes"
    );
    assert!(fences.windows(2).all(|w| w[1] == w[0] + 2), "{fences:?}");
    let leases_after = leases().await?;
    assert_eq!(
        leases_before, leases_after,
        "a lease was granted on the hot path"
    );
    Ok(())
}

/// etcd #22082: a release retried after the key was freed and taken again through the same
/// session (the same key name) must not delete the newer holder's key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_release_never_deletes_a_newer_holder() -> Result {
    let server = start().await?;
    let raw = raw_client(&server).await?;
    let a = connect(&url(&server)).await?;
    let key = key("stale-release")?;
    let ttl = Duration::from_secs(2);
    let old = a
        .try_acquire(&key, ttl)
        .await
        .or_fail("the old acquisition")?
        .or_fail("the old acquisition: a fresh key was held")?;
    assert_eq!(
        a.release(&old).await.or_fail("the old release")?,
        Released::Released
    );
    let new = a
        .try_acquire(&key, ttl)
        .await
        .or_fail("the new acquisition")?
        .or_fail("the new acquisition: the released key was held")?;
    assert_eq!(
        contender_key(&old),
        contender_key(&new),
        "the same session reuses the freed name, as etcd's Mutex does"
    );
    assert!(new.fence() > old.fence());
    assert_eq!(
        a.release(&old).await.or_fail("the stale release")?,
        Released::AlreadyGone
    );
    let still = keys_under(&raw, contender_key(&new).or_fail("the new contender key")?).await?;
    assert_eq!(
        still.len(),
        1,
        "the stale release deleted the newer holder's key"
    );
    assert!(a
        .try_acquire(&key, ttl)
        .await
        .or_fail("acquire the held key")?
        .is_none());
    assert_eq!(
        a.release(&new).await.or_fail("the new release")?,
        Released::Released
    );
    Ok(())
}

/// Lock keys `a` and `a/b` are separate queues (`/` is escaped), and the layout is etcd's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_looking_keys_do_not_collide() -> Result {
    let server = start().await?;
    let raw = raw_client(&server).await?;
    let a = connect(&format!("etcd://{}/apps/billing", server.endpoint())).await?;
    let ttl = Duration::from_secs(1);
    let outer = key("a")?;
    let inner = key("a/b")?;
    let g_inner = a
        .try_acquire(&inner, ttl)
        .await
        .or_fail("acquire `a/b`")?
        .or_fail("acquire `a/b`: a fresh key was held")?;
    let g_outer = a
        .try_acquire(&outer, ttl)
        .await
        .or_fail("acquire `a`")?
        .or_fail("`a` is not held by `a/b`")?;
    assert_eq!(a.prefix(&outer), "apps/billing/a/");
    assert_eq!(keys_under(&raw, "apps/billing/a/").await?.len(), 1);
    assert_eq!(keys_under(&raw, "apps/billing/a%2Fb/").await?.len(), 1);
    let _ = a.release(&g_inner).await.or_fail("release `a/b`")?;
    let _ = a.release(&g_outer).await.or_fail("release `a`")?;
    Ok(())
}

/// The fence inside etcd itself: a write guarded by `still_holds` in the same transaction
/// commits while the grant holds the lock, and is refused once another holder has it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guarded_etcd_transactions_refuse_a_former_holder() -> Result {
    let server = start().await?;
    let (a, b) = (connect(&url(&server)).await?, connect(&url(&server)).await?);
    let key = key("invoice:inv_9")?;
    let ttl = Duration::from_secs(1);
    let write = |grant: &leasehold_core::Grant, value: &str| -> Result<Txn> {
        Ok(Txn::new()
            .when([still_holds(grant).or_fail("the guard")?])
            .and_then([TxnOp::put("invoices/inv_9", value, None)]))
    };
    let old = a
        .try_acquire(&key, ttl)
        .await
        .or_fail("A acquires")?
        .or_fail("A acquires: a fresh key was held")?;
    let mut kv = a.client().kv_client();
    assert!(kv
        .txn(write(&old, "old")?)
        .await
        .or_fail("A's guarded write")?
        .succeeded());
    // A pauses: its grant is not renewed, it ends at its TTL, B takes the lock.
    let start = Instant::now();
    let new = loop {
        if let Some(g) = b.try_acquire(&key, ttl).await.or_fail("B tries")? {
            break g;
        }
        assert!(start.elapsed() < ttl * 3, "B never got the key");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(kv
        .txn(write(&new, "new")?)
        .await
        .or_fail("B's guarded write")?
        .succeeded());
    assert!(
        !kv.txn(write(&old, "stale")?)
            .await
            .or_fail("A's stale guarded write")?
            .succeeded(),
        "the former holder's guarded write went through"
    );
    let value = kv
        .get("invoices/inv_9", None)
        .await
        .or_fail("read the invoice")?;
    assert_eq!(value.kvs()[0].value(), b"new");

    // The same through guarded_txn: applied for the holder; for the former holder refused,
    // naming the holder's fence, and counted as a stale holder caught.
    let put = |value: &str| vec![TxnOp::put("invoices/inv_9", value, None)];
    assert_eq!(
        guarded_txn(&b, &new, put("new again"))
            .await
            .or_fail("B's guarded_txn")?,
        Guarded::Accepted
    );
    assert_eq!(
        guarded_txn(&a, &old, put("stale again"))
            .await
            .or_fail("A's stale guarded_txn")?,
        Guarded::Stale {
            newest: new.fence().value()
        }
    );
    let value = kv
        .get("invoices/inv_9", None)
        .await
        .or_fail("read the invoice again")?;
    assert_eq!(value.kvs()[0].value(), b"new again");
    let _ = b.release(&new).await.or_fail("B releases")?;
    // Nobody holds it now: the refusal names a fence above the released one's.
    match guarded_txn(&a, &old, put("later"))
        .await
        .or_fail("A's guarded_txn on a free key")?
    {
        Guarded::Stale { newest } => assert!(newest > new.fence().value(), "{newest}"),
        Guarded::Accepted => return Err("a former holder's write went through".into()),
    }
    Ok(())
}
