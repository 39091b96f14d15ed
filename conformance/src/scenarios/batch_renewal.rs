//! Batched renewal (`Authority::renew_many`), the path every `Lease` on a batching backend
//! renews through, held to the rules a lone renewal is held to: conditional on the owner, each
//! refusal naming only its own grant, deadlines counted from before the batch was sent.

use std::time::Duration;

use leasehold_core::{Authority, Error, Grant, Instant, LockKey, Result, SafetyMargin};

use super::clock::latest;
use super::helpers::{acquire_within, outlive, paused, take, NO_PAUSE};
use crate::context::Context;
use crate::ensure;
use crate::verdict::{Failure, OrFail, Outcome, Verdict};

/// How many grants the deadline scenarios renew in one batch. A backend that renews one grant
/// per request (the trait's default `renew_many`) counts each grant from its own send, which is
/// later than the batch's: one grant is then the whole batch, and the bound stays as tight as a
/// lone renewal's.
fn batch_size(ctx: &Context) -> usize {
    if ctx.capabilities().batch_renewal {
        3
    } else {
        1
    }
}

/// Takes `n` free keys named `name-0`, `name-1`, ...
async fn take_many(
    ctx: &Context,
    client: &dyn Authority,
    name: &str,
    n: usize,
) -> std::result::Result<Vec<Grant>, Failure> {
    let mut grants = Vec::with_capacity(n);
    for i in 0..n {
        let key = ctx.key(&format!("{name}-{i}"));
        grants.push(take(client, &key, ctx.ttl(), "A acquires").await?);
    }
    Ok(grants)
}

/// Releases every grant, reporting the first failure.
async fn release_all(client: &dyn Authority, grants: &[Grant]) -> std::result::Result<(), Failure> {
    for grant in grants {
        let _ = client.release(grant).await.or_fail("A releases")?;
    }
    Ok(())
}

/// The deadline of every renewal in `answers`, or the first grant whose renewal failed, with
/// its error.
fn deadlines(
    grants: &[Grant],
    answers: Vec<Result<Instant>>,
) -> std::result::Result<Vec<Instant>, (LockKey, Error)> {
    answers
        .into_iter()
        .zip(grants)
        .map(|(answer, grant)| answer.map_err(|e| (grant.key().clone(), e)))
        .collect()
}

