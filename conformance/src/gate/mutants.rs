//! Broken gates: each gets one part of fence checking wrong, the way a hand-written gate
//! does. The resource suite is only worth something if every one of them fails the scenario
//! aimed at it; `conformance/tests/gate.rs` checks that they do.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use leasehold_core::{Fence, FencedResource, Guarded, Result};

use super::{GateContext, GateFactory, GateFaults, Probed};

/// What a broken gate gets wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum GateMutant {
    /// Reads the newest fence, then writes in a second step: an older fence can overwrite a
    /// newer one that landed in between.
    ReadThenWrite,
    /// Off by one: refuses only fences two or more below the newest.
    AcceptsOneBelow,
    /// Off by one the other way: refuses the holder's own fence when it writes again.
    RefusesItsOwnFence,
    /// Answers a claim as accepted without raising the newest fence.
    ClaimForgets,
    /// Keeps the newest fence in memory only: a restart of the store forgets it.
    ForgetsOnRestart,
    /// Answers a stale write as refused, but stores its value anyway.
    WritesWhenStale,
}

impl GateMutant {
    /// Every mutant.
    pub const ALL: [GateMutant; 6] = [
        GateMutant::ReadThenWrite,
        GateMutant::AcceptsOneBelow,
        GateMutant::RefusesItsOwnFence,
        GateMutant::ClaimForgets,
        GateMutant::ForgetsOnRestart,
        GateMutant::WritesWhenStale,
    ];

    /// The scenarios meant to catch it (at least one of them must fail).
    pub fn aimed_at(self) -> &'static [&'static str] {
        match self {
            GateMutant::ReadThenWrite => &["refusal_is_atomic_under_concurrency"],
            GateMutant::AcceptsOneBelow => {
                &["stale_fence_refused", "racing_writers_in_both_orders"]
            }
            GateMutant::RefusesItsOwnFence => &["equal_fence_accepted_again"],
            GateMutant::ClaimForgets => &["claim_then_older_write_refused"],
            GateMutant::ForgetsOnRestart => &["fence_survives_restart"],
            GateMutant::WritesWhenStale => {
                &["stale_fence_refused", "racing_writers_in_both_orders"]
            }
        }
    }
}

/// What one broken gate holds: its newest fence (0 before any was accepted) and its value.
#[derive(Debug, Default)]
struct Newest(Mutex<u64>, Mutex<Option<String>>);

impl Newest {
    fn lock(&self) -> MutexGuard<'_, u64> {
        // One integer: a panic elsewhere cannot leave it half-written.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn value(&self) -> MutexGuard<'_, Option<String>> {
        self.1.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A broken in-memory gate.
#[derive(Debug)]
struct BrokenGate {
    mutant: GateMutant,
    newest: Arc<Newest>,
}

impl BrokenGate {
    fn is_stale(&self, fence: u64, newest: u64) -> bool {
        match self.mutant {
            GateMutant::AcceptsOneBelow => fence.saturating_add(1) < newest,
            GateMutant::RefusesItsOwnFence => fence <= newest && newest > 0,
            _ => fence < newest,
        }
    }

    async fn guarded(&self, fence: Fence, raise: bool, value: Option<&str>) -> Result<Guarded> {
        let fence = fence.value();
        if self.mutant == GateMutant::ReadThenWrite {
            let seen = *self.newest.lock();
            if self.is_stale(fence, seen) {
                return Ok(Guarded::Stale { newest: seen });
            }
            // The second round trip of a read-then-write gate.
            tokio::time::sleep(Duration::from_millis(1)).await;
            *self.newest.lock() = fence;
            if let Some(v) = value {
                *self.newest.value() = Some(v.to_string());
            }
            return Ok(Guarded::Accepted);
        }
        let mut newest = self.newest.lock();
        let stale = self.is_stale(fence, *newest);
        if let Some(v) = value.filter(|_| !stale || self.mutant == GateMutant::WritesWhenStale) {
            *self.newest.value() = Some(v.to_string());
        }
        if stale {
            return Ok(Guarded::Stale { newest: *newest });
        }
        if raise {
            *newest = fence;
        }
        Ok(Guarded::Accepted)
    }
}

#[async_trait]
impl FencedResource for BrokenGate {
    async fn claim(&self, fence: Fence) -> Result<Guarded> {
        self.guarded(fence, self.mutant != GateMutant::ClaimForgets, None)
            .await
    }

    async fn write(&self, fence: Fence, value: &str) -> Result<Guarded> {
        self.guarded(fence, true, Some(value)).await
    }
}

/// Makes broken gates and, as their store's faults, forgets (or keeps) what they hold. It
/// cannot hold writes: a write to memory is never in flight anywhere a hold could stop it.
#[derive(Debug)]
struct BrokenStore {
    mutant: GateMutant,
    gates: Mutex<Vec<Arc<Newest>>>,
}

#[async_trait]
impl GateFactory for BrokenStore {
    async fn resource(&self) -> Result<Probed> {
        let newest = Arc::new(Newest::default());
        self.gates
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(newest.clone());
        let read = newest.clone();
        Ok(Probed {
            resource: Arc::new(BrokenGate {
                mutant: self.mutant,
                newest,
            }),
            value: Arc::new(move || {
                let value = read.value().clone();
                Box::pin(async move { Ok(value) })
            }),
        })
    }
}

#[async_trait]
impl GateFaults for BrokenStore {
    async fn cut_connections(&self) -> Result<()> {
        Ok(())
    }

    async fn restart(&self) -> Result<()> {
        if self.mutant == GateMutant::ForgetsOnRestart {
            for newest in self.gates.lock().unwrap_or_else(|e| e.into_inner()).iter() {
                *newest.lock() = 0;
            }
        }
        Ok(())
    }
}

/// A context whose gates are broken as `mutant` says, with store faults.
pub fn context(mutant: GateMutant) -> GateContext {
    let store = Arc::new(BrokenStore {
        mutant,
        gates: Mutex::new(Vec::new()),
    });
    GateContext::new(store.clone()).with_faults(store)
}
