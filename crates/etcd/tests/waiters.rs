//! Waiters on etcd, against a real single-node etcd started by the harness: a waiter that gives
//! up (cancelled or timed out) leaves no key, one that cannot look at the key ahead is
//! `Unavailable` rather than timed out, a release wakes only the next waiter, and cancelled
//! `try_acquire`s leave nothing behind.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::GetOptions;
use leasehold_core::{Authority, Error, Instant, LockKey, Released};
use leasehold_etcd::guarded::contender_key;
use leasehold_etcd::EtcdAuthority;
use leasehold_servers::EtcdServer;

mod common;

use common::{
    connect, cuts, eventually, key, keys_under, lease_alive, metric, raw_client, start, url,
    OrFail, Result, REQUEST_TIMEOUT,
};

/// A waiter that is cancelled (its future dropped) or that times out deletes its contender key:
/// listing the prefix shows only the holder's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_that_give_up_leave_no_key() -> Result {
    let server = start().await?;
    let raw = raw_client(&server).await?;
    let (a, b) = (connect(&url(&server)).await?, connect(&url(&server)).await?);
    let key = key("cancelled-waiter")?;
    let prefix = a.prefix(&key);
    let ttl = Duration::from_secs(1);
    let holder = a
        .try_acquire(&key, ttl)
        .await
        .or_fail("A holds the key")?
        .or_fail("A holds the key: a fresh key was held")?;
    let holder_key = contender_key(&holder)
        .or_fail("the holder's contender key")?
        .to_string();
    let b_session = {
        let g = b
            .try_acquire(&common::key("other")?, ttl)
            .await
            .or_fail("B's first grant")?
            .or_fail("B's first grant: a fresh key was held")?;
        let _ = b.release(&g).await.or_fail("B's first release")?;
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
        Ok(keys_under(&raw, &prefix).await? == vec![(holder_key.clone(), a.session_leases()[0])])
    })
    .await?;
    assert!(
        cleaned,
        "a cancelled waiter left a key: {:?}",
        keys_under(&raw, &prefix).await?
    );

    // Timed out: the key is gone by the time acquire returns.
    let timed_out = b.acquire(&key, ttl, Duration::from_millis(200)).await;
    assert!(
        matches!(timed_out, Err(Error::Timeout { .. })),
        "{timed_out:?}"
    );
    let left = keys_under(&raw, &prefix).await?;
    assert_eq!(left.len(), 1, "a timed-out waiter left a key: {left:?}");
    assert_ne!(left[0].1, b_session);

    let _ = a.release(&holder).await.or_fail("A releases")?;
    assert!(keys_under(&raw, &prefix).await?.is_empty());
    Ok(())
}

/// A waiter that cannot look at the key ahead for the whole of `max_wait` (the server died while
/// it waited) says so: `Unavailable`, nobody knows who holds the key, not `Timeout`, which says
/// someone does. Its looks are sent again until `max_wait` (a failover keeps its place), but
/// the last one's failure is what it returns. The TTL outlasts `max_wait`, so the session does
/// not end first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_cannot_look_until_max_wait_is_unavailable_not_timed_out() -> Result {
    let server = start().await?;
    let url = url(&server);
    let a = connect(&url).await.or_fail("A")?;
    let b = Arc::new(connect(&url).await.or_fail("B")?);
    let key = key("unreadable-wait")?;
    let ttl = Duration::from_secs(5);
    let max_wait = REQUEST_TIMEOUT * 2;
    let _held = a
        .try_acquire(&key, ttl)
        .await
        .or_fail("A's try")?
        .or_fail("the key was held")?;
    let waiter = {
        let (b, key) = (b.clone(), key.clone());
        tokio::spawn(async move { b.acquire(&key, ttl, max_wait).await })
    };
    let raw = raw_client(&server).await?;
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
            .or_fail("count the queue")?;
        if found.count() >= 2 {
            break;
        }
        if Instant::now() > queued_by {
            return Err(format!("B did not queue within {REQUEST_TIMEOUT:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let killed = {
        let server = server.clone();
        tokio::task::spawn_blocking(move || server.kill())
    };
    killed
        .await
        .or_fail("the harness task")?
        .or_fail("kill the server")?;
    // B returns at `max_wait`, later by at most the look in flight then.
    let outcome = tokio::time::timeout(max_wait + REQUEST_TIMEOUT * 2, waiter)
        .await
        .or_fail("B's acquire did not return")?
        .or_fail("B's task")?;
    match outcome {
        Err(Error::Unavailable { .. }) => Ok(()),
        other => Err(format!("B could not look at the key ahead, yet returned {other:?}").into()),
    }
}

/// Transactions the server has handled (every acquire, release, and a waiter's look at the key
/// ahead is one; renewals are reads, keep-alives are lease calls).
async fn txns(server: &EtcdServer) -> Result<u64> {
    metric(server, "grpc_server_handled_total", "grpc_method=\"Txn\"").await
}

/// Three waiters queue behind a holder, each on its own client. Each release
/// wakes only the next waiter: the server sees exactly two transactions per hand-off (the
/// release, and the next waiter's one look at the key ahead of it), and the waiters further
/// back stay asleep. A waiter watching the holder instead of its predecessor (a herd: every
/// release wakes every waiter) makes each of them look again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_only_the_next_waiter() -> Result {
    let server = start().await?;
    let raw = raw_client(&server).await?;
    let ttl = Duration::from_secs(10);
    let key = key("herd")?;
    let holder = connect(&url(&server)).await?;
    let prefix = holder.prefix(&key);
    let mut held = holder
        .try_acquire(&key, ttl)
        .await
        .or_fail("the holder's grant")?
        .or_fail("the holder's grant: a fresh key was held")?;
    let mut owner = holder.clone();
    let mut waiters = Vec::new();
    for i in 0..3 {
        let client = connect(&url(&server)).await?;
        let task = {
            let (client, key) = (client.clone(), key.clone());
            tokio::spawn(async move { client.acquire(&key, ttl, ttl).await })
        };
        let queued = eventually(ttl / 2, || async {
            Ok(keys_under(&raw, &prefix).await?.len() == i + 2)
        })
        .await?;
        assert!(queued, "waiter {i} did not queue");
        waiters.push((client, task));
    }
    // The holder's key is watched (loss is pushed), and so is each waiter's key ahead.
    let watching = eventually(ttl / 2, || async {
        Ok(metric(&server, "etcd_debugging_mvcc_watcher_total", "").await? >= 4)
    })
    .await?;
    assert!(watching, "the waiters never watched");
    // A settle time far above a loopback round trip: a herd would show within it.
    let settle = ttl / 20;
    for (i, (client, task)) in waiters.into_iter().enumerate() {
        tokio::time::sleep(settle).await;
        let before = txns(&server).await?;
        assert_eq!(
            owner
                .release(&held)
                .await
                .or_fail(format!("hand-off {i}: release"))?,
            Released::Released
        );
        let next = tokio::time::timeout(ttl / 2, task)
            .await
            .or_fail("the next waiter is woken")?
            .or_fail("the next waiter's task")?
            .or_fail("the next waiter gets the key")?;
        assert!(next.fence() > held.fence());
        tokio::time::sleep(settle).await;
        let spent = txns(&server).await? - before;
        assert_eq!(
            spent, 2,
            "hand-off {i}: {spent} transactions for one release and one waiter's look; the \
             others woke too"
        );
        (owner, held) = (client, next);
    }
    assert_eq!(
        owner.release(&held).await.or_fail("the last release")?,
        Released::Released
    );
    Ok(())
}

