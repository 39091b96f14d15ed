//! How PostgreSQL's notifications reach waiters: `wait_for_change` woken by the key's proclaim
//! and release, a release that notifies only when a waiter marked the key, an acquire that need
//! not wait opening no listening connection, and a release nobody announced not slept through.

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{Authority, Instant, LockKey};

mod common;

use common::{connect, key, start_server, url, OrFail, Result};

/// `wait_for_change` is woken by the key's proclaim and release through another client (by
/// NOTIFY, long before its bound), not by another key's; it returns at `max_wait` when nothing
/// happens, and `Duration::MAX` waits without panicking and can be dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_for_change_is_woken_by_proclaim_and_release() -> Result {
    let server = start_server().await?;
    let url = url(&server);
    let holder = connect(&url).await?;
    holder.migrate().await.or_fail("migrate")?;
    let observer = Arc::new(connect(&url).await?);
    let key = key("wait/changes")?;
    let other = common::key("wait/other")?;
    let ttl = Duration::from_secs(30);
    let long = Duration::from_secs(20);

    // Nothing happens: back at max_wait. This also starts the observer's listener.
    let started = Instant::now();
    observer
        .wait_for_change(&key, Duration::from_millis(300))
        .await
        .or_fail("a wait with nothing happening")?;
    assert!(started.elapsed() < Duration::from_secs(2));
    tokio::time::sleep(Duration::from_millis(500)).await;

    let g = holder
        .try_acquire(&key, ttl)
        .await
        .or_fail("acquire the key")?
        .or_fail("acquire the key: a fresh key was held")?;
    let elsewhere = holder
        .try_acquire(&other, ttl)
        .await
        .or_fail("acquire the other key")?
        .or_fail("acquire the other key: a fresh key was held")?;
    let waiting = |key: LockKey| {
        let observer = observer.clone();
        tokio::spawn(async move {
            observer.wait_for_change(&key, long).await?;
            Ok::<_, leasehold_core::Error>(Instant::now())
        })
    };

    // Another key's proclaim does not wake it; this key's does.
    let w = waiting(key.clone());
    tokio::time::sleep(Duration::from_millis(300)).await;
    holder
        .proclaim(&elsewhere, b"elsewhere")
        .await
        .or_fail("proclaim on the other key")?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!w.is_finished(), "woken by another key's proclaim");
    let sent = Instant::now();
    holder.proclaim(&g, b"here").await.or_fail("proclaim")?;
    let woken = tokio::time::timeout(Duration::from_secs(5), w)
        .await
        .or_fail("a proclaim wakes wait_for_change")?
        .or_fail("the waiting task")?
        .or_fail("wait_for_change")?;
    assert!(woken - sent < Duration::from_secs(2), "{:?}", woken - sent);

    // A release wakes it.
    let w = waiting(key.clone());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!w.is_finished(), "woken with nothing changed");
    let sent = Instant::now();
    let _ = holder.release(&g).await.or_fail("release")?;
    let woken = tokio::time::timeout(Duration::from_secs(5), w)
        .await
        .or_fail("a release wakes wait_for_change")?
        .or_fail("the waiting task")?
        .or_fail("wait_for_change")?;
    assert!(woken - sent < Duration::from_secs(2), "{:?}", woken - sent);

    // No bound: no panic, still waiting, and dropping it is fine. (Read first, as callers do:
    // a wait after a change this client has not read returns at once.)
    assert!(
        !observer
            .inspect(&key)
            .await
            .or_fail("inspect the released key")?
            .held
    );
    let forever = tokio::time::timeout(
        Duration::from_millis(300),
        observer.wait_for_change(&key, Duration::MAX),
    )
    .await;
    assert!(forever.is_err(), "returned with nothing changed");
    let _ = holder
        .release(&elsewhere)
        .await
        .or_fail("release the other key")?;
    Ok(())
}

