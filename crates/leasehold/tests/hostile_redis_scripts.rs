//! Misbehaving Redis servers answering leasehold's scripts with replies of the wrong type or
//! shape, or broken in transport: never a grant the fake did not make, never a renewal, and an
//! acquisition whose outcome is unknown is given back. Among them, two defects found and fixed:
//! numeric text from a script read as an integer, and a `renew_many` reply of the wrong shape
//! counted as renewals. What each call must do is in tests/common.
#![cfg(all(
    feature = "postgres",
    feature = "redis",
    feature = "etcd",
    feature = "zookeeper"
))]

use std::sync::Arc;
use std::time::{Duration, Instant};

use leasehold::{Authority, Grant, Released};

mod common;

use common::resp::{self, redis_url, redis_with_scripts};
use common::{bounded, connect, failed, fake, key, slack, timed_out, OrFail, Result, T, TTL};

/// The ways the transport can spoil a well-formed `reply`: garbage instead, half of it and then
/// nothing or a close, nothing at all, or the reply after the timeout.
fn transport_faults(reply: &[u8]) -> Vec<(&'static str, Vec<u8>, fake::Behaviour)> {
    use fake::Behaviour::*;
    vec![
        ("bytes that are no RESP", reply.to_vec(), Garbage),
        ("half a reply, then nothing", reply.to_vec(), HalfThenStall),
        ("half a reply, then close", reply.to_vec(), CloseMidReply),
        ("no reply", reply.to_vec(), Silent),
        ("a reply after the timeout", reply.to_vec(), Slow(T * 3 / 2)),
    ]
}