/// Tries `client.try_acquire` every 20 ms until it succeeds or `within` passes.
async fn try_within(
    client: &EtcdAuthority,
    key: &LockKey,
    ttl: Duration,
    within: Duration,
) -> Result<Option<leasehold_core::Grant>> {
    let start = Instant::now();
    loop {
        if let Some(g) = client.try_acquire(key, ttl).await.or_fail("try_acquire")? {
            return Ok(Some(g));
        }
        if start.elapsed() > within {
            return Ok(None);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `try_acquire` futures dropped at random points around one round trip, 200 times: another
/// client then gets the key within TTL + expiry slack + one request timeout, and no key of the
/// cancelling client's session is left under the prefix. (A cancelled try's key left booked as
/// pending on the kept-alive session lease would block the lock until the process exits.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_try_acquires_leave_nothing_behind() -> Result {
    let server = start().await?;
    let raw = raw_client(&server).await?;
    let (a, b) = (connect(&url(&server)).await?, connect(&url(&server)).await?);
    let key = key("cancelled-try")?;
    let prefix = a.prefix(&key);
    let ttl = Duration::from_secs(2);
    let sent = Instant::now();
    let g = a
        .try_acquire(&key, ttl)
        .await
        .or_fail("the measured acquisition")?
        .or_fail("the measured acquisition: a fresh key was held")?;
    let round_trip = sent.elapsed();
    let _ = a.release(&g).await.or_fail("the measured release")?;
    let session = a.session_leases()[0];
    let (mut cancelled, mut completed) = (0, 0);
    for cut in cuts(round_trip, 200) {
        match tokio::time::timeout(cut, a.try_acquire(&key, ttl)).await {
            Err(_) => cancelled += 1,
            Ok(Ok(Some(g))) => {
                completed += 1;
                let _ = a.release(&g).await.or_fail("release")?;
            }
            Ok(Ok(None)) => completed += 1,
            Ok(Err(e)) => return Err(format!("try_acquire failed: {e:?}").into()),
        }
    }
    eprintln!("{cancelled} cancelled, {completed} completed (round trip {round_trip:?})");
    assert!(cancelled > 0, "no try was cancelled");
    let within = ttl + a.capabilities().expiry_slack + Duration::from_secs(1);
    let got = try_within(&b, &key, ttl, within).await?;
    assert!(
        got.is_some(),
        "a cancelled try_acquire left the key blocked: {:?}",
        keys_under(&raw, &prefix).await?
    );
    let ours: Vec<_> = keys_under(&raw, &prefix)
        .await?
        .into_iter()
        .filter(|(_, lease)| *lease == session)
        .collect();
    assert!(ours.is_empty(), "keys of the cancelling session: {ours:?}");
    assert!(
        lease_alive(&raw, session).await?,
        "the session itself lives on"
    );
    let got = got.or_fail("B's grant")?;
    let _ = b.release(&got).await.or_fail("B releases")?;
    Ok(())
}
