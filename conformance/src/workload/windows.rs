//! Holders' validity windows: who believed they held which key, and when.
//!
//! A window opens at a grant (`acquire_ok`) and closes at the first of: the worker seeing the
//! lease lost, the worker starting its release, the worker being killed, or a new grant to the
//! same worker on the same key. A window the history never closes ends at the lease's last
//! known deadline (or at the end of the history, if no deadline was recorded).
//!
//! A loss does not close a window before its deadline. The worker learns of a loss through its
//! lease's watcher, while its round may sit anywhere between `ensure_valid()` and the write it
//! is about to send: until its own deadline it is entitled to act, so an authority that ends a
//! lease early (a refused renewal, a session ended) and grants the key on before that deadline
//! has broken exclusion, whatever the history logged in between. Such a window is marked
//! [`Window::ended_early_ns`], its own finding.
//!
//! Two measures come from the same windows:
//! * **observed** windows, as above: a holder paused past its TTL keeps its window open until it
//!   wakes and sees the loss, so under pauses windows of successive holders overlap. That
//!   overlap is the *stale window*, the time an old holder could still act: expected, measured,
//!   and made harmless by the fence.
//! * **valid** windows, additionally cut at the lease's local deadline: the time the holder
//!   was entitled to act by its own clock. Overlapping valid windows mean the authority handed
//!   the key on while an earlier holder's lease was still valid (or reissued a fence).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::{Deserialize, Serialize};

use super::event::{FaultKind, Nanos, What, WorkerId};
use super::history::History;

/// Why a window closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WindowEnd {
    /// The worker started releasing.
    Released,
    /// The worker saw the lease lost.
    Lost,
    /// The nemesis killed the worker.
    Killed,
    /// The same worker was granted the key again (it lost track of the old lease).
    Replaced,
    /// Nothing closed it: it ends at the lease's last known deadline.
    Deadline,
    /// Nothing closed it and no deadline was recorded: it ends with the history.
    HistoryEnd,
}

/// One grant's window on one key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Window {
    /// The key.
    pub key: String,
    /// The holder.
    pub worker: WorkerId,
    /// The grant's fence.
    pub fence: u64,
    /// Index of the `acquire_ok` event.
    pub granted: usize,
    /// When the grant was seen.
    pub start: Nanos,
    /// When the observed window closed.
    pub end: Nanos,
    /// Why it closed.
    pub end_cause: WindowEnd,
    /// The end of the valid window: `end`, or the lease's last known deadline if earlier.
    pub valid_end: Nanos,
    /// How long before the lease's own deadline the worker saw it lost (0 if it did not): the
    /// authority ended the lease early.
    #[serde(default)]
    pub ended_early_ns: Nanos,
}

/// Two holders of one key whose windows overlapped.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Overlap {
    /// The key.
    pub key: String,
    /// The earlier holder's worker and fence.
    pub older: (WorkerId, u64),
    /// The later holder's worker and fence.
    pub newer: (WorkerId, u64),
    /// Index of the later holder's `acquire_ok`, where the overlap began.
    pub at: usize,
    /// When the overlap began.
    pub from: Nanos,
    /// How long both windows were open.
    pub ns: Nanos,
}

/// The time covered by a history: from its first to its last event, the final state excluded.
pub fn span(history: &History) -> Option<(Nanos, Nanos)> {
    let mut times = history
        .events()
        .iter()
        .filter(|e| !matches!(e.what, What::Final { .. }))
        .map(|e| e.t);
    let first = times.next()?;
    let (lo, hi) = times.fold((first, first), |(lo, hi), t| (lo.min(t), hi.max(t)));
    Some((lo, hi))
}

struct Open {
    window: usize,
    deadline: Option<Nanos>,
}

