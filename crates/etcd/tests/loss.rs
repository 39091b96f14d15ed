//! Losing a lease on etcd, against a real single-node etcd started by the harness: a revoked
//! session loses every lease on it, the loss pushed to every grant within a second; a key deleted
//! behind our back loses that grant alone; grants start no task of their own, yet their watches
//! open, all on one stream per session that routes each deletion and outlives a restart; and a
//! grant that is not renewed ends at its TTL while the session lives.

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{
    Authority, Error, Grant, Instant, Lease, LeaseOptions, LossSignal, LostReason, Released,
};
use leasehold_etcd::guarded::contender_key;

mod common;

use common::{
    connect, eventually, key, keys_under, lease_alive, metric, raw_client, start, url, OrFail,
    Result, REQUEST_TIMEOUT,
};

/// When the session's lease is revoked, every lease on it is lost at its next renewal with
/// `SessionEnded`, and the next acquire starts a new session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_session_loses_every_lease_on_it() -> Result {
    let server = start().await?;
    let raw = raw_client(&server).await?;
    let a = Arc::new(connect(&url(&server)).await?);
    let ttl = Duration::from_secs(1);
    let mut held = Vec::new();
    for name in ["revoked/1", "revoked/2", "revoked/3"] {
        let key = key(name)?;
        held.push(
            Lease::try_acquire(a.clone(), &key, ttl, LeaseOptions::default())
                .await
                .or_fail(format!("the lease on {key}"))?
                .or_fail(format!("the lease on {key}: a fresh key was held"))?,
        );
    }
    let session = a.session_leases()[0];
    raw.lease_client()
        .revoke(session)
        .await
        .or_fail("revoke the session's lease")?;
    let revoked = Instant::now();
    for lease in &held {
        let reason = tokio::time::timeout(ttl, lease.lost())
            .await
            .or_fail("lost within a TTL of the revoke")?;
        assert!(
            matches!(reason, LostReason::SessionEnded),
            "{reason:?} after {:?}",
            revoked.elapsed()
        );
    }
    let key = key("revoked/1")?;
    let again = a
        .try_acquire(&key, ttl)
        .await
        .or_fail("acquire after the revoke")?
        .or_fail("free again")?;
    let fresh = a.session_leases();
    assert_eq!(fresh.len(), 1);
    assert_ne!(fresh[0], session, "a new session after the old one ended");
    let _ = a.release(&again).await.or_fail("release")?;
    Ok(())
}

/// A grant that is not renewed is withdrawn by its session at the end of its TTL (its key is
/// deleted), while the session's lease lives on for the other locks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unrenewed_grant_ends_at_its_ttl_though_the_session_lives() -> Result {
    let server = start().await?;
    let raw = raw_client(&server).await?;
    let a = Arc::new(connect(&url(&server)).await?);
    let ttl = Duration::from_secs(1);
    let kept = Lease::try_acquire(a.clone(), &key("kept")?, ttl, LeaseOptions::default())
        .await
        .or_fail("the kept lease")?
        .or_fail("the kept lease: a fresh key was held")?;
    let key = key("unrenewed")?;
    let sent = Instant::now();
    let grant = a
        .try_acquire(&key, ttl)
        .await
        .or_fail("the unrenewed grant")?
        .or_fail("the unrenewed grant: a fresh key was held")?;
    assert!(grant.deadline() <= sent + ttl);
    // The session deletes the key at (its own send instant, after `sent`) + TTL, with one
    // request bounded by the request timeout; we look every 20 ms, with one list request.
    let latest = ttl + REQUEST_TIMEOUT * 2 + Duration::from_millis(20);
    let gone = eventually(latest, || async {
        Ok(keys_under(&raw, &a.prefix(&key)).await?.is_empty())
    })
    .await?;
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
        .or_fail("the other lock on the session is unaffected")?;
    assert!(lease_alive(&raw, a.session_leases()[0]).await?);
    let _ = kept.release().await.or_fail("the kept lease released")?;
    Ok(())
}