/// A release announces itself (NOTIFY, which PostgreSQL delivers by signalling every
/// listening server process) only when a waiter marked the key, so an uncontended acquire and
/// release costs the bare pair. Nobody waits: neither form of acquire nor the release sends a
/// notification, even while another client listens. A waiter in another client marks the key
/// and the release wakes it by notification, far sooner than its fallback timer (the holder's
/// 30 s TTL) could.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_notifies_only_when_somebody_waits() -> Result {
    let server = start_server().await?;
    let url = url(&server);
    let a = connect(&url).await?;
    a.migrate().await.or_fail("migrate")?;
    let b = Arc::new(connect(&url).await?);
    let mut heard = sqlx::postgres::PgListener::connect(&server.url())
        .await
        .or_fail("a listener of our own")?;
    heard
        .listen("leasehold_release")
        .await
        .or_fail("LISTEN leasehold_release")?;
    let key = key("notify/only-when-waited")?;
    let ttl = Duration::from_secs(30);
    // b's listener is up too: a release with nobody waiting has nobody to wake either way.
    b.wait_for_change(
        &common::key("notify/elsewhere")?,
        Duration::from_millis(100),
    )
    .await
    .or_fail("B's first wait")?;

    let waited = a
        .acquire(&key, ttl, Duration::from_secs(1))
        .await
        .or_fail("the waiting form of acquire")?;
    let _ = a.release(&waited).await.or_fail("release")?;
    let tried = a
        .try_acquire(&key, ttl)
        .await
        .or_fail("try_acquire")?
        .or_fail("try_acquire: the released key was held")?;
    let _ = a.release(&tried).await.or_fail("release")?;
    // NOTIFY is delivered at commit, before the release returns: 500 ms is ample.
    let none = tokio::time::timeout(Duration::from_millis(500), heard.recv()).await;
    assert!(
        none.is_err(),
        "a release nobody waited for notified: {none:?}"
    );

    let held = a
        .try_acquire(&key, ttl)
        .await
        .or_fail("A holds the key")?
        .or_fail("A holds the key: the released key was held")?;
    let waiter = {
        let (b, key) = (b.clone(), key.clone());
        tokio::spawn(async move {
            let grant = b.acquire(&key, ttl, Duration::from_secs(20)).await?;
            Ok::<_, leasehold_core::Error>((Instant::now(), grant))
        })
    };
    // The waiter's waiting form marks the key (after its first attempt, the plain upsert).
    wait_for_mark(a.pool(), &key, Duration::from_secs(10)).await?;
    let sent = Instant::now();
    let _ = a.release(&held).await.or_fail("A releases")?;
    let note = tokio::time::timeout(Duration::from_secs(5), heard.recv())
        .await
        .or_fail("a release somebody waits for notifies")?
        .or_fail("the notification")?;
    assert_eq!(note.payload(), format!("leasehold_leases {}", key.as_str()));
    let (took, grant) = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .or_fail("the waiter holds long before its timer")?
        .or_fail("the waiter's task")?
        .or_fail("the waiter")?;
    assert!(took - sent < Duration::from_secs(5), "{:?}", took - sent);
    assert!(grant.fence() > held.fence());
    let _ = b.release(&grant).await.or_fail("B releases")?;
    Ok(())
}

