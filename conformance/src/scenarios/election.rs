//! Leader election: one leader at a time, epochs (the leases' fences) that only grow across
//! resignation, expiry, crash and restart, observers that see each change, and a deposed
//! leader's commands refused downstream.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_core::{
    Election, Error, Guarded, Instant, Leader, LeaseOptions, Observer, WaitStrategy,
};

use super::cancellation::cut_short;
use crate::context::Context;
use crate::ensure;
use crate::verdict::{Failure, OrFail, Outcome, Verdict};

/// Four candidates, each on its own client, campaign three times each (waiting up to twenty
/// TTLs), lead a moment and resign. At no moment do two of them lead (counted in this process
/// from the moment `campaign` returns to the moment `resign` is called, with `ensure_valid`
/// checked inside); a follower's register accepts every leader's epoch in the order they were
/// elected, so epochs strictly grow; each leader reads its own value back through `leader()`.
pub async fn election_one_leader_at_a_time(ctx: &Context) -> Outcome {
    let key = ctx.key("election");
    let ttl = ctx.ttl();
    let leading = Arc::new(AtomicU32::new(0));
    let most = Arc::new(AtomicU32::new(0));
    let epochs: Arc<Mutex<Vec<u64>>> = Arc::default();
    let follower = ctx.resource().await?;
    let mut tasks = Vec::new();
    for i in 0..4 {
        let election = Election::new(ctx.connect().await?, &key)
            .with_value(format!("candidate-{i}"))
            .or_fail("a candidate's value")?;
        let (leading, most, epochs, follower) = (
            leading.clone(),
            most.clone(),
            epochs.clone(),
            follower.clone(),
        );
        tasks.push(tokio::spawn(async move {
            for _ in 0..3 {
                let leadership = election.campaign(ttl, ttl * 20).await?;
                let now = leading.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                let epoch = leadership.epoch();
                epochs
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(epoch.value());
                leadership.ensure_valid()?;
                let claimed = follower.claim(epoch).await?;
                tokio::time::sleep(Duration::from_millis(5)).await;
                let seen = election.leader().await?;
                leadership.ensure_valid()?;
                leading.fetch_sub(1, Ordering::SeqCst);
                let _ = leadership.resign().await?;
                if !claimed.is_accepted() {
                    return Ok(Some(format!(
                        "the follower refused epoch {epoch}: {claimed:?}"
                    )));
                }
                let expected = format!("candidate-{i}");
                match seen {
                    Some(l) if l.epoch == epoch && l.value_str() == Some(&expected) => {}
                    other => {
                        return Ok(Some(format!(
                            "leader {expected} with epoch {epoch} read back {other:?}"
                        )))
                    }
                }
            }
            Ok::<Option<String>, Error>(None)
        }));
    }
    for task in tasks {
        if let Some(problem) = task
            .await
            .or_fail("a candidate task")?
            .or_fail("a candidate")?
        {
            return Err(Failure::new(problem));
        }
    }
    let most = most.load(Ordering::SeqCst);
    ensure!(most == 1, "{most} candidates led at once");
    let epochs = epochs.lock().unwrap_or_else(|e| e.into_inner());
    ensure!(epochs.len() == 12, "{} leaderships, not 12", epochs.len());
    ensure!(
        epochs.windows(2).all(|w| w[0] < w[1]),
        "epochs did not grow in the order leaders were elected: {epochs:?}"
    );
    Ok(Verdict::Passed)
}

