//! What the checker found, one event at a time, and how much it weighs.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::event::{FaultKind, Nanos, WorkerId};

/// How a finding bears on the verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    /// The run fails.
    Failure,
    /// A weakness the backend declares (a fence reissued by a failover-unsafe backend, and an
    /// acknowledged element lost through such a reissued fence): shown, labelled, not failed.
    Declared,
    /// Expected in the unfenced control: the nemesis doing its work. The control *fails* if it
    /// shows no lost acknowledgement.
    Control,
    /// Worth knowing, never a verdict by itself: a lease the authority ended before its
    /// holder's deadline, with nobody granted the key in the rest of that time.
    Noted,
}

/// One thing the checker found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finding {
    /// Index of the offending event (its line in the history file is `at + 1`).
    pub at: usize,
    /// The key, where there is one.
    pub key: Option<String>,
    /// How it weighs.
    pub severity: Severity,
    /// What it is.
    pub kind: FindingKind,
}

/// The kinds of findings.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "finding", rename_all = "snake_case")]
#[non_exhaustive]
pub enum FindingKind {
    /// An acknowledged write's element is missing from the final set.
    LostAck {
        /// The element.
        element: u64,
        /// The fence its write carried.
        fence: u64,
    },
    /// The resource accepted a write (or, without `element`, a claim) whose fence was below one
    /// it had already accepted.
    StaleAccepted {
        /// The write's element; `None` for a claim.
        element: Option<u64>,
        /// The fence accepted.
        fence: u64,
        /// The greater fence accepted before it.
        newer: u64,
    },
    /// A grant's fence was granted before on the key, or is not above a fence granted before
    /// this acquire began.
    ReissuedFence {
        /// The fence granted.
        fence: u64,
        /// The earlier grant's fence (equal, or greater).
        earlier: u64,
        /// Index of the earlier grant.
        earlier_at: usize,
    },
    /// A write the resource refused as stale left its element in the set anyway.
    RefusedButPresent {
        /// The element.
        element: u64,
        /// The fence its write carried.
        fence: u64,
    },
    /// The final set holds an element that no write to that key carried.
    UnexpectedElement {
        /// The element.
        element: u64,
    },
    /// Two writes carried the same element: the workload broke its own rule, so losses cannot
    /// be told apart.
    DuplicateElement {
        /// The element.
        element: u64,
        /// Index of the first write carrying it.
        first_at: usize,
    },
    /// The resource's final `last_fence` is below a fence it accepted.
    ResourceFenceBehind {
        /// The final `last_fence`.
        last_fence: Option<u64>,
        /// The greatest fence the history shows accepted.
        accepted: u64,
    },
    /// The key was written but the final state has no row for it: nothing can be checked.
    MissingFinalState,
    /// A fault was started and never healed.
    UnhealedFault {
        /// The fault's id.
        fault: u64,
        /// Its kind.
        kind: FaultKind,
    },
    /// An event's time is before its predecessor's: the history was not merged by time.
    OutOfOrder {
        /// The predecessor's time.
        previous: Nanos,
        /// This event's time.
        t: Nanos,
    },
    /// The authority granted the key while an earlier holder's lease was still valid by that
    /// holder's own clock (its local deadline, taken before its request and less the safety
    /// margin, had not passed, and it had not released). Exclusion is the authority's part of
    /// the bargain: a certain violation on one machine, where every process reads the same
    /// monotonic clock.
    ExclusionBroken {
        /// The earlier holder's worker and fence.
        older: (WorkerId, u64),
        /// The later holder's worker and fence.
        newer: (WorkerId, u64),
        /// How long both leases were valid.
        overlap_ns: Nanos,
    },
    /// Acquires waited on a key that nobody held, with no fault to explain it, for longer than
    /// two TTLs and a second (see [`super::stuck`]): the key was booked for no holder.
    KeyStuck {
        /// How long acquires waited in that stretch.
        waited_ns: Nanos,
    },
    /// The unfenced control lost no acknowledged write: the nemesis is too weak to show what
    /// the fence prevents.
    ControlLostNothing,
    /// The authority ended a lease before its holder's own deadline (a renewal refused, a
    /// session ended): the holder saw the loss that much early. Harmless if nobody was granted
    /// the key before the deadline; if someone was, that is [`FindingKind::ExclusionBroken`]
    /// too.
    EndedEarly {
        /// The holder and its fence.
        holder: (WorkerId, u64),
        /// How long before its deadline the loss was seen.
        early_ns: Nanos,
    },
    /// An element a read returned was missing from a read that began after that one ended
    /// (or from the final set): a lost update, whether or not its write was acknowledged and
    /// even if the element came back later (Jepsen's set-full).
    ReadLost {
        /// The element.
        element: u64,
        /// Index of the first read that returned it.
        first_read_at: usize,
    },
    /// The nemesis planned faults of this kind and none landed: the run proves nothing about
    /// them.
    FaultNeverLanded {
        /// The kind.
        kind: FaultKind,
    },
    /// A fenced run under worker pauses that never needed its fence: no stale write refused,
    /// or no key handed on while its holder was paused. Its zero losses prove nothing.
    GuardNotExercised {
        /// What never happened.
        missing: String,
    },
}