/// Waits (at most `within`) until a waiter's mark on `key` is in the future.
async fn wait_for_mark(pool: &sqlx::PgPool, key: &LockKey, within: Duration) -> Result {
    let started = Instant::now();
    loop {
        let mark: Option<bool> = sqlx::query_scalar(
            "SELECT waited_until > statement_timestamp() FROM leasehold_leases WHERE lock_key = $1",
        )
        .bind(key.as_str())
        .fetch_optional(pool)
        .await
        .or_fail("read the waiter's mark")?
        .flatten();
        if mark == Some(true) {
            return Ok(());
        }
        assert!(
            started.elapsed() < within,
            "the waiter never marked the key"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Backends whose `application_name` is like `app` and whose last statement was `LISTEN`, or
/// the listener's periodic check that it still answers (every `listen_check_ms`).
async fn listening(pool: &sqlx::PgPool, app: &str) -> Result<i64> {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE $1 \
         AND (query LIKE 'LISTEN%' OR query = 'SELECT ''leasehold listener''')",
    )
    .bind(app)
    .fetch_one(pool)
    .await
    .or_fail(format!("count the listening connections of {app}"))
}

/// An `acquire` that finds the key free takes it with the plain upsert, as `try_acquire` does,
/// and opens no listening connection: the waiting form (which marks a held key) and LISTEN are
/// for a key that is held. With them, an uncontended `acquire()` pair cost 1.10x
/// `try_acquire()`'s on one core, and every listening server process is signalled
/// by every notification in the database. An authority that has to wait listens (the control:
/// it started after the other's acquires, so the other's listener, had one been started,
/// would be up first).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_that_need_not_wait_does_not_listen() -> Result {
    let server = start_server().await?;
    let with_app = |app: &str| format!("{}&application_name={app}", url(&server));
    let uncontended = connect(&with_app("uncontended")).await?;
    uncontended.migrate().await.or_fail("migrate")?;
    let key = key("unheard/free")?;
    for _ in 0..3 {
        let grant = uncontended
            .acquire(&key, Duration::from_secs(5), Duration::from_secs(1))
            .await
            .or_fail("an uncontended acquire")?;
        let _ = uncontended
            .release(&grant)
            .await
            .or_fail("an uncontended release")?;
    }

    let waiting = Arc::new(connect(&with_app("waiting")).await?);
    let held = uncontended
        .try_acquire(&key, Duration::from_secs(5))
        .await
        .or_fail("hold the key")?
        .or_fail("hold the key: the released key was held")?;
    let waiter = {
        let (waiting, key) = (waiting.clone(), key.clone());
        tokio::spawn(async move {
            waiting
                .acquire(&key, Duration::from_secs(5), Duration::from_secs(10))
                .await
        })
    };
    let up = Instant::now();
    while listening(uncontended.pool(), "waiting").await? == 0 {
        assert!(
            up.elapsed() < Duration::from_secs(5),
            "the waiter never listened"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        listening(uncontended.pool(), "uncontended").await?,
        0,
        "an acquire that found its key free started a listening connection"
    );
    let _ = uncontended.release(&held).await.or_fail("release")?;
    let grant = waiter
        .await
        .or_fail("the waiter's task")?
        .or_fail("the waiter")?;
    assert!(grant.fence() > held.fence());
    let _ = waiting
        .release(&grant)
        .await
        .or_fail("the waiter releases")?;
    Ok(())
}

/// A release nobody had marked is announced to nobody, so a waiter must not sleep through it:
/// * a release that commits while a waiter's attempt is blocked on the row (its statement's
///   snapshot still shows the old holder, 30 s from expiry) makes the attempt time its next look
///   by the newest row, and the waiter holds within seconds. The blocked attempt is the
///   waiter's form (it marks the key): the waiter has looked once and marked the key, and a
///   notification (as a proclaim sends) has it look again while an operator holds the row;
/// * a release between an observer's read and its `wait_for_change` returns that wait at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_nobody_announced_is_not_slept_through() -> Result {
    let server = start_server().await?;
    let url = url(&server);
    let a = connect(&url).await?;
    a.migrate().await.or_fail("migrate")?;
    // The waiter's attempt stays blocked on the row until the operator commits: its requests
    // may take longer than the other clients' second.
    let b = Arc::new(connect(&url.replace("timeout_ms=1000", "timeout_ms=30000")).await?);
    let ttl = Duration::from_secs(30);
    // b's listener is up first: when it starts listening it wakes every waiter to look again,
    // which would hide what this test is after.
    b.wait_for_change(&key("race/elsewhere")?, Duration::from_millis(300))
        .await
        .or_fail("B's first wait")?;
    let up = Instant::now();
    loop {
        if listening(a.pool(), "%").await? > 0 {
            break;
        }
        assert!(
            up.elapsed() < Duration::from_secs(10),
            "b's listener never started"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let key = key("race/attempt")?;
    let _held = a
        .try_acquire(&key, ttl)
        .await
        .or_fail("A holds the key")?
        .or_fail("A holds the key: a fresh key was held")?;
    let waiter = {
        let (b, key) = (b.clone(), key.clone());
        tokio::spawn(async move { b.acquire(&key, ttl, Duration::from_secs(20)).await })
    };
    // The waiter has marked the key, and sleeps until the holder's 30 s are up.
    wait_for_mark(a.pool(), &key, Duration::from_secs(10)).await?;
    // An operator's transaction holds the row, and a notification on the key has the waiter
    // look again: its attempt blocks on the row, its snapshot showing the holder's 30 s.
    let mut tx = a.pool().begin().await.or_fail("the operator's begin")?;
    sqlx::query("SELECT 1 FROM leasehold_leases WHERE lock_key = $1 FOR UPDATE")
        .bind(key.as_str())
        .execute(&mut *tx)
        .await
        .or_fail("the operator locks the row")?;
    sqlx::query("SELECT pg_notify('leasehold_release', 'leasehold_leases ' || $1)")
        .bind(key.as_str())
        .execute(a.pool())
        .await
        .or_fail("notify the key")?;
    let blocked = Instant::now();
    loop {
        let waiting: i64 = sqlx::query_scalar(
            // The waiting form of the attempt: the upsert that takes the key or marks it.
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
             AND query LIKE 'INSERT INTO %' AND query LIKE '%waited_until = CASE%'",
        )
        .fetch_one(a.pool())
        .await
        .or_fail("count the blocked attempts")?;
        if waiting > 0 {
            break;
        }
        assert!(
            blocked.elapsed() < Duration::from_secs(10),
            "the attempt never blocked"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The lease ends in that transaction, after the attempt's snapshot, with no notification.
    sqlx::query(
        "UPDATE leasehold_leases SET expires_at = statement_timestamp() WHERE lock_key = $1",
    )
    .bind(key.as_str())
    .execute(&mut *tx)
    .await
    .or_fail("the operator ends the lease")?;
    let ended = Instant::now();
    tx.commit().await.or_fail("the operator's commit")?;
    let grant = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .or_fail("the waiter slept through a release it could not hear")?
        .or_fail("the waiter's task")?
        .or_fail("the waiter")?;
    assert!(ended.elapsed() < Duration::from_secs(10));
    let _ = b.release(&grant).await.or_fail("B releases")?;

    let key = common::key("race/observer")?;
    let held = a
        .try_acquire(&key, ttl)
        .await
        .or_fail("A holds the observed key")?
        .or_fail("A holds the observed key: a fresh key was held")?;
    assert!(
        b.inspect(&key)
            .await
            .or_fail("B reads the observed key")?
            .held
    );
    let _ = a
        .release(&held)
        .await
        .or_fail("A releases the observed key")?;
    let started = Instant::now();
    b.wait_for_change(&key, Duration::from_secs(20))
        .await
        .or_fail("B waits for a change")?;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "a release between the read and the wait was slept through: {:?}",
        started.elapsed()
    );
    // Nothing changed since: the next wait waits.
    let quiet = tokio::time::timeout(
        Duration::from_millis(500),
        b.wait_for_change(&key, Duration::from_secs(20)),
    )
    .await;
    assert!(quiet.is_err(), "returned with nothing changed");
    Ok(())
}
