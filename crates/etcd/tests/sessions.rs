//! etcd sessions, against a real single-node etcd started by the harness: one session lease
//! carries every lock of a TTL, and sessions end when idle, dropped or closed, even by a close or
//! a session grant that was itself cut short, leaving no lease nobody knows. What the end of a
//! session, or of one grant's key, does to the grants on it has a test file of its own.

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{Authority, Instant, Lease, LeaseOptions, Released};
use leasehold_etcd::guarded::contender_key;

mod common;

use common::{
    connect, cuts, eventually, key, keys_under, lease_alive, raw_client, start, url, OrFail,
    Result, REQUEST_TIMEOUT,
};

/// Ten locks through one authority: one session lease, every contender key on it; they stay
/// held past three TTLs (the single keep-alive stream plus per-grant checks); a second
/// acquisition of a held key through the same session waits behind the first instead of sharing
/// its key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_session_lease_for_many_locks() -> Result {
    let server = start().await?;
    let raw = raw_client(&server).await?;
    let a = Arc::new(connect(&url(&server)).await?);
    let ttl = Duration::from_secs(1);
    let mut leases = Vec::new();
    for i in 0..10 {
        let key = key(&format!("many/{i}"))?;
        let lease = Lease::try_acquire(a.clone(), &key, ttl, LeaseOptions::default())
            .await
            .or_fail(format!("the lease on {key}"))?
            .or_fail("a free key")?;
        leases.push(lease);
    }
    let sessions = a.session_leases();
    assert_eq!(sessions.len(), 1, "one session for one TTL: {sessions:?}");
    let session = sessions[0];
    for lease in &leases {
        let name = contender_key(lease.grant()).or_fail("the lease's contender key")?;
        assert_eq!(name, format!("{}{session:x}", a.prefix(lease.key())));
        let on = keys_under(&raw, name).await?;
        assert_eq!(on, vec![(name.to_string(), session)]);
    }
    // Besides the session's lease, the server has none of ours (the TTL probe was revoked).
    let only_session = eventually(Duration::from_secs(2), || async {
        let listed = raw
            .lease_client()
            .leases()
            .await
            .or_fail("list the leases")?;
        Ok(listed.leases().iter().map(|l| l.id()).collect::<Vec<_>>() == vec![session])
    })
    .await?;
    assert!(
        only_session,
        "the server holds leases other than the session's"
    );

    tokio::time::sleep(ttl * 3).await;
    for lease in &leases {
        lease.ensure_valid().or_fail("renewed past three TTLs")?;
    }
    assert_eq!(a.session_leases(), vec![session], "still the same session");

    // A second contender through the same session queues behind the first.
    let key = leases[0].key().clone();
    let waiter = {
        let (a, key) = (a.clone(), key.clone());
        tokio::spawn(async move { a.acquire(&key, ttl, Duration::from_secs(5)).await })
    };
    let queued = eventually(Duration::from_secs(2), || async {
        Ok(keys_under(&raw, &a.prefix(&key)).await?.len() == 2)
    })
    .await?;
    assert!(queued, "the second contender did not queue");
    let listed = keys_under(&raw, &a.prefix(&key)).await?;
    assert_eq!(listed[1].0, format!("{}{session:x}_1", a.prefix(&key)));
    assert!(!waiter.is_finished(), "two holders through one session");
    let first_fence = leases[0].fence();
    let first = leases.remove(0);
    assert_eq!(
        first.release().await.or_fail("the first lease released")?,
        Released::Released
    );
    let second = waiter
        .await
        .or_fail("the waiter's task")?
        .or_fail("the waiter gets the key")?;
    assert!(second.fence() > first_fence);
    let _ = a.release(&second).await.or_fail("the waiter releases")?;
    Ok(())
}

/// An idle session revokes its lease after `session_idle_ms`; dropping the authority revokes
/// the leases of its sessions at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_dropped_sessions_revoke_their_leases() -> Result {
    let server = start().await?;
    let raw = raw_client(&server).await?;
    let ttl = Duration::from_secs(5);
    let key = key("idle")?;

    let idle = connect(&format!("{}&session_idle_ms=300", url(&server))).await?;
    let g = idle
        .try_acquire(&key, ttl)
        .await
        .or_fail("acquire on the idle client")?
        .or_fail("acquire on the idle client: a fresh key was held")?;
    let session = idle.session_leases()[0];
    let _ = idle
        .release(&g)
        .await
        .or_fail("release on the idle client")?;
    assert!(
        lease_alive(&raw, session).await?,
        "not idle long enough yet"
    );
    let closed = eventually(Duration::from_secs(2), || async {
        Ok(!lease_alive(&raw, session).await?)
    })
    .await?;
    assert!(closed, "the idle session's lease was not revoked");
    assert!(idle.session_leases().is_empty());

    let dropped = connect(&url(&server)).await?;
    let g = dropped
        .try_acquire(&key, ttl)
        .await
        .or_fail("acquire on the dropped client")?
        .or_fail("acquire on the dropped client: the released key was held")?;
    let session = dropped.session_leases()[0];
    let holder = contender_key(&g).or_fail("the contender key")?.to_string();
    drop(g);
    drop(dropped);
    let revoked = eventually(Duration::from_secs(1), || async {
        Ok(!lease_alive(&raw, session).await?)
    })
    .await?;
    assert!(
        revoked,
        "dropping the authority left its session's lease alive"
    );
    assert!(keys_under(&raw, &holder).await?.is_empty());
    Ok(())
}

