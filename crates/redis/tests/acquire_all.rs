//! A set of keys in one script on a real Redis: a plain `SET NX PX` client (redis-py's `Lock`)
//! holding one key of the set makes the whole step answer "held" and take nothing; once it is
//! gone the step takes every key, each fenced by its own counter, and the plain client is
//! excluded; a counter that cannot be raised fails the step with nothing held; a step whose
//! answer never came is given back as soon as the server runs it.

use std::time::Duration;

use leasehold_conformance::harness_call;
use leasehold_core::Instant;

use leasehold_conformance::kit::{ErrOrFail, OrFail, TestResult};
use leasehold_conformance::Failure;
use leasehold_core::{canonical, Authority, Error, LockKey, Released};
use leasehold_redis::RedisAuthority;
use redis::aio::MultiplexedConnection;

mod common;

use common::{raw, start, url};

async fn get(con: &mut MultiplexedConnection, key: &str) -> TestResult<Option<String>> {
    redis::cmd("GET")
        .arg(key)
        .query_async(con)
        .await
        .or_fail(format!("GET {key}"))
}

async fn plain_set(con: &mut MultiplexedConnection, key: &str) -> TestResult<bool> {
    let set: Option<String> = redis::cmd("SET")
        .arg(key)
        .arg("plain-token")
        .arg("NX")
        .arg("PX")
        .arg(10_000)
        .query_async(con)
        .await
        .or_fail(format!("plain SET NX PX {key}"))?;
    Ok(set.is_some())
}

fn set_of(names: &[&str]) -> TestResult<Vec<LockKey>> {
    let keys = names
        .iter()
        .map(|n| LockKey::new(*n))
        .collect::<Result<Vec<_>, _>>()
        .or_fail("the keys")?;
    canonical(&keys).or_fail("order the set")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_peer_on_one_key_makes_the_one_step_set_held() -> TestResult {
    let server = start().await?;
    let a = RedisAuthority::connect(&url(&server))
        .await
        .or_fail("connect")?;
    assert!(a.capabilities().atomic_acquire_all);
    let layout = a.config().layout().clone();
    let mut con = raw(&server).await?;
    let keys = set_of(&["order:1", "order:2", "order:3"])?;
    let ttl = Duration::from_secs(10);
    // Earlier fences on the first key, so each key's counter is seen to be its own.
    for _ in 0..3 {
        let g = a
            .try_acquire(&keys[0], ttl)
            .await
            .or_fail("an earlier grant")?
            .or_fail("the first key is free")?;
        assert_eq!(a.release(&g).await.or_fail("release")?, Released::Released);
    }

    let middle = layout.lock_key(&keys[1]);
    assert!(
        plain_set(&mut con, &middle).await?,
        "the plain client's SET"
    );
    let busy = a
        .try_acquire_all(&keys, ttl)
        .await
        .or_fail("try the set beside the plain holder")?;
    assert!(busy.is_none(), "the set was taken beside a plain holder");
    for key in [&keys[0], &keys[2]] {
        let holder = get(&mut con, &layout.lock_key(key)).await?;
        assert_eq!(holder, None, "{key} was taken by a step that answered held");
    }
    assert_eq!(
        get(&mut con, &middle).await?.as_deref(),
        Some("plain-token"),
        "the plain holder's key was touched"
    );
    let _: i64 = redis::cmd("DEL")
        .arg(&middle)
        .query_async(&mut con)
        .await
        .or_fail("the plain client releases")?;

    let grants = a
        .try_acquire_all(&keys, ttl)
        .await
        .or_fail("take the free set")?
        .or_fail("the set is free")?;
    assert_eq!(grants.len(), keys.len());
    for (grant, key) in grants.iter().zip(&keys) {
        assert_eq!(grant.key(), key);
        let counter = get(&mut con, &layout.fence_key(key)).await?;
        assert_eq!(
            counter,
            Some(grant.fence().raw().to_string()),
            "{key}'s fence is not its own counter"
        );
        assert_eq!(
            get(&mut con, &layout.lock_key(key)).await?,
            Some(grant.owner().to_hex()),
            "{key} does not hold the grant's owner token"
        );
        assert!(
            !plain_set(&mut con, &layout.lock_key(key)).await?,
            "a plain client took {key} while the set held it"
        );
    }
    assert_eq!(grants[0].fence().raw(), 4, "three grants came before");
    assert_eq!(grants[1].fence().raw(), 1, "the second key's first grant");
    for grant in &grants {
        assert_eq!(
            a.release(grant).await.or_fail("release")?,
            Released::Released
        );
    }
    Ok(())
}

/// A counter that cannot be raised on the last key of a set fails the step with a permanent
/// error after the script set the earlier keys: it deletes them again, so nothing is held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_counter_in_a_set_fails_the_step_and_holds_nothing() -> TestResult {
    let server = start().await?;
    let a = RedisAuthority::connect(&url(&server))
        .await
        .or_fail("connect")?;
    let layout = a.config().layout().clone();
    let mut con = raw(&server).await?;
    let keys = set_of(&["batch:1", "batch:2", "batch:3"])?;
    let _: () = redis::cmd("SET")
        .arg(layout.fence_key(&keys[2]))
        .arg("not a number")
        .query_async(&mut con)
        .await
        .or_fail("break the last counter")?;
    let err = a
        .try_acquire_all(&keys, Duration::from_secs(10))
        .await
        .err_or_fail("the set with a broken counter")?;
    if !matches!(
        err,
        Error::Backend {
            retryable: false,
            ..
        }
    ) {
        return Err(Failure::new(format!(
            "a broken counter gave {err:?}, not a permanent backend error"
        )));
    }
    for key in &keys {
        let holder = get(&mut con, &layout.lock_key(key)).await?;
        assert_eq!(holder, None, "{key} is held after the failed step");
    }
    Ok(())
}

