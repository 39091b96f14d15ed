//! The gate scenarios: what a store that checks fences must do, one function each.

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{Fence, FenceSafety, FencedResource, Guarded, Instant};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{GateContext, ValueReader};
use crate::ensure;
use crate::verdict::{Failure, OrFail, Outcome, Verdict};

/// Concurrent writers in [`refusal_is_atomic_under_concurrency`].
pub const WRITERS: usize = 8;
/// Claims and writes per writer in [`refusal_is_atomic_under_concurrency`].
pub const WRITER_ROUNDS: usize = 25;

/// How long a gate may take to serve again after its connections were cut.
pub(super) const RECONNECT_WITHIN: Duration = Duration::from_secs(30);

pub(super) fn fence(n: u64) -> Result<Fence, Failure> {
    Fence::from_value(n, FenceSafety::Linearizable).or_fail(format!("fence {n}"))
}

pub(super) async fn fresh(
    ctx: &GateContext,
) -> Result<(Arc<dyn FencedResource>, ValueReader), Failure> {
    let probed = ctx
        .resources()
        .resource()
        .await
        .or_fail("a fresh resource")?;
    Ok((probed.resource, probed.value))
}

/// Fails unless the store holds `expected` (`None`: nothing written): a refused write must
/// leave no trace, whatever the gate answered.
async fn holds(value: &ValueReader, expected: Option<&str>, after: &str) -> Result<(), Failure> {
    let held = value()
        .await
        .or_fail(format!("read the value after {after}"))?;
    ensure!(
        held.as_deref() == expected,
        "after {after} the store holds {held:?}, not {expected:?}"
    );
    Ok(())
}

pub(super) async fn write(r: &dyn FencedResource, n: u64, value: &str) -> Result<Guarded, Failure> {
    r.write(fence(n)?, value)
        .await
        .or_fail(format!("write with fence {n}"))
}

async fn claim(r: &dyn FencedResource, n: u64) -> Result<Guarded, Failure> {
    r.claim(fence(n)?)
        .await
        .or_fail(format!("claim with fence {n}"))
}

/// A write with a fence older than one the resource accepted is refused, and the refusal names
/// the newest fence.
pub async fn stale_fence_refused(ctx: &GateContext) -> Outcome {
    let (r, value) = fresh(ctx).await?;
    let first = write(&*r, 5, "five").await?;
    ensure!(
        first.is_accepted(),
        "the first write (fence 5) was refused: {first:?}"
    );
    let late = write(&*r, 4, "four").await?;
    ensure!(
        late == Guarded::Stale { newest: 5 },
        "a write with fence 4 after fence 5 was not refused as stale with newest 5: {late:?}"
    );
    let much_later = write(&*r, 1, "one").await?;
    ensure!(
        much_later == Guarded::Stale { newest: 5 },
        "a write with fence 1 after fence 5 was not refused: {much_later:?}"
    );
    holds(&value, Some("five"), "two refused writes").await?;
    Ok(Verdict::Passed)
}

/// The holder writes several times under one lease: its own fence, equal to the newest, is
/// accepted every time, and a greater one after it too.
pub async fn equal_fence_accepted_again(ctx: &GateContext) -> Outcome {
    let (r, value) = fresh(ctx).await?;
    for round in 0..3 {
        let again = write(&*r, 7, "seven").await?;
        ensure!(
            again.is_accepted(),
            "write {round} with the newest fence 7 was refused: {again:?}"
        );
    }
    let next = write(&*r, 8, "eight").await?;
    ensure!(next.is_accepted(), "fence 8 after 7 was refused: {next:?}");
    holds(&value, Some("eight"), "the accepted writes").await?;
    Ok(Verdict::Passed)
}

