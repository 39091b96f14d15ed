//! Several keys all or nothing: overlapping sets from many tasks never deadlock and never
//! overlap, and a failed or cancelled `acquire_all` leaves no key held.
//!
//! Each scenario drives the recipe through a [`MultiMaker`], so the same scenario runs
//! [`acquire_all`] ([`recipe`]) and its deliberately broken variants
//! (`crate::recipe_mutants`), which it must fail.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_core::{
    acquire_all, Authority, Error, Instant, Lease, LeaseOptions, LockKey, Result,
};

use crate::context::Context;
use crate::ensure;
use crate::verdict::{Failure, OrFail, Outcome, Verdict};

/// What a multi-key acquisition returns to the scenarios: one lease per key.
pub type MultiFuture = Pin<Box<dyn Future<Output = Result<Vec<Lease>>> + Send>>;

/// Takes every key of a set on a client, waiting at most `max_wait` (the recipe, or a broken
/// variant of it).
pub type MultiMaker =
    fn(Arc<dyn Authority>, Vec<LockKey>, Duration, Duration, LeaseOptions) -> MultiFuture;

/// The recipe itself.
pub fn recipe(
    authority: Arc<dyn Authority>,
    keys: Vec<LockKey>,
    ttl: Duration,
    max_wait: Duration,
    options: LeaseOptions,
) -> MultiFuture {
    Box::pin(async move {
        let all = acquire_all(authority, &keys, ttl, max_wait, options).await?;
        Ok(all.into_leases())
    })
}

fn locked<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// How many keys the scenarios' sets are drawn from.
const KEYS: usize = 5;

/// Eight tasks on their own clients each take overlapping sets of two or three of five keys,
/// named in different orders, four times, holding them a moment: every acquisition succeeds
/// (no deadlock: all finish within a bound well under their `max_wait`), and a shared checker
/// never sees a key held twice.
pub async fn acquire_all_never_deadlocks_or_overlaps(ctx: &Context) -> Outcome {
    never_deadlocks_or_overlaps_with(ctx, recipe).await
}

/// [`acquire_all_never_deadlocks_or_overlaps`] with `take`.
pub async fn never_deadlocks_or_overlaps_with(ctx: &Context, take: MultiMaker) -> Outcome {
    let ttl = ctx.ttl();
    let keys: Vec<LockKey> = (0..KEYS).map(|i| ctx.key(&format!("multi-{i}"))).collect();
    let holders: Arc<Mutex<HashMap<LockKey, u32>>> = Arc::default();
    let overlaps: Arc<Mutex<Vec<String>>> = Arc::default();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for task in 0..8usize {
        let client = ctx.connect().await?;
        let (keys, holders, overlaps) = (keys.clone(), holders.clone(), overlaps.clone());
        tasks.push(tokio::spawn(async move {
            for round in 0..4usize {
                // A set of two or three neighbouring keys, named highest first for odd tasks:
                // taken in the order named, two such sets deadlock.
                let size = 2 + (task + round) % 2;
                let first = (task * 3 + round) % KEYS;
                let mut set: Vec<LockKey> = (0..size)
                    .map(|i| keys[(first + i) % KEYS].clone())
                    .collect();
                if task % 2 == 1 {
                    set.reverse();
                }
                let leases = take(
                    client.clone(),
                    set.clone(),
                    ttl,
                    ttl * 20,
                    LeaseOptions::default(),
                )
                .await
                .map_err(|e| format!("task {task} round {round} {set:?}: {e}"))?;
                {
                    let mut h = locked(&holders);
                    for lease in &leases {
                        let n = h.entry(lease.key().clone()).or_insert(0);
                        *n += 1;
                        if *n > 1 {
                            locked(&overlaps).push(format!("{} held {n} times", lease.key()));
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
                for lease in &leases {
                    lease
                        .ensure_valid()
                        .map_err(|e| format!("{}: {e}", lease.key()))?;
                }
                {
                    let mut h = locked(&holders);
                    for lease in &leases {
                        if let Some(n) = h.get_mut(lease.key()) {
                            *n = n.saturating_sub(1);
                        }
                    }
                }
                for lease in leases {
                    let _ = lease.release().await.map_err(|e| e.to_string())?;
                }
            }
            Ok::<(), String>(())
        }));
    }
    let bound = ttl * 15;
    let mut failures = Vec::new();
    for task in tasks {
        if let Err(e) = task.await.or_fail("a task")? {
            failures.push(e);
        }
    }
    ensure!(failures.is_empty(), "acquisitions failed: {failures:?}");
    let took = started.elapsed();
    ensure!(
        took <= bound,
        "32 acquisitions took {took:?} (bound {bound:?})"
    );
    let overlaps = locked(&overlaps);
    ensure!(overlaps.is_empty(), "keys held twice: {:?}", *overlaps);
    Ok(Verdict::Passed)
}

/// Another client holds the third of four keys. `acquire_all` of the four with a short
/// `max_wait` fails with `Timeout` and has given back the two keys it took by the time it
/// returns; a hundred attempts dropped at random points leave every key free within two TTLs
/// once the third is released (an attempt in flight may still create a lease, which runs out).
pub async fn acquire_all_failure_leaves_no_key(ctx: &Context) -> Outcome {
    failure_leaves_no_key_with(ctx, recipe).await
}

/// [`acquire_all_failure_leaves_no_key`] with `take`.
pub async fn failure_leaves_no_key_with(ctx: &Context, take: MultiMaker) -> Outcome {
    let ttl = ctx.ttl();
    let keys: Vec<LockKey> = (0..4)
        .map(|i| ctx.key(&format!("multi-fail-{i}")))
        .collect();
    let other = ctx.connect().await?;
    let blocker = Lease::try_acquire(other.clone(), &keys[2], ttl, LeaseOptions::default())
        .await
        .or_fail("take the third key")?
        .ok_or_else(|| Failure::new("the third key was held"))?;
    let client = ctx.connect().await?;
    // Leases that are not released when dropped: what a failed attempt took must be given back
    // by the attempt itself.
    let options = LeaseOptions::default().with_release_on_drop(false);
    let started = Instant::now();
    other.inspect(&keys[0]).await.or_fail("inspect")?;
    let rtt = started.elapsed().max(Duration::from_micros(100));
    match take(client.clone(), keys.clone(), ttl, ttl / 4, options.clone()).await {
        Err(Error::Timeout { .. }) => {}
        Ok(_) => return Err(Failure::new("acquire_all got a key another client holds")),
        Err(e) => return Err(Failure::new(format!("acquire_all gave {e}, not a timeout"))),
    }
    for key in [&keys[0], &keys[1], &keys[3]] {
        let seen = other.inspect(key).await.or_fail("inspect")?;
        ensure!(
            !seen.held,
            "{key} is still held after acquire_all timed out"
        );
    }
    for _ in 0..100 {
        let attempt = take(client.clone(), keys.clone(), ttl, ttl * 5, options.clone());
        if let Some(Ok(_)) = super::cancellation::cut_short(attempt, rtt * 3).await {
            return Err(Failure::new("acquire_all got a key another client holds"));
        }
    }
    let _ = blocker.release().await.or_fail("release the third key")?;
    let within = ttl * 2 + ctx.tolerance();
    let all = take(other, keys.clone(), ttl, within, LeaseOptions::default())
        .await
        .or_fail("every key after the dropped attempts")?;
    for lease in all {
        let _ = lease.release().await.or_fail("release")?;
    }
    Ok(Verdict::Passed)
}
