//! Scheduled work with ShedLock's options: a late timer never makes the next period skip,
//! `at_most` ends a hung run's claim (and the fence refuses its late writes), `at_least` keeps
//! a fast run's claim, and waiting for a held period is bounded.

use std::time::Duration;

use leasehold_core::{Claim, Error, Guarded, Instant, Schedule, ScheduledRun, WhenHeld};

use crate::context::Context;
use crate::ensure;
use crate::verdict::{Failure, OrFail, Outcome, Verdict};

/// The shortest period, in TTLs of the suite, whose claim still gets a TTL the backend grants
/// when its tick fires `late_tenths` tenths of it late.
fn period_for(ctx: &Context, late_tenths: u32) -> Result<Duration, Failure> {
    let caps = ctx.capabilities();
    [4, 8, 16, 32]
        .into_iter()
        .map(|k| ctx.ttl() * k)
        .find(|&p| {
            let window = (p * (9 - late_tenths) / 10).saturating_sub(caps.expiry_slack);
            caps.ttl.at_most(window).is_some()
        })
        .ok_or_else(|| {
            Failure::new(format!(
                "no period up to 32 TTLs of {:?} leaves a claim the backend grants",
                ctx.ttl()
            ))
        })
}

fn run(claim: Claim, what: &str) -> Result<ScheduledRun, Failure> {
    match claim {
        Claim::Run(run) => Ok(run),
        other => Err(Failure::new(format!("{what}: {other:?}, not a run"))),
    }
}

/// A period's tick fires three tenths of a period late, and A claims it: A runs, and B (another
/// instance, in the same period) finds it held. The next period's tick fires on time: A runs
/// it, with a greater fence (the late tick's claim ended before it). A tick claimed after its
/// period's window is `Missed`.
pub async fn schedule_late_timer_does_not_skip_the_next_period(ctx: &Context) -> Outcome {
    late_timer(ctx, Anchor::Due).await
}

/// The same with the late tick's claim counted from the moment it fired, as a claim that
/// ignores when its tick was due would be: the conformance suite's own tests run it to show
/// that the scenario catches that (the next period is skipped). Not in [`super::all`].
pub async fn schedule_late_timer_anchored_at_firing(ctx: &Context) -> Outcome {
    late_timer(ctx, Anchor::Fired).await
}

/// From which instant the late tick's claim is counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Anchor {
    Due,
    Fired,
}

async fn late_timer(ctx: &Context, anchor: Anchor) -> Outcome {
    let period = period_for(ctx, 3)?;
    let key = ctx.key(match anchor {
        Anchor::Due => "schedule-late",
        Anchor::Fired => "schedule-late-fired",
    });
    let a = Schedule::new(ctx.connect().await?, &key, period);
    let b = Schedule::new(ctx.connect().await?, &key, period);
    let due = Instant::now();
    tokio::time::sleep(period * 3 / 10).await;
    let counted_from = match anchor {
        Anchor::Due => due,
        Anchor::Fired => Instant::now(),
    };
    let first = run(
        a.claim(counted_from)
            .await
            .or_fail("A claims the late tick")?,
        "A's claim of a free period",
    )?;
    let second = b.claim(due).await.or_fail("B claims the same period")?;
    ensure!(
        matches!(second, Claim::Held),
        "B's claim of the period A runs was {second:?}"
    );
    tokio::time::sleep_until(due + period).await;
    let next = match a
        .claim(due + period)
        .await
        .or_fail("A claims the next period, on time")?
    {
        Claim::Run(run) => run,
        other => {
            return Err(Failure::new(format!(
                "the next period's on-time tick found {other:?}: the late tick's claim (fired \
                 {:?} late, period {period:?}) made it skip",
                period * 3 / 10
            )))
        }
    };
    ensure!(
        next.fence() > first.fence(),
        "the next period's fence {} is not above the last one's {}",
        next.fence(),
        first.fence()
    );
    let missed = b
        .claim(due)
        .await
        .or_fail("B claims the last period after its window")?;
    ensure!(
        matches!(missed, Claim::Missed),
        "a tick claimed after its period's window was {missed:?}, not Missed"
    );
    Ok(Verdict::Passed)
}

