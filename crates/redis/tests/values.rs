//! Proclaimed values on a real Redis: a stale grant's proclaim is refused and leaves the holder's
//! value, a new grant starts without the previous value (however the earlier lease ended),
//! binary values round-trip, and `wait_for_change` wakes on another client's release and
//! proclaim.

use std::sync::Arc;
use std::time::Duration;

use leasehold_conformance::kit::{ErrOrFail, OrFail, TestResult};
use leasehold_core::{Authority, Error, Instant, LockKey, Released};
use leasehold_redis::RedisAuthority;
use redis::aio::MultiplexedConnection;

mod common;

use common::{calls, raw, start, url, wait_subscribed};

/// The value key of a lock, as a plain client reads it: `(fence, value)`, each `None` when
/// absent.
async fn stored_value(
    con: &mut MultiplexedConnection,
    a: &RedisAuthority,
    key: &LockKey,
) -> TestResult<(Option<u64>, Option<Vec<u8>>)> {
    redis::cmd("HMGET")
        .arg(a.config().layout().value_key(key))
        .arg("fence")
        .arg("value")
        .query_async(con)
        .await
        .or_fail("HMGET the value key")
}

/// A grant whose lease ran out and went to someone else cannot proclaim: `LeaseLost`, and the
/// new holder's value (and the fence stored with it) are untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_grants_proclaim_is_refused_and_leaves_the_holders_value() -> TestResult {
    let server = start().await?;
    let a = RedisAuthority::connect(&url(&server))
        .await
        .or_fail("connect A")?;
    let b = RedisAuthority::connect(&url(&server))
        .await
        .or_fail("connect B")?;
    let mut con = raw(&server).await?;
    let key = LockKey::new("proclaim-stale").or_fail("the key")?;
    let old = a
        .try_acquire(&key, Duration::from_millis(200))
        .await
        .or_fail("A acquires")?
        .or_fail("the key is free")?;
    a.proclaim(&old, b"old leader")
        .await
        .or_fail("A proclaims")?;
    assert_eq!(
        a.inspect(&key)
            .await
            .or_fail("A inspects")?
            .value
            .as_deref(),
        Some(&b"old leader"[..])
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    let new = b
        .try_acquire(&key, Duration::from_secs(10))
        .await
        .or_fail("B acquires")?
        .or_fail("the old lease ran out")?;
    b.proclaim(&new, b"new leader")
        .await
        .or_fail("B proclaims")?;

    let err = a
        .proclaim(&old, b"stale")
        .await
        .err_or_fail("A's stale proclaim")?;
    assert!(err.is_lease_lost(), "{err:?}");
    let seen = b.inspect(&key).await.or_fail("B inspects")?;
    assert_eq!(seen.fence, Some(new.fence()), "{seen:?}");
    assert_eq!(seen.value.as_deref(), Some(&b"new leader"[..]));
    assert_eq!(
        stored_value(&mut con, &b, &key).await?,
        (Some(new.fence().raw()), Some(b"new leader".to_vec()))
    );
    // A grant that was released is refused too.
    assert_eq!(
        b.release(&new).await.or_fail("B releases")?,
        Released::Released
    );
    let err = b
        .proclaim(&new, b"after release")
        .await
        .err_or_fail("a released grant's proclaim")?;
    assert!(err.is_lease_lost(), "{err:?}");
    assert_eq!(stored_value(&mut con, &b, &key).await?, (None, None));
    Ok(())
}

