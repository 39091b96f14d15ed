//! `wait_for_change` on etcd, against a real server: woken by another client's release, a change
//! between read and wait not missed, `max_wait` honoured, and no watch left behind by a dropped
//! wait.

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{Authority, Instant, Lease, LeaseOptions, Released};

mod common;

use common::{connect, cuts, eventually, key, metric, start, url, OrFail, Result, REQUEST_TIMEOUT};

/// `wait_for_change` is a watch on the lock's prefix: it sleeps while a renewed holder holds
/// the key, wakes soon after another client releases it (a fraction of the TTL, far below its
/// `max_wait` of ten TTLs), and sees a change made between the caller's read and the call
/// (replayed from the read's revision). With nothing happening it returns at `max_wait`, and
/// `Duration::MAX` waits for a change without panicking.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_for_change_wakes_on_a_release_from_another_client() -> Result {
    let server = start().await?;
    let holder = Arc::new(connect(&url(&server)).await?);
    let watcher = Arc::new(connect(&url(&server)).await?);
    let ttl = Duration::from_secs(2);
    let soon = ttl / 4;
    let key = key("wait/for-change")?;
    let lease = Lease::try_acquire(holder.clone(), &key, ttl, LeaseOptions::default())
        .await
        .or_fail("the holder's lease")?
        .or_fail("a free key")?;
    assert!(
        watcher
            .inspect(&key)
            .await
            .or_fail("the watcher reads")?
            .held
    );
    let waiting = {
        let (watcher, key) = (watcher.clone(), key.clone());
        tokio::spawn(async move {
            watcher.wait_for_change(&key, ttl * 10).await?;
            Ok::<_, leasehold_core::Error>(Instant::now())
        })
    };
    // Renewals (reads and keep-alives) change no key: the waiter sleeps through them.
    tokio::time::sleep(ttl).await;
    assert!(!waiting.is_finished(), "woke while nothing changed");
    let released = Instant::now();
    let _ = lease.release().await.or_fail("the holder releases")?;
    let woke = tokio::time::timeout(ttl * 10, waiting)
        .await
        .or_fail("the wait ends")?
        .or_fail("the waiting task")?
        .or_fail("wait_for_change")?;
    let took = woke.saturating_duration_since(released);
    assert!(
        took <= soon,
        "woke {took:?} after the release (bound {soon:?})"
    );

    // A change between a read and the wait is not missed.
    assert!(
        !watcher
            .inspect(&key)
            .await
            .or_fail("the watcher reads")?
            .held
    );
    let grant = holder
        .try_acquire(&key, ttl)
        .await
        .or_fail("the holder's grant")?
        .or_fail("free")?;
    let started = Instant::now();
    watcher
        .wait_for_change(&key, ttl * 10)
        .await
        .or_fail("wait_for_change after a change")?;
    let took = started.elapsed();
    assert!(took <= soon, "missed the grant before the call: {took:?}");
    assert_eq!(
        holder
            .release(&grant)
            .await
            .or_fail("the holder releases")?,
        Released::Released
    );

    // Nothing happens: back at max_wait, not before, and not much later.
    assert!(
        !watcher
            .inspect(&key)
            .await
            .or_fail("the watcher reads")?
            .held
    );
    let max_wait = ttl / 4;
    let started = Instant::now();
    watcher
        .wait_for_change(&key, max_wait)
        .await
        .or_fail("wait_for_change with nothing happening")?;
    let took = started.elapsed();
    assert!(
        took >= max_wait && took <= max_wait + REQUEST_TIMEOUT,
        "{took:?} for a wait of {max_wait:?}"
    );

    // No bound but a change: a proclaim by the holder wakes it.
    let waiting = {
        let (watcher, key) = (watcher.clone(), key.clone());
        tokio::spawn(async move { watcher.wait_for_change(&key, Duration::MAX).await })
    };
    tokio::time::sleep(ttl / 10).await;
    assert!(!waiting.is_finished(), "Duration::MAX returned at once");
    let grant = holder
        .try_acquire(&key, ttl)
        .await
        .or_fail("the holder's grant")?
        .or_fail("free")?;
    tokio::time::timeout(soon, waiting)
        .await
        .or_fail("woken by the grant")?
        .or_fail("the waiting task")?
        .or_fail("wait_for_change")?;
    assert_eq!(
        holder
            .release(&grant)
            .await
            .or_fail("the holder releases")?,
        Released::Released
    );
    Ok(())
}

/// `wait_for_change` futures dropped at random points around one round trip, and others that
/// ran out their `max_wait`, leave no watch at the server: its count of watchers returns to
/// what it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_waits_leave_no_watch_behind() -> Result {
    let server = start().await?;
    let watcher = connect(&url(&server)).await?;
    let key = key("wait/dropped")?;
    let watchers = || metric(&server, "etcd_debugging_mvcc_watcher_total", "");
    let before = watchers().await?;
    let started = Instant::now();
    watcher.inspect(&key).await.or_fail("the watcher reads")?;
    let round_trip = started.elapsed().max(Duration::from_micros(100));
    for cut in cuts(round_trip, 50) {
        let _ = tokio::time::timeout(cut, watcher.wait_for_change(&key, Duration::MAX)).await;
    }
    for _ in 0..5 {
        watcher
            .wait_for_change(&key, Duration::from_millis(50))
            .await
            .or_fail("a wait that runs out")?;
    }
    // Opened in the meantime: while a wait runs, the server counts its watch.
    let waiting = {
        let (watcher, key) = (watcher.clone(), key.clone());
        tokio::spawn(async move { watcher.wait_for_change(&key, Duration::MAX).await })
    };
    let counted = eventually(REQUEST_TIMEOUT, || async { Ok(watchers().await? > before) }).await?;
    assert!(counted, "the server never counted the wait's watch");
    waiting.abort();
    let settled = eventually(REQUEST_TIMEOUT * 2, || async {
        Ok(watchers().await? == before)
    })
    .await?;
    assert!(
        settled,
        "{} watchers at the server after the waits ended, {before} before",
        watchers().await?
    );
    Ok(())
}
