//! Keys blocked with nobody holding them: the one liveness property the checker judges.
//!
//! Waiting is the normal state of a contended key, and faults make it longer, so only a wait
//! that nothing explains counts: acquires pending on a key while no lease on it was seen, no
//! fault touching the key was in progress (or had ended less than a TTL before: a killed or
//! paused holder's lease outlives the fault by up to its TTL), for longer than twice the
//! longest TTL plus a second. A server fault touches every key; a worker fault only the keys
//! that worker held or was acquiring when it began, so the worker faults that come every
//! second or two do not excuse the keys they never reached; except on a one-writer authority (an
//! embedded SQLite file), where a worker stopped while one of its requests held the file's write
//! lock blocks every key, so its pause touches them all. A correct authority hands a key on within a TTL (plus its expiry slack) of the last
//! holder vanishing; something that keeps a key booked with no holder, such as a cancelled
//! attempt's grant kept alive by its client, does not.

use std::collections::{BTreeMap, HashMap};

use super::event::{Nanos, What, WorkerId};
use super::history::History;
use super::windows::{span, Window};

/// The slack beyond two TTLs before a wait counts as stuck.
const SLACK_NS: Nanos = 1_000_000_000;

/// A key that stayed blocked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stuck {
    /// The key.
    pub key: String,
    /// Index of the first acquire that waited in the blocked stretch.
    pub at: usize,
    /// How long acquires waited in it, in total.
    pub waited_ns: Nanos,
}

/// The longest unexplained blocked stretch per key, where it exceeds the bound. With
/// `one_writer`, a worker fault explains waits on every key, as a server fault does.
pub fn stuck_keys(history: &History, windows: &[Window], one_writer: bool) -> Vec<Stuck> {
    let Some((_, span_end)) = span(history) else {
        return Vec::new();
    };
    let max_ttl = history
        .events()
        .iter()
        .filter_map(|e| match &e.what {
            What::AcquireInvoke { ttl_ns, .. } => Some(*ttl_ns),
            _ => None,
        })
        .max()
        .unwrap_or(0);
    let bound = max_ttl.saturating_mul(2).saturating_add(SLACK_NS);

    // Faults, each stretched by a TTL after its end, with the keys they excuse (`None`: all).
    let mut fault_starts: HashMap<u64, (Nanos, Option<Vec<&str>>)> = HashMap::new();
    let mut excused: Vec<(Nanos, Nanos, Option<Vec<&str>>)> = Vec::new();
    // Acquires pending, per key: (invoke time, completion time, invoke index).
    let mut pending: BTreeMap<&str, Vec<(Nanos, Nanos, usize)>> = BTreeMap::new();
    let mut open: HashMap<(WorkerId, &str), (Nanos, usize)> = HashMap::new();
    for (i, e) in history.events().iter().enumerate() {
        match &e.what {
            What::FaultStart { fault, worker, .. } => {
                let keys = worker.filter(|_| !one_writer).map(|victim| {
                    let mut keys: Vec<&str> = windows
                        .iter()
                        .filter(|w| w.worker == victim && w.start <= e.t && e.t < w.end)
                        .map(|w| w.key.as_str())
                        .chain(open.keys().filter(|(w, _)| *w == victim).map(|(_, k)| *k))
                        .collect();
                    keys.sort_unstable();
                    keys.dedup();
                    keys
                });
                fault_starts.insert(*fault, (e.t, keys));
            }
            What::FaultEnd { fault, .. } => {
                if let Some((start, keys)) = fault_starts.remove(fault) {
                    excused.push((start, e.t.saturating_add(max_ttl), keys));
                }
            }
            What::AcquireInvoke { worker, key, .. } => {
                open.insert((*worker, key.as_str()), (e.t, i));
            }
            What::AcquireOk { worker, key, .. }
            | What::AcquireFail { worker, key, .. }
            | What::AcquireTimeout { worker, key }
            | What::AcquireCancelled { worker, key } => {
                if let Some((t, at)) = open.remove(&(*worker, key.as_str())) {
                    pending.entry(key.as_str()).or_default().push((t, e.t, at));
                }
            }
            _ => {}
        }
    }
    excused.extend(
        fault_starts
            .into_values()
            .map(|(start, keys)| (start, span_end, keys)),
    );
    for ((_, key), (t, at)) in open {
        pending.entry(key).or_default().push((t, span_end, at));
    }

    let mut found = Vec::new();
    for (key, waits) in pending {
        // What explains a wait on this key: its holders' windows and the faults that touched it.
        let mut covered: Vec<(Nanos, Nanos)> = windows
            .iter()
            .filter(|w| w.key == key)
            .map(|w| (w.start, w.end))
            .chain(
                excused
                    .iter()
                    .filter(|(_, _, keys)| keys.as_ref().is_none_or(|ks| ks.contains(&key)))
                    .map(|&(start, end, _)| (start, end)),
            )
            .collect();
        covered.sort_unstable();
        let mut worst: Option<Stuck> = None;
        for (from, to) in gaps(&covered, span_end) {
            let mut waited: Nanos = 0;
            let mut first: Option<usize> = None;
            for &(start, end, at) in &waits {
                let (lo, hi) = (start.max(from), end.min(to));
                if hi > lo {
                    waited = waited.saturating_add(hi - lo);
                    first = Some(first.map_or(at, |f| f.min(at)));
                }
            }
            // Overlapping waits of several workers count once per instant at most.
            let waited = waited.min(to - from);
            if let Some(at) = first.filter(|_| waited > bound) {
                if worst.as_ref().is_none_or(|w| waited > w.waited_ns) {
                    worst = Some(Stuck {
                        key: key.to_string(),
                        at,
                        waited_ns: waited,
                    });
                }
            }
        }
        found.extend(worst);
    }
    found
}

/// The stretches of `[0, end]` that no interval of `covered` (sorted by start) covers.
fn gaps(covered: &[(Nanos, Nanos)], end: Nanos) -> Vec<(Nanos, Nanos)> {
    let mut out = Vec::new();
    let mut reach: Nanos = 0;
    for &(start, stop) in covered {
        if start > reach {
            out.push((reach, start));
        }
        reach = reach.max(stop);
    }
    if end > reach {
        out.push((reach, end));
    }
    out
}
