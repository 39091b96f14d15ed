//! The etcd authority against a real single-node etcd started by the harness: the whole
//! conformance suite with faults, sessions (one lease, many locks; loss of the lease; idle close),
//! waiters that leave nothing behind, the etcd #22082 stale release, guarded etcd transactions,
//! cancellation, and pushed loss. Bad input, proclaimed values, `wait_for_change` and etcd's own
//! clients have test files of their own.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{Client, GetOptions, Txn, TxnOp};
use leasehold_conformance::scenarios::run_all;
use leasehold_conformance::{harness_call, harness_error};
use leasehold_conformance::{Connector, Context, Faults, Residue, Verdict};
use leasehold_core::{
    Authority, Error, Guarded, Instant, Lease, LeaseOptions, LockKey, LostReason, Released,
};
use leasehold_etcd::guarded::{contender_key, guarded_txn, still_holds};
use leasehold_etcd::EtcdAuthority;
use leasehold_servers::{self as servers, EtcdServer};

mod common;

use common::{
    cuts, eventually, keys_under, lease_alive, metric, raw_client, start, url, REQUEST_TIMEOUT,
};

struct Clients(String);

#[async_trait]
impl Connector for Clients {
    async fn connect(&self) -> leasehold_core::Result<Arc<dyn Authority>> {
        Ok(Arc::new(EtcdAuthority::connect(&self.0).await?))
    }
}

/// Crash, freeze and operator faults on the harness's etcd.
struct EtcdFaults {
    server: Arc<EtcdServer>,
    url: String,
}

impl EtcdFaults {
    async fn blocking(
        &self,
        f: impl FnOnce(&EtcdServer) -> servers::Result<()> + Send + 'static,
    ) -> leasehold_core::Result<()> {
        let server = self.server.clone();
        harness_call(move || f(&server)).await
    }
}

#[async_trait]
impl Faults for EtcdFaults {
    /// SIGKILL and a restart on the same data dir.
    async fn restart(&self) -> leasehold_core::Result<()> {
        self.blocking(|s| s.restart()).await
    }

    async fn pause(&self) -> leasehold_core::Result<()> {
        self.blocking(|s| s.pause()).await
    }

    async fn resume(&self) -> leasehold_core::Result<()> {
        self.blocking(|s| s.resume()).await
    }

    /// An operator deletes the holder's contender key (`etcdctl del`), leaving its session alive.
    async fn revoke(&self, key: &LockKey) -> leasehold_core::Result<()> {
        let admin = EtcdAuthority::connect(&self.url).await?;
        let prefix = admin.prefix(key);
        let holder = keys_under(admin.client(), &prefix).await;
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
async fn passes_the_conformance_suite_with_faults() {
    if let Some(endpoints) = servers::external::etcd_endpoints() {
        let url = format!("etcd://{endpoints}?timeout_ms=1000");
        let ctx = Context::new(Arc::new(Clients(url))).await.unwrap();
        let report = run_all("etcd (external)", &ctx).await;
        println!("{report}");
        report.assert_passed();
        return;
    }
    let server = start().await;
    let url = url(&server);
    let ctx = Context::new(Arc::new(Clients(url.clone())))
        .await
        .unwrap()
        .with_residue(Arc::new(EtcdResidue(url.clone())))
        .with_faults(Arc::new(EtcdFaults { server, url }));
    assert_eq!(
        ctx.ttl(),
        Duration::from_secs(1),
        "the harness etcd grants 1 s leases"
    );
    let report = run_all("etcd", &ctx).await;
    println!("{report}");
    report.assert_passed();
    for line in &report.lines {
        // Failover needs a cluster: see tests/cluster.rs.
        if line.scenario != "fences_survive_failover" {
            assert_eq!(
                line.outcome,
                Ok(Verdict::Passed),
                "{}:\n{report}",
                line.scenario
            );
        }
    }
}

/// Ten locks through one authority: one session lease, every contender key on it; they stay
/// held past three TTLs (the single keep-alive stream plus per-grant checks); a second
/// acquisition of a held key through the same session waits behind the first instead of sharing
/// its key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_session_lease_for_many_locks() {
    let server = start().await;
    let raw = raw_client(&server).await;
    let a = Arc::new(EtcdAuthority::connect(&url(&server)).await.unwrap());
    let ttl = Duration::from_secs(1);
    let mut leases = Vec::new();
    for i in 0..10 {
        let key = LockKey::new(format!("many/{i}")).unwrap();
        let lease = Lease::try_acquire(a.clone(), &key, ttl, LeaseOptions::default())
            .await
            .unwrap()
            .expect("a free key");
        leases.push(lease);
    }
    let sessions = a.session_leases();
    assert_eq!(sessions.len(), 1, "one session for one TTL: {sessions:?}");
    let session = sessions[0];
    for lease in &leases {
        let name = contender_key(lease.grant()).unwrap();
        assert_eq!(name, format!("{}{session:x}", a.prefix(lease.key())));
        let on = keys_under(&raw, name).await;
        assert_eq!(on, vec![(name.to_string(), session)]);
    }
    // Besides the session's lease, the server has none of ours (the TTL probe was revoked).
    let only_session = eventually(Duration::from_secs(2), || async {
        let listed = raw.lease_client().leases().await.unwrap();
        listed.leases().iter().map(|l| l.id()).collect::<Vec<_>>() == vec![session]
    })
    .await;
    assert!(
        only_session,
        "the server holds leases other than the session's"
    );

    tokio::time::sleep(ttl * 3).await;
    for lease in &leases {
        lease.ensure_valid().expect("renewed past three TTLs");
    }
    assert_eq!(a.session_leases(), vec![session], "still the same session");

    // A second contender through the same session queues behind the first.
    let key = leases[0].key().clone();
    let waiter = {
        let (a, key) = (a.clone(), key.clone());
        tokio::spawn(async move { a.acquire(&key, ttl, Duration::from_secs(5)).await })
    };
    let queued = eventually(Duration::from_secs(2), || async {
        keys_under(&raw, &a.prefix(&key)).await.len() == 2
    })
    .await;
    assert!(queued, "the second contender did not queue");
    let listed = keys_under(&raw, &a.prefix(&key)).await;
    assert_eq!(listed[1].0, format!("{}{session:x}_1", a.prefix(&key)));
    assert!(!waiter.is_finished(), "two holders through one session");
    let first_fence = leases[0].fence();
    let first = leases.remove(0);
    assert_eq!(first.release().await.unwrap(), Released::Released);
    let second = waiter.await.unwrap().expect("the waiter gets the key");
    assert!(second.fence() > first_fence);
    let _ = a.release(&second).await.unwrap();
}

/// etcd-io/etcd#15247: before 3.4.31 and 3.5.13, a leader that stalls and resumes revokes
/// leases the new leader kept alive. The fault workload met it (a paused leader, then a second
/// holder granted while the first lease was valid); a server with the defect must be declared.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_whose_stalled_leader_revokes_live_leases_is_declared() {
    let server = start().await;
    let mut raw = raw_client(&server).await;
    let version = raw.status().await.unwrap().version().to_string();
    let patch = |line: &str| {
        version
            .strip_prefix(line)
            .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|p| p.parse::<u64>().ok())
    };
    let affected = patch("3.4.").is_some_and(|p| p < 31) || patch("3.5.").is_some_and(|p| p < 13);
    let a = EtcdAuthority::connect(&url(&server)).await.unwrap();
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
}

