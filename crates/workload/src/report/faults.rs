//! The nemesis's faults as spans, paired start to end: what the timeline shades.

use std::collections::BTreeMap;

use leasehold_conformance::workload::{FaultKind, History, Nanos, What, WorkerId};

/// One fault from its start to its heal (or to the end of the history if never healed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct FaultSpan {
    pub kind: FaultKind,
    pub worker: Option<WorkerId>,
    pub start: Nanos,
    pub end: Nanos,
    /// False if the history never shows it healed (the checker fails the run for that).
    pub healed: bool,
}

/// Every fault of `history`, in start order; unhealed ones end at `history_end`.
pub(crate) fn spans(history: &History, history_end: Nanos) -> Vec<FaultSpan> {
    let mut open: BTreeMap<u64, usize> = BTreeMap::new();
    let mut out: Vec<FaultSpan> = Vec::new();
    for event in history.events() {
        match &event.what {
            What::FaultStart {
                fault,
                kind,
                worker,
                ..
            } => {
                open.insert(*fault, out.len());
                out.push(FaultSpan {
                    kind: *kind,
                    worker: *worker,
                    start: event.t,
                    end: history_end.max(event.t),
                    healed: false,
                });
            }
            What::FaultEnd { fault, .. } => {
                if let Some(span) = open.remove(fault).and_then(|i| out.get_mut(i)) {
                    span.end = event.t.max(span.start);
                    span.healed = true;
                }
            }
            _ => {}
        }
    }
    out
}

/// A fault kind as the history spells it (`pause_worker`), the name people grep for.
pub(crate) fn kind_name(kind: FaultKind) -> String {
    match serde_json::to_value(kind) {
        Ok(serde_json::Value::String(name)) => name,
        _ => format!("{kind:?}"),
    }
}