/// Replies of the wrong type, or broken, to the acquire script: never a grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_acquire_script_garbage_is_never_a_grant() -> Result {
    use fake::Behaviour::*;
    let fence_too_big = format!(":{}\r\n", 1u64 << 50).into_bytes();
    let replies: Vec<(&str, Vec<u8>, fake::Behaviour)> = vec![
        (
            "a bulk string of garbage",
            resp::bulk("garbage\u{1}"),
            Correct,
        ),
        ("a status reply", b"+OK\r\n".to_vec(), Correct),
        (
            "an array of integers",
            b"*2\r\n:7\r\n:8\r\n".to_vec(),
            Correct,
        ),
        ("a one-element array", b"*1\r\n:7\r\n".to_vec(), Correct),
        ("a nil bulk string", b"$-1\r\n".to_vec(), Correct),
        ("a nil array", b"*-1\r\n".to_vec(), Correct),
        ("an error", b"-ERR something broke\r\n".to_vec(), Correct),
        (
            "a script error",
            b"-NOSCRIPT No matching script\r\n".to_vec(),
            Correct,
        ),
        ("a fence out of range", fence_too_big, Correct),
        ("an integer that is not one", b":12x\r\n".to_vec(), Correct),
    ]
    .into_iter()
    .chain(transport_faults(b":7\r\n"))
    .collect();
    for (label, reply, how) in replies {
        let answer = reply.clone();
        let (server, seen) = redis_with_scripts(move |kind, _| match kind {
            resp::Script::Release => (b":1\r\n".to_vec(), Correct),
            _ => (answer.clone(), how),
        })
        .await?;
        let authority = connect(redis_url(&server, T))
            .await
            .or_fail("connect to the fake")?;
        let what = format!("redis try_acquire, script answers {label}");
        let a = authority.clone();
        let (result, _) = bounded(
            &what,
            T,
            1,
            async move { a.try_acquire(&key()?, TTL).await },
        )
        .await;
        match result {
            // A negative integer means "held": a correct `None`. Nothing here is one, but an
            // Ok(None) grants nothing either.
            Ok(None) => {}
            other => {
                failed(&what, other);
            }
        }
        let what = format!("redis acquire, script answers {label}");
        let a = authority.clone();
        // acquire waits up to one timeout for the subscription to settle, then attempts.
        let (result, _) =
            bounded(&what, T, 2, async move { a.acquire(&key()?, TTL, T).await }).await;
        let error = failed(&what, result);
        if matches!(how, HalfThenStall | Silent | Slow(_)) {
            timed_out(&what, &error);
        }
        // A well-formed reply that does not say what the script did (anything but a server
        // error), or one that came too late, may hide a lease the server made: the client
        // takes it back with a release for the same owner token, on the same connection. A
        // reply that is not RESP at all (or half of one, or none) leaves that connection
        // unusable, and the lease runs out its TTL, as one made by any request in flight may;
        // nobody believes it held.
        let server_error = reply.starts_with(b"-");
        let not_resp = label == "an integer that is not one";
        if !server_error && !not_resp && matches!(how, Correct | Slow(_)) {
            let acquired = seen.scripts(resp::Script::Acquire);
            assert!(
                !acquired.is_empty(),
                "{label}: no acquisition reached the fake"
            );
            let by = Instant::now() + T * 3 / 2 + slack(T);
            while !acquired
                .iter()
                .all(|t| seen.scripts(resp::Script::Release).contains(t))
            {
                assert!(
                    Instant::now() < by,
                    "{label}: an acquisition whose outcome is unknown was not released: {:?}",
                    fake::lock(&seen.0)
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        let _ = authority.close().await;
    }
    Ok(())
}

/// Replies of the wrong type, or broken, to renew, renew_many and release of a grant the fake
/// really made: a renewal is never believed, and nothing panics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_renew_and_release_garbage_is_never_a_renewal() -> Result {
    use fake::Behaviour::*;
    let replies: Vec<(&str, Vec<u8>, fake::Behaviour)> = vec![
        ("a bulk string of garbage", resp::bulk("garbage"), Correct),
        ("a status reply", b"+OK\r\n".to_vec(), Correct),
        ("an integer other than 1", b":7\r\n".to_vec(), Correct),
        (
            "an array of two integers, the first not 1",
            b"*2\r\n:0\r\n:1\r\n".to_vec(),
            Correct,
        ),
        ("an empty array", b"*0\r\n".to_vec(), Correct),
        ("a nil bulk string", b"$-1\r\n".to_vec(), Correct),
        ("an error", b"-ERR something broke\r\n".to_vec(), Correct),
    ]
    .into_iter()
    .chain(transport_faults(b":1\r\n"))
    .collect();
    for (label, reply, how) in replies {
        let answer = reply.clone();
        let (server, _) = redis_with_scripts(move |kind, _| match kind {
            resp::Script::Acquire => (b":7\r\n".to_vec(), Correct),
            _ => (answer.clone(), how),
        })
        .await?;
        let authority = connect(redis_url(&server, T))
            .await
            .or_fail("connect to the fake")?;
        let grant: Grant = authority
            .try_acquire(&key().or_fail("the key")?, TTL)
            .await
            .or_fail(format!("{label}: the first acquisition"))?
            .or_fail("the fake grants the first acquisition")?;
        assert_eq!(grant.fence().raw(), 7);

        let what = format!("redis renew, script answers {label}");
        let (a, g) = (authority.clone(), grant.clone());
        let (result, _) = bounded(&what, T, 1, async move { a.renew(&g, TTL).await }).await;
        let error = failed(&what, result);
        if matches!(how, HalfThenStall | Silent | Slow(_)) {
            timed_out(&what, &error);
        }

        let what = format!("redis renew_many, script answers {label}");
        let (a, g) = (authority.clone(), grant.clone());
        let (results, _) = bounded(&what, T, 1, async move {
            Ok(a.renew_many(std::slice::from_ref(&g)).await)
        })
        .await;
        let results = results.or_fail(&what)?;
        assert_eq!(results.len(), 1, "{what}");
        for result in results {
            failed(&what, result);
        }

        let what = format!("redis release, script answers {label}");
        let (a, g) = (authority.clone(), grant.clone());
        let (result, _) = bounded(&what, T, 1, async move { a.release(&g).await }).await;
        match result {
            // An integer other than 1 or 2 reads as "not ours any more": nothing is held.
            Ok(Released::AlreadyGone) if label == "an integer other than 1" => {}
            other => {
                failed(&what, other);
            }
        }
        let _ = authority.close().await;
    }
    Ok(())
}

/// A fake Redis that grants the first acquisition (fence 7) and answers every other script
/// with `reply`; connected, with that grant.
async fn redis_granted_then(reply: Vec<u8>) -> Result<(fake::Server, Arc<dyn Authority>, Grant)> {
    let (server, _) = redis_with_scripts(move |kind, _| match kind {
        resp::Script::Acquire => (b":7\r\n".to_vec(), fake::Behaviour::Correct),
        _ => (reply.clone(), fake::Behaviour::Correct),
    })
    .await?;
    let authority = connect(redis_url(&server, T))
        .await
        .or_fail("connect to the fake")?;
    let grant = authority
        .try_acquire(&key().or_fail("the key")?, TTL)
        .await
        .or_fail("the first acquisition")?
        .or_fail("the fake grants the first acquisition")?;
    Ok((server, authority, grant))
}

/// `renew_many` expects an array with one integer per grant: an integer alone (what `renew`
/// gets), or nothing at all, renews nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_renew_many_wrong_types_renew_nothing() -> Result {
    for (label, reply) in [
        ("an integer where an array is expected", b":1\r\n".to_vec()),
        ("a status reply", b"+OK\r\n".to_vec()),
        ("a nil array", b"*-1\r\n".to_vec()),
        ("an array of arrays", b"*1\r\n*1\r\n:1\r\n".to_vec()),
    ] {
        let (_server, authority, grant) = redis_granted_then(reply).await?;
        let what = format!("redis renew_many, script answers {label}");
        let (a, g) = (authority.clone(), grant.clone());
        let (results, _) = bounded(&what, T, 1, async move {
            Ok(a.renew_many(std::slice::from_ref(&g)).await)
        })
        .await;
        let results = results.or_fail(&what)?;
        assert_eq!(results.len(), 1, "{what}");
        for result in results {
            failed(&what, result);
        }
        let _ = authority.close().await;
    }
    Ok(())
}