/// The hot path is one write each: after the session exists, an acquire and a release move
/// etcd's revision by exactly one each (no lease grant, no extra key), and no lease is granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_and_release_are_one_write_each() {
    let server = start().await;
    let raw = raw_client(&server).await;
    let a = EtcdAuthority::connect(&url(&server)).await.unwrap();
    let key = LockKey::new("hot-path").unwrap();
    let ttl = Duration::from_secs(5);
    let warm = a.try_acquire(&key, ttl).await.unwrap().unwrap();
    let _ = a.release(&warm).await.unwrap();
    let leases_before = raw.lease_client().leases().await.unwrap().leases().len();
    let revision = |r: etcd_client::GetResponse| r.header().unwrap().revision();
    let before = revision(raw.kv_client().get("x", None).await.unwrap());
    let mut fences = Vec::new();
    for _ in 0..10 {
        let g = a.try_acquire(&key, ttl).await.unwrap().unwrap();
        fences.push(g.fence().raw());
        assert_eq!(a.release(&g).await.unwrap(), Released::Released);
    }
    let after = revision(raw.kv_client().get("x", None).await.unwrap());
    assert_eq!(
        after - before,
        20,
        "10 acquires + 10 releases are 20 writes"
    );
    assert!(fences.windows(2).all(|w| w[1] == w[0] + 2), "{fences:?}");
    let leases_after = raw.lease_client().leases().await.unwrap().leases().len();
    assert_eq!(
        leases_before, leases_after,
        "a lease was granted on the hot path"
    );
}

/// When the session's lease is revoked, every lease on it is lost at its next renewal with
/// `SessionEnded`, and the next acquire starts a new session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_session_loses_every_lease_on_it() {
    let server = start().await;
    let raw = raw_client(&server).await;
    let a = Arc::new(EtcdAuthority::connect(&url(&server)).await.unwrap());
    let ttl = Duration::from_secs(1);
    let mut held = Vec::new();
    for name in ["revoked/1", "revoked/2", "revoked/3"] {
        let key = LockKey::new(name).unwrap();
        held.push(
            Lease::try_acquire(a.clone(), &key, ttl, LeaseOptions::default())
                .await
                .unwrap()
                .unwrap(),
        );
    }
    let session = a.session_leases()[0];
    raw.lease_client().revoke(session).await.unwrap();
    let revoked = Instant::now();
    for lease in &held {
        let reason = tokio::time::timeout(ttl, lease.lost())
            .await
            .expect("lost within a TTL of the revoke");
        assert!(
            matches!(reason, LostReason::SessionEnded),
            "{reason:?} after {:?}",
            revoked.elapsed()
        );
    }
    let key = LockKey::new("revoked/1").unwrap();
    let again = a.try_acquire(&key, ttl).await.unwrap().expect("free again");
    let fresh = a.session_leases();
    assert_eq!(fresh.len(), 1);
    assert_ne!(fresh[0], session, "a new session after the old one ended");
    let _ = a.release(&again).await.unwrap();
}

