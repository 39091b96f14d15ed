//! A misbehaving server on etcd's port: an HTTP/1 server (a fake that reads the HTTP/2 preface
//! and answers as HTTP/1.1), answering every way. What each call must do is in tests/common.
#![cfg(all(
    feature = "postgres",
    feature = "redis",
    feature = "etcd",
    feature = "zookeeper"
))]

use leasehold::Error;

mod common;

use common::{bounded, connect, etcd, failed, fake, timed_out, Result, T};

/// etcd: connect makes the client (bounded), probes the minimum TTL (a grant and a revoke) and
/// reads the namespace, each bounded by the timeout.
const ETCD_CONNECT: u32 = 4;

/// An HTTP/1 server on etcd's port, answering every way: connect fails with a typed error in
/// time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_http1_server_fails_connect_in_time() -> Result {
    use fake::Behaviour::*;
    let cases: Vec<(&str, &'static [u8], fake::Behaviour, bool)> = vec![
        ("HTTP/1.1 200 OK", etcd::HTTP1_OK, Correct, false),
        (
            "HTTP/1.1 400 and close",
            etcd::HTTP1_BAD_REQUEST,
            Correct,
            true,
        ),
        ("garbage", etcd::HTTP1_OK, Garbage, false),
        (
            "half an HTTP/1 reply, then nothing",
            etcd::HTTP1_OK,
            HalfThenStall,
            false,
        ),
        (
            "half an HTTP/1 reply, then close",
            etcd::HTTP1_OK,
            CloseMidReply,
            false,
        ),
        ("no reply", etcd::HTTP1_OK, Silent, false),
        (
            "HTTP/1 just under the timeout",
            etcd::HTTP1_OK,
            Slow(T / 2),
            false,
        ),
        (
            "HTTP/1 just over the timeout",
            etcd::HTTP1_OK,
            Slow(T * 3 / 2),
            false,
        ),
    ];
    for (label, reply, how, close_after) in cases {
        let server = etcd::server(reply, how, close_after).await?;
        let url = format!(
            "etcd://127.0.0.1:{}?timeout_ms={}",
            server.port(),
            T.as_millis()
        );
        let what = format!("etcd connect, {label}");
        let (result, _) = bounded(&what, T, ETCD_CONNECT, connect(url)).await;
        let error = failed(&what, result);
        // Unreachable in time, or a protocol error (h2 refuses the HTTP/1 reply): either way
        // not a grant and not a wrong password.
        assert!(
            matches!(error, Error::Unavailable { .. } | Error::Backend { .. }),
            "{what}: {error:?}"
        );
        // Half an HTTP/1 reply is already a broken HTTP/2 frame; silence is a timeout.
        if how == Silent || how == Slow(T * 3 / 2) {
            timed_out(&what, &error);
        }
        assert!(server.accepted() >= 1, "{what}: the fake was never reached");
    }
    Ok(())
}
