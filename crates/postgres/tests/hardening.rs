//! PostgreSQL's edges, each against a real server started by the harness: huge durations,
//! isolation levels set as a database default, cancelled and timed-out acquisitions, a
//! read-only (demoted) primary, and lanes whose connections were terminated. The listening
//! connection and connecting have test files of their own.
//!
//! Timing bounds are fractions of the TTL each test picks, never absolute guesses.

use std::time::Duration;

use leasehold_conformance::scenarios::cut_short;
use leasehold_core::{Authority, Error, Instant, LockKey, Released};
use leasehold_postgres::PostgresAuthority;

mod common;

use common::{connect, exec, key, start_server, url, OrFail, Result};

/// Leases of `key` that are live by the database's clock.
async fn live_rows(a: &PostgresAuthority, key: &LockKey) -> Result<i64> {
    sqlx::query_scalar(
        "SELECT count(*) FROM leasehold_leases WHERE lock_key = $1 AND expires_at > statement_timestamp()",
    )
    .bind(key.as_str())
    .fetch_one(a.pool())
    .await
    .or_fail(format!("count the live leases of {key}"))
}

// ---------------------------------------------------------------------------------------------
// `Duration::MAX` and huge durations in the URL.

/// `acquire(.., Duration::MAX)` means "wait as long as it takes", not a panic, and huge
/// `timeout_ms` / `listen_check_ms` are "no limit", not an overflow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duration_max_waits_forever_instead_of_panicking() -> Result {
    let server = start_server().await?;
    let admin = connect(&url(&server)).await?;
    admin.migrate().await.or_fail("migrate")?;
    let ttl = Duration::from_secs(4);
    let k = key("forever")?;
    for waiter_url in [
        url(&server),
        format!("{}?timeout_ms={}", server.url(), u64::MAX),
        format!(
            "{}?listen_check_ms={}&timeout_ms=1000",
            server.url(),
            u64::MAX
        ),
        // A margin as large as the TTL: grants end at once locally, but nothing overflows.
        format!(
            "{}?safety_margin_ms={}&timeout_ms=1000",
            server.url(),
            u64::MAX
        ),
    ] {
        let holder = admin
            .try_acquire(&k, ttl)
            .await
            .or_fail(format!("{waiter_url}: hold the key"))?
            .or_fail(format!("{waiter_url}: hold the key: it was held"))?;
        let waiter = connect(&waiter_url).await?;
        let wait = {
            let (waiter, k) = (waiter.clone(), k.clone());
            tokio::spawn(async move { waiter.acquire(&k, ttl, Duration::MAX).await })
        };
        tokio::time::sleep(ttl / 8).await;
        assert!(
            !wait.is_finished(),
            "{waiter_url}: returned while the key was held"
        );
        let released_at = Instant::now();
        assert_eq!(
            admin
                .release(&holder)
                .await
                .or_fail(format!("{waiter_url}: release"))?,
            Released::Released
        );
        let got = tokio::time::timeout(ttl / 2, wait)
            .await
            .or_fail(format!(
                "{waiter_url}: no hand-off within TTL/2 of the release"
            ))?
            .or_fail(format!("{waiter_url}: the waiter's task"))?
            .or_fail(format!("{waiter_url}: the waiter"))?;
        assert!(got.fence() > holder.fence());
        assert!(released_at.elapsed() < ttl / 2);
        // The other entry points with the huge timeout too.
        let again = waiter
            .try_acquire(&k, ttl)
            .await
            .or_fail(format!("{waiter_url}: try_acquire"))?;
        assert!(again.is_none(), "{waiter_url}: the key is held by `got`");
        waiter
            .renew(&got, ttl)
            .await
            .or_fail(format!("{waiter_url}: renew"))?;
        assert_eq!(
            waiter
                .release(&got)
                .await
                .or_fail(format!("{waiter_url}: the waiter releases"))?,
            Released::Released
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Repeatable read / serializable as the database's default.

async fn contend(url: &str, k: &LockKey, workers: usize, rounds: usize) -> Result<Vec<u64>> {
    let ttl = Duration::from_secs(2);
    let mut tasks = Vec::new();
    for _ in 0..workers {
        let a = connect(url).await?;
        let k = k.clone();
        tasks.push(tokio::spawn(async move {
            let mut fences = Vec::new();
            for _ in 0..rounds {
                // Bursts of try_acquire between the waiting acquisitions, to race on the row.
                for _ in 0..3 {
                    if let Some(g) = a.try_acquire(&k, ttl).await? {
                        fences.push(g.fence().value());
                        let _ = a.release(&g).await?;
                    }
                }
                let g = a.acquire(&k, ttl, ttl * 10).await?;
                fences.push(g.fence().value());
                a.renew(&g, ttl).await?;
                let _ = a.release(&g).await?;
            }
            Ok::<_, Error>(fences)
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(
            t.await
                .or_fail("a contender's task")?
                .or_fail("a contender")?,
        );
    }
    Ok(all)
}

/// Under `repeatable read` and `serializable` set with `ALTER DATABASE`, contended acquisitions
/// neither fail with SQLSTATE 40001 nor hand out a fence twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contention_under_repeatable_read_and_serializable_defaults() -> Result {
    let server = start_server().await?;
    let admin = connect(&url(&server)).await?;
    admin.migrate().await.or_fail("migrate")?;
    for level in ["repeatable read", "serializable"] {
        exec(
            &admin,
            &format!("ALTER DATABASE postgres SET default_transaction_isolation = '{level}'"),
        )
        .await?;
        let probe = connect(&url(&server)).await?;
        let shown: String = sqlx::query_scalar("SHOW default_transaction_isolation")
            .fetch_one(probe.pool())
            .await
            .or_fail("SHOW default_transaction_isolation")?;
        assert_eq!(shown, level);
        let k = key(&format!("isolation-{}", level.replace(' ', "-")))?;
        let (workers, rounds) = (6, 6);
        let mut fences = contend(&url(&server), &k, workers, rounds).await?;
        let n = fences.len();
        assert!(n >= workers * rounds, "{level}: {n} grants");
        fences.sort_unstable();
        fences.dedup();
        assert_eq!(fences.len(), n, "{level}: a fence was handed out twice");
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Cancelled and timed-out acquisitions give their lease back; a read-only server is
// an outage, not a permanent error.

/// Acquisitions cut off at random points around one round trip (an acquire that waits: within
/// its wait), hundreds of times: afterwards nothing of ours is left live and another client
/// gets the key at once, not after the TTL. The
/// cuts are the conformance suite's (a timer, or a random number of polls: tokio's timers tick
/// in whole milliseconds, longer than an acquisition on loopback).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_acquisitions_leave_no_lease_behind() -> Result {
    let server = start_server().await?;
    let admin = connect(&url(&server)).await?;
    admin.migrate().await.or_fail("migrate")?;
    let a = connect(&url(&server)).await?;
    let ttl = Duration::from_secs(20);
    let k = key("cancelled")?;
    // One round trip, measured: the median of a few acquire+release pairs, halved.
    let mut trips = Vec::new();
    for _ in 0..21 {
        let t = Instant::now();
        let g = a
            .try_acquire(&k, ttl)
            .await
            .or_fail("a measured acquisition")?
            .or_fail("a measured acquisition: the key was held")?;
        trips.push(t.elapsed());
        let _ = a.release(&g).await.or_fail("a measured release")?;
    }
    trips.sort();
    let trip = trips[trips.len() / 2];
    let (mut won, mut cut, mut busy) = (0, 0, 0);
    for i in 0..400 {
        // The acquire rounds find the key held for a moment by another client (its lease ends
        // by the database's clock 5 ms on): the acquire waits, and the attempt that wins is the
        // waiter's form (which marks the key), cut at random moments too.
        let span = if i % 2 == 0 {
            trip * 2
        } else {
            // (Held already when an earlier cut-off's statement is still landing: its lease is
            // given back at once, and the acquire waits for that instead.)
            let _ = admin
                .try_acquire(&k, Duration::from_millis(5))
                .await
                .or_fail(format!("round {i}: the other client's short hold"))?;
            Duration::from_millis(30)
        };
        let attempt = async {
            if i % 2 == 0 {
                a.try_acquire(&k, ttl).await
            } else {
                a.acquire(&k, ttl, ttl).await.map(Some)
            }
        };
        match cut_short(attempt, span).await {
            Some(Ok(Some(g))) => {
                won += 1;
                assert_eq!(
                    a.release(&g)
                        .await
                        .or_fail(format!("round {i}: release what was won"))?,
                    Released::Released
                );
            }
            // The statement of an earlier cut-off may still be landing (its lease is given back
            // as soon as it does, which the wait below checks).
            Some(Ok(None)) => busy += 1,
            Some(Err(e)) => return Err(format!("round {i}: {e:?}").into()),
            None => cut += 1,
        }
        // A lease left by a cut-off must be gone before the next attempt can be refused
        // for it: wait until the key is free again (bounded well below the TTL).
        let started = Instant::now();
        while live_rows(&admin, &k).await? > 0 {
            assert!(
                started.elapsed() < ttl / 4,
                "a lease left by a cut-off acquisition stayed live ({won} won, {cut} cut)"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    println!("round trip {trip:?}: {won} won, {cut} cut off, {busy} found it taken");
    assert!(
        cut > 0 && won > 0,
        "{won} won, {cut} cut: the cut-offs missed the window"
    );
    let b = connect(&url(&server)).await?;
    let g = b
        .acquire(&k, ttl, ttl / 4)
        .await
        .or_fail("another client acquires afterwards")?;
    let _ = b.release(&g).await.or_fail("the other client releases")?;
    Ok(())
}

/// An acquisition that times out while its statement waits at the server (here on a row lock
/// an administrator holds), and lands later, is given back at once instead of holding the key
/// for its TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_acquisition_is_given_back_when_it_lands() -> Result {
    let server = start_server().await?;
    let admin = connect(&url(&server)).await?;
    admin.migrate().await.or_fail("migrate")?;
    let a = connect(&url(&server)).await?;
    let ttl = Duration::from_secs(20);
    let k = key("timed-out")?;
    let held = admin
        .try_acquire(&k, ttl)
        .await
        .or_fail("hold the key")?
        .or_fail("hold the key: a fresh key was held")?;
    let mut tx = admin.pool().begin().await.or_fail("the operator's begin")?;
    sqlx::query("SELECT 1 FROM leasehold_leases WHERE lock_key = $1 FOR UPDATE")
        .bind(k.as_str())
        .execute(&mut *tx)
        .await
        .or_fail("the operator locks the row")?;
    let err = match a.try_acquire(&k, ttl).await {
        Ok(g) => return Err(format!("an acquisition blocked on the row returned {g:?}").into()),
        Err(e) => e,
    };
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
    // The holder's lease ends (as if long expired) and the lock is let go: the waiting
    // statement now takes the key, for nobody.
    sqlx::query(
        "UPDATE leasehold_leases SET expires_at = statement_timestamp() - interval '1 hour' \
         WHERE lock_key = $1",
    )
    .bind(k.as_str())
    .execute(&mut *tx)
    .await
    .or_fail("the operator ends the lease")?;
    tx.commit().await.or_fail("the operator's commit")?;
    let b = connect(&url(&server)).await?;
    let started = Instant::now();
    let g = b
        .acquire(&k, ttl, ttl / 4)
        .await
        .or_fail("the timed-out acquisition kept the key")?;
    assert!(started.elapsed() < ttl / 4);
    assert!(
        g.fence().value() > held.fence().value() + 1,
        "the late acquisition did take a fence"
    );
    let _ = b.release(&g).await.or_fail("release")?;
    Ok(())
}

/// A server that refuses writes (a demoted primary: SQLSTATE 25006) is `Unavailable` and
/// retryable, like Redis's READONLY; when it takes writes again, the same client works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_server_is_unavailable_and_retryable() -> Result {
    let server = start_server().await?;
    let admin = connect(&url(&server)).await?;
    admin.migrate().await.or_fail("migrate")?;
    let a = connect(&url(&server)).await?;
    let ttl = Duration::from_secs(5);
    let (k, other) = (key("read-only")?, key("read-only-2")?);
    let held = a
        .try_acquire(&k, ttl)
        .await
        .or_fail("hold the key")?
        .or_fail("hold the key: a fresh key was held")?;
    exec(
        &admin,
        "ALTER DATABASE postgres SET default_transaction_read_only = on",
    )
    .await?;
    // Existing sessions keep their setting; a new client sees the read-only server.
    let ro = connect(&url(&server)).await?;
    let refused = |what: &str, result: leasehold_core::Result<()>| match result {
        Ok(()) => Err(format!("{what} succeeded on a read-only server")),
        Err(e) => Ok(e),
    };
    let err = refused("try_acquire", ro.try_acquire(&other, ttl).await.map(|_| ()))?;
    assert!(
        matches!(err, Error::Unavailable { .. }) && err.is_retryable(),
        "{err:?}"
    );
    let err = refused("acquire", ro.acquire(&other, ttl, ttl).await.map(|_| ()))?;
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
    let err = refused("renew", ro.renew(&held, ttl).await.map(|_| ()))?;
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
    let err = refused("release", ro.release(&held).await.map(|_| ()))?;
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
    exec(
        &admin,
        "ALTER DATABASE postgres RESET default_transaction_read_only",
    )
    .await?;
    // The writable server is back (as a new primary would be): the connections that met the
    // read-only one were closed, so the same client reaches it again.
    let started = Instant::now();
    let g = loop {
        match ro.try_acquire(&other, ttl).await {
            Ok(g) => break g.or_fail("nobody else holds it")?,
            Err(e @ Error::Unavailable { .. }) => {
                assert!(
                    started.elapsed() < ttl,
                    "still read-only after {:?}: {e}",
                    started.elapsed()
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => return Err(format!("{e:?}").into()),
        }
    };
    assert_eq!(
        ro.release(&g)
            .await
            .or_fail("release on the writable server")?,
        Released::Released
    );
    assert_eq!(
        a.release(&held).await.or_fail("release the first lease")?,
        Released::Released
    );
    Ok(())
}

/// Lease statements run on lanes (kept connections) instead of sqlx's pool, which
/// pinged every connection it took back. What the ping protected against still holds: with every
/// lane's server process terminated (an operator, a failover), a lane used within the last second
/// fails its next statement with a retryable error and connects afresh, so the call after it
/// succeeds; a lane idle for longer is pinged first and replaced before the statement, so the
/// call succeeds at once. Nothing is left held by mistake either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lanes_recover_from_terminated_connections() -> Result {
    let server = start_server().await?;
    let url = url(&server);
    let a = connect(&format!("{url}&pool_size=2")).await?;
    a.migrate().await.or_fail("migrate")?;
    let admin = connect(&url).await?;
    let ttl = Duration::from_secs(5);
    let terminate = || async {
        let killed: i64 = sqlx::query_scalar(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid() \
               AND backend_type = 'client backend' AND query NOT ILIKE '%LISTEN%'",
        )
        .fetch_one(admin.pool())
        .await
        .or_fail("terminate the lanes' server processes")?;
        Ok::<_, common::Failure>(killed)
    };
    let (hot, idle) = (key("lane/hot")?, key("lane/idle")?);
    // A lane in use a moment ago.
    let g = a
        .try_acquire(&hot, ttl)
        .await
        .or_fail("acquire on a hot lane")?
        .or_fail("acquire on a hot lane: a fresh key was held")?;
    assert!(terminate().await? >= 1);
    let mut failed = 0;
    let released = loop {
        match a.release(&g).await {
            Ok(r) => break r,
            Err(e) => {
                assert!(e.is_retryable(), "{e}");
                failed += 1;
                assert!(failed <= 2, "the lane did not reconnect: {e}");
            }
        }
    };
    assert_eq!(released, Released::Released);
    assert_eq!(live_rows(&admin, &hot).await?, 0);
    // Lanes idle past the ping threshold are replaced before use.
    let g = a
        .try_acquire(&idle, ttl)
        .await
        .or_fail("acquire on an idle lane")?
        .or_fail("acquire on an idle lane: a fresh key was held")?;
    assert!(terminate().await? >= 1);
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(
        a.release(&g).await.or_fail("release on a replaced lane")?,
        Released::Released
    );
    let again = a
        .try_acquire(&idle, ttl)
        .await
        .or_fail("acquire after the release")?;
    assert!(again.is_some(), "the key was left held");
    Ok(())
}
