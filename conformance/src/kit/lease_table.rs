//! Cancellation scenarios for authorities whose leases are rows of a lease table (PostgreSQL,
//! MySQL/MariaDB), written once: each backend's test calls them with its own server and
//! reaches the table through a [`LeaseTable`].

use std::future::Future;
use std::time::Duration;

use async_trait::async_trait;
use leasehold_core::{Authority, Error, Instant, LockKey, Released};

use super::{OrFail, TestResult};
use crate::scenarios::cut_short;

/// What a test does to the lease table behind the authority's back, in the server's SQL.
#[async_trait]
pub trait LeaseTable: Send + Sync {
    /// Leases of `key` that are live by the server's clock.
    async fn live_rows(&self, key: &LockKey) -> TestResult<i64>;

    /// An operator's transaction locks the row of `key` (`SELECT ... FOR UPDATE`) and keeps
    /// it locked until [`LockedRow::expire_and_commit`].
    async fn lock_row(&self, key: &LockKey) -> TestResult<Box<dyn LockedRow>>;
}

/// A lease row an operator's open transaction holds locked.
#[async_trait]
pub trait LockedRow: Send {
    /// Ends the lease in that transaction (as if long expired) and commits, which lets the
    /// row go.
    async fn expire_and_commit(self: Box<Self>) -> TestResult;
}

/// Acquisitions cut off at random points around one round trip (an acquire that waits:
/// within its wait), `rounds` times: afterwards nothing of ours is left live and another
/// client gets the key at once, not after the TTL. The cuts are the conformance suite's (a
/// timer, or a random number of polls: tokio's timers tick in whole milliseconds, longer than
/// an acquisition on loopback).
///
/// `admin` and `a` are two clients of the server, `connect` makes another, and `table` reads
/// the lease table.
pub async fn cancelled_acquisitions_leave_no_lease_behind<A, C, F>(
    admin: &A,
    a: &A,
    connect: C,
    table: &dyn LeaseTable,
    rounds: usize,
) -> TestResult
where
    A: Authority,
    C: FnOnce() -> F,
    F: Future<Output = TestResult<A>>,
{
    let ttl = Duration::from_secs(20);
    let k = LockKey::new("cancelled").or_fail("the key")?;
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
    for i in 0..rounds {
        // The acquire rounds find the key held for a moment by another client (its lease ends
        // by the server's clock 5 ms on): the acquire waits, and is cut at random moments of
        // its wait too.
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
                let released = a
                    .release(&g)
                    .await
                    .or_fail(format!("round {i}: release what was won"))?;
                if released != Released::Released {
                    return Err(format!("round {i}: releasing what was won: {released:?}").into());
                }
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
        while table.live_rows(&k).await? > 0 {
            if started.elapsed() >= ttl / 4 {
                return Err(format!(
                    "a lease left by a cut-off acquisition stayed live ({won} won, {cut} cut)"
                )
                .into());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    println!("round trip {trip:?}: {won} won, {cut} cut off, {busy} found it taken");
    if cut == 0 || won == 0 {
        return Err(format!("{won} won, {cut} cut: the cut-offs missed the window").into());
    }
    let b = connect().await?;
    let g = b
        .acquire(&k, ttl, ttl / 4)
        .await
        .or_fail("another client acquires afterwards")?;
    let _ = b.release(&g).await.or_fail("the other client releases")?;
    Ok(())
}

/// An acquisition that times out while its statement waits at the server (on a row lock an
/// operator's transaction holds), and lands later, is given back at once instead of holding
/// the key for its TTL: the timeout is `Unavailable` and retryable, and another client gets
/// the key well within the TTL, with a fence past the one the late statement took.
///
/// `admin` and `a` are two clients of a server whose requests give up long before the TTL
/// (20 s), `connect` makes another, and `table` reaches the lease table.
pub async fn a_timed_out_acquisition_is_given_back_when_it_lands<A, C, F>(
    admin: &A,
    a: &A,
    connect: C,
    table: &dyn LeaseTable,
) -> TestResult
where
    A: Authority,
    C: FnOnce() -> F,
    F: Future<Output = TestResult<A>>,
{
    let ttl = Duration::from_secs(20);
    let k = LockKey::new("timed-out").or_fail("the key")?;
    let held = admin
        .try_acquire(&k, ttl)
        .await
        .or_fail("hold the key")?
        .or_fail("hold the key: a fresh key was held")?;
    let locked = table.lock_row(&k).await?;
    let err = match a.try_acquire(&k, ttl).await {
        Ok(g) => return Err(format!("an acquisition blocked on the row returned {g:?}").into()),
        Err(e) => e,
    };
    if !(matches!(err, Error::Unavailable { .. }) && err.is_retryable()) {
        return Err(
            format!("a timed-out acquisition must be Unavailable, retryable: {err:?}").into(),
        );
    }
    // The holder's lease ends (as if long expired) and the lock is let go: the waiting
    // statement now takes the key, for nobody.
    locked.expire_and_commit().await?;
    let b = connect().await?;
    let started = Instant::now();
    let g = b
        .acquire(&k, ttl, ttl / 4)
        .await
        .or_fail("the timed-out acquisition kept the key")?;
    if started.elapsed() >= ttl / 4 {
        return Err(format!("the key came free after {:?}", started.elapsed()).into());
    }
    if g.fence().value() <= held.fence().value() + 1 {
        return Err(format!(
            "the late acquisition did not take a fence: {:?} after {:?}",
            g.fence(),
            held.fence()
        )
        .into());
    }
    let _ = b.release(&g).await.or_fail("release")?;
    Ok(())
}
