//! The fault workload's history and checker: the foundation the runner, the worker
//! processes, the nemesis and the report stand on.
//!
//! A run is Jepsen's lock-set workload with fences: workers take a lease on a key, claim and
//! read the key's set at the protected resource, write the set plus one new element guarded by
//! the fence, and release, while a nemesis pauses and kills workers and servers. Every invoke
//! and completion is an [`Event`], one JSON line per event in a [`History`]; [`check`] judges
//! the history against the resource's [`FinalState`] and returns a [`RunVerdict`] with the
//! [`Figures`] the report shows. See `docs/workload.md`.
//!
//! [`crate::resource::check_history`] is the same fence rule for one in-process resource;
//! [`History::accesses`] turns a key's history into its input, and a test keeps the two in
//! agreement.

pub mod checker;
pub mod clock;
pub mod event;
pub mod figures;
pub mod final_state;
pub mod finding;
pub mod history;
pub mod latency;
pub mod stuck;
pub mod verdict;
pub mod windows;

#[cfg(test)]
mod tests;

pub use checker::{check, check_recorded, CheckOptions, FAILOVER_AFTERMATH};
pub use event::{Event, FaultKind, Nanos, What, WorkerId};
pub use figures::Figures;
pub use final_state::{FinalState, KeyState};
pub use finding::{Finding, FindingKind, Severity};
pub use history::{History, HistoryError, HistorySlice, HistoryWriter};
pub use latency::Latencies;
pub use verdict::{RunVerdict, Status};
pub use windows::{Overlap, Window, WindowEnd};
