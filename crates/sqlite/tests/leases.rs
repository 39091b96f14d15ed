//! Leases on a SQLite file: fences across reopening the file, leases of an earlier boot, dropped
//! acquisitions, bad paths, clients opening a fresh file together, a pool of one, hand-offs
//! within one client, and batched renewal.

use std::sync::Arc;
use std::time::Duration;

use leasehold_conformance::kit::{ErrOrFail, OrFail, TestResult};
use leasehold_conformance::Failure;
use leasehold_core::{Authority, Error, Instant, Lease, LeaseOptions, LockKey};
use leasehold_sqlite::SqliteAuthority;
use rand::Rng;

mod common;

use common::{live_rows, now_ns, url};

/// Fences keep growing across release, and across closing every connection and opening the
/// file again (what is left after every process exited).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_grow_across_release_and_reopening_the_file() -> TestResult {
    let dir = tempfile::tempdir().or_fail("a temporary directory")?;
    let url = url(&dir.path().join("locks.db"));
    let key = LockKey::new("fences/reopen").or_fail("the key")?;
    let ttl = Duration::from_secs(5);
    let mut last = None;
    for _ in 0..3 {
        let a = SqliteAuthority::connect(&url).await.or_fail("connect")?;
        for _ in 0..3 {
            let g = a
                .try_acquire(&key, ttl)
                .await
                .or_fail("acquire")?
                .or_fail("the key is free")?;
            if let Some(before) = last {
                assert!(g.fence() > before, "{} after {before}", g.fence());
            }
            last = Some(g.fence());
            assert_eq!(
                a.release(&g).await.or_fail("release")?,
                leasehold_core::Released::Released
            );
        }
        a.close().await;
    }
    assert_eq!(last.or_fail("a fence")?.raw(), 9);
    Ok(())
}

/// A lease written in another boot counts as expired, however far ahead its expiry reads; one
/// of this boot still holds the key. The fence goes on from the old row's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_from_an_earlier_boot_is_expired() -> TestResult {
    let dir = tempfile::tempdir().or_fail("a temporary directory")?;
    let a = SqliteAuthority::connect(&url(&dir.path().join("locks.db")))
        .await
        .or_fail("connect")?;
    let ttl = Duration::from_secs(5);
    let insert = "INSERT INTO leasehold_leases (lock_key, owner, fence, boot_id, expires_ns) \
                  VALUES (?1, 'someone-else', 41, ?2, ?3)";
    sqlx::query(insert)
        .bind("boot/earlier")
        .bind("00000000-0000-0000-0000-000000000000")
        .bind(i64::MAX)
        .execute(a.pool())
        .await
        .or_fail("insert a row of an earlier boot")?;
    sqlx::query(insert)
        .bind("boot/this")
        .bind(a.boot_id())
        .bind(now_ns() + 3_600_000_000_000)
        .execute(a.pool())
        .await
        .or_fail("insert a row of this boot")?;
    let g = a
        .try_acquire(&LockKey::new("boot/earlier").or_fail("a key")?, ttl)
        .await
        .or_fail("acquire boot/earlier")?
        .or_fail("a lease of an earlier boot kept the key")?;
    assert_eq!(g.fence().raw(), 42);
    assert!(a
        .try_acquire(&LockKey::new("boot/this").or_fail("a key")?, ttl)
        .await
        .or_fail("try boot/this")?
        .is_none());
    // The earlier boot's lease cannot be renewed or released by its old owner either: the row
    // is ours now.
    let _ = a.release(&g).await.or_fail("release")?;
    Ok(())
}

