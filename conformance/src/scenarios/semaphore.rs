//! The semaphore: never more than N holders, fences per slot grow, agreement on N enforced,
//! and dropped acquisitions leave no slot held beyond a TTL.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_core::{Error, Instant, LeaseOptions, Semaphore};

use crate::context::Context;
use crate::ensure;
use crate::verdict::{Failure, OrFail, Outcome, Verdict};

/// How many permits the scenarios' semaphores have.
const PERMITS: u32 = 2;

/// Six contenders, each on its own client, take a permit three times each (waiting up to ten
/// TTLs), hold it a moment and give it back. At no moment do more than two hold a valid permit
/// (counted in this process between a grant and its release); per slot, fences strictly grow in
/// the order the slot was granted.
pub async fn semaphore_never_exceeds_its_permits(ctx: &Context) -> Outcome {
    let name = ctx.key("semaphore");
    let ttl = ctx.ttl();
    let holding = Arc::new(AtomicU32::new(0));
    let most = Arc::new(AtomicU32::new(0));
    let fences: Arc<Mutex<HashMap<u32, Vec<u64>>>> = Arc::default();
    let mut tasks = Vec::new();
    for _ in 0..6 {
        let client = ctx.connect().await?;
        let semaphore = Semaphore::new(client, &name, PERMITS).or_fail("a semaphore")?;
        let (holding, most, fences) = (holding.clone(), most.clone(), fences.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..3 {
                let permit = semaphore.acquire(ttl, ttl * 10).await?;
                let now = holding.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                fences
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .entry(permit.slot())
                    .or_default()
                    .push(permit.fence().value());
                tokio::time::sleep(Duration::from_millis(5)).await;
                permit.ensure_valid()?;
                holding.fetch_sub(1, Ordering::SeqCst);
                let _ = permit.release().await?;
            }
            Ok::<(), Error>(())
        }));
    }
    for task in tasks {
        task.await
            .or_fail("a contender task")?
            .or_fail("a contender")?;
    }
    let most = most.load(Ordering::SeqCst);
    ensure!(
        most <= PERMITS,
        "{most} contenders held a permit at once; the semaphore has {PERMITS}"
    );
    ensure!(most >= 1, "nobody ever held a permit");
    let fences = fences.lock().unwrap_or_else(|e| e.into_inner());
    ensure!(
        fences.keys().all(|slot| *slot < PERMITS),
        "slots outside 0..{PERMITS}: {:?}",
        fences.keys()
    );
    for (slot, seen) in fences.iter() {
        ensure!(
            seen.windows(2).all(|w| w[0] < w[1]),
            "slot {slot}'s fences did not grow in grant order: {seen:?}"
        );
    }
    Ok(Verdict::Passed)
}

/// A holds a permit of a 2-permit semaphore; B uses the same name with 3 permits and is refused
/// with `InvalidConfig`, holding nothing; once A releases, B's count takes effect. Then A and B
/// try at the same moment, 20 rounds: never do both hold a permit.
pub async fn semaphore_permits_must_agree(ctx: &Context) -> Outcome {
    let name = ctx.key("semaphore-agree");
    let ttl = ctx.ttl();
    let a = Semaphore::new(ctx.connect().await?, &name, PERMITS).or_fail("A's semaphore")?;
    let b = Semaphore::new(ctx.connect().await?, &name, PERMITS + 1).or_fail("B's semaphore")?;
    let permit = a
        .try_acquire(ttl)
        .await
        .or_fail("A takes a permit")?
        .ok_or_else(|| Failure::new("A found no free permit"))?;
    match b.try_acquire(ttl).await {
        Err(Error::InvalidConfig { .. }) => {}
        Ok(Some(p)) => {
            return Err(Failure::new(format!(
                "B took slot {} with {} permits while A holds one of {PERMITS}",
                p.slot(),
                PERMITS + 1
            )))
        }
        other => return Err(Failure::new(format!("B's mismatched count gave {other:?}"))),
    }
    let checker = ctx.connect().await?;
    for slot in b.slots() {
        let seen = checker.inspect(slot).await.or_fail("inspect B's slots")?;
        ensure!(!seen.held, "B's refused attempt left {slot} held");
    }
    let _ = permit.release().await.or_fail("A releases")?;
    let taken = b
        .try_acquire(ttl)
        .await
        .or_fail("B after A released")?
        .ok_or_else(|| Failure::new("B found no free permit after A released"))?;
    let _ = taken.release().await.or_fail("B releases")?;
    // The two counts at the same moment, each on its own client: at least one sees the other's
    // slot on its second look and gives its own back, so they never both hold a permit.
    for round in 0..AGREE_ROUNDS {
        let (a, b) = (a.clone(), b.clone());
        let a = tokio::spawn(async move { a.try_acquire(ttl).await });
        let b = tokio::spawn(async move { b.try_acquire(ttl).await });
        let a = a.await.or_fail("A's task")?;
        let b = b.await.or_fail("B's task")?;
        let mut held = Vec::new();
        for (who, result) in [("A", a), ("B", b)] {
            match result {
                Ok(Some(permit)) => held.push(permit),
                Err(Error::InvalidConfig { .. }) => {}
                other => {
                    return Err(Failure::new(format!(
                        "round {round}: {who}'s try at once gave {other:?}"
                    )))
                }
            }
        }
        let both = held.len() == 2;
        for permit in held {
            let _ = permit.release().await.or_fail("release")?;
        }
        ensure!(
            !both,
            "round {round}: a permit of {PERMITS} and a permit of {} were held at once",
            PERMITS + 1
        );
    }
    Ok(Verdict::Passed)
}

