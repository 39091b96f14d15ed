//! What a semaphore's slots look like at one moment: how many permits are free and who holds
//! the others ([`crate::Semaphore::inspect`]).

use std::time::Duration;

use crate::contract::fence::Fence;
use crate::contract::inspection::{Inspection, OwnerId};
use crate::contract::key::LockKey;

/// A snapshot of every slot of a semaphore, one [`Inspection`] each, slot 0 first.
///
/// Read-only and stale the moment it returns, as every inspection is: for operators, status
/// pages and diagnostics, never a reason to act (a free slot may be taken an instant later).
/// Only a [`crate::Permit`] and its fence decide who may act.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SemaphoreStatus {
    /// How many permits the semaphore has.
    pub permits: u32,
    /// Each slot as the authority reported it, slot 0 first.
    pub slots: Vec<Inspection>,
}

/// One held permit, as [`SemaphoreStatus::holders`] lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PermitHolder {
    /// The slot (0 to N-1).
    pub slot: u32,
    /// The slot's lock key.
    pub key: LockKey,
    /// A short, non-secret id of the holder.
    pub owner: Option<OwnerId>,
    /// The holder's fence on the slot.
    pub fence: Option<Fence>,
    /// How long the holder's lease has left, where the backend can tell.
    pub remaining: Option<Duration>,
}

impl SemaphoreStatus {
    /// How many slots nobody held when they were read.
    pub fn free(&self) -> u32 {
        let held = self.slots.iter().filter(|s| s.held).count();
        self.permits
            .saturating_sub(u32::try_from(held).unwrap_or(u32::MAX))
    }

    /// The held slots, slot 0 first.
    pub fn holders(&self) -> Vec<PermitHolder> {
        self.slots
            .iter()
            .zip(0u32..)
            .filter(|(seen, _)| seen.held)
            .map(|(seen, slot)| PermitHolder {
                slot,
                key: seen.key.clone(),
                owner: seen.owner.clone(),
                fence: seen.fence,
                remaining: seen.remaining,
            })
            .collect()
    }
}
