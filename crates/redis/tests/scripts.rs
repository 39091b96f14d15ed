//! What leasehold keeps in a real Redis and how it gets there: interop with the plain
//! `SET NX PX` convention on the same key, one `EVALSHA` per step (and the scripts back after
//! `SCRIPT FLUSH`), held leases renewed in one script call per tick, and a broken fence counter
//! that fails the acquisition and holds nothing.

use std::sync::Arc;
use std::time::Duration;

use leasehold_conformance::kit::{ErrOrFail, OrFail, TestResult};
use leasehold_conformance::Failure;
use leasehold_core::{Authority, Error, Lease, LeaseOptions, LockKey, LostReason, Released};
use leasehold_redis::{KeyLayout, RedisAuthority};

mod common;

use common::{calls, command, raw, start, url};

/// A client that follows the plain convention on the same Redis key excludes leasehold and is
/// excluded by it, and a plain compare-and-delete with leasehold's token releases it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interoperates_with_the_plain_set_nx_px_convention() -> TestResult {
    let server = start().await?;
    let a = RedisAuthority::connect(&url(&server))
        .await
        .or_fail("connect")?;
    let mut con = raw(&server).await?;
    let key = LockKey::new("invoice:inv_72").or_fail("the key")?;
    let lock_key = "{leasehold:invoice:inv_72}";
    assert_eq!(a.config().layout().lock_key(&key), lock_key);
    let ttl = Duration::from_secs(10);
    let compare_and_delete = redis::Script::new(
        "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0",
    );

    // Plain holder first.
    let set: Option<String> = redis::cmd("SET")
        .arg(lock_key)
        .arg("plain-token")
        .arg("NX")
        .arg("PX")
        .arg(10_000)
        .query_async(&mut con)
        .await
        .or_fail("the plain client's SET")?;
    assert_eq!(set.as_deref(), Some("OK"));
    assert!(a
        .try_acquire(&key, ttl)
        .await
        .or_fail("try the key the plain client holds")?
        .is_none());
    // inspect shows the plain holder as a peer (its value is not an owner token, and it raised
    // no counter, so it has no fence), with its PTTL, and never its value.
    let seen = a.inspect(&key).await.or_fail("inspect")?;
    assert!(seen.held && seen.fence.is_none(), "{seen:?}");
    assert_eq!(
        seen.owner.as_ref().map(|o| o.as_str()),
        Some("peer:foreign")
    );
    assert!(seen
        .remaining
        .is_some_and(|r| r > Duration::from_secs(9) && r <= ttl));
    assert!(!format!("{seen:?}").contains("plain-token"));
    let err = a
        .acquire(&key, ttl, Duration::from_millis(200))
        .await
        .err_or_fail("wait behind the plain client")?;
    assert!(matches!(err, Error::Timeout { .. }), "{err:?}");
    let deleted: i64 = compare_and_delete
        .key(lock_key)
        .arg("plain-token")
        .invoke_async(&mut con)
        .await
        .or_fail("the plain client's compare-and-delete")?;
    assert_eq!(deleted, 1);

    // leasehold holder: the value is exactly the owner token, and the fence is the counter.
    let g = a
        .try_acquire(&key, ttl)
        .await
        .or_fail("acquire")?
        .or_fail("the key is free")?;
    let value: String = redis::cmd("GET")
        .arg(lock_key)
        .query_async(&mut con)
        .await
        .or_fail("GET the lock key")?;
    assert_eq!(value, g.owner().to_hex());
    let counter: u64 = redis::cmd("GET")
        .arg("{leasehold:invoice:inv_72}:fence")
        .query_async(&mut con)
        .await
        .or_fail("GET the counter")?;
    assert_eq!(counter, g.fence().raw());
    let pttl: i64 = redis::cmd("PTTL")
        .arg(lock_key)
        .query_async(&mut con)
        .await
        .or_fail("PTTL")?;
    assert!(pttl > 9_000 && pttl <= 10_000, "{pttl}");
    let set: Option<String> = redis::cmd("SET")
        .arg(lock_key)
        .arg("plain-token")
        .arg("NX")
        .arg("PX")
        .arg(10_000)
        .query_async(&mut con)
        .await
        .or_fail("the plain client's SET")?;
    assert_eq!(set, None, "the plain client must be excluded");
    let wrong: i64 = compare_and_delete
        .key(lock_key)
        .arg("plain-token")
        .invoke_async(&mut con)
        .await
        .or_fail("a compare-and-delete with the wrong token")?;
    assert_eq!(wrong, 0);
    let deleted: i64 = compare_and_delete
        .key(lock_key)
        .arg(g.owner().to_hex())
        .invoke_async(&mut con)
        .await
        .or_fail("a compare-and-delete with leasehold's token")?;
    assert_eq!(
        deleted, 1,
        "a plain compare-and-delete with leasehold's token releases it"
    );
    assert!(a
        .renew(&g, ttl)
        .await
        .err_or_fail("renew after the delete")?
        .is_lease_lost());
    assert_eq!(
        a.release(&g).await.or_fail("release after the delete")?,
        Released::AlreadyGone
    );
    let next = a
        .try_acquire(&key, ttl)
        .await
        .or_fail("acquire again")?
        .or_fail("the key is free")?;
    assert!(next.fence() > g.fence());
    Ok(())
}