/// Hundreds of try_acquire and acquire futures dropped at random moments (before, during and
/// after the step that takes the key), with and without a holder: with a TTL of a minute,
/// the key is free again at once afterwards, and no live row is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_acquisitions_leave_nothing_blocking() -> TestResult {
    let dir = tempfile::tempdir().or_fail("a temporary directory")?;
    let path = dir.path().join("locks.db");
    let a = SqliteAuthority::connect(&url(&path))
        .await
        .or_fail("connect A")?;
    let holder = SqliteAuthority::connect(&url(&path))
        .await
        .or_fail("connect the holder")?;
    let key = LockKey::new("cancel/dropped").or_fail("the key")?;
    let ttl = Duration::from_secs(60);
    let mut cut_short = 0;
    // Until enough futures were cut short: how many a random cut of 0-3 ms catches depends on
    // how fast the machine answers, so the count, not the rounds, is what is fixed.
    let mut round = 0;
    while cut_short < 100 && round < 4000 {
        round += 1;
        let held = if round % 3 == 0 {
            holder
                .try_acquire(&key, ttl)
                .await
                .or_fail("the holder acquires")?
        } else {
            None
        };
        let cut = Duration::from_micros(rand::rng().random_range(0..=3000));
        let done = if round % 2 == 0 {
            match tokio::time::timeout(cut, a.try_acquire(&key, ttl)).await {
                Ok(tried) => Ok(tried.or_fail("try_acquire")?),
                Err(elapsed) => Err(elapsed),
            }
        } else {
            match tokio::time::timeout(cut, a.acquire(&key, ttl, Duration::from_millis(2))).await {
                Ok(Ok(g)) => Ok(Some(g)),
                Ok(Err(Error::Timeout { .. })) => Ok(None),
                Ok(Err(e)) => return Err(Failure::new(format!("acquire: {e}"))),
                Err(elapsed) => Err(elapsed),
            }
        };
        match done {
            Ok(Some(g)) => {
                let _ = a.release(&g).await.or_fail("release")?;
            }
            Ok(None) => {}
            Err(_) => cut_short += 1,
        }
        if let Some(g) = held {
            let _ = holder.release(&g).await.or_fail("the holder releases")?;
        }
    }
    assert!(cut_short > 50, "only {cut_short} futures were cut short");
    // Give-backs run in the background: the key must be free within a moment, far below the TTL.
    let other = SqliteAuthority::connect(&url(&path))
        .await
        .or_fail("connect another client")?;
    let start = Instant::now();
    let g = loop {
        if let Some(g) = other.try_acquire(&key, ttl).await.or_fail("try the key")? {
            break g;
        }
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "a dropped acquisition left the key held"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let _ = other.release(&g).await.or_fail("release")?;
    let left = live_rows(&path, key.as_str())
        .await
        .or_fail("list the live rows")?;
    assert!(left.is_empty(), "{left:?}");
    Ok(())
}

/// Typed errors before anything is opened: a missing directory is not created, a bad URL says
/// what is wrong.
#[tokio::test]
async fn bad_paths_and_urls_are_refused() -> TestResult {
    let dir = tempfile::tempdir().or_fail("a temporary directory")?;
    let missing = dir.path().join("no/such/dir/locks.db");
    let err = SqliteAuthority::connect(&url(&missing))
        .await
        .err_or_fail("connect to a missing directory")?;
    assert!(matches!(err, Error::InvalidConfig { .. }), "{err}");
    assert!(!missing.parent().or_fail("the parent")?.exists());
    let err = SqliteAuthority::connect("sqlite://:memory:")
        .await
        .err_or_fail("connect to :memory:")?;
    assert!(matches!(err, Error::InvalidUrl { .. }), "{err}");
    // A file that is not a database: a permanent backend error, not "unavailable".
    let junk = dir.path().join("junk.db");
    std::fs::write(&junk, vec![b'x'; 4096]).or_fail("write the junk file")?;
    let err = SqliteAuthority::connect(&url(&junk))
        .await
        .err_or_fail("connect to a junk file")?;
    assert!(!err.is_retryable(), "{err}");
    Ok(())
}

/// Clients that open a fresh file at the same moment (each switching it to WAL mode, which
/// takes an exclusive lock the busy timeout does not wait for) all connect, and share one table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_opening_a_fresh_file_together_all_connect() -> TestResult {
    for _ in 0..5 {
        let dir = tempfile::tempdir().or_fail("a temporary directory")?;
        let url = url(&dir.path().join("fresh.db"));
        let opening: Vec<_> = (0..8)
            .map(|_| {
                let url = url.clone();
                tokio::spawn(async move { SqliteAuthority::connect(&url).await })
            })
            .collect();
        let key = LockKey::new("fresh/one").or_fail("the key")?;
        let mut granted = 0;
        for o in opening {
            let a = o.await.or_fail("the connecting task")?.or_fail("connect")?;
            if a.try_acquire(&key, Duration::from_secs(30))
                .await
                .or_fail("try the key")?
                .is_some()
            {
                granted += 1;
            }
        }
        assert_eq!(granted, 1);
    }
    Ok(())
}