/// `close()` revokes every session lease before it returns (nothing outlives a process that
/// closes and exits), fires the loss signal of every grant still held, and leaves the authority
/// usable with a new session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_revokes_every_session_lease_before_returning() -> Result {
    let server = start().await?;
    let raw = raw_client(&server).await?;
    let a = connect(&url(&server)).await?;
    let key = key("closed")?;
    let held = a
        .try_acquire(&key, Duration::from_secs(2))
        .await
        .or_fail("the first grant")?
        .or_fail("the first grant: a fresh key was held")?;
    let other = a
        .try_acquire(&common::key("closed/other")?, Duration::from_secs(3))
        .await
        .or_fail("the other grant")?
        .or_fail("the other grant: a fresh key was held")?;
    assert_eq!(a.session_leases().len(), 2, "one session per TTL");
    a.close().await.or_fail("close")?;
    let left = raw
        .lease_client()
        .leases()
        .await
        .or_fail("list the leases")?;
    assert!(left.leases().is_empty(), "leases left: {:?}", left.leases());
    assert!(keys_under(&raw, &a.prefix(&key)).await?.is_empty());
    assert!(held
        .loss_signal()
        .or_fail("etcd grants carry a loss signal")?
        .fired()
        .is_some());
    assert!(other
        .loss_signal()
        .or_fail("etcd grants carry a loss signal")?
        .fired()
        .is_some());
    let again = a
        .try_acquire(&key, Duration::from_secs(2))
        .await
        .or_fail("acquire after close")?;
    assert!(again.is_some(), "usable after close");
    a.close().await.or_fail("close again")?;
    Ok(())
}

/// The first acquire of a fresh authority grants its session's lease. Dropped while that grant
/// is in flight (30 fresh authorities, each cut at a random point around one round trip), it
/// must not leave a lease that nobody knows to live out its TTL at the server: the grant
/// completes in the background and the session is registered (reused by the next acquire, or
/// revoked when idle or closed), so every lease at the server is some client's session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_session_grants_leave_no_unknown_lease() -> Result {
    let server = start().await?;
    let raw = raw_client(&server).await?;
    let ttl = Duration::from_secs(5);
    let key = key("cancelled-grant")?;
    let probe = connect(&url(&server)).await?;
    let sent = Instant::now();
    let g = probe
        .try_acquire(&key, ttl)
        .await
        .or_fail("the probe's acquisition")?
        .or_fail("the probe's acquisition: a fresh key was held")?;
    let round_trip = sent.elapsed();
    let _ = probe.release(&g).await.or_fail("the probe's release")?;
    probe.close().await.or_fail("close the probe")?;
    // Each attempt on a fresh authority, so that each starts with the grant of its session.
    let mut cancelled = 0;
    let mut clients = Vec::new();
    for cut in cuts(round_trip / 2, 30) {
        let a = connect(&url(&server)).await?;
        match tokio::time::timeout(cut, a.try_acquire(&key, ttl)).await {
            Ok(result) => {
                if let Some(g) = result.or_fail("an acquisition that was not cut")? {
                    let _ = a.release(&g).await.or_fail("release")?;
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
    let leases_at_the_server = || async {
        raw.lease_client()
            .leases()
            .await
            .or_fail("list the leases")
            .map(|l| l.leases().len())
    };
    let settled = eventually(REQUEST_TIMEOUT, || async {
        let known: usize = clients.iter().map(|a| a.session_leases().len()).sum();
        Ok(leases_at_the_server().await? <= known)
    })
    .await?;
    let left = leases_at_the_server().await?;
    let known: usize = clients.iter().map(|a| a.session_leases().len()).sum();
    assert!(
        settled,
        "{left} leases at the server, {known} of them sessions: the others were granted for \
         dropped acquires and nobody knows them"
    );
    Ok(())
}

/// `close()` dropped at its first await (a caller's timeout) still revokes every session lease
/// (two here, one per TTL), within one request timeout, not at the end of their TTLs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_close_still_revokes() -> Result {
    let server = start().await?;
    let raw = raw_client(&server).await?;
    let a = connect(&url(&server)).await?;
    let mut grants = Vec::new();
    for (name, ttl) in [("dropped-close/5", 5), ("dropped-close/6", 6)] {
        let ttl = Duration::from_secs(ttl);
        let key = key(name)?;
        grants.push(
            a.try_acquire(&key, ttl)
                .await
                .or_fail(format!("acquire {key}"))?
                .or_fail(format!("acquire {key}: a fresh key was held"))?,
        );
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
            if lease_alive(&raw, *session).await? {
                return Ok(false);
            }
        }
        Ok(true)
    })
    .await?;
    assert!(revoked, "a session lease outlived a dropped close");
    for g in &grants {
        assert!(g
            .loss_signal()
            .or_fail("etcd grants carry a loss signal")?
            .fired()
            .is_some());
    }
    Ok(())
}
