//! The primaries of a replicated Redis form, watched while the run goes on.
//!
//! Sentinel moves the primary on its own: after the failover the nemesis caused, but also when
//! re-provisioned sentinels (their configuration numbered from epoch 0 again) vote on a stale
//! view. A failover of asynchronous replication can lose fence counters the replica had not
//! received, and while two servers answer as primary, clients that asked different sentinels
//! write to different servers. Both are the backend's declared weakness, but the checker can
//! only declare a reissued fence when the history shows a failover between the two grants, and
//! nothing the nemesis did shows this one. So the runner asks every data server its role a few
//! times a second and records what it sees as a [`FaultKind::PrimaryChanged`] span: from the
//! first answer naming two primaries, or one other than the last sole primary, until one
//! server alone answers as primary again.
//!
//! A server that does not answer is not counted either way: a role query timing out on a busy
//! machine is no evidence of a failover, and must not excuse a reissue.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use leasehold_conformance::workload::{FaultKind, What};
use tokio::sync::watch;

use crate::deployment::Deployment;
use crate::worker::Log;

/// How often the servers are asked their role.
const EVERY: Duration = Duration::from_millis(50);

/// What the watch knows between two looks.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Primaries {
    /// The server last seen as the only primary.
    sole: Option<String>,
    /// The open span's fault id, while the primaries are not `sole` alone.
    open: Option<u64>,
}

/// What one look at the servers' roles means for the history.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Seen {
    /// Nothing to record.
    Same,
    /// Two or more primaries: a span begins.
    Began { fault: u64, node: String },
    /// One primary alone again: the open span ends.
    Settled { fault: u64, node: String },
    /// Another server alone is the primary, and the watch never saw two at once: a span that
    /// begins and ends now, whose aftermath still covers what the lost counters cause.
    Moved { fault: u64, node: String },
}

impl Primaries {
    /// Takes in the servers that answered as primary; `id` gives a new span its fault id.
    pub(crate) fn look(&mut self, primaries: &[String], id: impl FnOnce() -> u64) -> Seen {
        match primaries {
            [] => Seen::Same,
            [one] => {
                let moved = self.sole.as_ref().is_some_and(|sole| sole != one);
                self.sole = Some(one.clone());
                match self.open.take() {
                    Some(fault) => Seen::Settled {
                        fault,
                        node: format!("{one} alone is the primary"),
                    },
                    None if moved => Seen::Moved {
                        fault: id(),
                        node: format!("the primary moved to {one}"),
                    },
                    None => Seen::Same,
                }
            }
            many => {
                if self.open.is_some() {
                    return Seen::Same;
                }
                let fault = id();
                self.open = Some(fault);
                Seen::Began {
                    fault,
                    node: format!("primaries at once: {}", many.join(", ")),
                }
            }
        }
    }
}

/// Watches `deployment`'s primaries until `stop` turns true, recording spans in `log` with ids
/// from `next_fault`. A span still open at the end stays open in the history: it never healed.
pub(crate) async fn watch(
    deployment: Arc<Deployment>,
    log: Log,
    next_fault: Arc<AtomicU64>,
    mut stop: watch::Receiver<bool>,
) {
    let kind = FaultKind::PrimaryChanged;
    let start = |fault, node| What::FaultStart {
        fault,
        kind,
        worker: None,
        node: Some(node),
    };
    let end = |fault, node| What::FaultEnd {
        fault,
        kind,
        worker: None,
        node: Some(node),
    };
    let mut primaries = Primaries::default();
    while !*stop.borrow() {
        // A form with one writer by construction has nothing to watch.
        let Some(now) = deployment.primaries().await else {
            return;
        };
        match primaries.look(&now, || next_fault.fetch_add(1, Ordering::Relaxed)) {
            Seen::Same => {}
            Seen::Began { fault, node } => log.record(start(fault, node)),
            Seen::Settled { fault, node } => log.record(end(fault, node)),
            Seen::Moved { fault, node } => {
                log.record(start(fault, node.clone()));
                log.record(end(fault, node));
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(EVERY) => {}
            _ = stop.changed() => {}
        }
    }
}

/// Waits, at most `within`, until one server alone answers as primary (or the form has no
/// primaries to watch). Part of healing at the end of a run, as the nemesis heals what it
/// injected: Sentinel demotes a former primary that comes back only after looking at it again,
/// seconds later, and a run that stopped before then would leave the watch's span open
/// although nothing is broken. A form that never settles leaves the span open, and the
/// checker says so.
pub(crate) async fn settle(deployment: &Arc<Deployment>, within: Duration) {
    let give_up = leasehold_core::time::saturating_add(tokio::time::Instant::now(), within);
    loop {
        match deployment.primaries().await {
            None => return,
            Some(now) if now.len() == 1 => return,
            Some(_) if tokio::time::Instant::now() >= give_up => return,
            Some(_) => tokio::time::sleep(EVERY).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn servers(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn only_two_primaries_or_another_sole_primary_is_a_change() {
        let mut p = Primaries::default();
        let mut ids = 0..;
        let mut next = || ids.next().unwrap_or(0);
        assert_eq!(p.look(&servers(&["a"]), &mut next), Seen::Same);
        // A server that did not answer proves nothing.
        assert_eq!(p.look(&servers(&[]), &mut next), Seen::Same);
        assert_eq!(p.look(&servers(&["a"]), &mut next), Seen::Same);
        assert_eq!(
            p.look(&servers(&["a", "b"]), &mut next),
            Seen::Began {
                fault: 0,
                node: "primaries at once: a, b".into()
            }
        );
        assert_eq!(p.look(&servers(&["a", "b"]), &mut next), Seen::Same);
        assert_eq!(p.look(&servers(&[]), &mut next), Seen::Same);
        assert_eq!(
            p.look(&servers(&["b"]), &mut next),
            Seen::Settled {
                fault: 0,
                node: "b alone is the primary".into()
            }
        );
        assert_eq!(p.look(&servers(&["b"]), &mut next), Seen::Same);
        // From b to a without ever seeing both: a span that begins and ends at once.
        assert_eq!(
            p.look(&servers(&["a"]), &mut next),
            Seen::Moved {
                fault: 1,
                node: "the primary moved to a".into()
            }
        );
        assert_eq!(p.look(&servers(&["a"]), &mut next), Seen::Same);
    }
}
