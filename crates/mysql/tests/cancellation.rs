//! Cancellation against a real MariaDB: acquisitions cut off at random points around one round
//! trip leave nothing live behind, and an acquisition whose caller timed out while its
//! statement waited on a row lock is given back when it lands, instead of holding the key for
//! its TTL.

use std::time::Duration;

use leasehold_conformance::scenarios::cut_short;
use leasehold_core::{Authority, Error, Instant, LockKey, Released};
use leasehold_mysql::MysqlAuthority;

mod common;

use common::{connect, key, start_server, url, OrFail, Result};

/// Leases of `key` that are live by the server's clock.
async fn live_rows(a: &MysqlAuthority, key: &LockKey) -> Result<i64> {
    sqlx::query_scalar(
        "SELECT count(*) FROM leasehold_leases WHERE lock_key = ? AND expires_at > UTC_TIMESTAMP(6)",
    )
    .bind(key.as_str())
    .fetch_one(a.pool())
    .await
    .or_fail(format!("count the live leases of {key}"))
}

/// Acquisitions cut off at random points around one round trip (an acquire that waits:
/// within its wait), hundreds of times: afterwards nothing of ours is left live and another
/// client gets the key at once, not after the TTL.
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
    for i in 0..300 {
        // The acquire rounds find the key held for a moment by another client: the acquire
        // polls, and is cut at random moments of its wait too.
        let span = if i % 2 == 0 {
            trip * 2
        } else {
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
        // A lease left by a cut-off must be gone before the next attempt can be refused for
        // it: wait until the key is free again (bounded well below the TTL).
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

/// An acquisition that times out while its statement waits at the server (on a row lock an
/// operator's transaction holds), and lands later, is given back at once instead of holding
/// the key for its TTL.
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
    sqlx::query("SELECT 1 FROM leasehold_leases WHERE lock_key = ? FOR UPDATE")
        .bind(k.as_str())
        .execute(&mut *tx)
        .await
        .or_fail("the operator locks the row")?;
    let err = match a.try_acquire(&k, ttl).await {
        Ok(g) => return Err(format!("an acquisition blocked on the row returned {g:?}").into()),
        Err(e) => e,
    };
    assert!(
        matches!(err, Error::Unavailable { .. } | Error::Timeout { .. }) && err.is_retryable(),
        "{err:?}"
    );
    // The holder's lease ends (as if long expired) and the lock is let go: the waiting
    // statement now takes the key, for nobody.
    sqlx::query(
        "UPDATE leasehold_leases SET expires_at = UTC_TIMESTAMP(6) - INTERVAL 1 HOUR \
         WHERE lock_key = ?",
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