/// A value belongs to its grant: a later grant starts without one, whether the earlier lease
/// was released (its value key is deleted with it), ran out, or was released by a plain peer's
/// compare-and-delete (its value key stays, but holds a smaller fence); nor is it shown for a
/// plain peer holding the key. The lock key still holds exactly the owner token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_grant_starts_without_the_previous_value() -> TestResult {
    let server = start().await?;
    let a = RedisAuthority::connect(&url(&server))
        .await
        .or_fail("connect")?;
    let mut con = raw(&server).await?;
    let key = LockKey::new("proclaim-fresh").or_fail("the key")?;
    let lock_key = a.config().layout().lock_key(&key);
    let ttl = Duration::from_secs(10);

    // Released: the value key goes with the lease.
    let first = a
        .try_acquire(&key, ttl)
        .await
        .or_fail("the first grant")?
        .or_fail("the key is free")?;
    a.proclaim(&first, b"first")
        .await
        .or_fail("the first proclaim")?;
    let token: String = redis::cmd("GET")
        .arg(&lock_key)
        .query_async(&mut con)
        .await
        .or_fail("GET the lock key")?;
    assert_eq!(token, first.owner().to_hex(), "the lock key is unchanged");
    assert_eq!(
        a.release(&first).await.or_fail("release the first grant")?,
        Released::Released
    );
    assert_eq!(stored_value(&mut con, &a, &key).await?, (None, None));
    let seen = a.inspect(&key).await.or_fail("inspect")?;
    assert!(!seen.held && seen.value.is_none(), "{seen:?}");
    let second = a
        .try_acquire(&key, ttl)
        .await
        .or_fail("the second grant")?
        .or_fail("the key is free")?;
    assert_eq!(a.inspect(&key).await.or_fail("inspect")?.value, None);

    // Ran out: the value key is left, with the old fence, and not shown for the next grant.
    a.proclaim(&second, b"second")
        .await
        .or_fail("the second proclaim")?;
    let _: () = redis::cmd("PEXPIRE")
        .arg(&lock_key)
        .arg(1)
        .query_async(&mut con)
        .await
        .or_fail("PEXPIRE the lock key")?;
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(
        stored_value(&mut con, &a, &key).await?,
        (Some(second.fence().raw()), Some(b"second".to_vec()))
    );
    let third = a
        .try_acquire(&key, ttl)
        .await
        .or_fail("the third grant")?
        .or_fail("the key is free")?;
    let seen = a.inspect(&key).await.or_fail("inspect")?;
    assert_eq!(seen.fence, Some(third.fence()));
    assert_eq!(seen.value, None, "{seen:?}");

    // Released by a plain compare-and-delete: the same.
    a.proclaim(&third, b"third")
        .await
        .or_fail("the third proclaim")?;
    let deleted: i64 = redis::Script::new(
        "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0",
    )
    .key(&lock_key)
    .arg(third.owner().to_hex())
    .invoke_async(&mut con)
    .await
    .or_fail("a plain compare-and-delete")?;
    assert_eq!(deleted, 1);
    assert_eq!(a.inspect(&key).await.or_fail("inspect")?.value, None);
    // A plain peer holds the key now: no fence, no value.
    let _: () = redis::cmd("SET")
        .arg(&lock_key)
        .arg("plain-token")
        .arg("PX")
        .arg(10_000)
        .query_async(&mut con)
        .await
        .or_fail("a plain peer's SET")?;
    let seen = a.inspect(&key).await.or_fail("inspect")?;
    assert!(
        seen.held && seen.fence.is_none() && seen.value.is_none(),
        "{seen:?}"
    );
    let _: () = redis::cmd("DEL")
        .arg(&lock_key)
        .query_async(&mut con)
        .await
        .or_fail("the plain peer's DEL")?;
    let fourth = a
        .try_acquire(&key, ttl)
        .await
        .or_fail("the fourth grant")?
        .or_fail("the key is free")?;
    assert!(fourth.fence() > third.fence());
    assert_eq!(a.inspect(&key).await.or_fail("inspect")?.value, None);
    a.proclaim(&fourth, b"fourth")
        .await
        .or_fail("the fourth proclaim")?;
    assert_eq!(
        a.inspect(&key).await.or_fail("inspect")?.value.as_deref(),
        Some(&b"fourth"[..])
    );
    assert_eq!(
        a.release(&fourth)
            .await
            .or_fail("release the fourth grant")?,
        Released::Released
    );
    Ok(())
}

/// Values are bytes: any byte (NUL, invalid UTF-8), up to `MAX_VALUE_LEN` of them, round-trip
/// exactly; an empty value is a value; a longer one is refused before anything is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_binary_value_round_trips() -> TestResult {
    let server = start().await?;
    let a = RedisAuthority::connect(&url(&server))
        .await
        .or_fail("connect A")?;
    let observer = RedisAuthority::connect(&url(&server))
        .await
        .or_fail("connect the observer")?;
    let mut con = raw(&server).await?;
    let key = LockKey::new("proclaim-binary").or_fail("the key")?;
    let g = a
        .try_acquire(&key, Duration::from_secs(10))
        .await
        .or_fail("acquire")?
        .or_fail("the key is free")?;
    let binary = vec![0x00, 0xff, 0xfe, b'\n', 0xc3, 0x28, b' ', b'{', b'}', 0x80];
    assert!(std::str::from_utf8(&binary).is_err());
    let largest: Vec<u8> = (0..leasehold_core::MAX_VALUE_LEN)
        .map(|i| (i * 7 % 256) as u8)
        .collect();
    for value in [binary.clone(), largest.clone(), Vec::new()] {
        a.proclaim(&g, &value).await.or_fail("proclaim")?;
        let seen = observer.inspect(&key).await.or_fail("inspect")?;
        assert_eq!(seen.value.as_ref(), Some(&value), "{} bytes", value.len());
    }
    a.proclaim(&g, &binary).await.or_fail("proclaim")?;
    let too_long = vec![0u8; leasehold_core::MAX_VALUE_LEN + 1];
    let (evalsha, _) = calls(&server, "evalsha").await?;
    let err = a
        .proclaim(&g, &too_long)
        .await
        .err_or_fail("proclaim a value over the limit")?;
    assert!(matches!(err, Error::InvalidConfig { .. }), "{err:?}");
    assert_eq!(calls(&server, "evalsha").await?.0, evalsha, "nothing sent");
    assert_eq!(
        stored_value(&mut con, &a, &key).await?,
        (Some(g.fence().raw()), Some(binary.clone()))
    );
    assert_eq!(a.release(&g).await.or_fail("release")?, Released::Released);
    Ok(())
}

