//! Releases a waiter is never told about, on a real Redis: one while the subscription is down,
//! one by an ACL user without channel rights (who must still release and hand off, with one
//! warning), a plain holder that deletes without announcing, and a leasehold release announced
//! on another channel. Each waiter gets the key well before the holder's TTL.

use std::sync::Arc;
use std::time::Duration;

use leasehold_conformance::harness_call;
use leasehold_conformance::kit::{OrFail, TestResult};
use leasehold_conformance::Failure;
use leasehold_core::{Authority, Grant, Instant, LockKey, Released};
use leasehold_redis::RedisAuthority;

mod common;

use common::{
    command, hand_off_rounds, median_under, raw, start, subscribers, url, wait_subscribed, Warnings,
};

/// The subscription connection is killed, and the holder releases while it is down: the
/// announcement is lost, yet the waiter gets the key at once after the subscription is back,
/// not after the holder's TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_while_the_subscription_is_down_is_not_missed() -> TestResult {
    let server = start().await?;
    let holder = RedisAuthority::connect(&url(&server))
        .await
        .or_fail("connect the holder")?;
    let waiter = Arc::new(
        RedisAuthority::connect(&url(&server))
            .await
            .or_fail("connect the waiter")?,
    );
    let key = LockKey::new("outage").or_fail("the key")?;
    let ttl = Duration::from_secs(20);
    let held = holder
        .try_acquire(&key, ttl)
        .await
        .or_fail("the holder acquires")?
        .or_fail("the key is free")?;
    let task = {
        let (waiter, key) = (waiter.clone(), key.clone());
        tokio::spawn(async move { waiter.acquire(&key, ttl, Duration::from_secs(10)).await })
    };
    let mut con = raw(&server).await?;
    let subscribed = Instant::now();
    loop {
        let numsub = subscribers(&mut con).await?;
        if numsub == Some(redis::Value::Int(1)) {
            break;
        }
        assert!(subscribed.elapsed() < Duration::from_secs(2));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(&mut con)
        .await
        .or_fail("kill the subscription")?;
    assert_eq!(killed, 1);
    let released_at = Instant::now();
    assert_eq!(
        holder.release(&held).await.or_fail("the holder releases")?,
        Released::Released
    );
    let g = tokio::time::timeout(Duration::from_secs(3), task)
        .await
        .or_fail("the waiter missed the release")?
        .or_fail("the waiting task")?
        .or_fail("the waiter acquires")?;
    assert!(g.fence() > held.fence());
    println!(
        "hand-off across a subscription outage: {:?}",
        released_at.elapsed()
    );
    Ok(())
}

