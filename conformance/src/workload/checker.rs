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

/// How long after the harness sees a grant-losing fault healed its effects may still show on a
/// failover-unsafe backend: a returning old primary serves until its sentinels or replicas
/// reconfigure it, which Redis Sentinel does within a few of its 1 s info periods (double grants
/// came 2.5 s after such a heal in the long run). Later reissues fail the run.
pub const FAILOVER_AFTERMATH: Nanos = 10_000_000_000;

/// How to judge a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CheckOptions {
    /// Whether the resource checked the fences. `false` is the unfenced control: lost
    /// acknowledgements and stale accepts are expected there (they show the nemesis works),
    /// and their absence fails the control.
    pub fenced: bool,
    /// What the backend declares about its fences: with
    /// [`FenceSafety::FailoverUnsafe`], reissued fences, keys granted while another lease was
    /// valid, and acknowledgements lost through them are labelled declared instead of failing
    /// the run, if a fault that can make the authority forget grants
    /// ([`FaultKind::can_lose_grants`]) began between the two grants. Without such a fault
    /// they fail the run as on any backend: the declaration covers failovers, not every
    /// defect.
    pub fence_safety: FenceSafety,
    /// Whether the authority declares that it can end a live lease before its TTL
    /// ([`leasehold_core::ExclusionSafety::EarlyRevocation`]): a key granted while another
    /// holder's lease was still valid is then labelled declared, if a paused leader resumed
    /// between the two grants (what the declared defect needs). Writes are judged as ever: a
    /// stale write accepted still fails the run.
    pub early_revocation: bool,
    /// Whether the authority serialises every request through one write lock that a stopped
    /// client process can keep (an embedded SQLite file): a paused worker then explains a wait
    /// on any key, since it may have stopped while one of its requests held that lock.
    pub one_writer: bool,
}

impl CheckOptions {
    /// A fenced run on a backend with the given fence safety.
    pub fn fenced(fence_safety: FenceSafety) -> Self {
        CheckOptions {
            fenced: true,
            fence_safety,
            early_revocation: false,
            one_writer: false,
        }
    }

    /// The unfenced control on a backend with the given fence safety.
    pub fn unfenced_control(fence_safety: FenceSafety) -> Self {
        CheckOptions {
            fenced: false,
            fence_safety,
            early_revocation: false,
            one_writer: false,
        }
    }