/// A new holder's claim (no write) closes the door on every older fence, and lets its own
/// writes through.
pub async fn claim_then_older_write_refused(ctx: &GateContext) -> Outcome {
    let (r, value) = fresh(ctx).await?;
    let old = write(&*r, 3, "three").await?;
    ensure!(old.is_accepted(), "fence 3's write was refused: {old:?}");
    let claimed = claim(&*r, 9).await?;
    ensure!(
        claimed.is_accepted(),
        "the claim with fence 9 was refused: {claimed:?}"
    );
    let late = write(&*r, 3, "three, late").await?;
    ensure!(
        late == Guarded::Stale { newest: 9 },
        "fence 3's write after a claim with fence 9 was not refused: {late:?}"
    );
    let between = write(&*r, 8, "eight").await?;
    ensure!(
        between == Guarded::Stale { newest: 9 },
        "fence 8's write after a claim with fence 9 was not refused: {between:?}"
    );
    holds(&value, Some("three"), "a claim and two refused writes").await?;
    let own = write(&*r, 9, "nine").await?;
    ensure!(
        own.is_accepted(),
        "the claimer's own write was refused: {own:?}"
    );
    let older_claim = claim(&*r, 4).await?;
    ensure!(
        older_claim == Guarded::Stale { newest: 9 },
        "a claim with fence 4 after fence 9 was not refused: {older_claim:?}"
    );
    holds(
        &value,
        Some("nine"),
        "the claimer's write and a refused claim",
    )
    .await?;
    Ok(Verdict::Passed)
}

/// Two holders' writes reach the resource in both orders: older then newer, both accepted;
/// newer then older, the older refused.
pub async fn racing_writers_in_both_orders(ctx: &GateContext) -> Outcome {
    let (in_order, _) = fresh(ctx).await?;
    let a = write(&*in_order, 10, "A").await?;
    let b = write(&*in_order, 11, "B").await?;
    ensure!(
        a.is_accepted() && b.is_accepted(),
        "fences 10 then 11: {a:?}, {b:?} (both must be accepted)"
    );
    let (reversed, reversed_value) = fresh(ctx).await?;
    let b = write(&*reversed, 11, "B").await?;
    let a = write(&*reversed, 10, "A").await?;
    ensure!(b.is_accepted(), "fence 11 first was refused: {b:?}");
    ensure!(
        a == Guarded::Stale { newest: 11 },
        "fence 10 after 11 was not refused: {a:?}"
    );
    holds(&reversed_value, Some("B"), "fence 10's refused write").await?;
    Ok(Verdict::Passed)
}

/// One call as the scenario saw it: when it was sent, when it was answered, what it presented
/// and whether it was accepted.
#[derive(Clone, Debug)]
struct Call {
    /// The value a write wrote (`None` for a claim).
    wrote: Option<String>,
    sent: Instant,
    answered: Instant,
    fence: u64,
    accepted: bool,
}