/// Loss is pushed, not polled. The session's lease is revoked behind the holders'
/// backs (a raw etcd client, as an operator's `etcdctl lease revoke` would): at a TTL of 9 s,
/// where the next renewal or keep-alive is up to 3 s (TTL/3) away, every grant's loss signal
/// fires and every `Lease` is lost within TTL/9 = 1 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_session_lease_is_lost_within_a_second() -> Result {
    let server = start().await?;
    let raw = raw_client(&server).await?;
    let a = Arc::new(connect(&url(&server)).await?);
    let ttl = Duration::from_secs(9);
    let bound = ttl / 9;
    let lease = Lease::try_acquire(
        a.clone(),
        &key("pushed/lease")?,
        ttl,
        LeaseOptions::default(),
    )
    .await
    .or_fail("the lease")?
    .or_fail("the lease: a fresh key was held")?;
    let grant = a
        .try_acquire(&key("pushed/grant")?, ttl)
        .await
        .or_fail("the grant")?
        .or_fail("the grant: a fresh key was held")?;
    let signal = grant
        .loss_signal()
        .or_fail("etcd grants carry a loss signal")?;
    assert!(signal.fired().is_none());
    let session = a.session_leases()[0];
    // Past the first keep-alive and renewal, so neither is about to happen by chance.
    tokio::time::sleep(Duration::from_millis(300)).await;
    raw.lease_client()
        .revoke(session)
        .await
        .or_fail("revoke the session's lease")?;
    let revoked = Instant::now();
    let reason = tokio::time::timeout(bound, signal.wait())
        .await
        .or_fail(format!(
            "the grant's loss signal did not fire within {bound:?}"
        ))?;
    assert!(matches!(reason, LostReason::SessionEnded), "{reason:?}");
    let reason = tokio::time::timeout_at(revoked + bound, lease.lost())
        .await
        .or_fail(format!("lease.lost() did not resolve within {bound:?}"))?;
    assert!(matches!(reason, LostReason::SessionEnded), "{reason:?}");
    assert!(lease.ensure_valid().is_err());
    assert!(!grant.is_valid());
    eprintln!("lost {:?} after the revoke", revoked.elapsed());
    Ok(())
}

/// A holder's key deleted by an operator (`etcdctl del`) while its session lives on: that
/// grant's loss signal fires (Refused) within TTL/9 = 1 s at a TTL of 9 s; the other grant on the
/// same session stays valid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_deleted_behind_our_back_is_lost_within_a_second() -> Result {
    let server = start().await?;
    let raw = raw_client(&server).await?;
    let a = connect(&url(&server)).await?;
    let ttl = Duration::from_secs(9);
    let bound = ttl / 9;
    let deleted = a
        .try_acquire(&key("pushed/deleted")?, ttl)
        .await
        .or_fail("the grant to delete")?
        .or_fail("the grant to delete: a fresh key was held")?;
    let kept = a
        .try_acquire(&key("pushed/kept")?, ttl)
        .await
        .or_fail("the grant to keep")?
        .or_fail("the grant to keep: a fresh key was held")?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    raw.kv_client()
        .delete(contender_key(&deleted).or_fail("the contender key")?, None)
        .await
        .or_fail("delete the holder's key")?;
    let signal = deleted
        .loss_signal()
        .or_fail("etcd grants carry a loss signal")?;
    let reason = tokio::time::timeout(bound, signal.wait())
        .await
        .or_fail(format!("the loss signal did not fire within {bound:?}"))?;
    assert!(matches!(reason, LostReason::Refused), "{reason:?}");
    assert!(kept
        .loss_signal()
        .or_fail("etcd grants carry a loss signal")?
        .fired()
        .is_none());
    assert!(kept.is_valid());
    a.renew(&kept, ttl)
        .await
        .or_fail("the other grant is still held")?;
    assert_eq!(
        a.release(&kept).await.or_fail("release the kept grant")?,
        Released::Released
    );
    assert_eq!(
        a.release(&deleted)
            .await
            .or_fail("release the deleted grant")?,
        Released::AlreadyGone
    );
    Ok(())
}

