//! Misbehaving Redis servers: a fake (a tokio listener on `127.0.0.1:0` speaking only as much
//! RESP as it takes) whose handshake, `CONFIG GET` or `PING` goes wrong, whose scripts answer
//! just under and just over the request timeout, that always says "held" while its pub/sub
//! handshake misbehaves, or whose renewals of a lease go wrong. What each call must do is in
//! tests/common; the script replies of the wrong type have a test file of their own.
#![cfg(all(
    feature = "postgres",
    feature = "redis",
    feature = "etcd",
    feature = "zookeeper"
))]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use leasehold::{Error, Lease, LeaseOptions, Released};

mod common;

use common::resp::{self, redis_url, redis_with_scripts, REDIS_CONNECT};
use common::{
    bounded, connect, failed, failed_any, fake, join_all, key, slack, timed_out, OrFail, Result,
    SLOW_T, T, TTL,
};

/// Every way the handshake can go wrong ends connect with a typed error within its requests'
/// time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_misbehaving_handshake_fails_connect_in_time() -> Result {
    use fake::Behaviour::*;
    for how in [
        Garbage,
        HalfThenStall,
        CloseMidReply,
        Silent,
        Slow(T * 3 / 2),
    ] {
        let (server, _) = resp::server(move |command| {
            let reply = resp::handshake_reply(command).unwrap_or_else(|| b"-ERR no\r\n".to_vec());
            (reply, how)
        })
        .await?;
        let what = format!("redis connect, handshake {how:?}");
        let (result, _) = bounded(&what, T, REDIS_CONNECT, connect(redis_url(&server, T))).await;
        let error = failed(&what, result);
        if matches!(how, HalfThenStall | Silent | Slow(_)) {
            timed_out(&what, &error);
        }
        assert!(server.accepted() >= 1, "{what}: the fake was never reached");
    }
    Ok(())
}

/// PING answered just under the timeout: connect succeeds; just over: a retryable timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_slow_ping_under_succeeds_over_times_out() -> Result {
    for (delay, succeeds) in [(SLOW_T / 2, true), (SLOW_T * 3 / 2, false)] {
        let (server, _) = resp::server(move |command| {
            let reply = resp::handshake_reply(command).unwrap_or_else(|| b"-ERR no\r\n".to_vec());
            let how = if resp::name(command) == "PING" {
                fake::Behaviour::Slow(delay)
            } else {
                fake::Behaviour::Correct
            };
            (reply, how)
        })
        .await?;
        let what = format!("redis connect, PING after {delay:?}");
        let (result, _) = bounded(
            &what,
            SLOW_T,
            REDIS_CONNECT,
            connect(redis_url(&server, SLOW_T)),
        )
        .await;
        if succeeds {
            let authority = result.or_fail(&what)?;
            assert_eq!(authority.capabilities().backend, "redis");
            let _ = authority.close().await;
        } else {
            timed_out(&what, &failed(&what, result));
        }
    }
    Ok(())
}

/// `CONFIG GET` answered with the wrong types, or refused: connect either fails with a typed
/// error or goes on without believing the fences durable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_config_of_the_wrong_type_claims_no_durability() -> Result {
    let replies: Vec<(&str, Vec<u8>)> = vec![
        ("an integer", b":1\r\n".to_vec()),
        ("a bulk string", resp::bulk("noeviction")),
        (
            "a pair with an integer value",
            b"*2\r\n$16\r\nmaxmemory-policy\r\n:1\r\n".to_vec(),
        ),
        ("an empty array", b"*0\r\n".to_vec()),
        ("a refusal", b"-ERR unknown command 'CONFIG'\r\n".to_vec()),
        ("garbage", fake::GARBAGE.to_vec()),
    ];
    for (label, reply) in replies {
        let (server, _) = resp::server(move |command| {
            if resp::name(command) == "CONFIG" {
                return (reply.clone(), fake::Behaviour::Correct);
            }
            let reply = resp::handshake_reply(command).unwrap_or_else(|| b"-ERR no\r\n".to_vec());
            (reply, fake::Behaviour::Correct)
        })
        .await?;
        let what = format!("redis connect, CONFIG GET answered with {label}");
        let (result, _) = bounded(&what, T, REDIS_CONNECT, connect(redis_url(&server, T))).await;
        match result {
            Ok(authority) => {
                assert!(
                    !authority.capabilities().durable_fences,
                    "{what}: fences declared durable"
                );
                let _ = authority.close().await;
            }
            Err(e) => {
                failed(&what, Err::<(), _>(e));
            }
        }
    }
    Ok(())
}