/// `wait_for_change` returns soon after another client releases the key or proclaims a value
/// (by the announcement, long before its `max_wait`, also `Duration::MAX`), and after
/// `max_wait` when nothing happens (once the subscription is up). However many waits come and go, the authority keeps one
/// subscription connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_for_change_wakes_on_another_clients_release_and_proclaim() -> TestResult {
    let server = start().await?;
    let holder = RedisAuthority::connect(&url(&server))
        .await
        .or_fail("connect the holder")?;
    let observer = Arc::new(
        RedisAuthority::connect(&url(&server))
            .await
            .or_fail("connect the observer")?,
    );
    let mut con = raw(&server).await?;
    let key = LockKey::new("wait-for-change").or_fail("the key")?;
    let ttl = Duration::from_secs(30);
    let held = holder
        .try_acquire(&key, ttl)
        .await
        .or_fail("the holder acquires")?
        .or_fail("the key is free")?;

    // The first wait starts the subscription, and may return as soon as it is up (whatever
    // changed before that was not announced to it).
    observer
        .wait_for_change(&key, Duration::from_millis(50))
        .await
        .or_fail("the first wait")?;
    wait_subscribed(&mut con, 1).await?;
    // Nothing happens: it returns after max_wait, not before.
    let since = Instant::now();
    observer
        .wait_for_change(&key, Duration::from_millis(150))
        .await
        .or_fail("a wait of 150 ms")?;
    let waited = since.elapsed();
    assert!(
        waited >= Duration::from_millis(150) && waited < Duration::from_secs(2),
        "{waited:?}"
    );

    let wait = |max_wait: Duration| {
        let (observer, key) = (observer.clone(), key.clone());
        tokio::spawn(async move {
            observer
                .wait_for_change(&key, max_wait)
                .await
                .or_fail("the observer waits")?;
            TestResult::Ok(Instant::now())
        })
    };
    // A proclaim wakes it.
    let task = wait(Duration::from_secs(20));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!task.is_finished(), "woke with nothing changed");
    let proclaimed = Instant::now();
    holder
        .proclaim(&held, b"leader-1")
        .await
        .or_fail("the holder proclaims")?;
    let woke = tokio::time::timeout(Duration::from_secs(2), task)
        .await
        .or_fail("the proclaim did not wake the waiter")?
        .or_fail("the waiting task")??;
    println!("woken by a proclaim after {:?}", woke - proclaimed);

    // A release wakes it, with no bound on the wait at all.
    let task = wait(Duration::MAX);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!task.is_finished(), "woke with nothing changed");
    let released = Instant::now();
    assert_eq!(
        holder.release(&held).await.or_fail("the holder releases")?,
        Released::Released
    );
    let woke = tokio::time::timeout(Duration::from_secs(2), task)
        .await
        .or_fail("the release did not wake the waiter")?
        .or_fail("the waiting task")??;
    println!("woken by a release after {:?}", woke - released);

    // Dropped waits leave nothing behind: still one subscription, and a later one still works.
    for _ in 0..50 {
        let _ = tokio::time::timeout(
            Duration::from_millis(1),
            observer.wait_for_change(&key, Duration::from_secs(60)),
        )
        .await;
    }
    wait_subscribed(&mut con, 1).await?;
    let again = holder
        .try_acquire(&key, ttl)
        .await
        .or_fail("the holder acquires again")?
        .or_fail("the key is free")?;
    let task = wait(Duration::from_secs(20));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        holder
            .release(&again)
            .await
            .or_fail("the holder releases again")?,
        Released::Released
    );
    tokio::time::timeout(Duration::from_secs(2), task)
        .await
        .or_fail("a release after dropped waits did not wake the waiter")?
        .or_fail("the waiting task")??;
    Ok(())
}