    /// The options the history's `run` line records, if it has one.
    pub fn from_history(history: &History) -> Option<Self> {
        history.events().iter().find_map(|e| match &e.what {
            What::Run {
                fenced,
                failover_unsafe,
                early_revocation,
                one_writer,
                ..
            } => Some(CheckOptions {
                fenced: *fenced,
                fence_safety: if *failover_unsafe {
                    FenceSafety::FailoverUnsafe
                } else {
                    FenceSafety::Linearizable
                },
                early_revocation: *early_revocation,
                one_writer: *one_writer,
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
    /// Elements some read returned: when that read ended, and where.
    read: HashMap<u64, (Nanos, usize)>,
    /// Elements already reported lost from a read.
    read_lost: BTreeSet<u64>,
    /// The workers in a round on the key (granted, not yet releasing or killed), with the time
    /// each was granted.
    holders: HashMap<WorkerId, Nanos>,
    /// The greatest fence the resource is known to have accepted (completed accepts only).
    accepted: Tally,
    /// The greatest fence granted (completed grants only).
    granted: Tally,
    /// Every fence granted, and where first.
    grants: HashMap<u64, usize>,
    /// Fences found reissued where the backend's declaration covers it (a grant-losing fault
    /// began between the two grants).
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
    /// Each fault that can make an authority forget grants: when it began and, once healed,
    /// when it ended.
    grant_losing_faults: Vec<(Nanos, Option<Nanos>)>,
    /// Where in `grant_losing_faults` each such fault still in progress is.
    losing_open: HashMap<u64, usize>,
    /// Workers paused by the nemesis right now.
    paused: BTreeSet<WorkerId>,
    /// Reads started: when.
    reading: HashMap<(WorkerId, String), Nanos>,
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
        grant_losing_faults: Vec::new(),
        losing_open: HashMap::new(),
        paused: BTreeSet::new(),
        reading: HashMap::new(),
    };
    pass.walk();
    pass.judge_writes(finals);
    pass.judge_resource(finals);
    pass.measure_windows();
    pass.judge_plan();
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
        let through_reissue = |fence: &u64| {
            key.and_then(|k| self.keys.get(k))
                .is_some_and(|t| t.reissued.contains(fence))
        };
        let severity = match &kind {
            FindingKind::LostAck { .. } | FindingKind::ReadLost { .. } if !fenced => {
                Severity::Control
            }
            FindingKind::LostAck { fence, .. } if through_reissue(fence) => Severity::Declared,
            FindingKind::ReadLost { element, .. }
                if self
                    .writes
                    .get(element)
                    .is_some_and(|(w, _)| through_reissue(&w.fence)) =>
            {
                Severity::Declared
            }
            FindingKind::StaleAccepted { .. } if !fenced => Severity::Control,
            FindingKind::EndedEarly { .. } => Severity::Noted,
            _ => Severity::Failure,
        };
        self.push(at, key, severity, kind);
    }

    /// Whether the backend declares failover-unsafe fences and a fault that can make it forget
    /// grants was under way at some point between `from` and `to` (it began in between, or
    /// began before and had not healed [`FAILOVER_AFTERMATH`] before `from`): what a reissued
    /// fence or a double grant on such a backend needs to be declared rather than failed. A
    /// failover is a stretch, not an instant: until it heals, and for a while after the harness
    /// sees it healed, two servers may each believe they are the primary.
    fn declared_between(&self, from: Nanos, to: Nanos) -> bool {
        self.options.fence_safety == FenceSafety::FailoverUnsafe
            && self.grant_losing_faults.iter().any(|&(start, end)| {
                start <= to && end.is_none_or(|end| end.saturating_add(FAILOVER_AFTERMATH) >= from)
            })
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
            let stalled = match &e.what {
                What::FaultEnd {
                    kind: FaultKind::PauseLeader,
                    ..
                } => true,
                // A hand-off leader change that paused its leader is the same stall; one that
                // killed it is not (a restarted member comes back a follower).
                What::FaultEnd {
                    kind: FaultKind::HandoffLeaderChange,
                    node,
                    ..
                } => node.as_deref().is_some_and(|n| n.ends_with("(paused)")),
                _ => false,
            };
            stalled
                && (older.start..=o.from).contains(&e.t)
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
            // A loss does not end the holder's round: it may sit between its validity check and
            // its write until it releases, so it stays a holder for the hand-off count.
            What::Lost { .. } => self.figures.losses += 1,
            What::ReadInvoke { worker, key, fence } => {
                self.reading.insert((*worker, key.clone()), t);
                if fence.is_some() {
                    let accepted = self.key(key).accepted.before(t);
                    self.claiming.insert((*worker, key.clone()), accepted);
                }
            }
            What::ReadOk {
                worker,
                key,
                fence,
                elements,
            } => {
                let invoked = self.reading.remove(&(*worker, key.clone()));
                self.read_returned(i, t, key, invoked, elements);
                if let Some(fence) = fence {
                    let before = self.claiming.remove(&(*worker, key.clone())).flatten();
                    self.accepted(i, key, *fence, None, before, None);
                }
            }
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
            What::ReleaseInvoke { worker, key, .. } => {
                let track = self.key(key);
                track.release_started = Some(t);
                track.holders.remove(worker);
            }
            What::ReleaseOk { .. } | What::ReleaseFail { .. } => {}
            What::FaultStart {
                fault,
                kind,
                worker,
                ..
            } => {
                *self.figures.faults.entry(*kind).or_default() += 1;
                self.faults_open.insert(*fault, (*kind, i));
                if kind.can_lose_grants() {
                    self.losing_open
                        .insert(*fault, self.grant_losing_faults.len());
                    self.grant_losing_faults.push((t, None));
                }
                match (kind, worker) {
                    (FaultKind::PauseWorker, Some(w)) => {
                        self.paused.insert(*w);
                    }
                    (FaultKind::KillWorker | FaultKind::KillWorkerInTransaction, Some(w)) => {
                        for track in self.keys.values_mut() {
                            track.holders.remove(w);
                        }
                    }
                    _ => {}
                }
            }
            What::FaultEnd {
                fault,
                kind,
                worker,
                ..
            } => {
                self.faults_open.remove(fault);
                if let Some(at) = self.losing_open.remove(fault) {
                    if let Some(span) = self.grant_losing_faults.get_mut(at) {
                        span.1 = Some(t);
                    }
                }
                if let (FaultKind::PauseWorker, Some(w)) = (kind, worker) {
                    self.paused.remove(w);
                }
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
        let paused = &self.paused;
        let track = self.keys.entry(key.to_string()).or_default();
        let reissue = match track.grants.get(&fence) {
            Some(&first) => Some((fence, first)),
            None => started
                .and_then(|(_, before)| before)
                .filter(|&(f, _)| f >= fence),
        };
        track.grants.entry(fence).or_insert(i);
        track.granted.record(fence, i, t);
        // A key handed on while its holder sat paused: the case the fence exists for.
        if track
            .holders
            .keys()
            .any(|h| *h != worker && paused.contains(h))
        {
            self.figures.handoffs_during_pause += 1;
        }
        track.holders.insert(worker, t);
        if let Some(released) = track.release_started.take() {
            if invoked < released {
                self.figures.handoff.push(t.saturating_sub(released));
            }
        }
        if let Some((earlier, earlier_at)) = reissue {
            self.figures.fences_reissued += 1;
            let earlier_t = self.history.events().get(earlier_at).map_or(0, |e| e.t);
            let kind = FindingKind::ReissuedFence {
                fence,
                earlier,
                earlier_at,
            };
            if self.declared_between(earlier_t, t) {
                self.key(key).reissued.insert(fence);
                self.push(i, Some(key), Severity::Declared, kind);
            } else {
                self.find(i, Some(key), kind);
            }
        }
    }

    /// A read returned `elements`: every element an earlier read returned (one that ended
    /// before this one began) must still be there.
    fn read_returned(
        &mut self,
        i: usize,
        t: Nanos,
        key: &str,
        invoked: Option<Nanos>,
        elements: &[u64],
    ) {
        let track = self.keys.entry(key.to_string()).or_default();
        let present: BTreeSet<u64> = elements.iter().copied().collect();
        let mut lost: Vec<(u64, usize)> = Vec::new();
        if let Some(invoked) = invoked {
            for (&element, &(ended, first_at)) in &track.read {
                if ended < invoked
                    && !present.contains(&element)
                    && !track.read_lost.contains(&element)
                {
                    lost.push((element, first_at));
                }
            }
        }
        for &element in elements {
            track.read.entry(element).or_insert((t, i));
        }
        lost.sort_unstable();
        for (element, first_read_at) in lost {
            self.key(key).read_lost.insert(element);
            self.figures.reads_lost += 1;
            self.find(
                i,
                Some(key),
                FindingKind::ReadLost {
                    element,
                    first_read_at,
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
        // Elements a read returned and the final set lacks (acknowledged ones are lost
        // acknowledgements already).
        let mut read_missing: Vec<(usize, String, u64, usize)> = Vec::new();
        for (key, track) in &self.keys {
            let Some(state) = finals.get(key) else {
                continue;
            };
            for (&element, &(_, first_at)) in &track.read {
                let acknowledged = self
                    .writes
                    .get(&element)
                    .is_some_and(|(w, _)| matches!(w.outcome, WriteOutcome::Acknowledged(_)));
                if !state.elements.contains(&element)
                    && !acknowledged
                    && !track.read_lost.contains(&element)
                {
                    let at = final_at.get(key.as_str()).copied().unwrap_or(last);
                    read_missing.push((at, key.clone(), element, first_at));
                }
            }
        }
        read_missing.sort_unstable();
        for (at, key, element, first_read_at) in read_missing {
            self.figures.reads_lost += 1;
            self.find(
                at,
                Some(&key),
                FindingKind::ReadLost {
                    element,
                    first_read_at,
                },
            );
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
            // Declared where the backend declares failover-unsafe fences and a grant-losing
            // fault began while the older holder held the key, or declares early revocation
            // and a paused leader's resume can explain this overlap.
            let older_start = ws
                .iter()
                .find(|w| w.key == o.key && (w.worker, w.fence) == o.older)
                .map_or(o.from, |w| w.start);
            let declared = self.declared_between(older_start, o.from)
                || (self.options.early_revocation && self.after_a_stalled_leader(&ws, &o));
            let severity = if declared {
                Severity::Declared
            } else {
                Severity::Failure
            };
            self.push(o.at, Some(&o.key), severity, kind);
        }
        for w in ws.iter().filter(|w| w.ended_early_ns > 0) {
            self.figures.leases_ended_early += 1;
            let kind = FindingKind::EndedEarly {
                holder: (w.worker, w.fence),
                early_ns: w.ended_early_ns,
            };
            self.push(w.granted, Some(&w.key), Severity::Noted, kind);
        }
        self.figures.availability = windows::availability(self.history, &ws);
        for stuck in super::stuck::stuck_keys(self.history, &ws, self.options.one_writer) {
            self.find(
                stuck.at,
                Some(&stuck.key),
                FindingKind::KeyStuck {
                    waited_ns: stuck.waited_ns,
                },
            );
        }
    }

    /// What the run's plan promised: every planned fault kind landed, and a fenced run under
    /// worker pauses needed its fence at least once each way.
    fn judge_plan(&mut self) {
        let planned: Vec<FaultKind> = self
            .history
            .events()
            .iter()
            .find_map(|e| match &e.what {
                What::Run { planned_faults, .. } => Some(planned_faults.clone()),
                _ => None,
            })
            .unwrap_or_default();
        let at = self.history.len().saturating_sub(1);
        for kind in &planned {
            if !self.figures.faults.contains_key(kind) {
                self.find(at, None, FindingKind::FaultNeverLanded { kind: *kind });
            }
        }
        if self.options.fenced && planned.contains(&FaultKind::PauseWorker) {
            let mut missing = Vec::new();
            if self.figures.writes_refused_stale == 0 {
                missing.push("no stale write refused");
            }
            if self.figures.handoffs_during_pause == 0 {
                missing.push("no key handed on while its holder was paused");
            }
            if !missing.is_empty() {
                self.find(
                    at,
                    None,
                    FindingKind::GuardNotExercised {
                        missing: missing.join(", "),
                    },
                );
            }
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
                Severity::Noted => "noted",
            };
            format!("{weight}: {n} x {label}; first at {first}")
        })
        .collect()
}
