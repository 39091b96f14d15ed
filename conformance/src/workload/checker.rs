//! The checker: a history plus the resource's final state in, a [`RunVerdict`] out.
//!
//! Like Jepsen's set checker, it needs no model search: every write adds an element no other
//! write carries, so the final set says which acknowledged writes survived. Fences make the
//! rest checkable from the history alone: the resource must never accept a fence below one it
//! accepted, and the authority must never grant a fence twice or go back.
//!
//! Orders are taken from real time, never guessed: an operation counts as *after* another only
//! if it was invoked after the other completed. So concurrent operations are never blamed, and
//! every finding is a certain violation.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use leasehold_core::FenceSafety;

use super::event::{FaultKind, Nanos, What, WorkerId};
use super::figures::Figures;
use super::final_state::FinalState;
use super::finding::{Finding, FindingKind, Severity};
use super::history::History;
use super::verdict::{RunVerdict, Status};
use super::windows;

/// How soon after a paused leader resumes its revocation of live leases can hand a key on: its
/// lessor's next expiry check (every 500 ms), the revocation's way through the new leader, and
/// the waiter's next look, with room for a loaded machine.
const STALL_REVOCATION_WITHIN: Nanos = 2_000_000_000;

/// Events of the key shown before and after the first failure.
const SLICE_BEFORE: usize = 12;
const SLICE_AFTER: usize = 6;

/// How to judge a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CheckOptions {
    /// Whether the resource checked the fences. `false` is the unfenced control: lost
    /// acknowledgements and stale accepts are expected there (they show the nemesis works),
    /// and their absence fails the control.
    pub fenced: bool,
    /// What the backend declares about its fences: with
    /// [`FenceSafety::FailoverUnsafe`], reissued fences (and acknowledgements lost through
    /// them) are labelled declared instead of failing the run.
    pub fence_safety: FenceSafety,
    /// Whether the authority declares that it can end a live lease before its TTL
    /// ([`leasehold_core::ExclusionSafety::EarlyRevocation`]): a key granted while another
    /// holder's lease was still valid is then labelled declared, if a paused leader resumed
    /// between the two grants (what the declared defect needs). Writes are judged as ever: a
    /// stale write accepted still fails the run.
    pub early_revocation: bool,
}

impl CheckOptions {
    /// A fenced run on a backend with the given fence safety.
    pub fn fenced(fence_safety: FenceSafety) -> Self {
        CheckOptions {
            fenced: true,
            fence_safety,
            early_revocation: false,
        }
    }

    /// The unfenced control on a backend with the given fence safety.
    pub fn unfenced_control(fence_safety: FenceSafety) -> Self {
        CheckOptions {
            fenced: false,
            fence_safety,
            early_revocation: false,
        }
    }

    /// The options the history's `run` line records, if it has one.
    pub fn from_history(history: &History) -> Option<Self> {
        history.events().iter().find_map(|e| match &e.what {
            What::Run {
                fenced,
                failover_unsafe,
                early_revocation,
                ..
            } => Some(CheckOptions {
                fenced: *fenced,
                fence_safety: if *failover_unsafe {
                    FenceSafety::FailoverUnsafe
                } else {
                    FenceSafety::Linearizable
                },
                early_revocation: *early_revocation,
            }),
            _ => None,
        })
    }
}

/// Where a write stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum WriteOutcome {
    Pending,
    Acknowledged(usize),
    Refused(usize),
    Unknown(usize),
}

struct WriteTrack {
    key: String,
    fence: u64,
    invoked_at: usize,
    outcome: WriteOutcome,
}

/// The greatest fence seen so far and the event that showed it.
type Highest = Option<(u64, usize)>;

/// The greatest fence completed, and the greatest completed strictly before the latest
/// completion's time: events of different processes at the same time are in no known order, so
/// an operation invoked at the very time another completed is concurrent with it, not after.
#[derive(Clone, Copy, Debug, Default)]
struct Tally {
    all: Highest,
    settled: Highest,
    tick: Nanos,
}