/// A waiter that is cancelled (its future dropped) or that times out deletes its contender key:
/// listing the prefix shows only the holder's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_that_give_up_leave_no_key() {
    let server = start().await;
    let raw = raw_client(&server).await;
    let (a, b) = (
        EtcdAuthority::connect(&url(&server)).await.unwrap(),
        EtcdAuthority::connect(&url(&server)).await.unwrap(),
    );
    let key = LockKey::new("cancelled-waiter").unwrap();
    let prefix = a.prefix(&key);
    let ttl = Duration::from_secs(1);
    let holder = a.try_acquire(&key, ttl).await.unwrap().unwrap();
    let holder_key = contender_key(&holder).unwrap().to_string();
    let b_session = {
        let g = b
            .try_acquire(&LockKey::new("other").unwrap(), ttl)
            .await
            .unwrap()
            .unwrap();
        let _ = b.release(&g).await.unwrap();
        b.session_leases()[0]
    };

    // Cancelled: the future is dropped while it waits.
    let cancelled =
        tokio::time::timeout(Duration::from_millis(300), b.acquire(&key, ttl, ttl * 10)).await;
    assert!(
        cancelled.is_err(),
        "the waiter was not waiting: {cancelled:?}"
    );
    let cleaned = eventually(Duration::from_secs(1), || async {
        keys_under(&raw, &prefix).await == vec![(holder_key.clone(), a.session_leases()[0])]
    })
    .await;
    assert!(
        cleaned,
        "a cancelled waiter left a key: {:?}",
        keys_under(&raw, &prefix).await
    );

    // Timed out: the key is gone by the time acquire returns.
    let timed_out = b.acquire(&key, ttl, Duration::from_millis(200)).await;
    assert!(
        matches!(timed_out, Err(Error::Timeout { .. })),
        "{timed_out:?}"
    );
    let left = keys_under(&raw, &prefix).await;
    assert_eq!(left.len(), 1, "a timed-out waiter left a key: {left:?}");
    assert_ne!(left[0].1, b_session);

    let _ = a.release(&holder).await.unwrap();
    assert!(keys_under(&raw, &prefix).await.is_empty());
}

/// A waiter that cannot look at the key ahead for the whole of `max_wait` (the server died while
/// it waited) says so: `Unavailable`, nobody knows who holds the key, not `Timeout`, which says
/// someone does. Its looks are sent again until `max_wait` (a failover keeps its place), but
/// the last one's failure is what it returns. The TTL outlasts `max_wait`, so the session does
/// not end first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_cannot_look_until_max_wait_is_unavailable_not_timed_out(
) -> Result<(), String> {
    let server = tokio::task::spawn_blocking(EtcdServer::start)
        .await
        .map_err(|e| format!("the harness task: {e}"))?
        .map_err(|e| format!("etcd must start for this test: {e}"))?;
    let url = url(&server);
    let a = EtcdAuthority::connect(&url)
        .await
        .map_err(|e| format!("connect A: {e}"))?;
    let b = Arc::new(
        EtcdAuthority::connect(&url)
            .await
            .map_err(|e| format!("connect B: {e}"))?,
    );
    let key = LockKey::new("unreadable-wait").map_err(|e| e.to_string())?;
    let ttl = Duration::from_secs(5);
    let max_wait = REQUEST_TIMEOUT * 2;
    let _held = a
        .try_acquire(&key, ttl)
        .await
        .map_err(|e| format!("A's try: {e}"))?
        .ok_or("the key was held")?;
    let waiter = {
        let (b, key) = (b.clone(), key.clone());
        tokio::spawn(async move { b.acquire(&key, ttl, max_wait).await })
    };
    let raw = Client::connect([server.endpoint()], None)
        .await
        .map_err(|e| format!("a raw client: {e}"))?;
    let prefix = a.prefix(&key);
    let queued_by = Instant::now() + REQUEST_TIMEOUT;
    loop {
        let found = raw
            .kv_client()
            .get(
                prefix.as_str(),
                Some(GetOptions::new().with_prefix().with_count_only()),
            )
            .await
            .map_err(|e| format!("count the queue: {e}"))?;
        if found.count() >= 2 {
            break;
        }
        if Instant::now() > queued_by {
            return Err(format!("B did not queue within {REQUEST_TIMEOUT:?}"));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let server = Arc::new(server);
    let killed = {
        let server = server.clone();
        tokio::task::spawn_blocking(move || server.kill())
    };
    killed
        .await
        .map_err(|e| format!("the harness task: {e}"))?
        .map_err(|e| format!("kill the server: {e}"))?;
    // B returns at `max_wait`, later by at most the look in flight then.
    let outcome = tokio::time::timeout(max_wait + REQUEST_TIMEOUT * 2, waiter)
        .await
        .map_err(|_| "B's acquire did not return".to_string())?
        .map_err(|e| format!("B's task: {e}"))?;
    match outcome {
        Err(Error::Unavailable { .. }) => Ok(()),
        other => Err(format!(
            "B could not look at the key ahead, yet returned {other:?}"
        )),
    }
}

/// etcd #22082: a release retried after the key was freed and taken again through the same
/// session (the same key name) must not delete the newer holder's key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_release_never_deletes_a_newer_holder() {
    let server = start().await;
    let raw = raw_client(&server).await;
    let a = EtcdAuthority::connect(&url(&server)).await.unwrap();
    let key = LockKey::new("stale-release").unwrap();
    let ttl = Duration::from_secs(2);
    let old = a.try_acquire(&key, ttl).await.unwrap().unwrap();
    assert_eq!(a.release(&old).await.unwrap(), Released::Released);
    let new = a.try_acquire(&key, ttl).await.unwrap().unwrap();
    assert_eq!(
        contender_key(&old),
        contender_key(&new),
        "the same session reuses the freed name, as etcd's Mutex does"
    );
    assert!(new.fence() > old.fence());
    assert_eq!(a.release(&old).await.unwrap(), Released::AlreadyGone);
    let still = keys_under(&raw, contender_key(&new).unwrap()).await;
    assert_eq!(
        still.len(),
        1,
        "the stale release deleted the newer holder's key"
    );
    assert!(a.try_acquire(&key, ttl).await.unwrap().is_none());
    assert_eq!(a.release(&new).await.unwrap(), Released::Released);
}

/// Lock keys `a` and `a/b` are separate queues (`/` is escaped), and the layout is etcd's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_looking_keys_do_not_collide() {
    let server = start().await;
    let raw = raw_client(&server).await;
    let a = EtcdAuthority::connect(&format!("etcd://{}/apps/billing", server.endpoint()))
        .await
        .unwrap();
    let ttl = Duration::from_secs(1);
    let outer = LockKey::new("a").unwrap();
    let inner = LockKey::new("a/b").unwrap();
    let g_inner = a.try_acquire(&inner, ttl).await.unwrap().unwrap();
    let g_outer = a
        .try_acquire(&outer, ttl)
        .await
        .unwrap()
        .expect("`a` is not held by `a/b`");
    assert_eq!(a.prefix(&outer), "apps/billing/a/");
    assert_eq!(keys_under(&raw, "apps/billing/a/").await.len(), 1);
    assert_eq!(keys_under(&raw, "apps/billing/a%2Fb/").await.len(), 1);
    let _ = a.release(&g_inner).await.unwrap();
    let _ = a.release(&g_outer).await.unwrap();
}

