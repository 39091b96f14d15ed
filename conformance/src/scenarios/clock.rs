//! The local deadline counts from before the request, minus the safety margin.

use std::time::Duration;

use leasehold_core::{Instant, SafetyMargin};

use super::helpers::{paused, take, NO_PAUSE};
use crate::context::Context;
use crate::ensure;
use crate::verdict::{Failure, OrFail, Outcome, Verdict};

/// The latest deadline a grant or renewal sent at `sent` may carry: the TTL minus the default
/// safety margin, counted from `sent`, plus `slack` for the moments between our reading of the
/// clock and the backend's own reading before it sent the request.
pub(super) fn latest(sent: Instant, ttl: Duration, slack: Duration) -> Instant {
    sent + ttl - SafetyMargin::default().for_ttl(ttl) + slack
}

/// A grant's deadline, and a renewal's, are never later than (the instant before the request was
/// sent) + TTL − margin: counted from the response, the client would believe in its lease for a
/// whole round trip longer than the authority keeps it.
///
/// On loopback a round trip is far shorter than any margin, so the bound allows only half the
/// call's own duration as slack: a deadline counted from the reply overshoots by the whole call.
/// A scheduling hiccup between our clock read and the backend's can exceed that on a loaded
/// machine, so each check gets three tries and must hold once; a backend that counts from the
/// reply fails all three.
pub async fn deadline_counts_from_the_request(ctx: &Context) -> Outcome {
    let a = ctx.connect().await?;
    let key = ctx.key("deadline");
    let ttl = ctx.ttl();
    let margin = SafetyMargin::default().for_ttl(ttl);
    let mut overshoots = Vec::new();
    let mut held = None;
    for _ in 0..3 {
        let sent = Instant::now();
        let grant = take(&*a, &key, ttl, "A acquires").await?;
        let took = sent.elapsed();
        ensure!(
            grant.deadline() > sent,
            "the grant's deadline is not after the request"
        );
        if grant.deadline() <= latest(sent, ttl, took / 2) {
            held = Some(grant);
            break;
        }
        overshoots.push((grant.deadline() - sent, took));
        let _ = a.release(&grant).await.or_fail("A releases")?;
    }
    let grant = held.ok_or_else(|| {
        Failure::new(format!(
            "three grants' deadlines, after the request was sent, and how long the call took: \
             {overshoots:?} (TTL {ttl:?}, margin {margin:?}): counted from the reply, or without \
             the margin"
        ))
    })?;
    let mut overshoots = Vec::new();
    for _ in 0..3 {
        let renew_sent = Instant::now();
        let renewed = a.renew(&grant, ttl).await.or_fail("A renews")?;
        let took = renew_sent.elapsed();
        if renewed <= latest(renew_sent, ttl, took / 2) {
            let _ = a.release(&grant).await.or_fail("A releases")?;
            return Ok(Verdict::Passed);
        }
        overshoots.push((renewed - renew_sent, took));
    }
    let _ = a.release(&grant).await.or_fail("A releases")?;
    Err(Failure::new(format!(
        "three renewals' deadlines, after each was sent, and how long the call took: \
         {overshoots:?} (TTL {ttl:?}, margin {margin:?}): counted from the reply"
    )))
}

/// A reply delayed by an unresponsive server (paused for a third of the TTL while the request is
/// in flight) gives a grant that is already a third shorter: its deadline still counts from
/// before the request. A backend that reads the clock after the reply overshoots by the pause.
pub async fn delayed_reply_shortens_the_grant(ctx: &Context) -> Outcome {
    let a = ctx.connect().await?;
    let key = ctx.key("deadline-delayed");
    let ttl = ctx.ttl();
    // Warm the client up (sessions, connections), so the paused request is the acquire itself.
    let warm = take(&*a, &key, ttl, "A warms up").await?;
    let _ = a
        .release(&warm)
        .await
        .or_fail("A releases the warm-up grant")?;
    if !paused(ctx).await? {
        return Ok(Verdict::NotApplicable(NO_PAUSE.into()));
    }
    let pause = ttl / 3;
    // `sent` is read in the task, right before the call: on a loaded machine a spawned task
    // may first run a while after it was spawned, and the client cannot count from before it
    // was called.
    let started = Instant::now();
    let request = {
        let (a, key) = (a.clone(), key.clone());
        tokio::spawn(async move {
            let sent = Instant::now();
            (sent, a.try_acquire(&key, ttl).await)
        })
    };
    tokio::time::sleep(pause).await;
    ctx.faults().resume().await.or_fail("resume the server")?;
    let (sent, answer) = tokio::time::timeout(ttl * 10 + Duration::from_secs(10), request)
        .await
        .map_err(|_| Failure::new("the delayed try_acquire never returned"))?
        .or_fail("the request task")?;
    let grant = match answer {
        Ok(Some(grant)) => grant,
        Ok(None) => return Err(Failure::new("the key was not free")),
        Err(e) if e.is_retryable() => {
            return Ok(Verdict::NotApplicable(format!(
                "the client gave up during a pause of {pause:?} ({e}); the request timeout is \
                 shorter than a third of the TTL"
            )))
        }
        Err(e) => return Err(Failure::new(format!("the delayed try_acquire: {e}"))),
    };
    let took = sent.elapsed();
    let result = (|| {
        ensure!(
            started.elapsed() >= pause,
            "the request returned after {:?}, before the server resumed: it was not delayed",
            started.elapsed()
        );
        ensure!(
            grant.deadline() <= latest(sent, ttl, ttl / 20),
            "the grant's deadline is {:?} after the request was sent although the reply took \
             {took:?} (TTL {ttl:?}): the deadline counts from the reply",
            grant.deadline() - sent
        );
        Ok(Verdict::Passed)
    })();
    let _ = a.release(&grant).await.or_fail("A releases")?;
    result
}