impl Tally {
    /// A completion of `fence` at event `i`, time `t` (events come in time order).
    fn record(&mut self, fence: u64, i: usize, t: Nanos) {
        if t > self.tick {
            self.settled = self.all;
            self.tick = t;
        }
        if self.all.is_none_or(|(f, _)| fence > f) {
            self.all = Some((fence, i));
        }
    }

    /// The greatest fence completed strictly before `t`.
    fn before(&self, t: Nanos) -> Highest {
        if t > self.tick {
            self.all
        } else {
            self.settled
        }
    }
}

#[derive(Default)]
struct KeyTrack {
    /// The greatest fence the resource is known to have accepted (completed accepts only).
    accepted: Tally,
    /// The greatest fence granted (completed grants only).
    granted: Tally,
    /// Every fence granted, and where first.
    grants: HashMap<u64, usize>,
    /// Fences found reissued.
    reissued: BTreeSet<u64>,
    /// A release started and not yet followed by a grant.
    release_started: Option<Nanos>,
}

struct Pass<'h> {
    history: &'h History,
    options: CheckOptions,
    figures: Figures,
    findings: Vec<Finding>,
    keys: BTreeMap<String, KeyTrack>,
    /// Acquires started: when, and the key's greatest grant at that moment.
    acquiring: HashMap<(WorkerId, String), (Nanos, Highest)>,
    /// Claims started: the key's greatest accepted fence at that moment.
    claiming: HashMap<(WorkerId, String), Highest>,
    /// Writes by element, with the key's greatest accepted fence when each was invoked.
    writes: HashMap<u64, (WriteTrack, Highest)>,
    /// Faults started and not healed.
    faults_open: BTreeMap<u64, (super::event::FaultKind, usize)>,
}

/// Judges a run: `history` as recorded, `finals` as read from the resource after it.
pub fn check(history: &History, finals: &FinalState, options: &CheckOptions) -> RunVerdict {
    let mut pass = Pass {
        history,
        options: *options,
        figures: Figures::default(),
        findings: Vec::new(),
        keys: BTreeMap::new(),
        acquiring: HashMap::new(),
        claiming: HashMap::new(),
        writes: HashMap::new(),
        faults_open: BTreeMap::new(),
    };
    pass.walk();
    pass.judge_writes(finals);
    pass.judge_resource(finals);
    pass.measure_windows();
    pass.finish()
}

/// Judges a history that carries its own `run` line and `final` lines.
pub fn check_recorded(history: &History) -> Option<RunVerdict> {
    let options = CheckOptions::from_history(history)?;
    Some(check(history, &history.final_state(), &options))
}