/// A grant that is not renewed is withdrawn by its session at the end of its TTL (its key is
/// deleted), while the session's lease lives on for the other locks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unrenewed_grant_ends_at_its_ttl_though_the_session_lives() {
    let server = start().await;
    let raw = raw_client(&server).await;
    let a = Arc::new(EtcdAuthority::connect(&url(&server)).await.unwrap());
    let ttl = Duration::from_secs(1);
    let kept = Lease::try_acquire(
        a.clone(),
        &LockKey::new("kept").unwrap(),
        ttl,
        LeaseOptions::default(),
    )
    .await
    .unwrap()
    .unwrap();
    let key = LockKey::new("unrenewed").unwrap();
    let sent = Instant::now();
    let grant = a.try_acquire(&key, ttl).await.unwrap().unwrap();
    assert!(grant.deadline() <= sent + ttl);
    // The session deletes the key at (its own send instant, after `sent`) + TTL, with one
    // request bounded by the request timeout; we look every 20 ms, with one list request.
    let latest = ttl + REQUEST_TIMEOUT * 2 + Duration::from_millis(20);
    let gone = eventually(latest, || async {
        keys_under(&raw, &a.prefix(&key)).await.is_empty()
    })
    .await;
    let at = sent.elapsed();
    assert!(
        gone,
        "the unrenewed grant's key is still there after {at:?}"
    );
    // Timers never fire early, and the session's clock started after `sent`.
    assert!(at >= ttl, "withdrawn early, after {at:?}");
    assert!(at <= latest, "withdrawn late, after {at:?}");
    assert!(matches!(
        a.renew(&grant, ttl).await,
        Err(Error::LeaseLost {
            reason: LostReason::Refused,
            ..
        })
    ));
    kept.ensure_valid()
        .expect("the other lock on the session is unaffected");
    assert!(lease_alive(&raw, a.session_leases()[0]).await);
    let _ = kept.release().await.unwrap();
}

/// An idle session revokes its lease after `session_idle_ms`; dropping the authority revokes
/// the leases of its sessions at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_dropped_sessions_revoke_their_leases() {
    let server = start().await;
    let raw = raw_client(&server).await;
    let ttl = Duration::from_secs(5);
    let key = LockKey::new("idle").unwrap();

    let idle = EtcdAuthority::connect(&format!("{}&session_idle_ms=300", url(&server)))
        .await
        .unwrap();
    let g = idle.try_acquire(&key, ttl).await.unwrap().unwrap();
    let session = idle.session_leases()[0];
    let _ = idle.release(&g).await.unwrap();
    assert!(lease_alive(&raw, session).await, "not idle long enough yet");
    let closed = eventually(Duration::from_secs(2), || async {
        !lease_alive(&raw, session).await
    })
    .await;
    assert!(closed, "the idle session's lease was not revoked");
    assert!(idle.session_leases().is_empty());

    let dropped = EtcdAuthority::connect(&url(&server)).await.unwrap();
    let g = dropped.try_acquire(&key, ttl).await.unwrap().unwrap();
    let session = dropped.session_leases()[0];
    let holder = contender_key(&g).unwrap().to_string();
    drop(g);
    drop(dropped);
    let revoked = eventually(Duration::from_secs(1), || async {
        !lease_alive(&raw, session).await
    })
    .await;
    assert!(
        revoked,
        "dropping the authority left its session's lease alive"
    );
    assert!(keys_under(&raw, &holder).await.is_empty());
}

