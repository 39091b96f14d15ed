//! Waiters counted: where contenders queue in the authority, inspect says how many wait.

use std::time::Duration;

use leasehold_core::{Authority, Grant, Inspection, Instant, Lease, LeaseOptions, LockKey};
use tokio::task::JoinHandle;

use crate::context::Context;
use crate::ensure;
use crate::verdict::{Failure, OrFail, Outcome, Verdict};

/// How often the count is read while it settles.
const EVERY: Duration = Duration::from_millis(10);

/// Inspects `key` until its waiter count is `want`, for at most `within`; fails with the last
/// inspection otherwise. A waiter queues a moment after its acquire starts, so the count is
/// given that moment; it is never allowed to pass `want` on the way.
async fn until_waiters(
    observer: &dyn Authority,
    key: &LockKey,
    want: u32,
    within: Duration,
    what: &str,
) -> Result<Inspection, Failure> {
    let until = Instant::now() + within;
    loop {
        let seen = observer.inspect(key).await.or_fail(what)?;
        ensure!(
            seen.waiters.is_some_and(|n| n <= want),
            "{what}: inspect counted {:?} waiters, expected {want}: {seen:?}",
            seen.waiters
        );
        if seen.waiters == Some(want) && seen.held {
            return Ok(seen);
        }
        if Instant::now() >= until {
            return Err(Failure::new(format!(
                "{what}: inspect still counted {:?} waiters after {within:?}, expected {want}: {seen:?}",
                seen.waiters
            )));
        }
        tokio::time::sleep(EVERY).await;
    }
}

fn wait_for(
    client: &std::sync::Arc<dyn Authority>,
    key: &LockKey,
    ttl: Duration,
    max_wait: Duration,
) -> JoinHandle<leasehold_core::Result<Grant>> {
    let (client, key) = (client.clone(), key.clone());
    tokio::spawn(async move { client.acquire(&key, ttl, max_wait).await })
}

/// A holds the key, B and C wait for it: inspect (from a fourth client) counts 2 waiters and
/// A's fence. A releases; one of B and C holds it, and inspect counts 1. That one releases; the
/// other holds it, and inspect counts none. A backend that does not declare
/// `Capabilities::counts_waiters` must not show a count at all (it could only be a guess): with
/// A holding and B waiting, its inspect says `None`.
pub async fn inspect_counts_waiters(ctx: &Context) -> Outcome {
    if !ctx.capabilities().counts_waiters {
        return shows_no_count(ctx).await;
    }
    let (a, b, c, observer) = (
        ctx.connect().await?,
        ctx.connect().await?,
        ctx.connect().await?,
        ctx.connect().await?,
    );
    let key = ctx.key("waiters");
    let ttl = ctx.ttl();
    let settle = ctx.tolerance();
    let lease = Lease::try_acquire(a, &key, ttl, LeaseOptions::default())
        .await
        .or_fail("A acquires")?
        .ok_or_else(|| Failure::new("A could not acquire a free key"))?;
    let a_fence = lease.fence();
    let alone = until_waiters(&*observer, &key, 0, settle, "A alone").await?;
    ensure!(
        alone.fence == Some(a_fence),
        "A alone: inspect reported fence {:?}, A holds {a_fence}",
        alone.fence
    );

    // Long enough for both hand-offs, short enough that a stuck waiter ends the scenario.
    let max_wait = (ttl + settle) * 4;
    let mut b_wait = wait_for(&b, &key, ttl, max_wait);
    let mut c_wait = wait_for(&c, &key, ttl, max_wait);
    let two = until_waiters(&*observer, &key, 2, settle, "B and C wait").await?;
    ensure!(
        two.fence == Some(a_fence),
        "B and C wait: inspect reported fence {:?}, A holds {a_fence}",
        two.fence
    );
    ensure!(
        !b_wait.is_finished() && !c_wait.is_finished(),
        "a waiter finished while A held the key"
    );

    let _ = lease.release().await.or_fail("A releases")?;
    // The first of the two to hold it; the other still waits.
    let (first, first_client, second, second_client) = tokio::select! {
        got = &mut b_wait => (got, b.clone(), c_wait, c.clone()),
        got = &mut c_wait => (got, c.clone(), b_wait, b.clone()),
    };
    let first = first
        .or_fail("the first waiter's task")?
        .or_fail("the first waiter's acquire after A released")?;
    let one = until_waiters(&*observer, &key, 1, settle, "one waiter left").await?;
    ensure!(
        one.fence == Some(first.fence()),
        "one waiter left: inspect reported fence {:?}, the new holder has {}",
        one.fence,
        first.fence()
    );

    let _ = first_client
        .release(&first)
        .await
        .or_fail("the first waiter releases")?;
    let last = second
        .await
        .or_fail("the second waiter's task")?
        .or_fail("the second waiter's acquire")?;
    let none = until_waiters(&*observer, &key, 0, settle, "the last holder alone").await?;
    ensure!(
        none.fence == Some(last.fence()),
        "the last holder alone: inspect reported fence {:?}, it has {}",
        none.fence,
        last.fence()
    );
    let _ = second_client
        .release(&last)
        .await
        .or_fail("the second waiter releases")?;
    Ok(Verdict::Passed)
}

/// The other backends: no count while A holds and B waits, and B gets the key once A releases.
async fn shows_no_count(ctx: &Context) -> Outcome {
    let (a, b, observer) = (
        ctx.connect().await?,
        ctx.connect().await?,
        ctx.connect().await?,
    );
    let key = ctx.key("no-waiter-count");
    let ttl = ctx.ttl();
    let grant = a
        .try_acquire(&key, ttl)
        .await
        .or_fail("A acquires")?
        .ok_or_else(|| Failure::new("A could not acquire a free key"))?;
    let waiter = wait_for(&b, &key, ttl, (ttl + ctx.tolerance()) * 4);
    // Give B the time to start waiting, as the counting backends' count is given.
    tokio::time::sleep(EVERY * 5).await;
    let seen = observer
        .inspect(&key)
        .await
        .or_fail("inspect while A holds and B waits")?;
    ensure!(
        seen.held && seen.waiters.is_none(),
        "the backend does not declare counts_waiters, yet inspect showed {:?} waiters: {seen:?}",
        seen.waiters
    );
    let _ = a.release(&grant).await.or_fail("A releases")?;
    let next = waiter
        .await
        .or_fail("the waiter's task")?
        .or_fail("B's acquire after A released")?;
    let _ = b.release(&next).await.or_fail("B releases")?;
    Ok(Verdict::Passed)
}
