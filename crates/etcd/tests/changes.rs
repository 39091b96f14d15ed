//! `wait_for_change` on etcd, against a real server: woken by another client's release, a change
//! between read and wait not missed, `max_wait` honoured, and no watch left behind by a dropped
//! wait.

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{Authority, Instant, Lease, LeaseOptions, LockKey, Released};
use leasehold_etcd::EtcdAuthority;

mod common;

use common::{cuts, eventually, metric, start, url, REQUEST_TIMEOUT};

/// `wait_for_change` is a watch on the lock's prefix: it sleeps while a renewed holder holds
/// the key, wakes soon after another client releases it (a fraction of the TTL, far below its
/// `max_wait` of ten TTLs), and sees a change made between the caller's read and the call
/// (replayed from the read's revision). With nothing happening it returns at `max_wait`, and
/// `Duration::MAX` waits for a change without panicking.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_for_change_wakes_on_a_release_from_another_client() {
    let server = start().await;
    let holder = Arc::new(EtcdAuthority::connect(&url(&server)).await.unwrap());
    let watcher = Arc::new(EtcdAuthority::connect(&url(&server)).await.unwrap());
    let ttl = Duration::from_secs(2);
    let soon = ttl / 4;
    let key = LockKey::new("wait/for-change").unwrap();
    let lease = Lease::try_acquire(holder.clone(), &key, ttl, LeaseOptions::default())
        .await
        .unwrap()
        .expect("a free key");
    assert!(watcher.inspect(&key).await.unwrap().held);
    let waiting = {
        let (watcher, key) = (watcher.clone(), key.clone());
        tokio::spawn(async move {
            watcher.wait_for_change(&key, ttl * 10).await.unwrap();
            Instant::now()
        })
    };
    // Renewals (reads and keep-alives) change no key: the waiter sleeps through them.
    tokio::time::sleep(ttl).await;
    assert!(!waiting.is_finished(), "woke while nothing changed");
    let released = Instant::now();
    let _ = lease.release().await.unwrap();
    let woke = tokio::time::timeout(ttl * 10, waiting)
        .await
        .expect("the wait ends")
        .unwrap();
    let took = woke.saturating_duration_since(released);
    assert!(
        took <= soon,
        "woke {took:?} after the release (bound {soon:?})"
    );

    // A change between a read and the wait is not missed.
    assert!(!watcher.inspect(&key).await.unwrap().held);
    let grant = holder.try_acquire(&key, ttl).await.unwrap().expect("free");
    let started = Instant::now();
    watcher.wait_for_change(&key, ttl * 10).await.unwrap();
    let took = started.elapsed();
    assert!(took <= soon, "missed the grant before the call: {took:?}");
    assert_eq!(holder.release(&grant).await.unwrap(), Released::Released);

    // Nothing happens: back at max_wait, not before, and not much later.
    assert!(!watcher.inspect(&key).await.unwrap().held);
    let max_wait = ttl / 4;
    let started = Instant::now();
    watcher.wait_for_change(&key, max_wait).await.unwrap();
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
    let grant = holder.try_acquire(&key, ttl).await.unwrap().expect("free");
    tokio::time::timeout(soon, waiting)
        .await
        .expect("woken by the grant")
        .unwrap()
        .unwrap();
    assert_eq!(holder.release(&grant).await.unwrap(), Released::Released);
}

/// `wait_for_change` futures dropped at random points around one round trip, and others that
/// ran out their `max_wait`, leave no watch at the server: its count of watchers returns to
/// what it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_waits_leave_no_watch_behind() {
    let server = start().await;
    let watcher = EtcdAuthority::connect(&url(&server)).await.unwrap();
    let key = LockKey::new("wait/dropped").unwrap();
    let watchers = || metric(&server, "etcd_debugging_mvcc_watcher_total", "");
    let before = watchers().await;
    let started = Instant::now();
    watcher.inspect(&key).await.unwrap();
    let round_trip = started.elapsed().max(Duration::from_micros(100));
    for cut in cuts(round_trip, 50) {
        let _ = tokio::time::timeout(cut, watcher.wait_for_change(&key, Duration::MAX)).await;
    }
    for _ in 0..5 {
        watcher
            .wait_for_change(&key, Duration::from_millis(50))
            .await
            .unwrap();
    }
    // Opened in the meantime: while a wait runs, the server counts its watch.
    let waiting = {
        let (watcher, key) = (watcher.clone(), key.clone());
        tokio::spawn(async move { watcher.wait_for_change(&key, Duration::MAX).await })
    };
    let counted = eventually(REQUEST_TIMEOUT, || async { watchers().await > before }).await;
    assert!(counted, "the server never counted the wait's watch");
    waiting.abort();
    let settled = eventually(REQUEST_TIMEOUT * 2, || async { watchers().await == before }).await;
    assert!(
        settled,
        "{} watchers at the server after the waits ended, {before} before",
        watchers().await
    );
}