/// The fence inside etcd itself: a write guarded by `still_holds` in the same transaction
/// commits while the grant holds the lock, and is refused once another holder has it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guarded_etcd_transactions_refuse_a_former_holder() {
    let server = start().await;
    let (a, b) = (
        EtcdAuthority::connect(&url(&server)).await.unwrap(),
        EtcdAuthority::connect(&url(&server)).await.unwrap(),
    );
    let key = LockKey::new("invoice:inv_9").unwrap();
    let ttl = Duration::from_secs(1);
    let write = |grant: &leasehold_core::Grant, value: &str| {
        Txn::new()
            .when([still_holds(grant).unwrap()])
            .and_then([TxnOp::put("invoices/inv_9", value, None)])
    };
    let old = a.try_acquire(&key, ttl).await.unwrap().unwrap();
    let mut kv = a.client().kv_client();
    assert!(kv.txn(write(&old, "old")).await.unwrap().succeeded());
    // A pauses: its grant is not renewed, it ends at its TTL, B takes the lock.
    let start = Instant::now();
    let new = loop {
        if let Some(g) = b.try_acquire(&key, ttl).await.unwrap() {
            break g;
        }
        assert!(start.elapsed() < ttl * 3, "B never got the key");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(kv.txn(write(&new, "new")).await.unwrap().succeeded());
    assert!(
        !kv.txn(write(&old, "stale")).await.unwrap().succeeded(),
        "the former holder's guarded write went through"
    );
    let value = kv.get("invoices/inv_9", None).await.unwrap();
    assert_eq!(value.kvs()[0].value(), b"new");

    // The same through guarded_txn: applied for the holder; for the former holder refused,
    // naming the holder's fence, and counted as a stale holder caught.
    let put = |value: &str| vec![TxnOp::put("invoices/inv_9", value, None)];
    assert_eq!(
        guarded_txn(&b, &new, put("new again")).await.unwrap(),
        Guarded::Accepted
    );
    assert_eq!(
        guarded_txn(&a, &old, put("stale again")).await.unwrap(),
        Guarded::Stale {
            newest: new.fence().value()
        }
    );
    let value = kv.get("invoices/inv_9", None).await.unwrap();
    assert_eq!(value.kvs()[0].value(), b"new again");
    let _ = b.release(&new).await.unwrap();
    // Nobody holds it now: the refusal names a fence above the released one's.
    match guarded_txn(&a, &old, put("later")).await.unwrap() {
        Guarded::Stale { newest } => assert!(newest > new.fence().value(), "{newest}"),
        Guarded::Accepted => panic!("a former holder's write went through"),
    }
}