/// Every grant's window, in the order the grants appear in the history.
pub fn windows(history: &History) -> Vec<Window> {
    let span_end = span(history).map_or(0, |(_, hi)| hi);
    let mut out: Vec<Window> = Vec::new();
    let mut open: HashMap<(WorkerId, String), Open> = HashMap::new();
    // Windows closed by a loss seen before their deadline: still open until the deadline, unless
    // the worker visibly stops acting first (its release starts, it is killed, or it is granted
    // the key again, which it asks for only after its round ended).
    let mut lost_early: HashMap<(WorkerId, String), usize> = HashMap::new();

    for (i, event) in history.events().iter().enumerate() {
        let t = event.t;
        match &event.what {
            What::AcquireOk {
                worker,
                key,
                fence,
                deadline,
            } => {
                if let Some(old) = open.remove(&(*worker, key.clone())) {
                    close(&mut out, old, t, WindowEnd::Replaced);
                }
                if let Some(w) = lost_early.remove(&(*worker, key.clone())) {
                    cut(&mut out[w], t);
                }
                out.push(Window {
                    key: key.clone(),
                    worker: *worker,
                    fence: *fence,
                    granted: i,
                    start: t,
                    end: t,
                    end_cause: WindowEnd::HistoryEnd,
                    valid_end: t,
                    ended_early_ns: 0,
                });
                open.insert(
                    (*worker, key.clone()),
                    Open {
                        window: out.len() - 1,
                        deadline: *deadline,
                    },
                );
            }
            What::Renewed {
                worker,
                key,
                fence,
                deadline,
            } => {
                if let Some(o) = open.get_mut(&(*worker, key.clone())) {
                    if out[o.window].fence == *fence {
                        o.deadline = Some(o.deadline.map_or(*deadline, |d| d.max(*deadline)));
                    }
                }
            }
            What::Lost {
                worker, key, fence, ..
            }
            | What::ReleaseInvoke {
                worker, key, fence, ..
            } => {
                let k = (*worker, key.clone());
                let lost = matches!(event.what, What::Lost { .. });
                if open.get(&k).is_some_and(|o| out[o.window].fence == *fence) {
                    let cause = if lost {
                        WindowEnd::Lost
                    } else {
                        WindowEnd::Released
                    };
                    if let Some(o) = open.remove(&k) {
                        let window = o.window;
                        close(&mut out, o, t, cause);
                        if out[window].ended_early_ns > 0 {
                            lost_early.insert(k, window);
                        }
                    }
                } else if !lost && lost_early.get(&k).is_some_and(|&w| out[w].fence == *fence) {
                    if let Some(w) = lost_early.remove(&k) {
                        cut(&mut out[w], t);
                    }
                }
            }
            What::FaultStart {
                kind: FaultKind::KillWorker | FaultKind::KillWorkerInTransaction,
                worker: Some(victim),
                ..
            } => {
                let hit: Vec<_> = open.keys().filter(|(w, _)| w == victim).cloned().collect();
                for k in hit {
                    if let Some(o) = open.remove(&k) {
                        close(&mut out, o, t, WindowEnd::Killed);
                    }
                }
                let hit: Vec<_> = lost_early
                    .keys()
                    .filter(|(w, _)| w == victim)
                    .cloned()
                    .collect();
                for k in hit {
                    if let Some(w) = lost_early.remove(&k) {
                        cut(&mut out[w], t);
                    }
                }
            }
            _ => {}
        }
    }
    let mut rest: Vec<Open> = open.into_values().collect();
    rest.sort_by_key(|o| o.window);
    for o in rest {
        let (end, cause) = match o.deadline {
            Some(d) => (d.min(span_end), WindowEnd::Deadline),
            None => (span_end, WindowEnd::HistoryEnd),
        };
        close(&mut out, o, end, cause);
    }
    out
}

fn close(out: &mut [Window], o: Open, t: Nanos, cause: WindowEnd) {
    let w = &mut out[o.window];
    let t = t.max(w.start);
    w.end_cause = cause;
    match (cause, o.deadline) {
        // The holder may still act until its deadline: the window stays open that long.
        (WindowEnd::Lost, Some(d)) => {
            let d = d.max(w.start);
            w.ended_early_ns = d.saturating_sub(t);
            w.end = t.max(d);
            w.valid_end = d;
        }
        _ => {
            w.end = t;
            w.valid_end = o.deadline.map_or(w.end, |d| d.clamp(w.start, w.end));
        }
    }
}

/// Ends a window lost early at `t`, when its worker visibly stopped acting before its deadline.
fn cut(w: &mut Window, t: Nanos) {
    let t = t.max(w.start);
    w.end = w.end.min(t);
    w.valid_end = w.valid_end.min(t);
}

/// Every pair of windows on the same key that overlapped, by observed windows (`valid` false)
/// or by valid windows (`valid` true).
pub fn overlaps(windows: &[Window], valid: bool) -> Vec<Overlap> {
    let end = |w: &Window| if valid { w.valid_end } else { w.end };
    let mut by_key: BTreeMap<&str, Vec<&Window>> = BTreeMap::new();
    for w in windows {
        by_key.entry(&w.key).or_default().push(w);
    }
    let mut found = Vec::new();
    for (key, mut ws) in by_key {
        ws.sort_by_key(|w| (w.start, w.fence));
        let mut active: Vec<&Window> = Vec::new();
        for b in ws {
            active.retain(|a| end(a) > b.start);
            for a in &active {
                let until = end(a).min(end(b));
                if until > b.start {
                    found.push(Overlap {
                        key: key.to_string(),
                        older: (a.worker, a.fence),
                        newer: (b.worker, b.fence),
                        at: b.granted,
                        from: b.start,
                        ns: until - b.start,
                    });
                }
            }
            active.push(b);
        }
    }
    found.sort_by_key(|o| o.at);
    found
}

/// Per key, the share of the history's span during which some holder's valid window was open.
/// Every key the history mentions is listed, with 0.0 if it was never held.
pub fn availability(history: &History, windows: &[Window]) -> BTreeMap<String, f64> {
    let keys: BTreeSet<&str> = history.events().iter().filter_map(|e| e.key()).collect();
    let mut out = BTreeMap::new();
    let Some((lo, hi)) = span(history) else {
        return out;
    };
    let total = hi.saturating_sub(lo);
    for key in keys {
        let mut spans: Vec<(Nanos, Nanos)> = windows
            .iter()
            .filter(|w| w.key == key)
            .map(|w| (w.start.clamp(lo, hi), w.valid_end.clamp(lo, hi)))
            .filter(|(s, e)| e > s)
            .collect();
        spans.sort_unstable();
        let mut held = 0;
        let mut cur: Option<(Nanos, Nanos)> = None;
        for (s, e) in spans {
            cur = match cur {
                Some((cs, ce)) if s <= ce => Some((cs, ce.max(e))),
                Some((cs, ce)) => {
                    held += ce - cs;
                    Some((s, e))
                }
                None => Some((s, e)),
            };
        }
        if let Some((cs, ce)) = cur {
            held += ce - cs;
        }
        let share = if total == 0 {
            0.0
        } else {
            held as f64 / total as f64
        };
        out.insert(key.to_string(), share);
    }
    out
}