/// A's batch holds, between live grants of A's, a grant whose lease expired and went to B and
/// one whose lease expired with nobody taking the key. The two stale grants are refused with
/// `LeaseLost`, each alone, and the live ones renewed; B's lease is not extended (it still ends
/// on its own schedule), and the key nobody took is free at once (the refused renewal did not
/// revive it).
pub async fn batch_renew_after_expiry_is_refused(ctx: &Context) -> Outcome {
    let (a, b, c) = (
        ctx.connect().await?,
        ctx.connect().await?,
        ctx.connect().await?,
    );
    let ttl = ctx.ttl();
    let (free_key, taken_key) = (ctx.key("batch-late-free"), ctx.key("batch-late-taken"));
    // The key nobody will take is taken first, so its lease ends no later than the one B is
    // seen to take over.
    let free_stale = take(&*a, &free_key, ttl, "A acquires").await?;
    let taken_stale = take(&*a, &taken_key, ttl, "A acquires").await?;
    outlive(ctx, &taken_stale).await;
    let (fresh, b_at) = acquire_within(ctx, &*b, &taken_key, ttl, Instant::now(), ctx.tolerance())
        .await?
        .ok_or_else(|| Failure::new("B could not take the key after A's lease expired"))?;
    let live = take_many(ctx, &*a, "batch-live", 3).await?;
    // The stale grants sit between live ones, so an answer given to the wrong grant shows.
    let batch = [
        live[0].clone(),
        taken_stale,
        live[1].clone(),
        free_stale,
        live[2].clone(),
    ];
    let answers = a.renew_many(&batch).await;
    ensure!(
        answers.len() == batch.len(),
        "renew_many answered {} results for {} grants",
        answers.len(),
        batch.len()
    );
    let mut renewed_until = Vec::with_capacity(live.len());
    for (i, (grant, answer)) in batch.iter().zip(&answers).enumerate() {
        let stale = i == 1 || i == 3;
        match (stale, answer) {
            (true, Err(Error::LeaseLost { .. })) => {}
            (false, Ok(deadline)) => renewed_until.push(*deadline),
            (true, Ok(deadline)) => {
                return Err(Failure::new(format!(
                    "A's batch renewed {}, whose lease expired{} (new deadline in {:?})",
                    grant.key(),
                    if i == 1 { " and went to B" } else { "" },
                    deadline.saturating_duration_since(Instant::now())
                )))
            }
            (true, Err(other)) => {
                return Err(Failure::new(format!(
                    "A's batch renewal of the expired {} failed with {other} instead of LeaseLost",
                    grant.key()
                )))
            }
            (false, Err(e)) => {
                return Err(Failure::new(format!(
                    "A's batch refused its live grant on {} beside the stale ones: {e}",
                    grant.key()
                )))
            }
        }
    }
    // A takeover is an overlap only while the holder still counts on its lease: a machine slow
    // enough to probe after the renewed deadline has let the lease run out, as it may.
    for (grant, until) in live.iter().zip(&renewed_until) {
        let probe = c.try_acquire(grant.key(), ttl).await.or_fail("C probes")?;
        if let Some(taken) = probe {
            ensure!(
                Instant::now() >= *until,
                "C took {} right after A's batch renewed it, {:?} before A's renewed deadline",
                grant.key(),
                until.saturating_duration_since(Instant::now())
            );
            let _ = c.release(&taken).await.or_fail("C releases")?;
        }
    }
    let by_c = c.try_acquire(&taken_key, ttl).await.or_fail("C tries")?;
    if let Some(taken) = by_c {
        ensure!(
            Instant::now() >= fresh.deadline(),
            "A's refused batch renewal freed B's lease"
        );
        let _ = c.release(&taken).await.or_fail("C releases")?;
    }
    let revived = c
        .try_acquire(&free_key, ttl)
        .await
        .or_fail("C tries the key nobody took")?;
    let Some(free_now) = revived else {
        return Err(Failure::new(
            "the key whose lease expired with nobody taking it was held after A's refused batch \
             renewal: the batch revived it",
        ));
    };
    let _ = c.release(&free_now).await.or_fail("C releases")?;
    // B does not renew, so its lease must end within its TTL (plus tolerance) of its grant.
    let freed = acquire_within(ctx, &*c, &taken_key, ttl, b_at, ttl + ctx.tolerance()).await?;
    ensure!(
        freed.is_some(),
        "B's lease outlived its TTL by more than the tolerance: was it extended by A's batch?"
    );
    drop(fresh);
    release_all(&*a, &live).await?;
    Ok(Verdict::Passed)
}