/// Epochs grow across each way a leadership ends: A resigns, then B leads; B stops renewing and
/// its lease runs out (B's own `ensure_valid` then fails), then C leads; C's process crashes
/// (leadership and client dropped, nothing released), then D leads, within a TTL of the crash.
pub async fn election_epochs_grow_across_resign_expiry_and_crash(ctx: &Context) -> Outcome {
    let key = ctx.key("election-epochs");
    let ttl = ctx.ttl();
    let max_wait = ttl * 4 + ctx.tolerance();
    let a = Election::new(ctx.connect().await?, &key);
    let first = a.campaign(ttl, max_wait).await.or_fail("A campaigns")?;
    let e1 = first.epoch();
    let _ = first.resign().await.or_fail("A resigns")?;

    let lapsing = LeaseOptions::default().with_auto_renew(false);
    let b = Election::new(ctx.connect().await?, &key).with_lease_options(lapsing);
    let second = b.campaign(ttl, max_wait).await.or_fail("B campaigns")?;
    let e2 = second.epoch();
    ensure!(
        e2 > e1,
        "B's epoch {e2} is not above A's {e1} after A resigned"
    );
    let c = Election::new(ctx.connect().await?, &key);
    let third = c
        .campaign(ttl, max_wait)
        .await
        .or_fail("C campaigns after B's lease ran out")?;
    let e3 = third.epoch();
    ensure!(
        second.ensure_valid().is_err(),
        "B still believes it leads after C was elected with epoch {e3}"
    );
    ensure!(
        e3 > e2,
        "C's epoch {e3} is not above B's {e2} after B expired"
    );
    drop(second);

    // C crashes: its leadership and its client vanish without releasing anything.
    let crashed = Instant::now();
    {
        let doomed = ctx.connect().await?;
        let crashing = Election::new(doomed.clone(), &key)
            .with_lease_options(LeaseOptions::default().with_release_on_drop(false));
        let _ = third
            .resign()
            .await
            .or_fail("C hands over to its crashing twin")?;
        let held = crashing
            .campaign(ttl, max_wait)
            .await
            .or_fail("the crashing candidate campaigns")?;
        let e4 = held.epoch();
        ensure!(e4 > e3, "epoch {e4} is not above C's {e3}");
        drop(held);
        drop(crashing);
        drop(doomed);
    }
    let d = Election::new(ctx.connect().await?, &key);
    let fourth = d
        .campaign(ttl, ttl * 2 + ctx.tolerance())
        .await
        .or_fail("D campaigns after the leader crashed")?;
    let took = crashed.elapsed();
    ensure!(
        took <= ttl + ctx.tolerance() + ttl / 2,
        "D was elected {took:?} after the leader crashed (TTL {ttl:?})"
    );
    ensure!(
        fourth.epoch() > e3,
        "D's epoch {} is not above the crashed leader's predecessor's {e3}",
        fourth.epoch()
    );
    let _ = fourth.resign().await.or_fail("D resigns")?;
    Ok(Verdict::Passed)
}

/// Across a crash and restart of the server, the next leader's epoch is greater than the last
/// one before, where the backend declares durable fences; elsewhere the result is declared.
pub async fn election_epochs_survive_restart(ctx: &Context) -> Outcome {
    let key = ctx.key("election-restart");
    let ttl = ctx.ttl();
    let a = Election::new(ctx.connect().await?, &key);
    let before = a.campaign(ttl, ttl * 4).await.or_fail("A campaigns")?;
    let e1 = before.epoch();
    let _ = before.resign().await.or_fail("A resigns")?;
    match ctx.faults().restart().await {
        Err(Error::Unsupported { .. }) => {
            return Ok(Verdict::NotApplicable(
                "the harness cannot restart the server".into(),
            ))
        }
        other => other.or_fail("restart the server")?,
    }
    let b = Election::new(ctx.connect().await?, &key);
    let after = b
        .campaign(ttl, ttl * 10 + ctx.tolerance())
        .await
        .or_fail("B campaigns after the restart")?;
    let e2 = after.epoch();
    let _ = after.resign().await.or_fail("B resigns")?;
    if e2 > e1 {
        return Ok(Verdict::Passed);
    }
    ensure!(
        !ctx.capabilities().durable_fences,
        "epoch {e2} after the restart is not above {e1} before it, yet fences are declared durable"
    );
    Ok(Verdict::Declared(format!(
        "epochs restarted ({e2} after, {e1} before), as declared: fences are not durable"
    )))
}

/// How soon an observer must see a change somebody made (a grant, a proclaim, a release): a
/// fraction of the TTL where the backend notifies, so the observer's timer (one TTL) could not
/// meet it alone; the observer's interval plus the tolerance where it polls.
fn notified_within(ctx: &Context, interval: Duration) -> Duration {
    match ctx.capabilities().wait {
        WaitStrategy::Notification => ctx.ttl() / 4 + ctx.capabilities().expiry_slack,
        _ => interval + ctx.tolerance(),
    }
}