/// A run claimed with `at_most` of one TTL writes with its fence, then hangs. After that TTL
/// (and the tolerance) its claim is over (`ensure_valid` fails) and B, waiting up to the
/// tolerance when held, runs the period with a greater fence and claims the resource; the hung
/// run's late write is refused. `at_least` above `at_most` is `InvalidConfig`, and an
/// `at_most` of zero `InvalidTtl`.
pub async fn schedule_at_most_ends_a_hung_run_and_fences_it(ctx: &Context) -> Outcome {
    let ttl = ctx.ttl();
    let period = period_for(ctx, 3)?.max(ttl * 16);
    let key = ctx.key("schedule-at-most");
    let resource = ctx.resource().await?;
    let a = Schedule::new(ctx.connect().await?, &key, period).at_most(ttl);
    let b = Schedule::new(ctx.connect().await?, &key, period)
        .at_most(ttl)
        .when_held(WhenHeld::Wait(ttl + ctx.tolerance()));
    let due = Instant::now();
    let hung = run(a.claim(due).await.or_fail("A claims")?, "A's claim")?;
    hung.ensure_valid().or_fail("A's fresh claim")?;
    ensure!(
        resource
            .write(hung.fence(), "A, running")
            .await
            .or_fail("A writes")?
            .is_accepted(),
        "A's write with its run's fence was refused"
    );
    // A hangs; B's instance fires in the same period and waits for the claim to end.
    let started = Instant::now();
    let taken = run(
        b.claim(due).await.or_fail("B claims, waiting")?,
        "B's claim once A's at_most passed",
    )?;
    let waited = started.elapsed();
    ensure!(
        waited >= ttl / 2,
        "B ran {waited:?} after A's claim of at most {ttl:?} began"
    );
    ensure!(
        hung.ensure_valid().is_err(),
        "A's run is still valid after its at_most of {ttl:?} passed and B ran"
    );
    ensure!(
        taken.fence() > hung.fence(),
        "B's fence {} is not above the hung run's {}",
        taken.fence(),
        hung.fence()
    );
    let claim = resource.claim(taken.fence()).await.or_fail("B claims")?;
    ensure!(claim.is_accepted(), "B's claim was refused: {claim:?}");
    let late = resource
        .write(hung.fence(), "A, after hanging")
        .await
        .or_fail("A's late write")?;
    ensure!(
        late == Guarded::Stale {
            newest: taken.fence().value()
        },
        "the hung run's late write was {late:?}, not refused"
    );
    let inverted = Schedule::new(ctx.connect().await?, &key, period)
        .at_most(ttl)
        .at_least(ttl * 2);
    match inverted.claim(Instant::now()).await {
        Err(Error::InvalidConfig { .. }) => {}
        other => {
            return Err(Failure::new(format!(
                "at_least above at_most gave {other:?}"
            )))
        }
    }
    let zero = Schedule::new(ctx.connect().await?, &key, period).at_most(Duration::ZERO);
    match zero.claim(Instant::now()).await {
        Err(Error::InvalidTtl { .. }) => {}
        other => return Err(Failure::new(format!("an at_most of zero gave {other:?}"))),
    }
    Ok(Verdict::Passed)
}

/// A run with `at_least` of two TTLs and `at_most` of four finishes at once. B, skipping when
/// held, finds the period held; C, waiting half a TTL, gives up with `Held` after about that
/// long; D, waiting up to five TTLs, runs the period once `at_least` has passed since A's claim
/// and before `at_most` would have ended it, with a greater fence.
pub async fn schedule_at_least_keeps_a_fast_run_and_waits_are_bounded(ctx: &Context) -> Outcome {
    let ttl = ctx.ttl();
    let (least, most) = (ttl * 2, ttl * 4);
    let period = period_for(ctx, 3)?.max(ttl * 16);
    let key = ctx.key("schedule-at-least");
    let schedule = |client| {
        Schedule::new(client, &key, period)
            .at_most(most)
            .at_least(least)
    };
    let a = schedule(ctx.connect().await?);
    let b = schedule(ctx.connect().await?);
    let c = schedule(ctx.connect().await?).when_held(WhenHeld::Wait(ttl / 2));
    let d = schedule(ctx.connect().await?).when_held(WhenHeld::Wait(ttl * 5));
    let due = Instant::now();
    let before = Instant::now();
    let fast = run(a.claim(due).await.or_fail("A claims")?, "A's claim")?;
    let first = fast.fence();
    fast.finish();
    let skipped = b.claim(due).await.or_fail("B claims")?;
    ensure!(
        matches!(skipped, Claim::Held),
        "B's claim right after A's fast run finished was {skipped:?}"
    );
    let started = Instant::now();
    let waited = c.claim(due).await.or_fail("C claims, waiting")?;
    let took = started.elapsed();
    ensure!(
        matches!(waited, Claim::Held),
        "C's claim, waiting {:?}, was {waited:?}",
        ttl / 2
    );
    ensure!(
        took + Duration::from_millis(1) >= ttl / 2 && took <= ttl / 2 + ctx.tolerance(),
        "C waited {took:?} for a bound of {:?}",
        ttl / 2
    );
    let next = run(
        d.claim(due).await.or_fail("D claims, waiting")?,
        "D's claim once A's at_least passed",
    )?;
    let at = before.elapsed();
    ensure!(
        at >= least,
        "D ran {at:?} after A's claim, before its at_least of {least:?}"
    );
    ensure!(
        at < most,
        "D ran {at:?} after A's claim: A's finished run was not released at its at_least of \
         {least:?} (at_most {most:?})"
    );
    ensure!(
        next.fence() > first,
        "D's fence {} is not above A's {first}",
        next.fence()
    );
    Ok(Verdict::Passed)
}