/// An ACL user granted the release channel alone (`&leasehold:released`, what these pages told
/// users before each authority had a channel of its own) still hands a key on at once: the
/// server refuses its own channel, so its waiters read the release channel instead, and its
/// release, whose copy on the waiter's channel is refused, names nobody there, so the waiter
/// reading it takes the turn. Median of five rounds, against retries 150 to 300 ms apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_with_the_release_channel_alone_still_hands_off_at_once() -> TestResult {
    let server = start().await?;
    command(
        &server,
        &[
            "ACL",
            "SETUSER",
            "relonly",
            "on",
            ">relonly-pw",
            "~*",
            "+@all",
            "resetchannels",
            "&leasehold:released",
        ],
    )
    .await?;
    let acl_url = format!(
        "redis://relonly:relonly-pw@127.0.0.1:{}?timeout_ms=1000",
        server.port()
    );
    let holder = RedisAuthority::connect(&acl_url)
        .await
        .or_fail("connect the holder")?;
    let waiter = Arc::new(
        RedisAuthority::connect(&acl_url)
            .await
            .or_fail("connect the waiter")?,
    );
    let mut con = raw(&server).await?;
    let key = LockKey::new("release-channel-alone").or_fail("the key")?;
    let ready = async || {
        let since = Instant::now();
        while common::release_channel_readers(&mut con).await? != 1 {
            if since.elapsed() > Duration::from_secs(5) {
                return Err(Failure::new(
                    "the waiter, refused its own channel, never read the release channel",
                ));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(())
    };
    let release = async |held: Grant| match holder.release(&held).await {
        Ok(Released::Released) => Ok(()),
        other => Err(Failure::new(format!("the holder's release: {other:?}"))),
    };
    let latencies = hand_off_rounds(&holder, &waiter, &key, 5, ready, release).await?;
    median_under(
        &latencies,
        Duration::from_millis(30),
        "for a user with the release channel alone",
    )
}

/// An ACL user created the Redis 7 way (`acl-pubsub-default resetchannels`: no channel rights
/// unless granted) may lock keys but not publish. Its release deletes the key and must say so,
/// not fail because the announcement was refused after the `DEL`; and a waiter of such a user
/// (whose subscription is refused too) still gets the key by retrying, well before the TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_by_an_acl_user_without_channel_rights_releases_and_hands_off() -> TestResult {
    let server = start().await?;
    command(
        &server,
        &[
            "ACL",
            "SETUSER",
            "nochan",
            "on",
            ">nochan-pw",
            "~*",
            "+@all",
        ],
    )
    .await?;
    // The precondition: this user may not publish on the release channel.
    let dry = {
        let s = server.clone();
        harness_call(move || {
            s.command(&[
                "ACL",
                "DRYRUN",
                "nochan",
                "PUBLISH",
                "leasehold:released",
                "x",
            ])
        })
        .await
    };
    assert!(
        !matches!(dry.as_deref(), Ok("OK")),
        "the user must lack channel rights: {dry:?}"
    );
    let acl_url = format!(
        "redis://nochan:nochan-pw@127.0.0.1:{}?timeout_ms=1000",
        server.port()
    );
    let holder = RedisAuthority::connect(&acl_url)
        .await
        .or_fail("connect the holder")?;
    let waiter = Arc::new(
        RedisAuthority::connect(&acl_url)
            .await
            .or_fail("connect the waiter")?,
    );
    let key = LockKey::new("acl-release").or_fail("the key")?;
    let lock_key = holder.config().layout().lock_key(&key);
    let ttl = Duration::from_secs(10);

    let held = holder
        .try_acquire(&key, ttl)
        .await
        .or_fail("the holder acquires")?
        .or_fail("the key is free")?;
    let task = {
        let (waiter, key) = (waiter.clone(), key.clone());
        tokio::spawn(async move { waiter.acquire(&key, ttl, ttl).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!task.is_finished(), "the waiter got a held key");
    let released_at = Instant::now();
    let warnings = Warnings::default();
    let released = {
        // The release runs on this thread: its warning is collected here.
        let _guard = tracing::subscriber::set_default(warnings.clone());
        holder.release(&held).await
    };
    assert_eq!(
        released.as_ref().ok(),
        Some(&Released::Released),
        "release under an ACL without channel rights: {released:?}"
    );
    // The waiter's subscription is refused as well, so it finds the free key by retrying, not
    // by the holder's TTL: half of it leaves room for a loaded machine.
    let got = tokio::time::timeout(ttl / 2, task)
        .await
        .or_fail("the waiter waited for the TTL")?
        .or_fail("the waiting task")?
        .or_fail("the waiter acquires")?;
    println!(
        "hand-off without channel rights: {:?}",
        released_at.elapsed()
    );
    assert!(got.fence() > held.fence());
    let value = command(&server, &["GET", &lock_key]).await?;
    assert_eq!(value, got.owner().to_hex(), "the waiter holds the key");
    assert_eq!(
        holder
            .release(&held)
            .await
            .or_fail("the holder releases again")?,
        Released::AlreadyGone
    );
    let again = holder.try_acquire(&key, ttl).await;
    assert!(matches!(again, Ok(None)), "{again:?}");
    assert_eq!(
        waiter.release(&got).await.or_fail("the waiter releases")?,
        Released::Released
    );
    assert_eq!(command(&server, &["EXISTS", &lock_key]).await?, "0");
    // One warning for the refused announcement, and only one, however many releases.
    let second = holder
        .try_acquire(&key, ttl)
        .await
        .or_fail("the holder acquires again")?
        .or_fail("the key is free")?;
    {
        let _guard = tracing::subscriber::set_default(warnings.clone());
        // A proclaim is announced the same way: refused, yet stored, and not warned twice.
        holder
            .proclaim(&second, b"10.0.0.9:80")
            .await
            .or_fail("the holder proclaims")?;
        let seen = waiter.inspect(&key).await.or_fail("the waiter inspects")?;
        assert_eq!(seen.value.as_deref(), Some(&b"10.0.0.9:80"[..]));
        assert_eq!(
            holder
                .release(&second)
                .await
                .or_fail("the holder releases")?,
            Released::Released
        );
    }
    let warnings = warnings.taken();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].contains("announce"), "{warnings:?}");
    assert!(!warnings[0].contains("nochan-pw"), "{warnings:?}");
    Ok(())
}