/// Each step is one `EVALSHA`; after the server forgot the scripts, one `EVAL` per script
/// brings them back, and then it is `EVALSHA` alone again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_cost_one_round_trip_and_survive_a_flushed_script_cache() -> TestResult {
    let server = start().await?;
    let a = RedisAuthority::connect(&url(&server))
        .await
        .or_fail("connect")?;
    let key = LockKey::new("round-trips").or_fail("the key")?;
    let ttl = Duration::from_secs(5);
    let pair = || async {
        let g = a
            .try_acquire(&key, ttl)
            .await
            .or_fail("acquire")?
            .or_fail("the key is free")?;
        let _ = a.renew(&g, ttl).await.or_fail("renew")?;
        assert_eq!(a.release(&g).await.or_fail("release")?, Released::Released);
        TestResult::Ok(())
    };
    pair().await?; // loads the three scripts
    let (sha0, eval0) = (
        calls(&server, "evalsha").await?,
        calls(&server, "eval").await?,
    );
    for _ in 0..20 {
        pair().await?;
    }
    let (sha1, eval1) = (
        calls(&server, "evalsha").await?,
        calls(&server, "eval").await?,
    );
    assert_eq!(sha1.0 - sha0.0, 60, "one EVALSHA per step");
    assert_eq!(sha1.1, sha0.1, "no failed EVALSHA");
    assert_eq!(eval1, eval0, "no EVAL while the scripts are cached");

    command(&server, &["SCRIPT", "FLUSH"]).await?;
    pair().await?;
    let (sha2, eval2) = (
        calls(&server, "evalsha").await?,
        calls(&server, "eval").await?,
    );
    assert_eq!(eval2.0 - eval1.0, 3, "each script sent in full once");
    assert_eq!(sha2.0 - sha1.0, 3);
    pair().await?;
    assert_eq!(
        calls(&server, "eval").await?,
        eval2,
        "and then by SHA again"
    );
    Ok(())
}

/// 200 leases held through one authority renew as one script call per renewal tick
/// (counted by the server), and a lease whose key was deleted behind its back is refused in its
/// batch and lost while the other 199 stay held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_leases_renew_in_one_script_call_per_tick() -> TestResult {
    let server = start().await?;
    let a: Arc<dyn Authority> = Arc::new(
        RedisAuthority::connect(&url(&server))
            .await
            .or_fail("connect")?,
    );
    let ttl = Duration::from_millis(1500);
    let mut leases = Vec::new();
    for i in 0..200 {
        let key = LockKey::new(format!("batched/{i}")).or_fail("a key")?;
        leases.push(
            Lease::try_acquire(a.clone(), &key, ttl, LeaseOptions::default())
                .await
                .or_fail("a lease")?
                .or_fail("the key is free")?,
        );
    }
    // Let the first tick align them, then count three ticks.
    tokio::time::sleep(ttl / 2).await;
    let before = calls(&server, "evalsha").await?.0;
    tokio::time::sleep(ttl).await;
    let calls_in_three_ticks = calls(&server, "evalsha").await?.0 - before;
    assert!(
        (2..=5).contains(&calls_in_three_ticks),
        "{calls_in_three_ticks} script calls renewed 200 leases for three ticks"
    );
    let victim = leases.remove(17);
    let lock_key = KeyLayout::default().lock_key(victim.key());
    command(&server, &["DEL", &lock_key]).await?;
    let reason = tokio::time::timeout(ttl, victim.lost())
        .await
        .or_fail("the victim's loss")?;
    assert!(matches!(reason, LostReason::Refused), "{reason:?}");
    tokio::time::sleep(ttl / 2).await;
    assert!(leases.iter().all(|l| l.state().is_held()));
    let mut con = raw(&server).await?;
    let ttl_left: i64 = redis::cmd("PTTL")
        .arg(KeyLayout::default().lock_key(leases[0].key()))
        .query_async(&mut con)
        .await
        .or_fail("PTTL")?;
    assert!(
        ttl_left > 0,
        "the first lease's key has no TTL left: {ttl_left}"
    );
    Ok(())
}

