//! Leader election's extras: a leader hands leadership to a named candidate with no gap for a
//! third, and a follower's epoch guard refuses a deposed leader's command once it has seen the
//! new leader elected.

use std::time::Duration;

use leasehold_core::{Election, EpochGuard, Guarded, Instant, LeaseOptions};

use crate::context::Context;
use crate::ensure;
use crate::verdict::{Failure, OrFail, Outcome, Verdict};

/// A leads; C (named "c") campaigns and waits. A yields to "b" for a window of two TTLs; B is
/// slow and campaigns only a fifth of a TTL later. B is elected next, with a greater epoch, and
/// C never leads meanwhile; an election read without campaigning shows A, then B. Once B
/// resigns, C is elected (after the window) with a greater epoch still.
pub async fn election_yield_hands_over_to_the_named_candidate(ctx: &Context) -> Outcome {
    handoff(ctx, true).await
}

/// The same with A resigning instead of yielding: the conformance suite's own tests run it to
/// show that the scenario catches a hand-off with a gap (C slips in). Not in [`super::all`].
pub async fn election_resign_leaves_a_gap_for_a_third(ctx: &Context) -> Outcome {
    handoff(ctx, false).await
}

async fn handoff(ctx: &Context, yielding: bool) -> Outcome {
    let key = ctx.key(if yielding {
        "election-yield"
    } else {
        "election-yield-gap"
    });
    let ttl = ctx.ttl();
    let window = ctx.capabilities().ttl.at_least(ttl * 2);
    let a = Election::new(ctx.connect().await?, &key).with_name("a");
    let b = Election::new(ctx.connect().await?, &key).with_name("b");
    let c = Election::new(ctx.connect().await?, &key).with_name("c");
    let watcher = Election::new(ctx.connect().await?, &key);
    let leading = a.campaign(ttl, ttl * 4).await.or_fail("A campaigns")?;
    let epoch_a = leading.epoch();
    let seen = watcher.leader().await.or_fail("read the leader")?;
    ensure!(
        seen.as_ref().map(|l| l.epoch) == Some(epoch_a),
        "an election read without campaigning shows {seen:?}, A leads with epoch {epoch_a}"
    );
    let third = tokio::spawn(async move {
        let got = c.campaign(ttl, window * 4).await;
        (got, Instant::now())
    });
    tokio::time::sleep(ttl / 10).await;
    ensure!(!third.is_finished(), "C was elected while A led");
    if yielding {
        let _ = leading
            .yield_to("b", window)
            .await
            .or_fail("A yields to B")?;
    } else {
        let _ = leading.resign().await.or_fail("A resigns")?;
    }
    // B is slow to campaign: the window must keep C out meanwhile.
    tokio::time::sleep(ttl / 5).await;
    ensure!(
        !third.is_finished(),
        "C was elected in the gap after A {} in favour of B",
        if yielding { "yielded" } else { "resigned" }
    );
    let successor = b
        .campaign(ttl, ttl)
        .await
        .or_fail("B campaigns in its hand-off window")?;
    let epoch_b = successor.epoch();
    ensure!(
        epoch_b > epoch_a,
        "B's epoch {epoch_b} is not above A's {epoch_a}"
    );
    ensure!(!third.is_finished(), "C was elected beside B");
    let seen = watcher.leader().await.or_fail("read the leader")?;
    ensure!(
        seen.as_ref().map(|l| l.epoch) == Some(epoch_b),
        "an election read shows {seen:?}, B leads with epoch {epoch_b}"
    );
    let _ = successor.resign().await.or_fail("B resigns")?;
    let (got, _) = tokio::time::timeout(window * 2 + ctx.tolerance(), third)
        .await
        .map_err(|_| Failure::new("C was not elected after B resigned and the window ended"))?
        .or_fail("C's task")?;
    let last = got.or_fail("C campaigns")?;
    ensure!(
        last.epoch() > epoch_b,
        "C's epoch {} is not above B's {epoch_b}",
        last.epoch()
    );
    let _ = last.resign().await.or_fail("C resigns")?;
    Ok(Verdict::Passed)
}

/// A leads (its lease not renewed: a pause) and its first command is admitted by a follower's
/// `EpochGuard`. The follower watches the election and witnesses each leader it sees. A's lease
/// runs out, B is elected and the follower sees it; then A wakes and sends the command it had
/// prepared, before B has sent anything: the guard refuses it in favour of B's epoch, and
/// admits B's command.
pub async fn election_follower_guard_refuses_a_deposed_leader(ctx: &Context) -> Outcome {
    guarded_follower(ctx, true).await
}

/// The same with a follower that learns epochs only from commands: the conformance suite's own
/// tests run it to show that the scenario catches such a follower (A's late command passes).
/// Not in [`super::all`].
pub async fn election_follower_without_watching_admits_a_deposed_leader(ctx: &Context) -> Outcome {
    guarded_follower(ctx, false).await
}

async fn guarded_follower(ctx: &Context, watching: bool) -> Outcome {
    let key = ctx.key(if watching {
        "election-guard"
    } else {
        "election-guard-blind"
    });
    let ttl = ctx.ttl();
    let guard = EpochGuard::new();
    let a = Election::new(ctx.connect().await?, &key)
        .with_lease_options(LeaseOptions::default().with_auto_renew(false));
    let old = a.campaign(ttl, ttl * 4).await.or_fail("A campaigns")?;
    let epoch_a = old.epoch();
    old.ensure_valid().or_fail("A leads")?;
    ensure!(
        guard.admit(epoch_a).is_accepted(),
        "the follower refused the leader A's first command"
    );
    let mut observer = Election::new(ctx.connect().await?, &key)
        .observe()
        .with_interval(ttl / 4);
    // A pauses here, after its validity check for the next command; B is elected.
    let b = Election::new(ctx.connect().await?, &key);
    let new = b
        .campaign(ttl, ttl * 4 + ctx.tolerance())
        .await
        .or_fail("B campaigns while A is paused")?;
    let epoch_b = new.epoch();
    if watching {
        let since = Instant::now();
        let within = ttl + ctx.tolerance();
        loop {
            let left = within.saturating_sub(since.elapsed());
            let seen = tokio::time::timeout(left.max(Duration::from_millis(1)), observer.next())
                .await
                .map_err(|_| {
                    Failure::new(format!(
                        "the follower did not see B elected within {within:?}"
                    ))
                })?
                .or_fail("the follower observes")?;
            if let Some(leader) = seen {
                guard.witness_leader(&leader);
                if leader.epoch == epoch_b {
                    break;
                }
            }
        }
    }
    // A wakes and sends what it prepared, before B has sent any command.
    let late = guard.admit(epoch_a);
    ensure!(
        late == Guarded::Stale {
            newest: epoch_b.value()
        },
        "the deposed leader's command with epoch {epoch_a} was {late:?} after the follower saw \
         epoch {epoch_b} elected"
    );
    ensure!(
        guard.admit(epoch_b).is_accepted(),
        "the follower refused the new leader B's command"
    );
    ensure!(
        old.ensure_valid().is_err(),
        "A still believes it leads after B was elected"
    );
    let _ = new.resign().await.or_fail("B resigns")?;
    Ok(Verdict::Passed)
}