/// Tries `client.try_acquire` every 20 ms until it succeeds or `within` passes.
async fn try_within(
    client: &EtcdAuthority,
    key: &LockKey,
    ttl: Duration,
    within: Duration,
) -> Option<leasehold_core::Grant> {
    let start = Instant::now();
    loop {
        if let Some(g) = client.try_acquire(key, ttl).await.unwrap() {
            return Some(g);
        }
        if start.elapsed() > within {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `try_acquire` futures dropped at random points around one round trip, 200 times: another
/// client then gets the key within TTL + expiry slack + one request timeout, and no key of the
/// cancelling client's session is left under the prefix. (A cancelled try's key left booked as
/// pending on the kept-alive session lease would block the lock until the process exits.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_try_acquires_leave_nothing_behind() {
    let server = start().await;
    let raw = raw_client(&server).await;
    let (a, b) = (
        EtcdAuthority::connect(&url(&server)).await.unwrap(),
        EtcdAuthority::connect(&url(&server)).await.unwrap(),
    );
    let key = LockKey::new("cancelled-try").unwrap();
    let prefix = a.prefix(&key);
    let ttl = Duration::from_secs(2);
    let sent = Instant::now();
    let g = a.try_acquire(&key, ttl).await.unwrap().unwrap();
    let round_trip = sent.elapsed();
    let _ = a.release(&g).await.unwrap();
    let session = a.session_leases()[0];
    let (mut cancelled, mut completed) = (0, 0);
    for cut in cuts(round_trip, 200) {
        match tokio::time::timeout(cut, a.try_acquire(&key, ttl)).await {
            Err(_) => cancelled += 1,
            Ok(Ok(Some(g))) => {
                completed += 1;
                let _ = a.release(&g).await.unwrap();
            }
            Ok(Ok(None)) => completed += 1,
            Ok(Err(e)) => panic!("try_acquire failed: {e:?}"),
        }
    }
    eprintln!("{cancelled} cancelled, {completed} completed (round trip {round_trip:?})");
    assert!(cancelled > 0, "no try was cancelled");
    let within = ttl + a.capabilities().expiry_slack + Duration::from_secs(1);
    let got = try_within(&b, &key, ttl, within).await;
    assert!(
        got.is_some(),
        "a cancelled try_acquire left the key blocked: {:?}",
        keys_under(&raw, &prefix).await
    );
    let ours: Vec<_> = keys_under(&raw, &prefix)
        .await
        .into_iter()
        .filter(|(_, lease)| *lease == session)
        .collect();
    assert!(ours.is_empty(), "keys of the cancelling session: {ours:?}");
    assert!(
        lease_alive(&raw, session).await,
        "the session itself lives on"
    );
    let _ = b.release(&got.unwrap()).await.unwrap();
}

/// Loss is pushed, not polled. The session's lease is revoked behind the holders'
/// backs (a raw etcd client, as an operator's `etcdctl lease revoke` would): at a TTL of 9 s,
/// where the next renewal or keep-alive is up to 3 s (TTL/3) away, every grant's loss signal
/// fires and every `Lease` is lost within TTL/9 = 1 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_session_lease_is_lost_within_a_second() {
    let server = start().await;
    let raw = raw_client(&server).await;
    let a = Arc::new(EtcdAuthority::connect(&url(&server)).await.unwrap());
    let ttl = Duration::from_secs(9);
    let bound = ttl / 9;
    let lease = Lease::try_acquire(
        a.clone(),
        &LockKey::new("pushed/lease").unwrap(),
        ttl,
        LeaseOptions::default(),
    )
    .await
    .unwrap()
    .unwrap();
    let grant = a
        .try_acquire(&LockKey::new("pushed/grant").unwrap(), ttl)
        .await
        .unwrap()
        .unwrap();
    let signal = grant
        .loss_signal()
        .expect("etcd grants carry a loss signal");
    assert!(signal.fired().is_none());
    let session = a.session_leases()[0];
    // Past the first keep-alive and renewal, so neither is about to happen by chance.
    tokio::time::sleep(Duration::from_millis(300)).await;
    raw.lease_client().revoke(session).await.unwrap();
    let revoked = Instant::now();
    let reason = tokio::time::timeout(bound, signal.wait())
        .await
        .unwrap_or_else(|_| panic!("the grant's loss signal did not fire within {bound:?}"));
    assert!(matches!(reason, LostReason::SessionEnded), "{reason:?}");
    let reason = tokio::time::timeout_at(revoked + bound, lease.lost())
        .await
        .unwrap_or_else(|_| panic!("lease.lost() did not resolve within {bound:?}"));
    assert!(matches!(reason, LostReason::SessionEnded), "{reason:?}");
    assert!(lease.ensure_valid().is_err());
    assert!(!grant.is_valid());
    eprintln!("lost {:?} after the revoke", revoked.elapsed());
}

/// A holder's key deleted by an operator (`etcdctl del`) while its session lives on: that
/// grant's loss signal fires (Refused) within TTL/9 = 1 s at a TTL of 9 s; the other grant on the
/// same session stays valid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_deleted_behind_our_back_is_lost_within_a_second() {
    let server = start().await;
    let raw = raw_client(&server).await;
    let a = EtcdAuthority::connect(&url(&server)).await.unwrap();
    let ttl = Duration::from_secs(9);
    let bound = ttl / 9;
    let deleted = a
        .try_acquire(&LockKey::new("pushed/deleted").unwrap(), ttl)
        .await
        .unwrap()
        .unwrap();
    let kept = a
        .try_acquire(&LockKey::new("pushed/kept").unwrap(), ttl)
        .await
        .unwrap()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    raw.kv_client()
        .delete(contender_key(&deleted).unwrap(), None)
        .await
        .unwrap();
    let reason = tokio::time::timeout(bound, deleted.loss_signal().unwrap().wait())
        .await
        .unwrap_or_else(|_| panic!("the loss signal did not fire within {bound:?}"));
    assert!(matches!(reason, LostReason::Refused), "{reason:?}");
    assert!(kept.loss_signal().unwrap().fired().is_none());
    assert!(kept.is_valid());
    a.renew(&kept, ttl)
        .await
        .expect("the other grant is still held");
    assert_eq!(a.release(&kept).await.unwrap(), Released::Released);
    assert_eq!(a.release(&deleted).await.unwrap(), Released::AlreadyGone);
}