/// With one connection in the pool, a lease keeps renewing while another task of the same
/// client waits for its key: a waiter never keeps the connection that renewals need.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_size_one_keeps_leases_while_waiting() -> TestResult {
    let dir = tempfile::tempdir().or_fail("a temporary directory")?;
    let url = format!(
        "sqlite://{}?pool_size=1&timeout_ms=1000",
        dir.path().join("locks.db").display()
    );
    let a = Arc::new(SqliteAuthority::connect(&url).await.or_fail("connect")?);
    let key = LockKey::new("pool/one").or_fail("the key")?;
    let ttl = Duration::from_millis(600);
    let lease = Lease::try_acquire(a.clone(), &key, ttl, LeaseOptions::default())
        .await
        .or_fail("the lease")?
        .or_fail("the key is free")?;
    let waiting = a.acquire(&key, ttl, ttl * 4).await;
    assert!(matches!(waiting, Err(Error::Timeout { .. })), "{waiting:?}");
    lease.ensure_valid().or_fail("the lease is still valid")?;
    let fence = lease.fence();
    let _ = lease.release().await.or_fail("release the lease")?;
    let g = a.acquire(&key, ttl, ttl).await.or_fail("acquire again")?;
    assert!(g.fence() > fence);
    let _ = a.release(&g).await.or_fail("release")?;
    Ok(())
}

/// Tasks sharing a client hand a key on at once when it is released through that client,
/// faster than polling would notice (a waiter that has waited a while polls every 25 to 50 ms).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_waiters_of_the_same_client_at_once() -> TestResult {
    let dir = tempfile::tempdir().or_fail("a temporary directory")?;
    let a = Arc::new(
        SqliteAuthority::connect(&url(&dir.path().join("locks.db")))
            .await
            .or_fail("connect")?,
    );
    let key = LockKey::new("wake/same-client").or_fail("the key")?;
    let ttl = Duration::from_secs(10);
    let mut handoffs = Vec::new();
    for _ in 0..5 {
        let held = a
            .try_acquire(&key, ttl)
            .await
            .or_fail("the holder acquires")?
            .or_fail("the key is free")?;
        let waiter = {
            let (a, key) = (a.clone(), key.clone());
            tokio::spawn(async move {
                let g = a.acquire(&key, ttl, Duration::from_secs(10)).await;
                (g, Instant::now())
            })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        let released = Instant::now();
        let _ = a.release(&held).await.or_fail("the holder releases")?;
        let (g, at) = waiter.await.or_fail("the waiting task")?;
        handoffs.push(at - released);
        let _ = a
            .release(&g.or_fail("the waiter acquires")?)
            .await
            .or_fail("the waiter releases")?;
    }
    handoffs.sort();
    assert!(
        handoffs[2] < Duration::from_millis(20),
        "hand-offs within one client: {handoffs:?}"
    );
    Ok(())
}

/// One transaction renews a batch. A grant released behind its back and a stale grant
/// (its key since taken by another client) are refused, each alone; the others in the same batch
/// are renewed to their full TTL.
#[tokio::test]
async fn renew_many_renews_a_batch_and_refuses_only_what_is_not_ours() -> TestResult {
    let dir = tempfile::tempdir().or_fail("a temporary directory")?;
    let path = dir.path().join("locks.db");
    let (a, b) = (
        SqliteAuthority::connect(&url(&path))
            .await
            .or_fail("connect A")?,
        SqliteAuthority::connect(&url(&path))
            .await
            .or_fail("connect B")?,
    );
    assert!(a.capabilities().batch_renewal);
    let short = Duration::from_millis(200);
    let long = Duration::from_secs(20);
    let mut grants = Vec::new();
    for i in 0..5 {
        let key = LockKey::new(format!("batch/{i}")).or_fail("a key")?;
        let ttl = if i == 3 { short } else { long };
        grants.push(
            a.try_acquire(&key, ttl)
                .await
                .or_fail("acquire")?
                .or_fail("the key is free")?,
        );
    }
    let _ = a.release(&grants[1]).await.or_fail("release grant 1")?;
    tokio::time::sleep(short + Duration::from_millis(100)).await;
    let taken = b
        .try_acquire(grants[3].key(), long)
        .await
        .or_fail("B acquires grant 3's key")?
        .or_fail("grant 3 ran out")?;
    let results = a.renew_many(&grants).await;
    assert_eq!(results.len(), 5);
    for (i, result) in results.iter().enumerate() {
        if i == 1 || i == 3 {
            assert!(
                matches!(result, Err(Error::LeaseLost { .. })),
                "grant {i}: {result:?}"
            );
        } else {
            let deadline = *result.as_ref().or_fail(format!("renew grant {i}"))?;
            assert!(deadline > Instant::now() + long / 2, "grant {i}");
            let seen = b
                .inspect(grants[i].key())
                .await
                .or_fail("inspect a renewed key")?;
            assert!(
                seen.held
                    && seen
                        .remaining
                        .is_some_and(|r| r > long - Duration::from_secs(2)),
                "grant {i}: {seen:?}"
            );
        }
    }
    let seen = a.inspect(taken.key()).await.or_fail("inspect")?;
    assert_eq!(seen.fence, Some(taken.fence()));
    Ok(())
}