/// A grant's key is watched (its loss pushed at once) from the session's own task, a twentieth
/// of the TTL (at most 250 ms) after the grant, instead of from a task and a timer per grant:
/// grants start no task, yet a key deleted behind our back before its watch opened is still
/// noticed (the watch replays from the key's creation), and every held key ends up watched.
/// Twenty grants in a row leave the runtime's task count where it was, give or take the tasks
/// of watches that opened meanwhile (at most three each: the watch, and the HTTP/2 stream's);
/// a task per grant would stay asleep for up to 250 ms each.
#[tokio::test]
async fn grants_start_no_task_of_their_own_and_their_watches_still_open() -> Result {
    let server = start().await?;
    let raw = raw_client(&server).await?;
    let a = connect(&url(&server)).await?;
    let ttl = Duration::from_secs(9);
    let delay = Duration::from_millis(250);
    let key = |i: usize| key(&format!("unspawned/{i}"));
    let watchers = || metric(&server, "etcd_debugging_mvcc_watcher_total", "");
    let no_watch = watchers().await?;
    // The session (and its task) exist from the first grant on.
    let first = a
        .try_acquire(&key(0)?, ttl)
        .await
        .or_fail("the first grant")?
        .or_fail("the first grant: a fresh key was held")?;
    let tasks = || {
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks()
    };
    let before = tasks();
    let mut grants = Vec::new();
    for i in 1..=20 {
        grants.push(
            a.try_acquire(&key(i)?, ttl)
                .await
                .or_fail(format!("grant {i}"))?
                .or_fail(format!("grant {i}: a fresh key was held"))?,
        );
    }
    let after = tasks();
    // Read after the count: at least as many watches were open when the tasks were counted.
    let opened = usize::try_from(watchers().await?.saturating_sub(no_watch))
        .or_fail("a count of watches")?;
    assert!(
        after <= before + 2 + 3 * opened,
        "20 grants started {} tasks ({before} alive before, {after} after, {opened} watches open)",
        after.saturating_sub(before)
    );
    // Deleted at once, before its watch opens. Seen when the watch opens: at most 250 ms after
    // the grant, plus a keep-alive in flight, the watch's creation and the look at the lease
    // (a request timeout each, at most).
    raw.kv_client()
        .delete(
            contender_key(&grants[0]).or_fail("the contender key")?,
            None,
        )
        .await
        .or_fail("delete the first key")?;
    let bound = delay + REQUEST_TIMEOUT * 3;
    let reason = tokio::time::timeout(
        bound,
        grants[0]
            .loss_signal()
            .or_fail("etcd grants carry a loss signal")?
            .wait(),
    )
    .await
    .or_fail(format!("the loss signal did not fire within {bound:?}"))?;
    assert!(matches!(reason, LostReason::Refused), "{reason:?}");
    // Every key still held gets its watch: the other 19 and the first.
    let all = eventually(delay + REQUEST_TIMEOUT * 3, || async {
        Ok(watchers().await? >= no_watch + 20)
    })
    .await?;
    assert!(
        all,
        "{} watches open at the server, {} expected",
        watchers().await?.saturating_sub(no_watch),
        20
    );
    for grant in grants.iter().skip(1).chain([&first]) {
        assert!(grant
            .loss_signal()
            .or_fail("etcd grants carry a loss signal")?
            .fired()
            .is_none());
        assert_eq!(
            a.release(grant).await.or_fail("release")?,
            Released::Released
        );
    }
    Ok(())
}

/// Every held key of a session is watched on one shared stream: with many grants held, a key
/// deleted behind our back loses exactly that grant. After etcd restarts (the stream breaks),
/// the watches open again and a key deleted at once is still lost within a few request
/// timeouts, while the other grants stay valid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shared_watch_stream_routes_each_deletion_and_survives_a_restart() -> Result {
    let server = start().await?;
    let a = connect(&url(&server)).await?;
    let ttl = Duration::from_secs(9);
    let mut grants = Vec::new();
    for i in 0..20 {
        grants.push(
            a.try_acquire(&key(&format!("shared/{i}"))?, ttl)
                .await
                .or_fail("a grant")?
                .or_fail("a fresh key was held")?,
        );
    }
    // Past the delay after which a grant's watch opens.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let delete = |grant: &Grant| -> Result<Vec<u8>> {
        Ok(contender_key(grant)
            .or_fail("the contender key")?
            .as_bytes()
            .to_vec())
    };
    fn signal(grant: &Grant) -> Result<&LossSignal> {
        grant
            .loss_signal()
            .or_fail("etcd grants carry a loss signal")
    }
    let raw = raw_client(&server).await?;
    raw.kv_client()
        .delete(delete(&grants[7])?, None)
        .await
        .or_fail("delete one holder's key")?;
    tokio::time::timeout(ttl / 9, signal(&grants[7])?.wait())
        .await
        .or_fail("the deleted grant's loss was not pushed within a second")?;

    let restarted = server.clone();
    tokio::task::spawn_blocking(move || restarted.restart())
        .await
        .or_fail("the harness task")?
        .or_fail("etcd must restart")?;
    let raw = raw_client(&server).await?;
    raw.kv_client()
        .delete(delete(&grants[13])?, None)
        .await
        .or_fail("delete another holder's key after the restart")?;
    let bound = REQUEST_TIMEOUT * 3 + Duration::from_secs(1);
    tokio::time::timeout(bound, signal(&grants[13])?.wait())
        .await
        .or_fail(format!(
            "after the restart, the deletion was not pushed within {bound:?}"
        ))?;
    for (i, grant) in grants.iter().enumerate() {
        if i == 7 || i == 13 {
            continue;
        }
        assert!(
            signal(grant)?.fired().is_none(),
            "grant {i} was lost though its key lives"
        );
        a.renew(grant, ttl)
            .await
            .or_fail(format!("grant {i} is still held"))?;
    }
    Ok(())
}
