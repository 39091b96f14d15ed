//! Deliberately broken recipes: each recipe scenario must fail on the variant it is aimed at.
//!
//! Each variant breaks exactly one rule of a recipe that an implementation could plausibly get
//! wrong, built from the same lock keys the recipe uses, on the reference authority. A scenario
//! that passes its variant has no teeth for that rule.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use leasehold_core::{Authority, Lease, LeaseOptions, LockKey, Result, RwLock};

use crate::context::Context;
use crate::scenarios::multi_key::{self, MultiFuture};
use crate::scenarios::rw_lock::{self, Hold, RwRecipe};
use crate::verdict::Outcome;

/// The ways a recipe can be broken.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RecipeMutant {
    /// A writer takes the gate but does not wait for the readers to drain.
    WriterIgnoresReaders,
    /// Readers take a slot without passing the gate, so a waiting writer does not hold them
    /// back (and their fences are the slot's, outside the gate's order).
    ReadersSkipGate,
    /// A writer dropped while it waits keeps the gate it took (its leases are not given back;
    /// they run out at their TTL).
    DroppedWriterKeepsGate,
    /// `acquire_all` takes the keys in the order the caller names them, not in one canonical
    /// order: two callers naming overlapping sets in different orders deadlock.
    KeysInGivenOrder,
    /// `acquire_all` keeps the keys it took when a later one times out.
    KeepsKeysOnTimeout,
}

impl RecipeMutant {
    /// Every recipe mutant.
    pub const ALL: [RecipeMutant; 5] = [
        RecipeMutant::WriterIgnoresReaders,
        RecipeMutant::ReadersSkipGate,
        RecipeMutant::DroppedWriterKeepsGate,
        RecipeMutant::KeysInGivenOrder,
        RecipeMutant::KeepsKeysOnTimeout,
    ];

    /// The scenario aimed at this mutant.
    pub fn aimed_at(&self) -> &'static str {
        match self {
            RecipeMutant::WriterIgnoresReaders => "rw_lock_never_writer_beside_anyone",
            RecipeMutant::ReadersSkipGate => "rw_lock_waiting_writer_blocks_new_readers",
            RecipeMutant::DroppedWriterKeepsGate => "rw_lock_cancelled_writer_leaves_nothing",
            RecipeMutant::KeysInGivenOrder => "acquire_all_never_deadlocks_or_overlaps",
            RecipeMutant::KeepsKeysOnTimeout => "acquire_all_failure_leaves_no_key",
        }
    }

    /// Runs the scenario aimed at this mutant on the broken variant.
    pub async fn run(&self, ctx: &Context) -> Outcome {
        match self {
            RecipeMutant::WriterIgnoresReaders => {
                rw_lock::never_writer_beside_anyone_with(ctx, writer_ignores_readers).await
            }
            RecipeMutant::ReadersSkipGate => {
                rw_lock::waiting_writer_blocks_new_readers_with(ctx, readers_skip_gate).await
            }
            RecipeMutant::DroppedWriterKeepsGate => {
                rw_lock::cancelled_writer_leaves_nothing_with(ctx, dropped_writer_keeps_gate).await
            }
            RecipeMutant::KeysInGivenOrder => {
                multi_key::never_deadlocks_or_overlaps_with(ctx, keys_in_given_order).await
            }
            RecipeMutant::KeepsKeysOnTimeout => {
                multi_key::failure_leaves_no_key_with(ctx, keeps_keys_on_timeout).await
            }
        }
    }
}

impl std::fmt::Display for RecipeMutant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self, f)
    }
}

/// A broken reader-writer lock: the recipe's keys, and one mode done wrong.
struct Broken {
    lock: RwLock,
    authority: Arc<dyn Authority>,
    mutant: RecipeMutant,
}

impl Broken {
    fn make(
        authority: Arc<dyn Authority>,
        name: &LockKey,
        mutant: RecipeMutant,
    ) -> Result<Box<dyn RwRecipe>> {
        Ok(Box::new(Broken {
            lock: RwLock::new(authority.clone(), name)?,
            authority,
            mutant,
        }))
    }

    /// The upgrade key and the gate, as the recipe's writer takes them, without the drain.
    async fn gate(&self, ttl: Duration, max_wait: Duration, options: LeaseOptions) -> Result<Hold> {
        let upgrade = Lease::acquire(
            self.authority.clone(),
            self.lock.upgrade_key(),
            ttl,
            max_wait,
            options.clone(),
        )
        .await?;
        let gate = Lease::acquire(
            self.authority.clone(),
            self.lock.gate(),
            ttl,
            max_wait,
            options,
        )
        .await?;
        Ok(Hold::Leases(gate.fence().value(), vec![gate, upgrade]))
    }
}

