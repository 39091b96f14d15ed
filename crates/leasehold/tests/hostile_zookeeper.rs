//! Misbehaving ZooKeeper servers: a fake (length-prefixed frames, the connect handshake, replies
//! by xid) that never finishes the handshake, answers it just under the timeout and then refuses
//! or spoils every request, or grants absurd session timeouts. What each call must do is in
//! tests/common.
#![cfg(all(
    feature = "postgres",
    feature = "redis",
    feature = "etcd",
    feature = "zookeeper"
))]

use std::time::Duration;

use leasehold::Error;

mod common;

use common::{
    bounded, connect, failed, failed_any, fake, join_all, key, zk, OrFail, Result, SLOW_T, T, TTL,
};

/// ZooKeeper: connect opens a session with the longest timeout, two more to learn the shortest
/// (the second after the first got no answer), checks and makes the chroot, and reads the
/// ensemble's configuration: six requests, each bounded by the timeout.
const ZK_CONNECT: u32 = 6;

fn zk_url(server: &fake::Server, chroot: &str, timeout: Duration) -> String {
    format!(
        "zk://127.0.0.1:{}{chroot}?timeout_ms={}",
        server.port(),
        timeout.as_millis()
    )
}

/// A server that never finishes the handshake, every way: connect fails with a typed error in
/// time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_unfinished_handshake_fails_connect_in_time() -> Result {
    use fake::Behaviour::*;
    let handshake = |connect| zk::Mode::Handshake {
        connect,
        requests: Correct,
        error: zk::NO_NODE,
    };
    let modes = [
        handshake(Silent),
        handshake(HalfThenStall),
        handshake(CloseMidReply),
        handshake(Garbage),
        handshake(Slow(T * 3 / 2)),
        zk::Mode::HugeLength,
        zk::Mode::NegativeLength,
        zk::Mode::TruncatedResponse,
    ];
    for mode in modes {
        let server = zk::server(mode).await?;
        let what = format!("zookeeper connect, {mode:?}");
        let (result, _) =
            bounded(&what, T, ZK_CONNECT, connect(zk_url(&server, "/locks", T))).await;
        let error = failed(&what, result);
        assert!(
            matches!(error, Error::Unavailable { .. } | Error::Backend { .. }),
            "{what}: {error:?}"
        );
        assert!(server.accepted() >= 1, "{what}: the fake was never reached");
    }
    Ok(())
}

/// The handshake answered just under the timeout: connect succeeds. Then a server that answers
/// every request with an error, or misbehaves on it: no grant, a typed error in time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_slow_handshake_succeeds_and_refused_requests_grant_nothing() -> Result {
    use fake::Behaviour::*;
    // The cases run side by side: each takes a few request timeouts.
    let mut runs = tokio::task::JoinSet::new();
    for requests in [
        Correct,
        Garbage,
        HalfThenStall,
        CloseMidReply,
        Silent,
        Slow(SLOW_T * 3 / 2),
    ] {
        runs.spawn(async move {
            let server = zk::server(zk::Mode::Handshake {
                connect: Slow(SLOW_T / 2),
                requests,
                error: zk::MARSHALLING,
            })
            .await?;
            let what = format!(
                "zookeeper connect, handshake after {:?}, requests {requests:?}",
                SLOW_T / 2
            );
            // With the chroot `/` connect needs no request answered: reading the ensemble's
            // configuration may fail. So every handshake answered in time connects.
            let (result, _) = bounded(
                &what,
                SLOW_T,
                ZK_CONNECT,
                connect(zk_url(&server, "/", SLOW_T)),
            )
            .await;
            let authority = result.or_fail(&what)?;
            let what = format!("zookeeper try_acquire, requests {requests:?}");
            let a = authority.clone();
            // A new session for the TTL, then the requests of one attempt.
            let (result, _) = bounded(&what, SLOW_T, 4, async move {
                a.try_acquire(&key()?, TTL).await
            })
            .await;
            failed(&what, result);
            let _ = tokio::time::timeout(SLOW_T, authority.close()).await;
            Ok(())
        });
    }
    join_all(runs).await
}

/// A server granting a session timeout no server grants (zero, negative, one millisecond, the
/// largest): connect and an acquisition end in time with a typed result, nothing panics (in
/// the caller or in the client's background task), and nothing is granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_absurd_session_timeouts_are_typed_errors_or_harmless() -> Result {
    for granted in [0, -1, i32::MIN, 1, i32::MAX] {
        let server = zk::server(zk::Mode::GrantTimeout(granted)).await?;
        let what = format!("zookeeper connect, session timeout {granted} ms granted");
        let (result, _) = bounded(&what, T, ZK_CONNECT, connect(zk_url(&server, "/", T))).await;
        let authority = match result {
            Ok(authority) => authority,
            Err(e) => {
                failed_any(&what, Err::<(), _>(e));
                continue;
            }
        };
        let range = authority.capabilities().ttl;
        assert!(range.min <= range.max, "{what}: {range:?}");
        let what = format!("zookeeper try_acquire, session timeout {granted} ms granted");
        let a = authority.clone();
        let (result, _) = bounded(
            &what,
            T,
            4,
            async move { a.try_acquire(&key()?, TTL).await },
        )
        .await;
        failed_any(&what, result);
        let _ = tokio::time::timeout(T, authority.close()).await;
    }
    Ok(())
}