/// Defect: `renew_many` takes any reply that converts to a vector of integers, so a bulk
/// string `"1"` (the client library makes it `[1]`) or an array longer than the batch renews
/// the grant. Only an array of exactly one integer per grant is an answer to the request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_renew_many_reply_of_the_wrong_shape_is_no_renewal() -> Result {
    for (label, reply) in [
        ("a bulk string where an array is expected", resp::bulk("1")),
        (
            "an array longer than the batch",
            b"*2\r\n:1\r\n:1\r\n".to_vec(),
        ),
    ] {
        let (_server, authority, grant) = redis_granted_then(reply).await?;
        let what = format!("redis renew_many, script answers {label}");
        let (a, g) = (authority.clone(), grant.clone());
        let (results, _) = bounded(&what, T, 1, async move {
            Ok(a.renew_many(std::slice::from_ref(&g)).await)
        })
        .await;
        for result in results.or_fail(&what)? {
            failed(&what, result);
        }
        let _ = authority.close().await;
    }
    Ok(())
}

/// Defect: the scripts return Lua numbers, which Redis sends as RESP integers only; the client
/// library converts text that reads as a number (a bulk or status string `7`) to an integer,
/// so such a reply to the acquire script becomes a grant with that fence, and to renew a
/// renewal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_numeric_text_from_a_script_is_no_grant_and_no_renewal() -> Result {
    for (label, text) in [
        ("a bulk string", resp::bulk("7")),
        ("a status reply", b"+7\r\n".to_vec()),
    ] {
        let reply = text.clone();
        let (server, _) =
            redis_with_scripts(move |_, _| (reply.clone(), fake::Behaviour::Correct)).await?;
        let authority = connect(redis_url(&server, T))
            .await
            .or_fail("connect to the fake")?;
        let what = format!("redis try_acquire, script answers {label} `7`");
        let a = authority.clone();
        let (result, _) = bounded(
            &what,
            T,
            1,
            async move { a.try_acquire(&key()?, TTL).await },
        )
        .await;
        failed(&what, result);
        let _ = authority.close().await;

        let one = if label == "a bulk string" {
            resp::bulk("1")
        } else {
            b"+1\r\n".to_vec()
        };
        let (_server, authority, grant) = redis_granted_then(one).await?;
        let what = format!("redis renew, script answers {label} `1`");
        let (a, g) = (authority.clone(), grant.clone());
        let (result, _) = bounded(&what, T, 1, async move { a.renew(&g, TTL).await }).await;
        failed(&what, result);
        let _ = authority.close().await;
    }
    Ok(())
}