/// A batch larger than one script call may renew goes as several calls, so that one renewal
/// tick of many leases does not keep the server from everyone else for tens of milliseconds:
/// 2,500 leases renew in three calls (counted by the server), each lease renewed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_batch_renews_in_calls_of_at_most_a_thousand_leases() -> TestResult {
    let server = start().await?;
    let a = RedisAuthority::connect(&url(&server))
        .await
        .or_fail("connect")?;
    let ttl = Duration::from_secs(30);
    let mut grants = Vec::new();
    for i in 0..2_500 {
        let key = LockKey::new(format!("chunked/{i}")).or_fail("a key")?;
        grants.push(
            a.try_acquire(&key, ttl)
                .await
                .or_fail("acquire")?
                .or_fail("the key is free")?,
        );
    }
    let before = calls(&server, "evalsha").await?.0;
    let answers = a.renew_many(&grants).await;
    let spent = calls(&server, "evalsha").await?.0 - before;
    if spent != 3 {
        return Err(Failure::new(format!(
            "2,500 leases renewed in {spent} script calls, not 3"
        )));
    }
    if answers.len() != grants.len() {
        return Err(Failure::new(format!(
            "{} answers for {} leases",
            answers.len(),
            grants.len()
        )));
    }
    if let Some((i, refused)) = answers.iter().enumerate().find(|(_, a)| a.is_err()) {
        return Err(Failure::new(format!(
            "lease {i} was not renewed: {refused:?}"
        )));
    }
    Ok(())
}

/// A fence counter that cannot be raised (an operator overwrote it with text) makes the
/// acquisition fail with a permanent error, and the script gives the fresh lease back before
/// answering: nothing is held by a client that got an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_fence_counter_fails_the_acquisition_and_holds_nothing() -> TestResult {
    let server = start().await?;
    let a = RedisAuthority::connect(&url(&server))
        .await
        .or_fail("connect")?;
    let key = LockKey::new("broken-counter").or_fail("the key")?;
    let layout = a.config().layout().clone();
    let mut con = raw(&server).await?;
    let _: () = redis::cmd("SET")
        .arg(layout.fence_key(&key))
        .arg("not a number")
        .query_async(&mut con)
        .await
        .or_fail("break the counter")?;
    let err = a
        .try_acquire(&key, Duration::from_secs(10))
        .await
        .err_or_fail("acquire with a broken counter")?;
    assert!(
        matches!(
            err,
            Error::Backend {
                retryable: false,
                ..
            }
        ),
        "{err:?}"
    );
    let holder: Option<String> = redis::cmd("GET")
        .arg(layout.lock_key(&key))
        .query_async(&mut con)
        .await
        .or_fail("GET the lock key")?;
    assert_eq!(holder, None, "the failed acquisition left a lease behind");
    // Repaired by hand, with a counter above every fence handed out: the lock works again.
    let _: () = redis::cmd("SET")
        .arg(layout.fence_key(&key))
        .arg(1000)
        .query_async(&mut con)
        .await
        .or_fail("repair the counter")?;
    let g = a
        .try_acquire(&key, Duration::from_secs(10))
        .await
        .or_fail("acquire after the repair")?
        .or_fail("the key is free")?;
    assert_eq!(g.fence().raw(), 1001);
    Ok(())
}