/// Many writers claim and write at once with fences drawn at random, many rounds each. A gate
/// whose compare and write are one atomic step never accepts a fence below one whose acceptance
/// was already answered when it was sent, and ends with the greatest fence it accepted as its
/// newest. A read-then-write gate lets an older fence overwrite a newer one between the two,
/// which both checks catch.
pub async fn refusal_is_atomic_under_concurrency(ctx: &GateContext) -> Outcome {
    let (r, value) = fresh(ctx).await?;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for writer in 0..WRITERS {
        let r = r.clone();
        tasks.push(tokio::spawn(async move {
            let mut rng = StdRng::seed_from_u64(writer as u64);
            let mut calls = Vec::new();
            for round in 0..WRITER_ROUNDS {
                // Fences that rise with the rounds, overlapping between writers: acceptances
                // keep happening throughout, so the compare and the write race all along
                // instead of only at the start.
                let n = (round * WRITERS) as u64 + rng.random_range(1..=(2 * WRITERS) as u64);
                // Writers take turns even on a gate that never waits (in memory), so that
                // their rounds interleave as they do on a real store.
                tokio::task::yield_now().await;
                let wrote = (round % 3 != 0).then(|| format!("writer {writer} round {round}"));
                let sent = Instant::now();
                let outcome = match &wrote {
                    None => claim(&*r, n).await?,
                    Some(v) => write(&*r, n, v).await?,
                };
                calls.push(Call {
                    wrote,
                    sent,
                    answered: Instant::now(),
                    fence: n,
                    accepted: outcome.is_accepted(),
                });
            }
            Ok::<_, Failure>(calls)
        }));
    }
    let mut calls = Vec::new();
    for task in tasks {
        calls.extend(task.await.or_fail("a writer task")??);
    }
    let accepted: Vec<&Call> = calls.iter().filter(|c| c.accepted).collect();
    ensure!(
        accepted.len() >= WRITERS,
        "only {} of {} calls with rising fences were accepted: the race was hardly run",
        accepted.len(),
        calls.len()
    );
    for late in &accepted {
        if let Some(newer) = accepted
            .iter()
            .find(|c| c.fence > late.fence && c.answered < late.sent)
        {
            return Err(Failure::new(format!(
                "fence {} was accepted although fence {} had been accepted {:?} before it was \
                 sent ({} calls from {WRITERS} writers)",
                late.fence,
                newer.fence,
                late.sent.saturating_duration_since(newer.answered),
                calls.len()
            )));
        }
    }
    let greatest = accepted.iter().map(|c| c.fence).max().unwrap_or(0);
    let probe = claim(&*r, 1).await?;
    let refused = calls.iter().filter(|c| !c.accepted).count();
    ensure!(
        probe == Guarded::Stale { newest: greatest } || greatest == 1,
        "after {} calls ({refused} refused) the resource's newest fence is {probe:?}, not the \
         greatest it accepted ({greatest}): an older fence overwrote a newer one",
        calls.len()
    );
    // The value is that of an accepted write with the greatest fence among accepted writes
    // (several writers can draw the same fence; claims write nothing).
    let last_write = accepted
        .iter()
        .filter(|c| c.wrote.is_some())
        .map(|c| c.fence)
        .max();
    let held = value().await.or_fail("read the value after the writers")?;
    let fits = accepted
        .iter()
        .any(|c| Some(c.fence) == last_write && c.wrote == held);
    ensure!(
        fits || (last_write.is_none() && held.is_none()),
        "after the writers the store holds {held:?}, which no accepted write with the greatest \
         written fence ({last_write:?}) wrote: a refused or older write landed"
    );
    tracing::debug!(
        calls = calls.len(),
        refused,
        took = ?started.elapsed(),
        "concurrent gate calls"
    );
    Ok(Verdict::Passed)
}

/// The newest fence outlives a crash of the store: after a restart, an older fence is still
/// refused.
pub async fn fence_survives_restart(ctx: &GateContext) -> Outcome {
    let Some(faults) = ctx.faults() else {
        return Ok(Verdict::NotApplicable(
            "the harness cannot restart this store".into(),
        ));
    };
    let (r, value) = fresh(ctx).await?;
    let first = write(&*r, 30, "before the restart").await?;
    ensure!(
        first.is_accepted(),
        "the write with fence 30 was refused: {first:?}"
    );
    faults.restart().await.or_fail("restart the store")?;
    let give_up = leasehold_core::time::saturating_add(Instant::now(), RECONNECT_WITHIN);
    let late = loop {
        match r.write(fence(29)?, "after the restart").await {
            Ok(outcome) => break outcome,
            Err(e) if Instant::now() < give_up && e.is_retryable() => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => return Err(Failure::new(format!("the write after the restart: {e}"))),
        }
    };
    if let (Guarded::Accepted, Some(why)) = (late, ctx.declared_forgetful()) {
        return Ok(Verdict::Declared(format!(
            "after a restart the store accepted fence 29 below fence 30: {why}"
        )));
    }
    ensure!(
        late == Guarded::Stale { newest: 30 },
        "after a restart, fence 29 was not refused below fence 30: {late:?}"
    );
    holds(
        &value,
        Some("before the restart"),
        "a restart and a refused write",
    )
    .await?;
    Ok(Verdict::Passed)
}