/// A grant's key is watched (its loss pushed at once) from the session's own task, a twentieth
/// of the TTL (at most 250 ms) after the grant, instead of from a task and a timer per grant:
/// grants start no task, yet a key deleted behind our back before its watch opened is still
/// noticed (the watch replays from the key's creation), and every held key ends up watched.
/// Twenty grants in a row leave the runtime's task count where it was, give or take the tasks
/// of watches that opened meanwhile (at most three each: the watch, and the HTTP/2 stream's);
/// a task per grant would stay asleep for up to 250 ms each.
#[tokio::test]
async fn grants_start_no_task_of_their_own_and_their_watches_still_open() {
    let server = start().await;
    let raw = raw_client(&server).await;
    let a = EtcdAuthority::connect(&url(&server)).await.unwrap();
    let ttl = Duration::from_secs(9);
    let delay = Duration::from_millis(250);
    let key = |i: usize| LockKey::new(format!("unspawned/{i}")).unwrap();
    let watchers = || metric(&server, "etcd_debugging_mvcc_watcher_total", "");
    let no_watch = watchers().await;
    // The session (and its task) exist from the first grant on.
    let first = a.try_acquire(&key(0), ttl).await.unwrap().unwrap();
    let tasks = || {
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks()
    };
    let before = tasks();
    let mut grants = Vec::new();
    for i in 1..=20 {
        grants.push(a.try_acquire(&key(i), ttl).await.unwrap().unwrap());
    }
    let after = tasks();
    // Read after the count: at least as many watches were open when the tasks were counted.
    let opened = usize::try_from(watchers().await.saturating_sub(no_watch)).unwrap();
    assert!(
        after <= before + 2 + 3 * opened,
        "20 grants started {} tasks ({before} alive before, {after} after, {opened} watches open)",
        after.saturating_sub(before)
    );
    // Deleted at once, before its watch opens. Seen when the watch opens: at most 250 ms after
    // the grant, plus a keep-alive in flight, the watch's creation and the look at the lease
    // (a request timeout each, at most).
    raw.kv_client()
        .delete(contender_key(&grants[0]).unwrap(), None)
        .await
        .unwrap();
    let bound = delay + REQUEST_TIMEOUT * 3;
    let reason = tokio::time::timeout(bound, grants[0].loss_signal().unwrap().wait())
        .await
        .unwrap_or_else(|_| panic!("the loss signal did not fire within {bound:?}"));
    assert!(matches!(reason, LostReason::Refused), "{reason:?}");
    // Every key still held gets its watch: the other 19 and the first.
    let all = eventually(delay + REQUEST_TIMEOUT * 3, || async {
        watchers().await >= no_watch + 20
    })
    .await;
    assert!(
        all,
        "{} watches open at the server, {} expected",
        watchers().await.saturating_sub(no_watch),
        20
    );
    for grant in grants.iter().skip(1).chain([&first]) {
        assert!(grant.loss_signal().unwrap().fired().is_none());
        assert_eq!(a.release(grant).await.unwrap(), Released::Released);
    }
}

/// `close()` revokes every session lease before it returns (nothing outlives a process that
/// closes and exits), fires the loss signal of every grant still held, and leaves the authority
/// usable with a new session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_revokes_every_session_lease_before_returning() {
    let server = start().await;
    let raw = raw_client(&server).await;
    let a = EtcdAuthority::connect(&url(&server)).await.unwrap();
    let key = LockKey::new("closed").unwrap();
    let held = a
        .try_acquire(&key, Duration::from_secs(2))
        .await
        .unwrap()
        .unwrap();
    let other = a
        .try_acquire(
            &LockKey::new("closed/other").unwrap(),
            Duration::from_secs(3),
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(a.session_leases().len(), 2, "one session per TTL");
    a.close().await.unwrap();
    let left = raw.lease_client().leases().await.unwrap();
    assert!(left.leases().is_empty(), "leases left: {:?}", left.leases());
    assert!(keys_under(&raw, &a.prefix(&key)).await.is_empty());
    assert!(held.loss_signal().unwrap().fired().is_some());
    assert!(other.loss_signal().unwrap().fired().is_some());
    let again = a.try_acquire(&key, Duration::from_secs(2)).await.unwrap();
    assert!(again.is_some(), "usable after close");
    a.close().await.unwrap();
}

/// Transactions the server has handled (every acquire, release, and a waiter's look at the key
/// ahead is one; renewals are reads, keep-alives are lease calls).
async fn txns(server: &EtcdServer) -> u64 {
    metric(server, "grpc_server_handled_total", "grpc_method=\"Txn\"").await
}