/// Every deadline a batch renewal returns is at most (the instant before the batch was sent) +
/// TTL − margin, with half the call's own duration as slack, as
/// [`deadline_counts_from_the_request`](super::deadline_counts_from_the_request) holds a lone
/// renewal: counted from the reply, the client would believe in its leases for a whole round
/// trip longer than the authority keeps them. Best of three batches, for the same reason.
pub async fn batch_deadline_counts_from_the_request(ctx: &Context) -> Outcome {
    let a = ctx.connect().await?;
    let ttl = ctx.ttl();
    let margin = SafetyMargin::default().for_ttl(ttl);
    let grants = take_many(ctx, &*a, "batch-deadline", batch_size(ctx)).await?;
    let mut overshoots = Vec::new();
    for _ in 0..3 {
        let sent = Instant::now();
        let answers = a.renew_many(&grants).await;
        let took = sent.elapsed();
        let renewed = match deadlines(&grants, answers) {
            Ok(renewed) => renewed,
            Err((key, e)) => {
                release_all(&*a, &grants).await?;
                return Err(Failure::new(format!(
                    "A renews its grants in a batch: the renewal of {key} failed: {e}"
                )));
            }
        };
        let bound = latest(sent, ttl, took / 2);
        let Some(worst) = renewed.iter().max().copied() else {
            return Err(Failure::new("renew_many answered an empty batch"));
        };
        if worst <= bound {
            release_all(&*a, &grants).await?;
            return Ok(Verdict::Passed);
        }
        overshoots.push((worst - sent, took));
    }
    release_all(&*a, &grants).await?;
    Err(Failure::new(format!(
        "three batch renewals of {} grants: the latest deadline after each batch was sent, and \
         how long the call took: {overshoots:?} (TTL {ttl:?}, margin {margin:?}): counted from \
         the reply",
        grants.len()
    )))
}

/// A batch renewal whose reply is delayed by an unresponsive server (paused for a third of the
/// TTL while the batch is in flight) renews every lease a third shorter: each deadline still
/// counts from before the batch was sent. A backend that reads the clock after the reply
/// overshoots by the pause.
pub async fn delayed_batch_reply_shortens_the_renewals(ctx: &Context) -> Outcome {
    let a = ctx.connect().await?;
    let ttl = ctx.ttl();
    let grants = take_many(ctx, &*a, "batch-delayed", batch_size(ctx)).await?;
    // Warm the batch path up (a script loaded, a statement prepared), so the paused request is
    // the renewal itself.
    if let Err((key, e)) = deadlines(&grants, a.renew_many(&grants).await) {
        release_all(&*a, &grants).await?;
        return Err(Failure::new(format!(
            "A's first batch renewal: the renewal of {key} failed: {e}"
        )));
    }
    if !paused(ctx).await? {
        release_all(&*a, &grants).await?;
        return Ok(Verdict::NotApplicable(NO_PAUSE.into()));
    }
    let pause = ttl / 3;
    // `sent` is read in the task, right before the call: a spawned task may first run a while
    // after it was spawned, and the client cannot count from before it was called.
    let started = Instant::now();
    let request = {
        let (a, grants) = (a.clone(), grants.clone());
        tokio::spawn(async move {
            let sent = Instant::now();
            (sent, a.renew_many(&grants).await)
        })
    };
    tokio::time::sleep(pause).await;
    ctx.faults().resume().await.or_fail("resume the server")?;
    let (sent, answers) = tokio::time::timeout(ttl * 10 + Duration::from_secs(10), request)
        .await
        .map_err(|_| Failure::new("the delayed renew_many never returned"))?
        .or_fail("the request task")?;
    let took = sent.elapsed();
    let result = match deadlines(&grants, answers) {
        Err((key, e)) if e.is_retryable() => Ok(Verdict::NotApplicable(format!(
            "the client gave up on renewing {key} during a pause of {pause:?} ({e}); the \
             request timeout is shorter than a third of the TTL"
        ))),
        Err((key, e)) => Err(Failure::new(format!(
            "the delayed batch renewal of {key}: {e}"
        ))),
        Ok(renewed) => (|| {
            ensure!(
                started.elapsed() >= pause,
                "the batch returned after {:?}, before the server resumed: it was not delayed",
                started.elapsed()
            );
            for (grant, deadline) in grants.iter().zip(&renewed) {
                ensure!(
                    *deadline <= latest(sent, ttl, ttl / 20),
                    "the renewal of {} has its deadline {:?} after the batch was sent although \
                     the reply took {took:?} (TTL {ttl:?}): the deadline counts from the reply",
                    grant.key(),
                    *deadline - sent
                );
            }
            Ok(Verdict::Passed)
        })(),
    };
    release_all(&*a, &grants).await?;
    result
}