/// How many rounds `semaphore_permits_must_agree` has the two counts try at the same moment.
const AGREE_ROUNDS: usize = 20;

/// A waiter blocked in `acquire` while both permits are held (their leases renewed, so only a
/// release frees one) for two TTLs gets the permit soon after one holder releases: within a
/// fraction of the TTL where the backend notifies (its timer fallback waits up to half a TTL by
/// then, so the timer alone would usually miss it), within the tolerance where it polls.
pub async fn semaphore_waits_by_notification(ctx: &Context) -> Outcome {
    let name = ctx.key("semaphore-wake");
    let ttl = ctx.ttl();
    let holder = Semaphore::new(ctx.connect().await?, &name, PERMITS).or_fail("a semaphore")?;
    let mut held = Vec::new();
    for _ in 0..PERMITS {
        held.push(
            holder
                .try_acquire(ttl)
                .await
                .or_fail("take a permit")?
                .ok_or_else(|| Failure::new("no free permit"))?,
        );
    }
    let waiter = Semaphore::new(ctx.connect().await?, &name, PERMITS).or_fail("a semaphore")?;
    let waiting = tokio::spawn(async move {
        let got = waiter.acquire(ttl, ttl * 10).await;
        (got, Instant::now())
    });
    tokio::time::sleep(ttl * 2).await;
    ensure!(
        !waiting.is_finished(),
        "the waiter returned while every permit was held"
    );
    for permit in &held {
        super::helpers::still_held(permit.lease(), "a held permit").await?;
    }
    let released = Instant::now();
    let _ = held
        .pop()
        .ok_or_else(|| Failure::new("no permit to release"))?
        .release()
        .await
        .or_fail("release one permit")?;
    let (got, at) = waiting.await.or_fail("the waiter task")?;
    let permit = got.or_fail("the waiter's acquire")?;
    let took = at.saturating_duration_since(released);
    let bound = super::waiting::handoff_bound(ctx);
    ensure!(
        took <= bound,
        "the waiter got a permit {took:?} after a release (bound {bound:?})"
    );
    let _ = permit.release().await.or_fail("the waiter releases")?;
    for p in held {
        let _ = p.release().await.or_fail("release")?;
    }
    Ok(Verdict::Passed)
}

/// Acquire futures dropped at random points around one round trip, a hundred times, while one
/// permit of two is held: afterwards, within two TTLs (an attempt in flight may still create a
/// lease, which runs out), both slots are free again.
pub async fn semaphore_cancelled_acquire_leaves_no_slot(ctx: &Context) -> Outcome {
    let name = ctx.key("semaphore-cancel");
    let ttl = ctx.ttl();
    let options = LeaseOptions::default().with_release_on_drop(false);
    let semaphore = Semaphore::new(ctx.connect().await?, &name, PERMITS)
        .or_fail("a semaphore")?
        .with_lease_options(options);
    let held = semaphore
        .try_acquire(ttl)
        .await
        .or_fail("take one permit")?
        .ok_or_else(|| Failure::new("no free permit"))?;
    let started = Instant::now();
    let probe = semaphore.acquire(ttl, Duration::ZERO).await;
    let rtt = started.elapsed().max(Duration::from_micros(100));
    if let Ok(p) = probe {
        let _ = p.release().await;
    }
    for _ in 0..100 {
        let cut = super::cancellation::cut_short(semaphore.acquire(ttl, ttl * 5), rtt * 3).await;
        if let Some(Ok(p)) = cut {
            let _ = p.release().await;
        }
    }
    let _ = held.release().await.or_fail("release the held permit")?;
    let other = Semaphore::new(ctx.connect().await?, &name, PERMITS).or_fail("a semaphore")?;
    let since = Instant::now();
    let within = ttl * 2 + ctx.tolerance();
    let mut permits = Vec::new();
    while permits.len() < PERMITS as usize {
        match other
            .try_acquire(ttl)
            .await
            .or_fail("take the permits back")?
        {
            Some(p) => permits.push(p),
            None if since.elapsed() < within => tokio::time::sleep(ttl / 20).await,
            None => {
                return Err(Failure::new(format!(
                    "only {} of {PERMITS} permits free {within:?} after the drops",
                    permits.len()
                )))
            }
        }
    }
    for p in permits {
        let _ = p.release().await.or_fail("release")?;
    }
    Ok(Verdict::Passed)
}
