//! The checker's figures: what a run measured, whether or not it passed.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::event::{FaultKind, Nanos};
use super::latency::Latencies;
use super::windows::Overlap;

/// Everything the checker counts and measures in one run. Serializable, so the report can be
/// rendered from stored results without the history.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Figures {
    /// Keys the history mentions.
    pub keys: usize,
    /// The time the history covers, first to last event.
    pub span_ns: Nanos,
    /// Acquires started.
    pub acquires: u64,
    /// Acquires that returned a lease.
    pub acquired: u64,
    /// Acquires that failed with an error.
    pub acquire_failed: u64,
    /// Acquires that gave up after `max_wait`.
    pub acquire_timed_out: u64,
    /// Acquires the worker cancelled on purpose.
    pub acquire_cancelled: u64,
    /// Leases the workers saw lost.
    pub losses: u64,
    /// Writes started.
    pub writes: u64,
    /// Writes the resource accepted (acknowledged).
    pub writes_acknowledged: u64,
    /// **Stale writes refused**: the resource refused a write whose fence was older than one it
    /// had accepted. The mechanism working; counted, not an error.
    pub writes_refused_stale: u64,
    /// Writes whose outcome is unknown (an error of unknown outcome, or the worker died).
    pub writes_unknown: u64,
    /// Of those, the ones whose element is in the final set (applied after all).
    pub unknown_recovered: u64,
    /// Claims (fenced reads) the resource refused as stale.
    pub claims_refused_stale: u64,
    /// **Acknowledged elements lost**: an accepted write whose element is missing from the
    /// final set. Must be 0 with fences.
    pub lost_acks: u64,
    /// **Stale writes accepted**: a write (or claim) accepted with a fence lower than one the
    /// resource had already accepted for the key. Must be 0 with fences.
    pub stale_accepted: u64,
    /// **Fences reissued**: a grant whose fence was granted before for the key, or is not
    /// above a fence granted (completed) before it was asked for. 0 unless the backend declares
    /// failover-unsafe fences.
    pub fences_reissued: u64,
    /// Grants of a key while another worker that held it sat paused by the nemesis: the
    /// moments the fence exists for. A fenced run under pauses with none proves nothing.
    #[serde(default)]
    pub handoffs_during_pause: u64,
    /// Elements a read returned that a later read (or the final set) lacked, acknowledged or
    /// not: lost updates seen from the reads (Jepsen's set-full). Must be 0 with fences.
    #[serde(default)]
    pub reads_lost: u64,
    /// Leases the holder saw lost before its own deadline: the authority ended them early.
    #[serde(default)]
    pub leases_ended_early: u64,
    /// Pairs of holders of one key whose observed windows overlapped (expected under pauses).
    pub overlapping_holders: u64,
    /// The longest such overlap: how long an old holder could still act after the next one got
    /// the key.
    pub longest_stale_window_ns: Nanos,
    /// The overlap that was longest.
    pub longest_overlap: Option<Overlap>,
    /// Pairs of holders whose *valid* windows (cut at their own deadlines) overlapped: the key
    /// was handed on while a lease was still valid by its holder's clock. Each is an
    /// exclusion failure of the authority (declared on failover-unsafe backends): on one
    /// machine every process reads the same monotonic clock, so no tolerance is needed.
    pub valid_overlaps: u64,
    /// Per key, the share of the span during which some holder's lease was valid.
    pub availability: BTreeMap<String, f64>,
    /// Hand-off latency: a release started, to the next grant of the key to a worker that was
    /// already waiting.
    pub handoff: Latencies,
    /// Acquire latency: invoke to grant.
    pub acquire_latency: Latencies,
    /// Faults started, by kind.
    pub faults: BTreeMap<FaultKind, u64>,
}

impl Figures {
    /// The mean availability over keys (0.0 without keys).
    pub fn mean_availability(&self) -> f64 {
        if self.availability.is_empty() {
            return 0.0;
        }
        self.availability.values().sum::<f64>() / self.availability.len() as f64
    }
}

impl fmt::Display for Figures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "  span {:.1?} over {} key(s)",
            Duration::from_nanos(self.span_ns),
            self.keys
        )?;
        writeln!(
            f,
            "  acquires {} (ok {}, failed {}, timed out {}, cancelled {}), losses seen {}",
            self.acquires,
            self.acquired,
            self.acquire_failed,
            self.acquire_timed_out,
            self.acquire_cancelled,
            self.losses
        )?;
        writeln!(
            f,
            "  writes {} (acknowledged {}, refused stale {}, unknown {} of which applied {}), claims refused stale {}",
            self.writes,
            self.writes_acknowledged,
            self.writes_refused_stale,
            self.writes_unknown,
            self.unknown_recovered,
            self.claims_refused_stale
        )?;
        // The lock's own evidence first: what an authority that hands a key to two holders at
        // once cannot hide. The resource's figures follow; with fences they stay at zero even
        // for such an authority, as long as its fences keep rising.
        writeln!(f, "  the lock:")?;
        writeln!(
            f,
            "    fences reissued              {}",
            self.fences_reissued
        )?;
        writeln!(
            f,
            "    valid windows overlapping    {}",
            self.valid_overlaps
        )?;
        writeln!(
            f,
            "    leases ended early           {}",
            self.leases_ended_early
        )?;
        writeln!(
            f,
            "    hand-offs during a pause     {}",
            self.handoffs_during_pause
        )?;
        writeln!(f, "  the resource:")?;
        writeln!(f, "    acknowledged elements lost   {}", self.lost_acks)?;
        writeln!(f, "    elements read, then missing  {}", self.reads_lost)?;
        writeln!(
            f,
            "    stale writes accepted        {}",
            self.stale_accepted
        )?;
        writeln!(
            f,
            "    stale writes refused         {}",
            self.writes_refused_stale
        )?;
        writeln!(
            f,
            "  overlapping holders          {} (longest stale window {:.1?})",
            self.overlapping_holders,
            Duration::from_nanos(self.longest_stale_window_ns),
        )?;
        writeln!(
            f,
            "  availability                 {:.1}%",
            self.mean_availability() * 100.0
        )?;
        writeln!(f, "  hand-off latency             {}", self.handoff)?;
        writeln!(f, "  acquire latency              {}", self.acquire_latency)?;
        let faults: Vec<String> = self
            .faults
            .iter()
            .map(|(kind, n)| format!("{kind:?} {n}"))
            .collect();
        writeln!(f, "  faults                       {}", faults.join(", "))
    }
}