/// Waits for the observer to report `wanted` within `within`, allowing `passing` states on the
/// way (a leader seen before its value was written); anything else is a failure.
async fn observe_until(
    observer: &mut Observer,
    within: Duration,
    what: &str,
    wanted: impl Fn(&Option<Leader>) -> bool,
    passing: impl Fn(&Option<Leader>) -> bool,
) -> Result<Option<Leader>, Failure> {
    let since = Instant::now();
    if let Some(Some(last)) = observer.last() {
        if wanted(&Some(last.clone())) {
            return Ok(Some(last.clone()));
        }
    }
    loop {
        let left = within.saturating_sub(since.elapsed());
        let seen = match tokio::time::timeout(left, observer.next()).await {
            Err(_) => {
                return Err(Failure::new(format!(
                    "the observer did not see {what} within {within:?} (last {:?})",
                    observer.last()
                )))
            }
            Ok(seen) => seen.or_fail("the observer reads")?,
        };
        if wanted(&seen) {
            return Ok(seen);
        }
        ensure!(
            passing(&seen),
            "while waiting for {what} the observer reported {seen:?}"
        );
    }
}

/// An observer on its own client (reading at least once a TTL) sees, each soon after it
/// happens: nobody; A elected with its value; A's new value; A's resignation; B elected with
/// a greater epoch; B's lease running out (within its TTL plus the observer's interval, as
/// nobody announces an expiry). A stream of a second observer sees the same leaders in order.
pub async fn election_observers_see_every_change(ctx: &Context) -> Outcome {
    let key = ctx.key("election-observe");
    let ttl = ctx.ttl();
    let interval = ttl;
    let watcher = Election::new(ctx.connect().await?, &key);
    let mut observer = watcher.observe().with_interval(interval);
    let first = observer.next().await.or_fail("the first observation")?;
    ensure!(
        first.is_none(),
        "a new election already has a leader: {first:?}"
    );
    let soon = notified_within(ctx, interval);

    let a = Election::new(ctx.connect().await?, &key)
        .with_value("10.0.0.1:7000")
        .or_fail("A's value")?;
    let mut leading = a.campaign(ttl, ttl * 4).await.or_fail("A campaigns")?;
    let epoch_a = leading.epoch();
    let is_a_unproclaimed =
        |l: &Option<Leader>| matches!(l, Some(l) if l.epoch == epoch_a && l.value.is_none());
    observe_until(
        &mut observer,
        soon,
        "A elected with its value",
        |l| matches!(l, Some(l) if l.epoch == epoch_a && l.value_str() == Some("10.0.0.1:7000")),
        is_a_unproclaimed,
    )
    .await?;
    leading
        .proclaim("10.0.0.1:7001")
        .await
        .or_fail("A proclaims a new value")?;
    observe_until(
        &mut observer,
        soon,
        "A's new value",
        |l| matches!(l, Some(l) if l.epoch == epoch_a && l.value_str() == Some("10.0.0.1:7001")),
        |_| false,
    )
    .await?;
    let _ = leading.resign().await.or_fail("A resigns")?;
    observe_until(
        &mut observer,
        soon,
        "A's resignation",
        Option::is_none,
        |_| false,
    )
    .await?;

    let b = Election::new(ctx.connect().await?, &key)
        .with_value("10.0.0.2:7000")
        .or_fail("B's value")?
        .with_lease_options(LeaseOptions::default().with_auto_renew(false));
    let lapsing = b.campaign(ttl, ttl * 4).await.or_fail("B campaigns")?;
    let epoch_b = lapsing.epoch();
    ensure!(
        epoch_b > epoch_a,
        "B's epoch {epoch_b} is not above A's {epoch_a}"
    );
    observe_until(
        &mut observer,
        soon,
        "B elected with its value",
        |l| matches!(l, Some(l) if l.epoch == epoch_b && l.value_str() == Some("10.0.0.2:7000")),
        |l| matches!(l, Some(l) if l.epoch == epoch_b && l.value.is_none()),
    )
    .await?;
    observe_until(
        &mut observer,
        ttl + interval + ctx.tolerance(),
        "B's lease running out",
        Option::is_none,
        |_| false,
    )
    .await?;
    drop(lapsing);
    Ok(Verdict::Passed)
}