/// The acquire script answered just under the timeout: a grant. Just over: a retryable
/// timeout, no grant, and the lease the late reply made is released by the client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_slow_scripts_under_succeed_over_time_out() -> Result {
    let delay = Arc::new(Mutex::new(Duration::ZERO));
    let granted = Arc::new(AtomicUsize::new(0));
    let (d, g) = (delay.clone(), granted.clone());
    let (server, seen) = redis_with_scripts(move |kind, _| {
        let how = fake::Behaviour::Slow(*fake::lock(&d));
        match kind {
            resp::Script::Acquire => {
                g.fetch_add(1, Ordering::SeqCst);
                (b":7\r\n".to_vec(), how)
            }
            _ => (b":1\r\n".to_vec(), how),
        }
    })
    .await?;
    let authority = connect(redis_url(&server, SLOW_T))
        .await
        .or_fail("connect to the fake")?;

    // Just under.
    *fake::lock(&delay) = SLOW_T / 2;
    let what = "redis try_acquire, answered just under the timeout";
    let a = authority.clone();
    let (result, _) = bounded(
        what,
        SLOW_T,
        1,
        async move { a.try_acquire(&key()?, TTL).await },
    )
    .await;
    let grant = result
        .or_fail(what)?
        .or_fail("a grant made in time is a grant")?;
    assert_eq!(granted.load(Ordering::SeqCst), 1);
    let what = "redis renew, answered just under the timeout";
    let (a, g) = (authority.clone(), grant.clone());
    let (result, _) = bounded(what, SLOW_T, 1, async move { a.renew(&g, TTL).await }).await;
    result.or_fail(what)?;
    let what = "redis release, answered just under the timeout";
    let (a, g) = (authority.clone(), grant.clone());
    let (result, _) = bounded(what, SLOW_T, 1, async move { a.release(&g).await }).await;
    assert_eq!(result.or_fail(what)?, Released::Released);

    // Just over.
    *fake::lock(&delay) = SLOW_T * 3 / 2;
    let what = "redis renew, answered just over the timeout";
    let (a, g) = (authority.clone(), grant.clone());
    let (result, _) = bounded(what, SLOW_T, 1, async move { a.renew(&g, TTL).await }).await;
    timed_out(what, &failed(what, result));
    let what = "redis try_acquire, answered just over the timeout";
    let a = authority.clone();
    let (result, _) = bounded(
        what,
        SLOW_T,
        1,
        async move { a.try_acquire(&key()?, TTL).await },
    )
    .await;
    timed_out(what, &failed(what, result));
    assert_eq!(
        granted.load(Ordering::SeqCst),
        2,
        "the fake saw the second acquisition"
    );
    // The fake made that lease (late); the client, told nothing in time, must take it back:
    // a release with the same owner token follows on the same connection.
    let acquired = seen.scripts(resp::Script::Acquire);
    let late_token = acquired
        .last()
        .cloned()
        .or_fail("the late acquisition's owner token")?;
    let released_by = Instant::now() + SLOW_T * 4 + slack(SLOW_T);
    loop {
        if seen.scripts(resp::Script::Release).contains(&late_token) {
            break;
        }
        assert!(
            Instant::now() < released_by,
            "the lease made by the late acquisition was never released: {:?}",
            fake::lock(&seen.0)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = authority.close().await;
    Ok(())
}

/// A server that always answers "held" (the holder's lease ending in 0 ms, never, or at the
/// far end of an i64), while the subscription's handshake misbehaves: acquire waits out
/// `max_wait` and ends with a `Timeout` (contention), never a grant, and a subscription that
/// does not come up costs at most one request timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_acquire_from_a_server_that_always_says_held_times_out() -> Result {
    use fake::Behaviour::*;
    let max_wait = T * 2;
    for (held, hello) in [
        (":-1\r\n", Correct),
        (":0\r\n", Garbage),
        (":-9223372036854775808\r\n", HalfThenStall),
        (":-1\r\n", CloseMidReply),
        (":-2\r\n", Silent),
    ] {
        let (server, _) = resp::server(move |command| {
            if resp::script(command) == Some(resp::Script::Acquire) {
                return (held.as_bytes().to_vec(), Correct);
            }
            let reply = resp::handshake_reply(command).unwrap_or_else(|| b"-ERR no\r\n".to_vec());
            let how = if resp::name(command) == "HELLO" {
                hello
            } else {
                Correct
            };
            (reply, how)
        })
        .await?;
        let authority = connect(redis_url(&server, T))
            .await
            .or_fail("connect to the fake")?;
        let what = format!(
            "redis acquire, always held ({}), HELLO {hello:?}",
            held.trim()
        );
        let a = authority.clone();
        // The subscription settles (one timeout), then attempts until max_wait (two), then
        // the attempt under way (one).
        let (result, took) = bounded(&what, T, 4, async move {
            a.acquire(&key()?, TTL, max_wait).await
        })
        .await;
        let error = failed_any(&what, result);
        assert!(matches!(error, Error::Timeout { .. }), "{what}: {error:?}");
        assert!(
            took >= max_wait,
            "{what}: gave up after {took:?}, before {max_wait:?}"
        );
        let what = format!("redis try_acquire, always held ({})", held.trim());
        let a = authority.clone();
        let (result, _) = bounded(
            &what,
            T,
            1,
            async move { a.try_acquire(&key()?, TTL).await },
        )
        .await;
        assert!(
            result.or_fail(&what)?.is_none(),
            "{what}: a grant from a held key"
        );
        let _ = authority.close().await;
    }
    Ok(())
}

