//! The unknown outcome: a holder's write is cut off at the store while it waits there, so the
//! holder cannot know whether it landed, and resolves that by claiming again.

use std::time::Duration;

use leasehold_core::{Error, Guarded, Instant};
use tokio::task::JoinHandle;

use super::scenarios::{fence, fresh, write, RECONNECT_WITHIN};
use super::{GateContext, HeldWrites};
use crate::ensure;
use crate::verdict::{Failure, OrFail, Outcome, Verdict};

/// How long the held write may take to show up as waiting at the store.
const REACH_THE_HOLD_WITHIN: Duration = Duration::from_secs(10);

/// How often the scenario looks whether the write waits at the store.
const POLL: Duration = Duration::from_millis(10);

/// Where the store cannot count the writes waiting on a hold: how many polls (each a look at
/// the writer, some round trips' time) the write must stay unanswered before the cut.
const BLIND_POLLS: usize = 10;

type Writer = JoinHandle<leasehold_core::Result<Guarded>>;

/// Waits until the held write is seen waiting at the store (or, where the store cannot tell,
/// until it stayed unanswered for [`BLIND_POLLS`] polls); fails if it was answered, since a
/// hold that lets it through would make the cut find nothing in flight.
async fn reach_the_hold(hold: &dyn HeldWrites, writer: &mut Writer) -> Result<(), Failure> {
    let give_up = leasehold_core::time::saturating_add(Instant::now(), REACH_THE_HOLD_WITHIN);
    let mut blind = 0;
    loop {
        if writer.is_finished() {
            let answer = writer.await.or_fail("the writer task")?;
            return Err(Failure::new(format!(
                "the write with fence 21 was answered ({answer:?}) while the store's writes were \
                 held: the hold let it through, so the cut would find nothing in flight"
            )));
        }
        match hold
            .waiting()
            .await
            .or_fail("count the writes waiting on the hold")?
        {
            Some(n) if n > 0 => return Ok(()),
            Some(_) => {}
            None => {
                blind += 1;
                if blind >= BLIND_POLLS {
                    return Ok(());
                }
            }
        }
        ensure!(
            Instant::now() < give_up,
            "the write with fence 21 was not seen waiting at the store within \
             {REACH_THE_HOLD_WITHIN:?} of being sent while writes were held"
        );
        tokio::time::sleep(POLL).await;
    }
}

/// A holder's write is in flight when the store's connections are cut, so it cannot know
/// whether the write landed. It resolves that by claiming again with its own fence (accepted
/// whether or not the write landed); a paused older holder's write is refused afterwards either
/// way.
///
/// The write is certainly in flight at the cut where the harness can hold writes at the store
/// ([`super::GateFaults::hold_writes`]): the scenario holds them, sends the write, waits until
/// the store sees it waiting (and checks that it is still unanswered), cuts, and only then
/// releases. The writer's answer must then be an error or an acceptance that did land; where
/// the cut loses held writes for good, it must be an error and the value the one before. A
/// harness that cannot hold writes gets the cut alone, and the outcome says that the write may
/// have been answered before the cut.
pub async fn unknown_outcome_resolved_by_claim(ctx: &GateContext) -> Outcome {
    let Some(faults) = ctx.faults() else {
        return Ok(Verdict::NotApplicable(
            "the harness cannot cut this store's connections".into(),
        ));
    };
    let (r, value) = fresh(ctx).await?;
    let first = write(&*r, 20, "before").await?;
    ensure!(
        first.is_accepted(),
        "the first write (fence 20) was refused: {first:?}"
    );
    let hold = match faults.hold_writes().await {
        Ok(hold) => Some(hold),
        Err(Error::Unsupported { .. }) => None,
        Err(e) => return Err(Failure::new(format!("hold the store's writes: {e}"))),
    };
    let mut writer: Writer = {
        let r = r.clone();
        let fence = fence(21)?;
        tokio::spawn(async move { r.write(fence, "in flight").await })
    };
    if let Some(hold) = &hold {
        reach_the_hold(&**hold, &mut writer).await?;
    }
    let unanswered_at_cut = !writer.is_finished();
    ensure!(
        unanswered_at_cut || hold.is_none(),
        "the write with fence 21 was answered while the store's writes were held, before the cut"
    );
    let cut = faults.cut_connections().await;
    // Released whatever the cut did: a store left held would fail every later scenario.
    let lost_for_good = match hold {
        Some(hold) => {
            let lost = hold.cut_loses_held_writes();
            hold.release().await.or_fail("release the held writes")?;
            Some(lost)
        }
        None => None,
    };
    cut.or_fail("cut the store's connections")?;
    let answer = writer.await.or_fail("the writer task")?;
    if let Ok(Guarded::Stale { newest }) = &answer {
        return Err(Failure::new(format!(
            "the write with fence 21 over 20, cut off in flight, was answered stale (newest \
             {newest}) though no newer fence was ever presented"
        )));
    }
    let accepted = matches!(answer, Ok(Guarded::Accepted));
    ensure!(
        !(accepted && lost_for_good == Some(true)),
        "the write with fence 21 was answered accepted though it was held at the store when its \
         connection was cut, and this store loses such a write for good"
    );
    let give_up = leasehold_core::time::saturating_add(Instant::now(), RECONNECT_WITHIN);
    let resolved = loop {
        match r.claim(fence(21)?).await {
            Ok(outcome) => break outcome,
            Err(e) if Instant::now() < give_up && e.is_retryable() => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => {
                return Err(Failure::new(format!(
                    "the holder's claim again failed: {e}"
                )))
            }
        }
    };
    ensure!(
        resolved.is_accepted(),
        "the holder's claim with its own fence 21 after an unknown outcome was refused: \
         {resolved:?}"
    );
    let late = write(&*r, 20, "late").await?;
    ensure!(
        late == Guarded::Stale { newest: 21 },
        "fence 20's write after the holder's claim with 21 was not refused: {late:?}"
    );
    let held = value()
        .await
        .or_fail("read the value after the late write")?;
    let allowed: &[&str] = match (accepted, lost_for_good) {
        (true, _) => &["in flight"],
        (false, Some(true)) => &["before"],
        (false, _) => &["before", "in flight"],
    };
    ensure!(
        held.as_deref().is_some_and(|v| allowed.contains(&v)),
        "after the refused late write the store holds {held:?}, not one of {allowed:?} (the \
         write cut off in flight answered {answer:?})"
    );
    match lost_for_good {
        Some(_) => Ok(Verdict::Passed),
        None => Ok(Verdict::NotApplicable(format!(
            "this store's faults cannot hold writes, so the cut was not certain to find the \
             write in flight (it was {} when the cut began); the claim again and the refused \
             late write were checked",
            if unanswered_at_cut {
                "still unanswered"
            } else {
                "already answered"
            }
        ))),
    }
}