/// A leads and commands a follower (a fenced resource) with its epoch. A then pauses (stops
/// renewing; its lease runs out), B is elected and commands the follower. A wakes and sends the
/// command it had prepared before the pause: the follower refuses it, and keeps B's.
pub async fn election_deposed_leader_is_refused(ctx: &Context) -> Outcome {
    let key = ctx.key("election-deposed");
    let ttl = ctx.ttl();
    let follower = ctx.resource().await?;
    let a = Election::new(ctx.connect().await?, &key)
        .with_lease_options(LeaseOptions::default().with_auto_renew(false));
    let old = a.campaign(ttl, ttl * 4).await.or_fail("A campaigns")?;
    let epoch_a = old.epoch();
    old.ensure_valid().or_fail("A leads")?;
    let first = follower
        .write(epoch_a, "A: first command")
        .await
        .or_fail("A commands")?;
    ensure!(
        first.is_accepted(),
        "the follower refused the leader A: {first:?}"
    );
    // A pauses here, after its validity check for the next command.
    let b = Election::new(ctx.connect().await?, &key);
    let new = b
        .campaign(ttl, ttl * 4 + ctx.tolerance())
        .await
        .or_fail("B campaigns while A is paused")?;
    let epoch_b = new.epoch();
    ensure!(
        epoch_b > epoch_a,
        "B's epoch {epoch_b} is not above A's {epoch_a}"
    );
    new.ensure_valid().or_fail("B leads")?;
    let b_cmd = follower
        .write(epoch_b, "B: first command")
        .await
        .or_fail("B commands")?;
    ensure!(
        b_cmd.is_accepted(),
        "the follower refused the new leader B: {b_cmd:?}"
    );
    // A wakes and sends what it prepared.
    let late = follower
        .write(epoch_a, "A: command after the pause")
        .await
        .or_fail("A's late command")?;
    ensure!(
        matches!(late, Guarded::Stale { newest } if newest == epoch_b.value()),
        "the deposed leader's command was {late:?}, not refused in favour of epoch {epoch_b}"
    );
    ensure!(
        old.ensure_valid().is_err(),
        "A still believes it leads after B was elected"
    );
    let _ = new.resign().await.or_fail("B resigns")?;
    Ok(Verdict::Passed)
}

/// Campaigns dropped at random points around one round trip, a hundred times, while another
/// candidate leads: afterwards, once the leader resigns, a new candidate is elected within two
/// TTLs (a campaign in flight may still have won a lease, which runs out), and then at once for
/// the client that dropped them.
pub async fn election_cancelled_campaign_leaves_nothing(ctx: &Context) -> Outcome {
    let key = ctx.key("election-cancel");
    let ttl = ctx.ttl();
    let leader = Election::new(ctx.connect().await?, &key);
    let held = leader
        .campaign(ttl, ttl * 4)
        .await
        .or_fail("the leader campaigns")?;
    let dropper = Election::new(ctx.connect().await?, &key)
        .with_value("dropper")
        .or_fail("the dropper's value")?
        .with_lease_options(LeaseOptions::default().with_release_on_drop(false));
    let started = Instant::now();
    let probe = dropper.try_campaign(ttl).await;
    let rtt = started.elapsed().max(Duration::from_micros(100));
    ensure!(
        matches!(probe, Ok(None)),
        "a candidate was elected while another led: {probe:?}"
    );
    let mut won = 0;
    for _ in 0..100 {
        if let Some(Ok(l)) = cut_short(dropper.campaign(ttl, ttl * 5), rtt * 3).await {
            won += 1;
            let _ = l.resign().await;
        }
    }
    ensure!(
        won == 0,
        "{won} dropped campaigns won while another candidate led"
    );
    let _ = held.resign().await.or_fail("the leader resigns")?;
    let other = Election::new(ctx.connect().await?, &key);
    let next = other
        .campaign(ttl, ttl * 2 + ctx.tolerance())
        .await
        .or_fail("a new candidate after the drops")?;
    let _ = next.resign().await.or_fail("the new leader resigns")?;
    let again = Election::new(dropper.authority().clone(), &key);
    let last = again
        .campaign(ttl, ctx.tolerance())
        .await
        .or_fail("the dropping client campaigns again")?;
    let _ = last.resign().await.or_fail("it resigns")?;
    Ok(Verdict::Passed)
}