impl FindingKind {
    /// A short name for the kind, used to group findings in a verdict's reasons.
    pub fn label(&self) -> &'static str {
        match self {
            FindingKind::LostAck { .. } => "acknowledged element lost",
            FindingKind::StaleAccepted { .. } => "stale write accepted",
            FindingKind::ReissuedFence { .. } => "fence reissued",
            FindingKind::RefusedButPresent { .. } => "refused write present in the set",
            FindingKind::UnexpectedElement { .. } => "element no write carried",
            FindingKind::DuplicateElement { .. } => "element written twice",
            FindingKind::ResourceFenceBehind { .. } => "resource last_fence behind",
            FindingKind::MissingFinalState => "no final state for a written key",
            FindingKind::UnhealedFault { .. } => "fault never healed",
            FindingKind::OutOfOrder { .. } => "history out of time order",
            FindingKind::ExclusionBroken { .. } => "key granted while another lease was valid",
            FindingKind::KeyStuck { .. } => "key blocked with no holder",
            FindingKind::ControlLostNothing => "unfenced control lost nothing",
            FindingKind::EndedEarly { .. } => "lease ended before its holder's deadline",
            FindingKind::ReadLost { .. } => "element read, then missing",
            FindingKind::FaultNeverLanded { .. } => "planned fault never landed",
            FindingKind::GuardNotExercised { .. } => "fence never needed",
        }
    }
}

impl fmt::Display for FindingKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FindingKind::LostAck { element, fence } => write!(
                f,
                "element {element}, acknowledged with fence {fence}, is missing from the final set"
            ),
            FindingKind::StaleAccepted {
                element: Some(element),
                fence,
                newer,
            } => write!(
                f,
                "write of element {element} accepted with fence {fence} after fence {newer}"
            ),
            FindingKind::StaleAccepted {
                element: None,
                fence,
                newer,
            } => write!(f, "claim accepted with fence {fence} after fence {newer}"),
            FindingKind::ReissuedFence {
                fence,
                earlier,
                earlier_at,
            } if fence == earlier => write!(
                f,
                "fence {fence} granted again (first granted at line {})",
                earlier_at + 1
            ),
            FindingKind::ReissuedFence {
                fence,
                earlier,
                earlier_at,
            } => write!(
                f,
                "fence {fence} granted after fence {earlier} (line {})",
                earlier_at + 1
            ),
            FindingKind::RefusedButPresent { element, fence } => write!(
                f,
                "element {element} is in the final set though its write (fence {fence}) was refused"
            ),
            FindingKind::UnexpectedElement { element } => {
                write!(
                    f,
                    "element {element} is in the final set but no write to this key carried it"
                )
            }
            FindingKind::DuplicateElement { element, first_at } => write!(
                f,
                "element {element} written again (first at line {})",
                first_at + 1
            ),
            FindingKind::ResourceFenceBehind {
                last_fence,
                accepted,
            } => write!(
                f,
                "final last_fence {} is below fence {accepted}, which the resource accepted",
                last_fence.map_or_else(|| "none".to_string(), |v| v.to_string())
            ),
            FindingKind::MissingFinalState => {
                write!(
                    f,
                    "the key was written but the final state has no row for it"
                )
            }
            FindingKind::UnhealedFault { fault, kind } => {
                write!(f, "fault {fault} ({kind:?}) was never healed")
            }
            FindingKind::OutOfOrder { previous, t } => {
                write!(f, "time {t} is before the previous event's {previous}")
            }
            FindingKind::ExclusionBroken {
                older,
                newer,
                overlap_ns,
            } => write!(
                f,
                "worker {} was granted fence {} while worker {}'s lease (fence {}) was valid for \
                 {:?} more",
                newer.0,
                newer.1,
                older.0,
                older.1,
                std::time::Duration::from_nanos(*overlap_ns)
            ),
            FindingKind::KeyStuck { waited_ns } => write!(
                f,
                "acquires waited {:?} for a key nobody held, with no fault in progress",
                std::time::Duration::from_nanos(*waited_ns)
            ),
            FindingKind::ControlLostNothing => write!(
                f,
                "the unfenced control lost no acknowledged element: the nemesis is too weak"
            ),
            FindingKind::EndedEarly { holder, early_ns } => write!(
                f,
                "worker {}'s lease (fence {}) was seen lost {:?} before its deadline",
                holder.0,
                holder.1,
                std::time::Duration::from_nanos(*early_ns)
            ),
            FindingKind::ReadLost {
                element,
                first_read_at,
            } => write!(
                f,
                "element {element}, read at line {}, is missing from a later read or the final set",
                first_read_at + 1
            ),
            FindingKind::FaultNeverLanded { kind } => write!(
                f,
                "the nemesis planned {kind:?} faults and none landed: the run proves nothing \
                 about them"
            ),
            FindingKind::GuardNotExercised { missing } => write!(
                f,
                "the fenced run never needed its fence ({missing}): its zero losses prove nothing"
            ),
        }
    }
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}", self.at + 1)?;
        if let Some(key) = &self.key {
            write!(f, ", key {key}")?;
        }
        write!(f, ": {}", self.kind)
    }
}
