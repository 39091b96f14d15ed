//! Misbehaving PostgreSQL servers: a fake that stops mid-startup, refuses just under and just
//! over the request timeout, or completes the startup and answers the lease statements slowly or
//! with rows of the wrong type or shape (a defect found and fixed: a `bigint` of fewer than 8
//! bytes decoded as a fence). What each call must do is in tests/common.
#![cfg(all(
    feature = "postgres",
    feature = "redis",
    feature = "etcd",
    feature = "zookeeper"
))]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use leasehold::{Error, Released};

mod common;

use common::pgq::{self, is_pg_release};
use common::{
    bounded, connect, failed, fake, join_all, key, pg, slack, timed_out, OrFail, Result, SLOW_T, T,
    TTL,
};

/// PostgreSQL: connect (the pool's first connection and one query) is bounded by one timeout in
/// all.
const PG_CONNECT: u32 = 1;

fn pg_url(server: &fake::Server, timeout: Duration) -> String {
    format!(
        "postgres://u@127.0.0.1:{}/db?timeout_ms={}",
        server.port(),
        timeout.as_millis()
    )
}

/// A server that stops mid-startup, every way: connect fails with a typed error in time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_server_stopping_mid_startup_fails_connect_in_time() -> Result {
    use fake::Behaviour::*;
    let modes = [
        pg::Mode::AuthOk(HalfThenStall),
        pg::Mode::AuthOk(CloseMidReply),
        pg::Mode::AuthOk(Garbage),
        pg::Mode::AuthOk(Silent),
        pg::Mode::AuthOkThenStall,
        pg::Mode::GarbageToSslRequest,
        pg::Mode::Refuse(HalfThenStall),
        pg::Mode::Refuse(CloseMidReply),
    ];
    for mode in modes {
        let server = pg::server(mode).await?;
        let what = format!("postgres connect, {mode:?}");
        let (result, _) = bounded(&what, T, PG_CONNECT, connect(pg_url(&server, T))).await;
        let error = failed(&what, result);
        if matches!(
            mode,
            pg::Mode::AuthOk(HalfThenStall | Silent) | pg::Mode::AuthOkThenStall
        ) {
            timed_out(&what, &error);
        }
        assert!(server.accepted() >= 1, "{what}: the fake was never reached");
    }
    Ok(())
}

/// A refusal just under the timeout is read (the credentials were refused); just over, the
/// connect is a retryable timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_slow_refusal_under_is_read_over_times_out() -> Result {
    for (delay, read) in [(SLOW_T / 2, true), (SLOW_T * 3 / 2, false)] {
        let server = pg::server(pg::Mode::Refuse(fake::Behaviour::Slow(delay))).await?;
        let what = format!("postgres connect, refused after {delay:?}");
        let (result, _) =
            bounded(&what, SLOW_T, PG_CONNECT, connect(pg_url(&server, SLOW_T))).await;
        let error = failed(&what, result);
        if read {
            assert!(
                matches!(error, Error::Unauthorized { .. }),
                "{what}: the refusal was not read: {error:?}"
            );
        } else {
            timed_out(&what, &error);
        }
    }
    Ok(())
}

/// What the fake PostgreSQL answers to the statements the authority runs, each delivered as
/// `how`: the settings at connect, the fence 7 to an acquisition, one row renewed or released.
fn pg_statement(query: &str, how: fake::Behaviour) -> pgq::Answer {
    let answer = if query.contains("current_setting") {
        pgq::Answer::settings()
    } else if query.contains("INSERT INTO") {
        pgq::Answer::fence(7)
    } else if is_pg_release(query) {
        // One row released; its column says whether it notified.
        pgq::Answer::rows(vec![("notified", pgq::BOOL)], vec![vec![Some(vec![0])]])
    } else if query.starts_with("UPDATE") {
        pgq::Answer::updated(1)
    } else {
        pgq::Answer::rows(Vec::new(), Vec::new())
    };
    answer.delivered(how)
}