/// Three waiters queue behind a holder, each on its own client. Each release
/// wakes only the next waiter: the server sees exactly two transactions per hand-off (the
/// release, and the next waiter's one look at the key ahead of it), and the waiters further
/// back stay asleep. A waiter watching the holder instead of its predecessor (a herd: every
/// release wakes every waiter) makes each of them look again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_only_the_next_waiter() {
    let server = start().await;
    let raw = raw_client(&server).await;
    let ttl = Duration::from_secs(10);
    let key = LockKey::new("herd").unwrap();
    let holder = EtcdAuthority::connect(&url(&server)).await.unwrap();
    let prefix = holder.prefix(&key);
    let mut held = holder.try_acquire(&key, ttl).await.unwrap().unwrap();
    let mut owner = holder.clone();
    let mut waiters = Vec::new();
    for i in 0..3 {
        let client = EtcdAuthority::connect(&url(&server)).await.unwrap();
        let task = {
            let (client, key) = (client.clone(), key.clone());
            tokio::spawn(async move { client.acquire(&key, ttl, ttl).await })
        };
        let queued = eventually(ttl / 2, || async {
            keys_under(&raw, &prefix).await.len() == i + 2
        })
        .await;
        assert!(queued, "waiter {i} did not queue");
        waiters.push((client, task));
    }
    // The holder's key is watched (loss is pushed), and so is each waiter's key ahead.
    let watching = eventually(ttl / 2, || async {
        metric(&server, "etcd_debugging_mvcc_watcher_total", "").await >= 4
    })
    .await;
    assert!(watching, "the waiters never watched");
    // A settle time far above a loopback round trip: a herd would show within it.
    let settle = ttl / 20;
    for (i, (client, task)) in waiters.into_iter().enumerate() {
        tokio::time::sleep(settle).await;
        let before = txns(&server).await;
        assert_eq!(owner.release(&held).await.unwrap(), Released::Released);
        let next = tokio::time::timeout(ttl / 2, task)
            .await
            .expect("the next waiter is woken")
            .unwrap()
            .expect("the next waiter gets the key");
        assert!(next.fence() > held.fence());
        tokio::time::sleep(settle).await;
        let spent = txns(&server).await - before;
        assert_eq!(
            spent, 2,
            "hand-off {i}: {spent} transactions for one release and one waiter's look; the \
             others woke too"
        );
        (owner, held) = (client, next);
    }
    assert_eq!(owner.release(&held).await.unwrap(), Released::Released);
}

/// The first acquire of a fresh authority grants its session's lease. Dropped while that grant
/// is in flight (30 fresh authorities, each cut at a random point around one round trip), it
/// must not leave a lease that nobody knows to live out its TTL at the server: the grant
/// completes in the background and the session is registered (reused by the next acquire, or
/// revoked when idle or closed), so every lease at the server is some client's session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_session_grants_leave_no_unknown_lease() {
    let server = start().await;
    let raw = raw_client(&server).await;
    let ttl = Duration::from_secs(5);
    let key = LockKey::new("cancelled-grant").unwrap();
    let probe = EtcdAuthority::connect(&url(&server)).await.unwrap();
    let sent = Instant::now();
    let g = probe.try_acquire(&key, ttl).await.unwrap().unwrap();
    let round_trip = sent.elapsed();
    let _ = probe.release(&g).await.unwrap();
    probe.close().await.unwrap();
    // Each attempt on a fresh authority, so that each starts with the grant of its session.
    let mut cancelled = 0;
    let mut clients = Vec::new();
    for cut in cuts(round_trip / 2, 30) {
        let a = EtcdAuthority::connect(&url(&server)).await.unwrap();
        match tokio::time::timeout(cut, a.try_acquire(&key, ttl)).await {
            Ok(result) => {
                if let Some(g) = result.unwrap() {
                    let _ = a.release(&g).await.unwrap();
                }
            }
            Err(_) => cancelled += 1,
        }
        clients.push(a);
    }
    let sessions: usize = clients.iter().map(|a| a.session_leases().len()).sum();
    eprintln!("{cancelled} cancelled, round trip {round_trip:?}, {sessions} sessions");
    assert!(cancelled > 0, "no acquire was cut short");
    // Every lease at the server is a session some client knows (and will revoke or reuse).
    let settled = eventually(REQUEST_TIMEOUT, || async {
        let known: usize = clients.iter().map(|a| a.session_leases().len()).sum();
        raw.lease_client().leases().await.unwrap().leases().len() <= known
    })
    .await;
    let left = raw.lease_client().leases().await.unwrap().leases().len();
    let known: usize = clients.iter().map(|a| a.session_leases().len()).sum();
    assert!(
        settled,
        "{left} leases at the server, {known} of them sessions: the others were granted for \
         dropped acquires and nobody knows them"
    );
}

/// `close()` dropped at its first await (a caller's timeout) still revokes every session lease
/// (two here, one per TTL), within one request timeout, not at the end of their TTLs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_close_still_revokes() {
    let server = start().await;
    let raw = raw_client(&server).await;
    let a = EtcdAuthority::connect(&url(&server)).await.unwrap();
    let mut grants = Vec::new();
    for (name, ttl) in [("dropped-close/5", 5), ("dropped-close/6", 6)] {
        let ttl = Duration::from_secs(ttl);
        let key = LockKey::new(name).unwrap();
        grants.push(a.try_acquire(&key, ttl).await.unwrap().unwrap());
    }
    let sessions = a.session_leases();
    assert_eq!(sessions.len(), 2);
    // Dropped after its first poll. On a loaded machine the revokes it spawned may already have
    // been answered by then (another worker thread ran them while this one was descheduled),
    // and close is done at its first poll; either way every session lease must be revoked.
    let dropped = tokio::time::timeout(Duration::ZERO, a.close()).await;
    if dropped.is_ok() {
        println!("close was answered at its first poll; checking the revokes all the same");
    }
    let revoked = eventually(REQUEST_TIMEOUT, || async {
        for session in &sessions {
            if lease_alive(&raw, *session).await {
                return false;
            }
        }
        true
    })
    .await;
    assert!(revoked, "a session lease outlived a dropped close");
    for g in &grants {
        assert!(g.loss_signal().unwrap().fired().is_some());
    }
}
