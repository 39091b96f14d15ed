//! Exclusion: one holder per key, under contention too.

use std::sync::{Arc, Mutex};

use leasehold_core::{FencedResource, Guarded, Instant, Lease, LeaseOptions};

use crate::context::Context;
use crate::ensure;
use crate::resource::{check_history, Recorder};
use crate::verdict::{Failure, OrFail, Outcome, Verdict};

/// While A holds K, B's try-acquire (and A's own second try) gets `None`; other keys are
/// independent; once A releases, B gets K.
pub async fn exclusion(ctx: &Context) -> Outcome {
    let (a, b) = (ctx.connect().await?, ctx.connect().await?);
    let (key, other) = (ctx.key("exclusion"), ctx.key("exclusion-other"));
    let ttl = ctx.ttl();
    let held = a.try_acquire(&key, ttl).await.or_fail("A acquires K")?;
    let held = held.ok_or_else(|| Failure::new("A could not acquire a free key"))?;
    let by_b = b.try_acquire(&key, ttl).await.or_fail("B tries K")?;
    ensure!(by_b.is_none(), "B acquired K while A held it: {by_b:?}");
    let again = a.try_acquire(&key, ttl).await.or_fail("A tries K again")?;
    ensure!(
        again.is_none(),
        "a second acquisition through the same client was granted while the first holds K"
    );
    let other_grant = b
        .try_acquire(&other, ttl)
        .await
        .or_fail("B takes another key")?;
    ensure!(
        other_grant.is_some(),
        "B could not take an unrelated free key"
    );
    let _ = a.release(&held).await.or_fail("A releases K")?;
    let after = b
        .try_acquire(&key, ttl)
        .await
        .or_fail("B tries K after release")?;
    ensure!(after.is_some(), "B could not take K after A released it");
    for g in after.iter().chain(other_grant.iter()) {
        let _ = b.release(g).await.or_fail("B releases")?;
    }
    Ok(Verdict::Passed)
}

/// How many contenders and rounds [`contention`] runs.
pub const CONTENDERS: usize = 4;
/// Rounds per contender.
pub const ROUNDS: usize = 5;

#[derive(Debug, Clone, Copy)]
struct Section {
    start: Instant,
    end: Instant,
    fence: u64,
    valid_at_end: bool,
}

/// N tasks x M rounds on one key, each with its own client; every critical section claims and
/// writes through a fenced resource. No two sections overlap while both are valid, the resource
/// never accepts an older fence after a newer one, and all N x M sections complete.
pub async fn contention(ctx: &Context) -> Outcome {
    let key = ctx.key("contention");
    let ttl = ctx.ttl();
    let resource = Recorder::new(ctx.resource().await?);
    let sections = Arc::new(Mutex::new(Vec::<Section>::new()));
    // Everyone waits behind up to N-1 others, each holding a short section.
    let max_wait = ttl * (CONTENDERS as u32 * 4) + ctx.tolerance() * 4;
    let hold = ttl / 20;
    let mut tasks = Vec::new();
    for n in 0..CONTENDERS {
        let client = ctx.connect().await?;
        let (key, resource, sections) = (key.clone(), resource.clone(), sections.clone());
        tasks.push(tokio::spawn(async move {
            for round in 0..ROUNDS {
                let lease = Lease::acquire(client.clone(), &key, ttl, max_wait, LeaseOptions::default())
                    .await
                    .or_fail(format!("contender {n} round {round} acquires"))?;
                lease.ensure_valid().or_fail("fresh lease valid")?;
                let start = Instant::now();
                let fence = lease.fence();
                let claimed = resource.claim(fence).await.or_fail("claim")?;
                ensure!(
                    claimed == Guarded::Accepted || lease.ensure_valid().is_err(),
                    "contender {n}: a valid holder's claim with fence {fence} was refused: {claimed:?}"
                );
                tokio::time::sleep(hold).await;
                let wrote = resource.write(fence, &format!("{n}/{round}")).await.or_fail("write")?;
                let end = Instant::now();
                let valid_at_end = lease.ensure_valid().is_ok();
                ensure!(
                    wrote.is_accepted() || !valid_at_end,
                    "contender {n}: a valid holder's write with fence {fence} was refused: {wrote:?}"
                );
                sections.lock().unwrap_or_else(|e| e.into_inner()).push(Section {
                    start,
                    end,
                    fence: fence.value(),
                    valid_at_end,
                });
                let _ = lease.release().await.or_fail("release")?;
            }
            Ok::<_, Failure>(())
        }));
    }
    for t in tasks {
        t.await.or_fail("contender task")??;
    }
    let mut sections = sections.lock().unwrap_or_else(|e| e.into_inner()).clone();
    ensure!(
        sections.len() == CONTENDERS * ROUNDS,
        "{} of {} critical sections completed",
        sections.len(),
        CONTENDERS * ROUNDS
    );
    let valid: Vec<_> = {
        sections.retain(|s| s.valid_at_end);
        sections.sort_by_key(|s| s.start);
        sections
    };
    for pair in valid.windows(2) {
        ensure!(
            pair[1].start >= pair[0].end,
            "two valid critical sections overlapped: fence {} ran {:?} into fence {}'s",
            pair[1].fence,
            pair[0].end - pair[1].start,
            pair[0].fence
        );
        ensure!(
            pair[1].fence > pair[0].fence,
            "a later critical section had fence {} <= the earlier {}",
            pair[1].fence,
            pair[0].fence
        );
    }
    check_history(&resource.history()).map_err(Failure::new)?;
    Ok(Verdict::Passed)
}