#[async_trait]
impl RwRecipe for Broken {
    async fn read(&self, ttl: Duration, max_wait: Duration) -> Result<Hold> {
        if self.mutant != RecipeMutant::ReadersSkipGate {
            return RwRecipe::read(&self.lock, ttl, max_wait).await;
        }
        for slot in self.lock.slots() {
            let taken =
                Lease::try_acquire(self.authority.clone(), slot, ttl, LeaseOptions::default())
                    .await?;
            if let Some(lease) = taken {
                return Ok(Hold::Leases(lease.fence().value(), vec![lease]));
            }
        }
        Err(leasehold_core::Error::Timeout {
            key: self.lock.gate().to_string(),
            waited: Duration::ZERO,
        })
    }

    async fn write(&self, ttl: Duration, max_wait: Duration) -> Result<Hold> {
        match self.mutant {
            RecipeMutant::WriterIgnoresReaders => {
                self.gate(ttl, max_wait, LeaseOptions::default()).await
            }
            RecipeMutant::DroppedWriterKeepsGate => {
                // The recipe's steps, with the partial leases held in plain variables that are
                // not released when the future is dropped.
                let options = LeaseOptions::default().with_release_on_drop(false);
                let Hold::Leases(fence, leases) = self.gate(ttl, max_wait, options).await? else {
                    return RwRecipe::write(&self.lock, ttl, max_wait).await;
                };
                let drained = drain(&*self.authority, &self.lock, max_wait).await;
                if let Err(e) = drained {
                    for lease in leases {
                        let _ = lease.release().await;
                    }
                    return Err(e);
                }
                Ok(Hold::Leases(fence, leases))
            }
            _ => RwRecipe::write(&self.lock, ttl, max_wait).await,
        }
    }
}

/// Waits, polling, until no read slot is held, at most `max_wait`.
async fn drain(authority: &dyn Authority, lock: &RwLock, max_wait: Duration) -> Result<()> {
    let started = leasehold_core::Instant::now();
    loop {
        let mut held = false;
        for slot in lock.slots() {
            held |= authority.inspect(slot).await?.held;
        }
        if !held {
            return Ok(());
        }
        if started.elapsed() >= max_wait {
            return Err(leasehold_core::Error::Timeout {
                key: lock.gate().to_string(),
                waited: started.elapsed(),
            });
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn writer_ignores_readers(a: Arc<dyn Authority>, name: &LockKey) -> Result<Box<dyn RwRecipe>> {
    Broken::make(a, name, RecipeMutant::WriterIgnoresReaders)
}

fn readers_skip_gate(a: Arc<dyn Authority>, name: &LockKey) -> Result<Box<dyn RwRecipe>> {
    Broken::make(a, name, RecipeMutant::ReadersSkipGate)
}

fn dropped_writer_keeps_gate(a: Arc<dyn Authority>, name: &LockKey) -> Result<Box<dyn RwRecipe>> {
    Broken::make(a, name, RecipeMutant::DroppedWriterKeepsGate)
}

/// Each key in the order named, each waited for in turn; on a failure, what was taken is given
/// back (unless `keep`).
fn in_order(
    authority: Arc<dyn Authority>,
    keys: Vec<LockKey>,
    ttl: Duration,
    max_wait: Duration,
    options: LeaseOptions,
    keep: bool,
) -> MultiFuture {
    Box::pin(async move {
        let started = leasehold_core::Instant::now();
        let mut leases = Vec::new();
        for key in &keys {
            let left = max_wait.saturating_sub(started.elapsed());
            match Lease::acquire(authority.clone(), key, ttl, left, options.clone()).await {
                Ok(lease) => leases.push(lease),
                Err(e) => {
                    if !keep {
                        for lease in leases {
                            let _ = lease.release().await;
                        }
                    }
                    return Err(e);
                }
            }
        }
        Ok(leases)
    })
}

fn keys_in_given_order(
    authority: Arc<dyn Authority>,
    keys: Vec<LockKey>,
    ttl: Duration,
    max_wait: Duration,
    options: LeaseOptions,
) -> MultiFuture {
    in_order(authority, keys, ttl, max_wait, options, false)
}

fn keeps_keys_on_timeout(
    authority: Arc<dyn Authority>,
    keys: Vec<LockKey>,
    ttl: Duration,
    max_wait: Duration,
    options: LeaseOptions,
) -> MultiFuture {
    let mut sorted = keys;
    sorted.sort();
    in_order(authority, sorted, ttl, max_wait, options, true)
}