/// Statements answered just under the timeout: connect, a grant, a renewal and a release
/// succeed. Just over: retryable timeouts, no grant, and the lease the late answer made is
/// given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_slow_statements_under_succeed_over_time_out() -> Result {
    let delay = Arc::new(Mutex::new(SLOW_T / 2));
    let d = delay.clone();
    let (server, executed) =
        pgq::server(move |query| pg_statement(query, fake::Behaviour::Slow(*fake::lock(&d))))
            .await?;
    let what = "postgres connect, statements answered just under the timeout";
    let (result, _) = bounded(what, SLOW_T, PG_CONNECT, connect(pg_url(&server, SLOW_T))).await;
    let authority = result.or_fail(what)?;
    let what = "postgres try_acquire, answered just under the timeout";
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
    assert_eq!(grant.fence().raw(), 7);
    let what = "postgres renew, answered just under the timeout";
    let (a, g) = (authority.clone(), grant.clone());
    let (result, _) = bounded(what, SLOW_T, 1, async move { a.renew(&g, TTL).await }).await;
    result.or_fail(what)?;
    let what = "postgres release, answered just under the timeout";
    let (a, g) = (authority.clone(), grant.clone());
    let (result, _) = bounded(what, SLOW_T, 1, async move { a.release(&g).await }).await;
    assert_eq!(result.or_fail(what)?, Released::Released);

    *fake::lock(&delay) = SLOW_T * 3 / 2;
    let what = "postgres renew, answered just over the timeout";
    let (a, g) = (authority.clone(), grant.clone());
    let (result, _) = bounded(what, SLOW_T, 1, async move { a.renew(&g, TTL).await }).await;
    timed_out(what, &failed(what, result));
    let releases = executed.releases();
    let what = "postgres try_acquire, answered just over the timeout";
    let a = authority.clone();
    let (result, _) = bounded(
        what,
        SLOW_T,
        1,
        async move { a.try_acquire(&key()?, TTL).await },
    )
    .await;
    timed_out(what, &failed(what, result));
    // The late answer made a lease nobody was told about: the client gives it back.
    let by = Instant::now() + SLOW_T * 4 + slack(SLOW_T);
    executed.await_release(releases, by, what).await;
    let _ = tokio::time::timeout(SLOW_T, authority.close()).await;
    Ok(())
}

/// An acquisition answered with a row of the wrong type or shape, a fence out of range, an
/// error, or a reply that breaks off: never a grant, a typed error in time; and where the row
/// did carry a number (so the server may have made a lease), the lease is given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_lease_rows_of_the_wrong_type_are_never_a_grant() -> Result {
    use fake::Behaviour::*;
    use pgq::{Answer, INT4, INT8, TEXT};
    let cases: Vec<(&str, Answer, bool)> = vec![
        (
            "a text fence",
            Answer::rows(vec![("fence", TEXT)], vec![vec![Some(b"7".to_vec())]]),
            false,
        ),
        (
            "an int4 fence",
            Answer::rows(
                vec![("fence", INT4)],
                vec![vec![Some(7i32.to_be_bytes().to_vec())]],
            ),
            false,
        ),
        (
            "three bytes for a bigint",
            Answer::rows(vec![("fence", INT8)], vec![vec![Some(vec![0, 0, 7])]]),
            false,
        ),
        (
            "a NULL fence",
            Answer::rows(vec![("fence", INT8)], vec![vec![None]]),
            false,
        ),
        (
            "a row without columns",
            Answer::rows(Vec::new(), vec![vec![]]),
            false,
        ),
        ("fence 0", Answer::fence(0), true),
        ("fence -1", Answer::fence(-1), true),
        ("fence i64::MIN", Answer::fence(i64::MIN), true),
        ("fence 2^50", Answer::fence(1 << 50), true),
        (
            "a serialization failure",
            Answer::error("40001", "could not serialize access"),
            false,
        ),
        (
            "an internal error",
            Answer::error("XX000", "something broke"),
            false,
        ),
        ("garbage", Answer::fence(7).delivered(Garbage), false),
        (
            "half a reply, then nothing",
            Answer::fence(7).delivered(HalfThenStall),
            false,
        ),
        (
            "half a reply, then close",
            Answer::fence(7).delivered(CloseMidReply),
            false,
        ),
        ("no reply", Answer::fence(7).delivered(Silent), false),
    ];
    let mut runs = tokio::task::JoinSet::new();
    for (label, bad, given_back) in cases {
        runs.spawn(async move {
            let (server, executed) = pgq::server(move |query| {
                if query.contains("INSERT INTO") {
                    bad.clone()
                } else {
                    pg_statement(query, Correct)
                }
            })
            .await?;
            let authority = connect(pg_url(&server, T))
                .await
                .or_fail("connect to the fake")?;
            let what = format!("postgres try_acquire, answered with {label}");
            let a = authority.clone();
            let (result, _) = bounded(
                &what,
                T,
                1,
                async move { a.try_acquire(&key()?, TTL).await },
            )
            .await;
            match result {
                Ok(None) => {}
                other => {
                    failed(&what, other);
                }
            }
            if given_back {
                let by = Instant::now() + T * 2 + slack(T);
                executed.await_release(0, by, &what).await;
            }
            let _ = tokio::time::timeout(T, authority.close()).await;
            Ok(())
        });
    }
    join_all(runs).await
}