/// A holder that never announces its release (redis-py's `Lock`, any plain `SET NX PX` client,
/// or a leasehold release whose message was lost) deletes its key long before its TTL. A
/// waiter whose subscription is up must find the key free within its retry backoff, not sleep
/// until the expiry it saw at its first try.
///
/// The bound: the waiter holds the key less than TTL/2 after the delete. Retrying every few
/// hundred ms meets it with seconds to spare on a loaded machine. A waiter that sleeps until the
/// expiry it saw cannot: its first try is after the `SET`, so it wakes at the earliest at
/// `set + TTL`, which is `TTL - (delete - set)` after the delete; the test checks that
/// `delete - set < TTL/4`, so that is more than `3/4 TTL` after the delete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_holder_that_deletes_without_announcing_hands_off_well_before_its_ttl() -> TestResult
{
    let server = start().await?;
    let waiter = Arc::new(
        RedisAuthority::connect(&url(&server))
            .await
            .or_fail("connect the waiter")?,
    );
    let mut con = raw(&server).await?;
    let key = LockKey::new("silent-plain-holder").or_fail("the key")?;
    let lock_key = waiter.config().layout().lock_key(&key);
    let ttl = Duration::from_secs(8);
    let compare_and_delete = redis::Script::new(
        "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0",
    );

    let set_at = Instant::now();
    let set: Option<String> = redis::cmd("SET")
        .arg(&lock_key)
        .arg("0123456789abcdef0123456789abcdef")
        .arg("NX")
        .arg("PX")
        .arg(ttl.as_millis() as u64)
        .query_async(&mut con)
        .await
        .or_fail("the plain holder's SET")?;
    assert_eq!(set.as_deref(), Some("OK"));
    let task = {
        let (waiter, key) = (waiter.clone(), key.clone());
        tokio::spawn(async move { waiter.acquire(&key, ttl, ttl).await })
    };
    // The waiter's subscription is up: the announcement path is live, so this is not the
    // fallback for a subscription that is down.
    wait_subscribed(&mut con, 1).await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!task.is_finished(), "the waiter got a held key");
    let deleted: i64 = compare_and_delete
        .key(&lock_key)
        .arg("0123456789abcdef0123456789abcdef")
        .invoke_async(&mut con)
        .await
        .or_fail("the plain holder's compare-and-delete")?;
    let deleted_at = Instant::now();
    assert_eq!(deleted, 1);
    assert!(
        deleted_at - set_at < ttl / 4,
        "the machine is too slow for this test's bound: {:?} from SET to DEL",
        deleted_at - set_at
    );
    let got = tokio::time::timeout(ttl / 2, task).await;
    let took = deleted_at.elapsed();
    let got = got
        .or_fail(format!(
            "the waiter did not get the free key within TTL/2 ({took:?} after the delete)"
        ))?
        .or_fail("the waiting task")?
        .or_fail("the waiter acquires")?;
    println!("hand-off from a silent plain holder: {took:?} after its delete");
    let value = command(&server, &["GET", &lock_key]).await?;
    assert_eq!(value, got.owner().to_hex());
    assert_eq!(
        waiter.release(&got).await.or_fail("the waiter releases")?,
        Released::Released
    );
    Ok(())
}

/// A leasehold release whose announcement never reaches the waiter (here: the holder announces
/// on another channel, as a misconfigured client, or a message lost on the way would) is found
/// by the waiter's retries, well before the holder's TTL. The bound is derived as in
/// `a_plain_holder_that_deletes_without_announcing_hands_off_well_before_its_ttl`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_whose_announcement_is_lost_is_found_well_before_the_ttl() -> TestResult {
    let server = start().await?;
    let holder = RedisAuthority::connect(&format!("{}&channel=elsewhere", url(&server)))
        .await
        .or_fail("connect the holder")?;
    let waiter = Arc::new(
        RedisAuthority::connect(&url(&server))
            .await
            .or_fail("connect the waiter")?,
    );
    let mut con = raw(&server).await?;
    let key = LockKey::new("lost-announcement").or_fail("the key")?;
    let ttl = Duration::from_secs(8);
    let held = holder
        .try_acquire(&key, ttl)
        .await
        .or_fail("the holder acquires")?
        .or_fail("the key is free")?;
    let acquired_at = Instant::now();
    let task = {
        let (waiter, key) = (waiter.clone(), key.clone());
        tokio::spawn(async move { waiter.acquire(&key, ttl, ttl).await })
    };
    wait_subscribed(&mut con, 1).await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!task.is_finished(), "the waiter got a held key");
    assert_eq!(
        holder.release(&held).await.or_fail("the holder releases")?,
        Released::Released
    );
    let released_at = Instant::now();
    assert!(
        released_at - acquired_at < ttl / 4,
        "the machine is too slow for this test's bound: {:?} from acquire to release",
        released_at - acquired_at
    );
    let got = tokio::time::timeout(ttl / 2, task)
        .await
        .or_fail(format!(
            "the waiter did not get the free key within TTL/2 ({:?} after the release)",
            released_at.elapsed()
        ))?
        .or_fail("the waiting task")?
        .or_fail("the waiter acquires")?;
    println!(
        "hand-off after a lost announcement: {:?}",
        released_at.elapsed()
    );
    assert!(got.fence() > held.fence());
    assert_eq!(
        waiter.release(&got).await.or_fail("the waiter releases")?,
        Released::Released
    );
    Ok(())
}
