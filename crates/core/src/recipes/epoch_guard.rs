//! A follower's guard against a deposed leader: it admits a command only if the command's epoch
//! is not older than the newest epoch the follower has seen, whether that epoch came with a
//! command or from watching the election.

use std::sync::Mutex;

use crate::contract::fence::Fence;
use crate::contract::resource::Guarded;
use crate::recipes::election::Leader;

/// The newest leader epoch a follower has seen, and the check it makes before acting on a
/// leader's command.
///
/// A leader can pause right after checking its leadership, be deposed while it sleeps, and wake
/// to send the command it prepared; nothing on the leader's side can stop that. The follower
/// can: it keeps the greatest epoch it has seen and refuses any command with an older one
/// ([`EpochGuard::admit`]). Seeing the new leader's first command teaches it the new epoch;
/// so does watching the election ([`EpochGuard::witness`] each leader an
/// [`crate::Observer`] reports), which refuses the deposed leader even before the new one has
/// sent anything.
///
/// ```
/// # use leasehold_core::{EpochGuard, Fence, FenceSafety, Guarded};
/// # let epoch = |n| Fence::from_value(n, FenceSafety::Linearizable).unwrap();
/// let guard = EpochGuard::new();
/// assert!(guard.admit(epoch(7)).is_accepted());         // the leader of epoch 7
/// guard.witness(epoch(9));                              // an observer saw epoch 9 elected
/// assert_eq!(guard.admit(epoch(7)), Guarded::Stale { newest: 9 }); // the deposed leader
/// assert!(guard.admit(epoch(9)).is_accepted());
/// ```
#[derive(Debug, Default)]
pub struct EpochGuard {
    newest: Mutex<u64>,
}

impl EpochGuard {
    /// A guard that has seen no epoch yet (it admits the first command it gets).
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether to act on a command sent with `epoch`: [`Guarded::Accepted`] when it is not
    /// older than every epoch seen (and then it is the newest), [`Guarded::Stale`] otherwise,
    /// with the newest. Check and update are one step, so two commands checked at once cannot
    /// both pass with the older one last.
    pub fn admit(&self, epoch: Fence) -> Guarded {
        let mut newest = self.lock();
        if epoch.value() < *newest {
            crate::telemetry::fence_rejected("epoch guard", epoch.value(), *newest);
            return Guarded::Stale { newest: *newest };
        }
        *newest = epoch.value();
        Guarded::Accepted
    }

    /// Learns of an epoch without a command: a leader seen elected. Older epochs change
    /// nothing.
    pub fn witness(&self, epoch: Fence) {
        let mut newest = self.lock();
        *newest = (*newest).max(epoch.value());
    }

    /// [`EpochGuard::witness`] of an observed leader's epoch.
    pub fn witness_leader(&self, leader: &Leader) {
        self.witness(leader.epoch);
    }

    /// The newest epoch seen (0 before any).
    pub fn newest(&self) -> u64 {
        *self.lock()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, u64> {
        // Each update is one assignment, so a poisoned lock still holds a consistent value.
        self.newest.lock().unwrap_or_else(|e| e.into_inner())
    }
}
