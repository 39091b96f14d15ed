//! Grants waiting for their key's watch to open.
//!
//! A grant's key is watched so that its loss is pushed to the holder at once
//! (see [`crate::held_watch_stream`]). Most grants on a hot path are released within milliseconds,
//! so the watch opens only after a twentieth of the session's TTL (at most 250 ms); nothing is
//! missed meanwhile, because the watch starts from the key's creation and replays a deletion
//! that happened before it opened. Until then a grant waits in this queue, which the session's
//! task serves, instead of in a task and a timer of its own: those cost an uncontended
//! acquire + release about 10 µs of client CPU (measured, see docs/performance-log.md).

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use leasehold_core::time::saturating_add;
use leasehold_core::LossSignal;
use tokio::time::Instant;

use crate::contenders::Withdrawal;

/// The longest a grant waits for its watch.
const LONGEST_DELAY: Duration = Duration::from_millis(250);

/// One grant whose watch is not open yet.
#[derive(Debug)]
pub(crate) struct PendingWatch {
    pub held: Withdrawal,
    pub loss: LossSignal,
    due: Instant,
}

/// The grants of one session whose watches open later, oldest first.
#[derive(Debug)]
pub(crate) struct HeldWatches {
    delay: Duration,
    queue: Mutex<VecDeque<PendingWatch>>,
}

impl HeldWatches {
    /// For a session whose lease lasts `ttl`.
    pub fn new(ttl: Duration) -> Self {
        HeldWatches {
            delay: (ttl / 20).min(LONGEST_DELAY),
            queue: Mutex::new(VecDeque::new()),
        }
    }

    fn queue(&self) -> std::sync::MutexGuard<'_, VecDeque<PendingWatch>> {
        // Every critical section leaves the queue consistent, so a poisoned lock is still usable.
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues the watch of `held`, granted now. True when the queue was empty: the session's
    /// task sleeps without a deadline for it and must be woken to take it into account.
    pub fn push(&self, held: Withdrawal, loss: LossSignal) -> bool {
        let mut queue = self.queue();
        // Read under the lock, so the queue stays in order of `due` whichever thread pushes.
        let due = saturating_add(Instant::now(), self.delay);
        queue.push_back(PendingWatch { held, loss, due });
        queue.len() == 1
    }

    /// The watches due at `now`, oldest first, and when the next one falls due.
    pub fn due(&self, now: Instant) -> (Vec<PendingWatch>, Option<Instant>) {
        let mut queue = self.queue();
        let ready = queue.iter().take_while(|p| p.due <= now).count();
        let due = queue.drain(..ready).collect();
        (due, queue.front().map(|p| p.due))
    }

    /// Drops every pending watch (the session ended: its grants are lost already).
    pub fn clear(&self) {
        self.queue().clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold_core::OwnerToken;

    fn held(name: &str) -> Withdrawal {
        Withdrawal {
            name: name.into(),
            owner: OwnerToken::generate().expect("a generated owner token"),
            revision: Some(7),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn watches_fall_due_a_twentieth_of_the_ttl_after_their_grant_in_order() {
        let watches = HeldWatches::new(Duration::from_secs(2));
        assert!(
            watches.push(held("a"), LossSignal::new()),
            "first in an empty queue"
        );
        tokio::time::advance(Duration::from_millis(40)).await;
        assert!(!watches.push(held("b"), LossSignal::new()));

        let (due, next) = watches.due(Instant::now());
        assert!(due.is_empty(), "nothing is due before 100 ms");
        assert_eq!(
            next.map(|n| n - Instant::now()),
            Some(Duration::from_millis(60))
        );
        tokio::time::advance(Duration::from_millis(60)).await;
        let (due, next) = watches.due(Instant::now());
        let names: Vec<_> = due.iter().map(|p| p.held.name.as_str()).collect();
        assert_eq!(names, ["a"]);
        assert_eq!(
            next.map(|n| n - Instant::now()),
            Some(Duration::from_millis(40))
        );
        tokio::time::advance(Duration::from_millis(40)).await;
        let (due, next) = watches.due(Instant::now());
        assert_eq!(due.len(), 1);
        assert_eq!(next, None);
        assert!(watches.push(held("c"), LossSignal::new()), "empty again");
    }

    #[tokio::test(start_paused = true)]
    async fn a_long_ttl_waits_at_most_250_ms_and_clear_drops_everything() {
        let watches = HeldWatches::new(Duration::from_secs(3600));
        watches.push(held("a"), LossSignal::new());
        let (_, next) = watches.due(Instant::now());
        assert_eq!(next.map(|n| n - Instant::now()), Some(LONGEST_DELAY));
        watches.clear();
        assert_eq!(watches.due(Instant::now() + LONGEST_DELAY).0.len(), 0);
    }
}