impl Pass<'_> {
    fn find(&mut self, at: usize, key: Option<&str>, kind: FindingKind) {
        let fenced = self.options.fenced;
        let declared = self.options.fence_safety == FenceSafety::FailoverUnsafe;
        let severity = match &kind {
            FindingKind::LostAck { fence, .. } => {
                let through_reissue = key
                    .and_then(|k| self.keys.get(k))
                    .is_some_and(|t| t.reissued.contains(fence));
                if !fenced {
                    Severity::Control
                } else if declared && through_reissue {
                    Severity::Declared
                } else {
                    Severity::Failure
                }
            }
            FindingKind::StaleAccepted { .. } if !fenced => Severity::Control,
            FindingKind::ReissuedFence { .. } if declared => Severity::Declared,
            _ => Severity::Failure,
        };
        self.push(at, key, severity, kind);
    }

    fn push(&mut self, at: usize, key: Option<&str>, severity: Severity, kind: FindingKind) {
        self.findings.push(Finding {
            at,
            key: key.map(str::to_string),
            severity,
            kind,
        });
    }

    /// Whether a paused leader resumed between the older holder's grant and the newer one's,
    /// at most [`STALL_REVOCATION_WITHIN`] before the newer grant: what an authority that
    /// declares early revocation (etcd before 3.4.31 and 3.5.13) needs to end a live lease, the
    /// resumed leader revoking it at its next expiry check. An overlap without one is a failure
    /// even there.
    fn after_a_stalled_leader(&self, ws: &[windows::Window], o: &windows::Overlap) -> bool {
        let Some(older) = ws
            .iter()
            .find(|w| w.key == o.key && (w.worker, w.fence) == o.older)
        else {
            return false;
        };
        self.history.events().iter().any(|e| {
            matches!(
                e.what,
                // A hand-off leader change may be a pause too: the same stall.
                What::FaultEnd {
                    kind: FaultKind::PauseLeader | FaultKind::HandoffLeaderChange,
                    ..
                }
            ) && (older.start..=o.from).contains(&e.t)
                && o.from - e.t <= STALL_REVOCATION_WITHIN
        })
    }

    fn key(&mut self, key: &str) -> &mut KeyTrack {
        self.keys.entry(key.to_string()).or_default()
    }

    fn walk(&mut self) {
        let history = self.history;
        let mut previous: Option<Nanos> = None;
        let mut reported_order = false;
        for (i, event) in history.events().iter().enumerate() {
            let t = event.t;
            if let Some(p) = previous {
                if t < p && !reported_order {
                    reported_order = true;
                    self.find(i, event.key(), FindingKind::OutOfOrder { previous: p, t });
                }
            }
            previous = Some(previous.map_or(t, |p| p.max(t)));
            if let Some(key) = event.key() {
                self.key(key);
            }
            self.step(i, t, &event.what);
        }
        self.figures.keys = self.keys.len();
        self.figures.span_ns = windows::span(history).map_or(0, |(lo, hi)| hi - lo);
        let unhealed: Vec<_> = std::mem::take(&mut self.faults_open).into_iter().collect();
        for (fault, (kind, at)) in unhealed {
            self.find(at, None, FindingKind::UnhealedFault { fault, kind });
        }
    }

    fn step(&mut self, i: usize, t: Nanos, what: &What) {
        match what {
            What::Run { .. } | What::Final { .. } | What::Renewed { .. } => {}
            What::AcquireInvoke { worker, key, .. } => {
                self.figures.acquires += 1;
                let granted = self.key(key).granted.before(t);
                self.acquiring.insert((*worker, key.clone()), (t, granted));
            }
            What::AcquireOk {
                worker, key, fence, ..
            } => self.granted(i, t, *worker, key, *fence),
            What::AcquireFail { worker, key, .. } => {
                self.figures.acquire_failed += 1;
                self.acquiring.remove(&(*worker, key.clone()));
            }
            What::AcquireTimeout { worker, key } => {
                self.figures.acquire_timed_out += 1;
                self.acquiring.remove(&(*worker, key.clone()));
            }
            What::AcquireCancelled { worker, key } => {
                self.figures.acquire_cancelled += 1;
                self.acquiring.remove(&(*worker, key.clone()));
            }
            What::Lost { .. } => self.figures.losses += 1,
            What::ReadInvoke {
                worker,
                key,
                fence: Some(_),
            } => {
                let accepted = self.key(key).accepted.before(t);
                self.claiming.insert((*worker, key.clone()), accepted);
            }
            What::ReadInvoke { .. } => {}
            What::ReadOk {
                worker,
                key,
                fence: Some(fence),
                ..
            } => {
                let before = self.claiming.remove(&(*worker, key.clone())).flatten();
                self.accepted(i, key, *fence, None, before, None);
            }
            What::ReadOk { .. } => {}
            What::ReadStale { worker, key, .. } => {
                self.figures.claims_refused_stale += 1;
                self.claiming.remove(&(*worker, key.clone()));
            }
            What::ReadFail { worker, key, .. } => {
                self.claiming.remove(&(*worker, key.clone()));
            }
            What::WriteInvoke {
                key,
                fence,
                element,
                ..
            } => {
                self.figures.writes += 1;
                if let Some((first, _)) = self.writes.get(element) {
                    let first_at = first.invoked_at;
                    self.find(
                        i,
                        Some(key),
                        FindingKind::DuplicateElement {
                            element: *element,
                            first_at,
                        },
                    );
                } else {
                    let accepted = self.key(key).accepted.before(t);
                    self.writes.insert(
                        *element,
                        (
                            WriteTrack {
                                key: key.clone(),
                                fence: *fence,
                                invoked_at: i,
                                outcome: WriteOutcome::Pending,
                            },
                            accepted,
                        ),
                    );
                }
            }
            What::WriteOk {
                key,
                fence,
                element,
                prior,
                ..
            } => {
                self.figures.writes_acknowledged += 1;
                let before = self.complete(i, key, *fence, *element, WriteOutcome::Acknowledged(i));
                self.accepted(i, key, *fence, Some(*element), before, *prior);
            }
            What::WriteStale {
                key,
                fence,
                element,
                ..
            } => {
                self.figures.writes_refused_stale += 1;
                self.complete(i, key, *fence, *element, WriteOutcome::Refused(i));
            }
            What::WriteUnknown {
                key,
                fence,
                element,
                ..
            } => {
                self.complete(i, key, *fence, *element, WriteOutcome::Unknown(i));
            }
            What::ReleaseInvoke { key, .. } => self.key(key).release_started = Some(t),
            What::ReleaseOk { .. } | What::ReleaseFail { .. } => {}
            What::FaultStart { fault, kind, .. } => {
                *self.figures.faults.entry(*kind).or_default() += 1;
                self.faults_open.insert(*fault, (*kind, i));
            }
            What::FaultEnd { fault, .. } => {
                self.faults_open.remove(fault);
            }
        }
    }

    /// A grant: checks that its fence is new and above every grant completed before the acquire
    /// began, and measures acquire and hand-off latency.
    fn granted(&mut self, i: usize, t: Nanos, worker: WorkerId, key: &str, fence: u64) {
        self.figures.acquired += 1;
        let started = self.acquiring.remove(&(worker, key.to_string()));
        let invoked = started.map_or(t, |(at, _)| at);
        if started.is_some() {
            self.figures.acquire_latency.push(t.saturating_sub(invoked));
        }
        let track = self.key(key);
        let reissue = match track.grants.get(&fence) {
            Some(&first) => Some((fence, first)),
            None => started
                .and_then(|(_, before)| before)
                .filter(|&(f, _)| f >= fence),
        };
        track.grants.entry(fence).or_insert(i);
        track.granted.record(fence, i, t);
        if let Some(released) = track.release_started.take() {
            if invoked < released {
                self.figures.handoff.push(t.saturating_sub(released));
            }
        }
        if let Some((earlier, earlier_at)) = reissue {
            self.key(key).reissued.insert(fence);
            self.figures.fences_reissued += 1;
            self.find(
                i,
                Some(key),
                FindingKind::ReissuedFence {
                    fence,
                    earlier,
                    earlier_at,
                },
            );
        }
    }

    /// A write's completion; returns the key's greatest accepted fence when it was invoked.
    fn complete(
        &mut self,
        i: usize,
        key: &str,
        fence: u64,
        element: u64,
        outcome: WriteOutcome,
    ) -> Highest {
        match self.writes.get_mut(&element) {
            Some((track, before)) if track.key == key => {
                track.outcome = outcome;
                *before
            }
            Some(_) => None,
            None => {
                // A completion without its invoke (the invoke line was lost): judge it from
                // here on, with nothing known about what came before it.
                self.writes.insert(
                    element,
                    (
                        WriteTrack {
                            key: key.to_string(),
                            fence,
                            invoked_at: i,
                            outcome,
                        },
                        None,
                    ),
                );
                None
            }
        }
    }

    /// The resource accepted `fence` (a write of `element`, or a claim): stale if a greater
    /// fence was accepted before this operation began, or the resource says it held one.
    fn accepted(
        &mut self,
        i: usize,
        key: &str,
        fence: u64,
        element: Option<u64>,
        before: Highest,
        prior: Option<u64>,
    ) {
        let newer = prior
            .filter(|&p| p > fence)
            .or_else(|| before.map(|(f, _)| f).filter(|&f| f > fence));
        let t = self.history.events().get(i).map_or(0, |e| e.t);
        let track = self.key(key);
        track.accepted.record(fence, i, t);
        if let Some(newer) = newer {
            self.figures.stale_accepted += 1;
            self.find(
                i,
                Some(key),
                FindingKind::StaleAccepted {
                    element,
                    fence,
                    newer,
                },
            );
        }
    }

    /// Every write against the final set: lost acknowledgements, refused writes that landed,
    /// unknown writes that did, and elements nobody wrote.
    fn judge_writes(&mut self, finals: &FinalState) {
        let final_at: HashMap<&str, usize> = self
            .history
            .events()
            .iter()
            .enumerate()
            .filter_map(|(i, e)| match &e.what {
                What::Final { key, .. } => Some((key.as_str(), i)),
                _ => None,
            })
            .collect();
        let last = self.history.len().saturating_sub(1);
        let mut writes: Vec<(u64, String, u64, usize, WriteOutcome)> = self
            .writes
            .iter()
            .map(|(&element, (w, _))| (element, w.key.clone(), w.fence, w.invoked_at, w.outcome))
            .collect();
        writes.sort_by_key(|w| w.3);
        let mut missing: BTreeSet<String> = BTreeSet::new();
        for (element, key, fence, invoked_at, outcome) in writes {
            let Some(state) = finals.get(&key) else {
                if missing.insert(key.clone()) {
                    self.find(invoked_at, Some(&key), FindingKind::MissingFinalState);
                }
                if matches!(outcome, WriteOutcome::Pending | WriteOutcome::Unknown(_)) {
                    self.figures.writes_unknown += 1;
                }
                continue;
            };
            let present = state.elements.contains(&element);
            match outcome {
                WriteOutcome::Acknowledged(at) if !present => {
                    self.figures.lost_acks += 1;
                    self.find(at, Some(&key), FindingKind::LostAck { element, fence });
                }
                WriteOutcome::Refused(at) if present => {
                    self.find(
                        at,
                        Some(&key),
                        FindingKind::RefusedButPresent { element, fence },
                    );
                }
                WriteOutcome::Pending | WriteOutcome::Unknown(_) => {
                    self.figures.writes_unknown += 1;
                    if present {
                        self.figures.unknown_recovered += 1;
                    }
                }
                _ => {}
            }
        }
        for (key, state) in &finals.keys {
            for &element in &state.elements {
                let carried = self
                    .writes
                    .get(&element)
                    .is_some_and(|(w, _)| &w.key == key);
                if !carried {
                    let at = final_at.get(key.as_str()).copied().unwrap_or(last);
                    self.find(at, Some(key), FindingKind::UnexpectedElement { element });
                }
            }
        }
    }

    /// With fences, the resource's final `last_fence` must be at least every fence it accepted.
    fn judge_resource(&mut self, finals: &FinalState) {
        if !self.options.fenced {
            return;
        }
        let behind: Vec<(String, u64, usize, Option<u64>)> = self
            .keys
            .iter()
            .filter_map(|(key, track)| {
                let (accepted, at) = track.accepted.all?;
                let state = finals.get(key)?;
                (state.last_fence.is_none_or(|l| l < accepted))
                    .then(|| (key.clone(), accepted, at, state.last_fence))
            })
            .collect();
        for (key, accepted, at, last_fence) in behind {
            self.find(
                at,
                Some(&key),
                FindingKind::ResourceFenceBehind {
                    last_fence,
                    accepted,
                },
            );
        }
    }

    fn measure_windows(&mut self) {
        let ws = windows::windows(self.history);
        let observed = windows::overlaps(&ws, false);
        self.figures.overlapping_holders = observed.len() as u64;
        if let Some(longest) = observed.iter().max_by_key(|o| o.ns) {
            self.figures.longest_stale_window_ns = longest.ns;
            self.figures.longest_overlap = Some(longest.clone());
        }
        let valid = windows::overlaps(&ws, true);
        self.figures.valid_overlaps = valid.len() as u64;
        for o in valid {
            let kind = FindingKind::ExclusionBroken {
                older: o.older,
                newer: o.newer,
                overlap_ns: o.ns,
            };
            // Declared where the backend declares failover-unsafe fences, or declares early
            // revocation and a paused leader's resume can explain this overlap.
            let declared = self.options.fence_safety == FenceSafety::FailoverUnsafe
                || (self.options.early_revocation && self.after_a_stalled_leader(&ws, &o));
            let severity = if declared {
                Severity::Declared
            } else {
                Severity::Failure
            };
            self.push(o.at, Some(&o.key), severity, kind);
        }
        self.figures.availability = windows::availability(self.history, &ws);
        for stuck in super::stuck::stuck_keys(self.history, &ws) {
            self.find(
                stuck.at,
                Some(&stuck.key),
                FindingKind::KeyStuck {
                    waited_ns: stuck.waited_ns,
                },
            );
        }
    }

    fn finish(mut self) -> RunVerdict {
        if !self.options.fenced && self.figures.lost_acks == 0 {
            let at = self.history.len().saturating_sub(1);
            self.find(at, None, FindingKind::ControlLostNothing);
        }
        self.findings.sort_by_key(|f| f.at);
        let status = if self
            .findings
            .iter()
            .any(|f| f.severity == Severity::Failure)
        {
            Status::Failed
        } else if self
            .findings
            .iter()
            .any(|f| f.severity == Severity::Declared)
        {
            Status::Declared
        } else {
            Status::Passed
        };
        let (seed, backend) = self
            .history
            .events()
            .iter()
            .find_map(|e| match &e.what {
                What::Run { seed, backend, .. } => Some((Some(*seed), Some(backend.clone()))),
                _ => None,
            })
            .unwrap_or((None, None));
        let slice = self
            .findings
            .iter()
            .find(|f| f.severity == Severity::Failure)
            .map(|f| {
                self.history
                    .slice_around(f.at, f.key.as_deref(), SLICE_BEFORE, SLICE_AFTER)
            });
        RunVerdict {
            status,
            fenced: self.options.fenced,
            seed,
            backend,
            reasons: reasons(&self.findings),
            findings: self.findings,
            figures: self.figures,
            slice,
        }
    }
}

/// One line per (severity, kind) of finding: the count and the first instance.
fn reasons(findings: &[Finding]) -> Vec<String> {
    let mut groups: Vec<(Severity, &'static str, usize, &Finding)> = Vec::new();
    for f in findings {
        let label = f.kind.label();
        match groups
            .iter_mut()
            .find(|(s, l, _, _)| *s == f.severity && *l == label)
        {
            Some(group) => group.2 += 1,
            None => groups.push((f.severity, label, 1, f)),
        }
    }
    groups.sort_by_key(|(s, _, _, first)| (*s, first.at));
    groups
        .into_iter()
        .map(|(severity, label, n, first)| {
            let weight = match severity {
                Severity::Failure => "FAIL",
                Severity::Declared => "declared",
                Severity::Control => "control, as expected",
            };
            format!("{weight}: {n} x {label}; first at {first}")
        })
        .collect()
}