/// A lease whose server stops renewing it (no answer, garbage, a reply of the wrong type, a
/// refusal, half a reply and close) is lost by its local deadline, and `ensure_valid` says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_lease_whose_renewals_go_wrong_is_lost_by_its_deadline() -> Result {
    use fake::Behaviour::*;
    let ttl = Duration::from_secs(1);
    // A lease renews with `renew_many` (one grant: the same keys and arguments as `renew`), so
    // the replies have its shape: one integer per grant.
    let cases: Vec<(&str, &'static [u8], fake::Behaviour)> = vec![
        ("no answer", b"*1\r\n:1\r\n", Silent),
        ("garbage", b"*1\r\n:1\r\n", Garbage),
        ("a status reply", b"+OK\r\n", Correct),
        ("a refusal", b"*1\r\n:0\r\n", Correct),
        ("half a reply, then close", b"*1\r\n:1\r\n", CloseMidReply),
    ];
    let mut runs = tokio::task::JoinSet::new();
    for (label, reply, how) in cases {
        runs.spawn(async move {
            let (server, _) = redis_with_scripts(move |kind, _| match kind {
                resp::Script::Acquire => (b":7\r\n".to_vec(), Correct),
                _ => (reply.to_vec(), how),
            })
            .await?;
            let authority = connect(redis_url(&server, T))
                .await
                .or_fail("connect to the fake")?;
            let lease = Lease::try_acquire(
                authority,
                &key().or_fail("the key")?,
                ttl,
                LeaseOptions::default(),
            )
            .await
            .or_fail(format!("renewals answered with {label}: acquire"))?
            .or_fail("the fake grants the acquisition")?;
            let deadline = lease.deadline();
            let by = deadline + slack(T);
            let reason = tokio::time::timeout_at(by, lease.lost()).await;
            let reason = reason.or_fail(format!(
                "renewals answered with {label}: the lease is not lost {:?} after its deadline",
                slack(T)
            ))?;
            assert!(
                lease.ensure_valid().is_err(),
                "renewals answered with {label}: lost ({reason}) but still valid"
            );
            assert!(lease.is_lost(), "renewals answered with {label}");
            if label == "a refusal" {
                assert!(
                    matches!(reason, leasehold::LostReason::Refused),
                    "a refused renewal: {reason:?}"
                );
            }
            println!("redis lease, renewals answered with {label}: lost ({reason})");
            drop(lease);
            drop(server);
            Ok(())
        });
    }
    join_all(runs).await
}