/// The server freezes while a set's step is on the wire. The caller gets `Unavailable` within
/// its timeout; when the server resumes it runs the step after all (every counter moved), and
/// the compare-and-deletes queued behind it free every key at once, long before the TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_step_frozen_on_the_wire_is_given_back_when_the_server_resumes() -> TestResult {
    let server = start().await?;
    let a = RedisAuthority::connect(&format!("{}?timeout_ms=500", server.url()))
        .await
        .or_fail("connect")?;
    let layout = a.config().layout().clone();
    let keys = set_of(&["frozen:1", "frozen:2", "frozen:3"])?;
    let ttl = Duration::from_secs(20);
    // Warm the script cache, so the frozen request is the step itself.
    let warm = a
        .try_acquire_all(&keys, ttl)
        .await
        .or_fail("warm up")?
        .or_fail("the set is free")?;
    for grant in &warm {
        assert_eq!(
            a.release(grant).await.or_fail("release")?,
            Released::Released
        );
    }
    {
        let s = server.clone();
        harness_call(move || s.pause())
            .await
            .or_fail("pause the server")?;
    }
    let started = Instant::now();
    let err = a
        .try_acquire_all(&keys, ttl)
        .await
        .err_or_fail("the set's step on a frozen server")?;
    let took = started.elapsed();
    {
        let s = server.clone();
        harness_call(move || s.resume())
            .await
            .or_fail("resume the server")?;
    }
    if !(matches!(err, Error::Unavailable { .. }) && err.is_retryable()) {
        return Err(Failure::new(format!("the frozen step gave {err:?}")));
    }
    assert!(took < Duration::from_millis(1500), "took {took:?}");

    let mut con = raw(&server).await?;
    let resumed = Instant::now();
    for key in &keys {
        loop {
            let holder = get(&mut con, &layout.lock_key(key)).await?;
            let counter = get(&mut con, &layout.fence_key(key)).await?;
            if holder.is_none() && counter.as_deref() == Some("2") {
                break;
            }
            assert!(
                resumed.elapsed() < ttl / 10,
                "after the resume, {key}: holder {holder:?}, fence counter {counter:?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    let again = a
        .try_acquire_all(&keys, ttl)
        .await
        .or_fail("take the set after the resume")?
        .or_fail("the set is free again")?;
    assert!(again.iter().all(|g| g.fence().raw() == 3), "{again:?}");
    Ok(())
}
