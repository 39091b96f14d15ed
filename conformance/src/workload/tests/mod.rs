//! The checker on hand-made histories (the history format's own tests are in `format.rs`).

use leasehold_core::FenceSafety;

use super::*;
use crate::resource::check_history;
use crate::Verdict;

mod format;
mod plan;

/// Builds a history by hand: events at explicit times, with shorthands for the workload's
/// steps.
#[derive(Clone, Default)]
struct Script {
    events: Vec<Event>,
}

impl Script {
    fn at(&mut self, t: Nanos, what: What) -> &mut Self {
        self.events.push(Event::new(t, what));
        self
    }

    fn run(&mut self, fenced: bool, failover_unsafe: bool) -> &mut Self {
        self.at(
            0,
            What::Run {
                seed: 7,
                backend: "hand-made".into(),
                fenced,
                failover_unsafe,
                early_revocation: false,
                one_writer: false,
                planned_faults: Vec::new(),
                commit: None,
                versions: Default::default(),
                command: None,
                resource: None,
            },
        )
    }

    fn acquire_invoke(&mut self, t: Nanos, worker: WorkerId, key: &str) -> &mut Self {
        self.at(
            t,
            What::AcquireInvoke {
                worker,
                key: key.into(),
                ttl_ns: 1_000,
                max_wait_ns: Some(10_000),
            },
        )
    }

    fn acquire_ok(
        &mut self,
        t: Nanos,
        worker: WorkerId,
        key: &str,
        fence: u64,
        deadline: Option<Nanos>,
    ) -> &mut Self {
        self.at(
            t,
            What::AcquireOk {
                worker,
                key: key.into(),
                fence,
                deadline,
            },
        )
    }

    /// Acquire invoked at `t`, granted at `t + 10`, deadline `t + 1000`.
    fn acquire(&mut self, t: Nanos, worker: WorkerId, key: &str, fence: u64) -> &mut Self {
        self.acquire_invoke(t, worker, key)
            .acquire_ok(t + 10, worker, key, fence, Some(t + 1_000))
    }

    /// A claiming read invoked at `t` returning `elements` at `t + 10`.
    fn read(
        &mut self,
        t: Nanos,
        worker: WorkerId,
        key: &str,
        fence: u64,
        elements: &[u64],
    ) -> &mut Self {
        self.at(
            t,
            What::ReadInvoke {
                worker,
                key: key.into(),
                fence: Some(fence),
            },
        )
        .at(
            t + 10,
            What::ReadOk {
                worker,
                key: key.into(),
                fence: Some(fence),
                elements: elements.to_vec(),
            },
        )
    }

    fn write_invoke(
        &mut self,
        t: Nanos,
        worker: WorkerId,
        key: &str,
        fence: u64,
        element: u64,
    ) -> &mut Self {
        self.at(
            t,
            What::WriteInvoke {
                worker,
                key: key.into(),
                fence,
                element,
            },
        )
    }

    fn write_ok(
        &mut self,
        t: Nanos,
        worker: WorkerId,
        key: &str,
        fence: u64,
        element: u64,
    ) -> &mut Self {
        self.at(
            t,
            What::WriteOk {
                worker,
                key: key.into(),
                fence,
                element,
                prior: None,
            },
        )
    }

    /// A write invoked at `t` and accepted at `t + 10`.
    fn write(
        &mut self,
        t: Nanos,
        worker: WorkerId,
        key: &str,
        fence: u64,
        element: u64,
    ) -> &mut Self {
        self.write_invoke(t, worker, key, fence, element).write_ok(
            t + 10,
            worker,
            key,
            fence,
            element,
        )
    }

    /// A release invoked at `t`, done at `t + 10`.
    fn release(&mut self, t: Nanos, worker: WorkerId, key: &str, fence: u64) -> &mut Self {
        self.at(
            t,
            What::ReleaseInvoke {
                worker,
                key: key.into(),
                fence,
            },
        )
        .at(
            t + 10,
            What::ReleaseOk {
                worker,
                key: key.into(),
                fence,
            },
        )
    }

    fn fault(
        &mut self,
        t: Nanos,
        end: Nanos,
        fault: u64,
        kind: FaultKind,
        worker: WorkerId,
    ) -> &mut Self {
        self.at(
            t,
            What::FaultStart {
                fault,
                kind,
                worker: Some(worker),
                node: None,
            },
        );
        self.at(
            end,
            What::FaultEnd {
                fault,
                kind,
                worker: Some(worker),
                node: None,
            },
        )
    }

    /// A server fault (no worker) from `t` to `end`.
    fn server_fault(&mut self, t: Nanos, end: Nanos, fault: u64, kind: FaultKind) -> &mut Self {
        for what in [
            What::FaultStart {
                fault,
                kind,
                worker: None,
                node: Some("server".into()),
            },
            What::FaultEnd {
                fault,
                kind,
                worker: None,
                node: Some("server".into()),
            },
        ] {
            let at = if matches!(what, What::FaultStart { .. }) {
                t
            } else {
                end
            };
            self.at(at, what);
        }
        self
    }

    /// From 600 on, workers 2 and 3 wait for `k0` in turn, half a second each, and time out:
    /// nobody is granted it for four seconds. Returns when the last wait ended.
    fn k0_waited_on_in_vain(&mut self) -> Nanos {
        let half_second = 500_000_000;
        let mut t = 600;
        for round in 0..8u64 {
            let worker = 2 + (round % 2) as WorkerId;
            self.acquire_invoke(t, worker, "k0").at(
                t + half_second,
                What::AcquireTimeout {
                    worker,
                    key: "k0".into(),
                },
            );
            t += half_second + 1_000;
        }
        t
    }

    fn history(&self) -> History {
        let mut events = self.events.clone();
        events.sort_by_key(|e| e.t);
        History::new(events)
    }
}

fn fenced() -> CheckOptions {
    CheckOptions::fenced(FenceSafety::Linearizable)
}

fn only(key: &str, elements: &[u64], last_fence: u64) -> FinalState {
    FinalState::new().with(
        key,
        KeyState::new(elements.iter().copied(), Some(last_fence)),
    )
}

fn kinds(v: &RunVerdict, severity: Severity) -> Vec<&FindingKind> {
    v.findings_of(severity).map(|f| &f.kind).collect()
}

/// Two workers take turns on one key; the second was already waiting when the first released.
fn clean_script() -> Script {
    let mut s = Script::default();
    s.run(true, false)
        .acquire(100, 1, "k0", 1)
        .acquire_invoke(150, 2, "k0")
        .read(200, 1, "k0", 1, &[])
        .write(300, 1, "k0", 1, 10)
        .release(400, 1, "k0", 1)
        .acquire_ok(450, 2, "k0", 2, Some(1_450))
        .read(500, 2, "k0", 2, &[10])
        .write(600, 2, "k0", 2, 20)
        .release(700, 2, "k0", 2);
    s
}

#[test]
fn clean_history_passes() {
    let h = clean_script().history();
    let v = check(&h, &only("k0", &[10, 20], 2), &fenced());
    assert_eq!(v.status, Status::Passed, "{v}");
    assert!(v.findings.is_empty(), "{v}");
    assert!(v.slice.is_none());
    assert_eq!(v.seed, Some(7));
    let f = &v.figures;
    assert_eq!((f.acquires, f.acquired), (2, 2));
    assert_eq!((f.writes, f.writes_acknowledged), (2, 2));
    assert_eq!(
        (f.lost_acks, f.stale_accepted, f.fences_reissued),
        (0, 0, 0)
    );
    assert_eq!(f.overlapping_holders, 0);
    assert_eq!(
        f.handoff.samples(),
        &[50],
        "release at 400, waiter granted at 450"
    );
    assert_eq!(f.acquire_latency.samples(), &[10, 300]);
    // Held 110..400 and 450..700 of the span 0..710.
    let share = f.availability["k0"];
    assert!((share - 540.0 / 710.0).abs() < 1e-9, "availability {share}");
    assert_eq!(v.outcome(), Ok(Verdict::Passed));
    // The same history, recorded with its own final state, judges the same.
    let mut s = clean_script();
    s.at(
        800,
        What::Final {
            key: "k0".into(),
            elements: vec![10, 20],
            last_fence: Some(2),
        },
    );
    let recorded = check_recorded(&s.history()).expect("has a run line");
    assert_eq!(recorded.status, Status::Passed, "{recorded}");
}

#[test]
fn lost_ack_is_found() {
    let h = clean_script().history();
    // The resource lost element 10, acknowledged at line 8.
    let v = check(&h, &only("k0", &[20], 2), &fenced());
    assert_eq!(v.status, Status::Failed);
    assert_eq!(v.figures.lost_acks, 1);
    assert_eq!(
        kinds(&v, Severity::Failure),
        [&FindingKind::LostAck {
            element: 10,
            fence: 1
        }]
    );
    let first = v.first_failure().expect("a failure");
    assert!(matches!(
        h.events()[first.at].what,
        What::WriteOk { element: 10, .. }
    ));
    let slice = v.slice.as_ref().expect("a failure prints its slice");
    assert_eq!(slice.focus, first.at);
    assert!(slice.events.iter().any(|(i, _)| *i == first.at));
    let text = v.outcome().expect_err("fails").0;
    assert!(text.contains("seed 7"), "{text}");
    assert!(
        text.contains(&format!(">> line {:>6}", first.at + 1)),
        "{text}"
    );
    assert!(text.contains("acknowledged element lost"), "{text}");
}

#[test]
fn stale_accept_is_found() {
    // Worker 1 claims with fence 1, is paused past its lease; worker 2 gets fence 2, claims,
    // writes; worker 1 wakes and the resource accepts its write with fence 1 anyway.
    let mut s = Script::default();
    s.run(true, false)
        .acquire(100, 1, "k0", 1)
        .read(200, 1, "k0", 1, &[])
        .fault(250, 2_000, 1, FaultKind::PauseWorker, 1)
        .acquire(1_200, 2, "k0", 2)
        .read(1_300, 2, "k0", 2, &[])
        .write(1_400, 2, "k0", 2, 20)
        .release(1_500, 2, "k0", 2)
        .write(2_100, 1, "k0", 1, 10);
    let h = s.history();
    let v = check(&h, &only("k0", &[10], 2), &fenced());
    assert_eq!(v.status, Status::Failed, "{v}");
    assert_eq!(v.figures.stale_accepted, 1);
    let failures = kinds(&v, Severity::Failure);
    assert!(failures.contains(&&FindingKind::StaleAccepted {
        element: Some(10),
        fence: 1,
        newer: 2
    }));
    // Worker 1's stale write overwrote worker 2's element.
    assert!(failures.contains(&&FindingKind::LostAck {
        element: 20,
        fence: 2
    }));
    // The in-process resource checker agrees on the same accesses.
    assert!(check_history(&h.accesses("k0")).is_err());
    assert!(check_history(&clean_script().history().accesses("k0")).is_ok());

    // In the unfenced control the same history is the nemesis working.
    let control = check(
        &h,
        &only("k0", &[10], 2),
        &CheckOptions::unfenced_control(FenceSafety::Linearizable),
    );
    assert_eq!(control.status, Status::Passed, "{control}");
    assert_eq!(control.figures.lost_acks, 1);
    assert_eq!(kinds(&control, Severity::Control).len(), 2);
    assert!(control.reasons.iter().any(|r| r.starts_with("control")));
}

#[test]
fn concurrent_writes_are_not_blamed_without_the_resource_saying_so() {
    // Worker 1's write with fence 1 was in flight while worker 2's fence 2 was accepted: the
    // resource may have taken them in either order, so no stale accept can be claimed...
    let mut s = Script::default();
    s.run(true, false)
        .acquire(100, 1, "k0", 1)
        .write_invoke(200, 1, "k0", 1, 10)
        .acquire(300, 2, "k0", 2)
        .write(400, 2, "k0", 2, 20)
        .write_ok(500, 1, "k0", 1, 10);
    let finals = only("k0", &[10, 20], 2);
    let v = check(&s.history(), &finals, &fenced());
    assert_eq!(v.figures.stale_accepted, 0, "{v}");
    // ...unless the resource reports the last_fence it held when it accepted.
    let mut events = s.history().events().to_vec();
    if let Some(What::WriteOk { prior, .. }) = events.last_mut().map(|e| &mut e.what) {
        *prior = Some(2);
    }
    let v = check(&History::new(events), &finals, &fenced());
    assert_eq!(v.figures.stale_accepted, 1, "{v}");
}

/// Events of different processes with the same time are in no known order (a merge puts them
/// in the order of its inputs; on a coarse or paused clock ties are common). Worker 1's write
/// invoked at the instant worker 2's claim of fence 2 completed is concurrent with it, not
/// after it, wherever the merge put the lines.
#[test]
fn operations_at_the_same_instant_are_concurrent() {
    let mut s = Script::default();
    s.run(true, false)
        .acquire(100, 1, "k0", 1)
        .read(200, 1, "k0", 1, &[])
        .acquire(300, 2, "k0", 2)
        .read(390, 2, "k0", 2, &[])
        // Worker 2's claim completed at 400; worker 1's write invoked at 400 too.
        .write_invoke(400, 1, "k0", 1, 10)
        .write_ok(410, 1, "k0", 1, 10);
    let v = check(&s.history(), &only("k0", &[10], 2), &fenced());
    assert_eq!(v.figures.stale_accepted, 0, "{v}");
    // One nanosecond later it is after the claim, and stale.
    let mut late = Script::default();
    late.run(true, false)
        .acquire(100, 1, "k0", 1)
        .read(200, 1, "k0", 1, &[])
        .acquire(300, 2, "k0", 2)
        .read(390, 2, "k0", 2, &[])
        .write_invoke(401, 1, "k0", 1, 10)
        .write_ok(410, 1, "k0", 1, 10);
    let v = check(&late.history(), &only("k0", &[10], 2), &fenced());
    assert_eq!(v.figures.stale_accepted, 1, "{v}");
}

#[test]
fn reissued_fence_is_found() {
    // Fence 5 is granted twice, then fence 4 after both (a failover to a replica that missed
    // the increments).
    let mut s = Script::default();
    s.run(true, false)
        .acquire(100, 1, "k0", 5)
        .release(200, 1, "k0", 5)
        .server_fault(250, 260, 1, FaultKind::PromoteReplica)
        .acquire(300, 2, "k0", 5)
        .release(400, 2, "k0", 5)
        .acquire(500, 3, "k0", 4)
        .release(600, 3, "k0", 4);
    let h = s.history();
    let finals = only("k0", &[], 5);
    let v = check(&h, &finals, &fenced());
    assert_eq!(v.status, Status::Failed, "{v}");
    assert_eq!(v.figures.fences_reissued, 2);
    assert_eq!(
        kinds(&v, Severity::Failure),
        [
            &FindingKind::ReissuedFence {
                fence: 5,
                earlier: 5,
                earlier_at: 2
            },
            &FindingKind::ReissuedFence {
                fence: 4,
                earlier: 5,
                earlier_at: 2
            }
        ]
    );

    // A backend that declares failover-unsafe fences shows the same as declared: a promotion
    // began between the grants.
    let declared = check(
        &h,
        &finals,
        &CheckOptions::fenced(FenceSafety::FailoverUnsafe),
    );
    assert_eq!(declared.status, Status::Declared, "{declared}");
    assert!(declared.passed());
    assert_eq!(kinds(&declared, Severity::Declared).len(), 2);
    assert!(
        matches!(declared.outcome(), Ok(Verdict::Declared(why)) if why.contains("fence reissued"))
    );
    // The run line carries the declaration too.
    let mut s2 = Script {
        events: h.events().to_vec(),
    };
    s2.events[0].what = What::Run {
        seed: 7,
        backend: "redis".into(),
        fenced: true,
        failover_unsafe: true,
        early_revocation: false,
        one_writer: false,
        planned_faults: Vec::new(),
        commit: None,
        versions: Default::default(),
        command: None,
        resource: None,
    };
    let from_run = CheckOptions::from_history(&s2.history()).expect("a run line");
    assert_eq!(from_run, CheckOptions::fenced(FenceSafety::FailoverUnsafe));
}

#[test]
fn concurrent_grants_out_of_order_are_not_reissues() {
    // Both acquires were in flight together; the reply for the smaller fence arrived last.
    let mut s = Script::default();
    s.run(true, false)
        .acquire_invoke(100, 1, "k0")
        .acquire_invoke(110, 2, "k0")
        .acquire_ok(200, 2, "k0", 8, None)
        .acquire_ok(210, 1, "k0", 7, None);
    let v = check(&s.history(), &only("k0", &[], 8), &fenced());
    assert_eq!(v.figures.fences_reissued, 0, "{v}");
    assert_eq!(v.status, Status::Passed, "{v}");
}

#[test]
fn lost_ack_through_a_declared_reissue_is_declared() {
    // Two holders with the same fence both write; the second overwrites the first's element.
    let mut s = Script::default();
    s.run(true, true)
        .acquire(100, 1, "k0", 3)
        .read(200, 1, "k0", 3, &[])
        .server_fault(250, 260, 1, FaultKind::KillAuthority)
        .acquire(300, 2, "k0", 3)
        .read(400, 2, "k0", 3, &[])
        .write(500, 1, "k0", 3, 10)
        .write(600, 2, "k0", 3, 20);
    let h = s.history();
    let finals = only("k0", &[20], 3);
    let declared = check(
        &h,
        &finals,
        &CheckOptions::fenced(FenceSafety::FailoverUnsafe),
    );
    assert_eq!(declared.status, Status::Declared, "{declared}");
    assert_eq!(declared.figures.lost_acks, 1);
    let linearizable = check(&h, &finals, &fenced());
    assert_eq!(linearizable.status, Status::Failed);
    // The reissued fence, the lost write, and the key granted while worker 1's lease was valid.
    assert_eq!(kinds(&linearizable, Severity::Failure).len(), 3);
}

#[test]
fn overlapping_holders_are_measured() {
    // Worker 1 holds fence 1 with deadline 1100 and is paused; its lease ends at the authority
    // and worker 2 is granted at 1510; worker 1 wakes at 3000, sees the loss at 3050, and its
    // late write is refused: the fence working.
    let mut s = Script::default();
    s.run(true, false)
        .acquire(100, 1, "k0", 1)
        .read(200, 1, "k0", 1, &[])
        .fault(300, 3_000, 1, FaultKind::PauseWorker, 1)
        .acquire(1_500, 2, "k0", 2)
        .read(1_600, 2, "k0", 2, &[])
        .write(1_700, 2, "k0", 2, 20)
        .write_invoke(3_010, 1, "k0", 1, 10)
        .at(
            3_020,
            What::WriteStale {
                worker: 1,
                key: "k0".into(),
                fence: 1,
                element: 10,
                newest: 2,
            },
        )
        .at(
            3_050,
            What::Lost {
                worker: 1,
                key: "k0".into(),
                fence: 1,
                reason: "the local deadline passed".into(),
            },
        )
        .release(3_100, 2, "k0", 2);
    let h = s.history();
    let v = check(&h, &only("k0", &[20], 2), &fenced());
    assert_eq!(v.status, Status::Passed, "{v}");
    let f = &v.figures;
    assert_eq!(f.writes_refused_stale, 1);
    assert_eq!(f.overlapping_holders, 1);
    assert_eq!(f.longest_stale_window_ns, 3_050 - 1_510);
    let o = f.longest_overlap.as_ref().expect("an overlap");
    assert_eq!((o.older, o.newer), ((1, 1), (2, 2)));
    assert_eq!(
        f.valid_overlaps, 0,
        "worker 1's deadline passed before the hand-over"
    );
    assert_eq!(f.faults.get(&FaultKind::PauseWorker), Some(&1));
    // The report reads stored figures back.
    let stored = serde_json::to_string(f).expect("figures serialize");
    let back: Figures = serde_json::from_str(&stored).expect("figures parse");
    assert_eq!(back.longest_overlap, f.longest_overlap);
    assert_eq!(back.faults, f.faults);
    assert_eq!(back.handoff, f.handoff);

    // Had worker 1's deadline been later than the grant to worker 2, the valid windows overlap.
    let ws = windows::windows(&h);
    assert_eq!(ws[0].end_cause, WindowEnd::Lost);
    assert_eq!((ws[0].end, ws[0].valid_end), (3_050, 1_100));
    let mut late = ws.clone();
    late[0].valid_end = 2_000;
    assert_eq!(windows::overlaps(&late, true)[0].ns, 2_000 - 1_510);
}

/// The authority handed the key to worker 2 while worker 1's lease was still valid by worker
/// 1's own clock (deadline 1100, worker 2 granted at 510): exclusion broken by the authority,
/// whatever the fences then saved. A failure on a backend that declares linearizable fences,
/// declared on one that declares failover-unsafe fences, and in the control as well.
#[test]
fn a_key_granted_while_another_lease_is_valid_breaks_exclusion() {
    let script = |fenced: bool, failover_unsafe: bool| {
        let mut s = Script::default();
        s.run(fenced, failover_unsafe)
            .acquire(100, 1, "k0", 1)
            .server_fault(300, 310, 1, FaultKind::KillAuthority)
            .acquire(500, 2, "k0", 2)
            .read(600, 2, "k0", 2, &[])
            .write(700, 2, "k0", 2, 20)
            .release(800, 2, "k0", 2)
            .release(900, 1, "k0", 1);
        s.history()
    };
    let v = check(&script(true, false), &only("k0", &[20], 2), &fenced());
    assert_eq!(v.status, Status::Failed, "{v}");
    assert_eq!(v.figures.valid_overlaps, 1);
    let broken: Vec<_> = kinds(&v, Severity::Failure)
        .into_iter()
        .filter(|k| matches!(k, FindingKind::ExclusionBroken { .. }))
        .collect();
    assert_eq!(
        broken,
        [&FindingKind::ExclusionBroken {
            older: (1, 1),
            newer: (2, 2),
            // Until worker 2 released: both valid from its grant to then.
            overlap_ns: 800 - 510,
        }]
    );

    let declared = script(true, true);
    let v = check(
        &declared,
        &only("k0", &[20], 2),
        &CheckOptions::fenced(FenceSafety::FailoverUnsafe),
    );
    assert_eq!(v.status, Status::Declared, "{v}");

    // Not a finding of the control's kind: the control is about fences, exclusion is the
    // authority's, fenced or not.
    let control = script(false, false);
    let v = check(
        &control,
        &only("k0", &[20], 2),
        &CheckOptions::unfenced_control(FenceSafety::Linearizable),
    );
    assert!(
        v.findings.iter().any(|f| f.severity == Severity::Failure
            && matches!(f.kind, FindingKind::ExclusionBroken { .. })),
        "{v}"
    );
}

/// An authority that declares it can end a live lease early (etcd before 3.4.31 and 3.5.13:
/// a stalled leader that resumes revokes leases the new leader kept alive) gets the same second
/// grant labelled declared, read from the run line, when a paused leader resumed between the
/// two grants; without that pause it is a failure still, and a stale write always is.
#[test]
fn a_declared_early_revocation_labels_broken_exclusion_but_not_stale_writes() {
    // Worker 1 holds from 110 until 10 s; a paused leader resumes at 300 (if paused); worker 2
    // is granted at `second + 10`.
    let timed =
        |early_revocation: bool, stale_accepted: bool, leader_paused: bool, second: Nanos| {
            let mut s = Script::default();
            s.run(true, false).acquire_invoke(100, 1, "k0").acquire_ok(
                110,
                1,
                "k0",
                1,
                Some(10_000_000_000),
            );
            if leader_paused {
                s.at(
                    50,
                    What::FaultStart {
                        fault: 1,
                        kind: FaultKind::PauseLeader,
                        worker: None,
                        node: Some("etcd-1".into()),
                    },
                )
                .at(
                    300,
                    What::FaultEnd {
                        fault: 1,
                        kind: FaultKind::PauseLeader,
                        worker: None,
                        node: Some("etcd-1".into()),
                    },
                );
            }
            let then = |t: Nanos| second - 500 + t;
            s.acquire(then(500), 2, "k0", 2)
                .write(then(600), 2, "k0", 2, 20);
            if stale_accepted {
                s.write(then(650), 1, "k0", 1, 10);
            }
            s.release(then(800), 2, "k0", 2)
                .release(then(900), 1, "k0", 1);
            s.events[0].what = What::Run {
                seed: 7,
                backend: "etcd".into(),
                fenced: true,
                failover_unsafe: false,
                early_revocation,
                one_writer: false,
                planned_faults: Vec::new(),
                commit: None,
                versions: Default::default(),
                command: None,
                resource: None,
            };
            s.history()
        };
    let scripted = |early_revocation, stale_accepted, leader_paused| {
        timed(early_revocation, stale_accepted, leader_paused, 500)
    };
    let judge = |h: &History, set: &[u64]| {
        let options = CheckOptions::from_history(h).expect("a run line");
        check(h, &only("k0", set, 2), &options)
    };
    let script =
        |early_revocation, stale_accepted| scripted(early_revocation, stale_accepted, true);
    let undeclared = judge(&script(false, false), &[20]);
    assert_eq!(undeclared.status, Status::Failed, "{undeclared}");
    let no_stall = judge(&scripted(true, false, false), &[20]);
    assert_eq!(no_stall.status, Status::Failed, "{no_stall}");
    // A leader that resumed 3 s before the second grant did not cause it.
    let v = judge(&timed(true, false, true, 3_000_000_000), &[20]);
    assert_eq!(v.status, Status::Failed, "{v}");
    let declared = judge(&script(true, false), &[20]);
    assert_eq!(declared.status, Status::Declared, "{declared}");
    assert_eq!(declared.figures.valid_overlaps, 1);
    assert!(kinds(&declared, Severity::Declared)
        .iter()
        .any(|k| matches!(k, FindingKind::ExclusionBroken { .. })));
    let stale = judge(&script(true, true), &[20, 10]);
    assert_eq!(stale.status, Status::Failed, "{stale}");
    assert!(kinds(&stale, Severity::Failure)
        .iter()
        .any(|k| matches!(k, FindingKind::StaleAccepted { .. })));
}

/// A key nobody holds while workers keep waiting for it, with no fault to explain it, for far
/// longer than any lease could last: something (a cancelled attempt's grant kept alive by its
/// client) blocks the key. Waits around faults, and short gaps after a holder's deadline, are
/// not blamed.
#[test]
fn a_key_blocked_without_a_holder_is_stuck() {
    // TTLs are 1_000 here (Script's acquire_invoke), so the bound is 2 x 1_000 + 1 s.
    let second = 1_000_000_000;
    let mut s = Script::default();
    s.run(true, false)
        .acquire(100, 1, "k0", 1)
        .release(500, 1, "k0", 1);
    let t = s.k0_waited_on_in_vain();
    let v = check(&s.history(), &FinalState::new(), &fenced());
    let stuck: Vec<_> = kinds(&v, Severity::Failure)
        .into_iter()
        .filter(|k| matches!(k, FindingKind::KeyStuck { .. }))
        .collect();
    assert_eq!(stuck.len(), 1, "{v}");
    let FindingKind::KeyStuck { waited_ns } = stuck[0] else {
        unreachable!()
    };
    assert!(*waited_ns >= 4 * second - 1_000_000, "{v}");

    // The same waits while the authority was down are the fault's, not a stuck key.
    let mut excused = s.clone();
    excused.server_fault(550, t, 9, FaultKind::KillAuthority);
    let v = check(&excused.history(), &FinalState::new(), &fenced());
    assert!(
        !v.findings
            .iter()
            .any(|f| matches!(f.kind, FindingKind::KeyStuck { .. })),
        "{v}"
    );
}

/// On an authority with one write lock for every key (an embedded SQLite file), a worker
/// stopped while one of its requests held that lock blocks every key, including keys it never
/// held or asked for. Such a pause explains the wait there, and nowhere else.
#[test]
fn a_paused_worker_excuses_every_key_only_on_a_one_writer_authority() -> Result<(), String> {
    let mut s = Script::default();
    s.run(true, false)
        .acquire(100, 1, "k0", 1)
        .release(500, 1, "k0", 1);
    let t = s.k0_waited_on_in_vain();
    // Worker 7 holds nothing and asks for nothing, and is paused all along.
    s.fault(550, t, 9, FaultKind::PauseWorker, 7);
    let stuck = |v: &RunVerdict| {
        v.findings
            .iter()
            .any(|f| matches!(f.kind, FindingKind::KeyStuck { .. }))
    };

    let elsewhere = check(&s.history(), &FinalState::new(), &fenced());
    if !stuck(&elsewhere) {
        return Err(format!(
            "a pause of a worker that never touched k0 excused k0's wait on an ordinary authority: {elsewhere}"
        ));
    }

    let one_writer = CheckOptions {
        one_writer: true,
        ..fenced()
    };
    let embedded = check(&s.history(), &FinalState::new(), &one_writer);
    if stuck(&embedded) {
        return Err(format!(
            "the pause did not excuse k0 on a one-writer authority: {embedded}"
        ));
    }

    // The run line carries the option, so a recorded history is judged the same way.
    let mut recorded = s.clone();
    if let What::Run { one_writer, .. } = &mut recorded.events[0].what {
        *one_writer = true;
    }
    let options = CheckOptions::from_history(&recorded.history())
        .ok_or("the recorded history has no run line")?;
    if !options.one_writer {
        return Err(format!(
            "the run line's one_writer was not read: {options:?}"
        ));
    }
    Ok(())
}

#[test]
fn killed_holder_window_ends_at_the_kill() {
    let mut s = Script::default();
    s.run(true, false)
        .acquire(100, 1, "k0", 1)
        .fault(500, 600, 1, FaultKind::KillWorker, 1)
        .acquire(1_200, 2, "k0", 2);
    let ws = windows::windows(&s.history());
    assert_eq!((ws[0].end, ws[0].end_cause), (500, WindowEnd::Killed));
    // Worker 2's window is never closed: it ends at its deadline, cut to the history's end.
    assert_eq!((ws[1].end, ws[1].end_cause), (1_210, WindowEnd::Deadline));
}

#[test]
fn holder_killed_inside_a_transaction_window_ends_at_the_kill() {
    let mut s = Script::default();
    s.run(true, false)
        .acquire(100, 1, "k0", 1)
        .fault(500, 600, 1, FaultKind::KillWorkerInTransaction, 1)
        .acquire(1_200, 2, "k0", 2);
    let ws = windows::windows(&s.history());
    assert_eq!((ws[0].end, ws[0].end_cause), (500, WindowEnd::Killed));
}

#[test]
fn integrity_findings_fail_the_run() {
    let mut s = Script::default();
    s.run(true, false)
        .acquire(100, 1, "k0", 1)
        .read(150, 1, "k0", 1, &[])
        .write(200, 1, "k0", 1, 10)
        .write_invoke(300, 1, "k0", 1, 10)
        .at(
            400,
            What::WriteStale {
                worker: 1,
                key: "k0".into(),
                fence: 1,
                element: 11,
                newest: 2,
            },
        )
        .write_invoke(450, 1, "k1", 1, 12)
        .at(
            500,
            What::FaultStart {
                fault: 9,
                kind: FaultKind::KillLeader,
                worker: None,
                node: Some("etcd-1".into()),
            },
        );
    let mut h = s.history();
    h.push(Event::new(
        450,
        What::ReleaseInvoke {
            worker: 1,
            key: "k0".into(),
            fence: 1,
        },
    ));
    // k1 has no final row; k0 holds the refused 11 and a 99 nobody wrote; last_fence went back.
    let finals = FinalState::new().with("k0", KeyState::new([10, 11, 99], Some(0)));
    let v = check(&h, &finals, &fenced());
    assert_eq!(v.status, Status::Failed);
    let labels: Vec<&str> = v
        .findings_of(Severity::Failure)
        .map(|f| f.kind.label())
        .collect();
    for expected in [
        "element written twice",
        "refused write present in the set",
        "no final state for a written key",
        "fault never healed",
        "history out of time order",
        "element no write carried",
        "resource last_fence behind",
    ] {
        assert!(
            labels.contains(&expected),
            "{expected} missing from {labels:?}"
        );
    }
    // Reasons group by kind, with the first instance's line.
    assert!(
        v.reasons.iter().all(|r| r.starts_with("FAIL: 1 x")),
        "{:?}",
        v.reasons
    );
}

#[test]
fn unknown_writes_are_neither_lost_nor_blamed() {
    let mut s = Script::default();
    s.run(true, false)
        .acquire(100, 1, "k0", 1)
        .read(150, 1, "k0", 1, &[])
        .write_invoke(200, 1, "k0", 1, 10)
        .at(
            210,
            What::WriteUnknown {
                worker: 1,
                key: "k0".into(),
                fence: 1,
                element: 10,
                error: "connection reset".into(),
            },
        )
        .write_invoke(300, 1, "k0", 1, 11);
    let v = check(&s.history(), &only("k0", &[10], 1), &fenced());
    assert_eq!(v.status, Status::Passed, "{v}");
    assert_eq!(
        (v.figures.writes_unknown, v.figures.unknown_recovered),
        (2, 1)
    );
}

#[test]
fn unfenced_control_without_losses_fails() {
    let mut s = clean_script();
    s.events[0].what = What::Run {
        seed: 7,
        backend: "hand-made".into(),
        fenced: false,
        failover_unsafe: false,
        early_revocation: false,
        one_writer: false,
        planned_faults: Vec::new(),
        commit: None,
        versions: Default::default(),
        command: None,
        resource: None,
    };
    let h = s.history();
    let options = CheckOptions::from_history(&h).expect("a run line");
    assert!(!options.fenced);
    let v = check(&h, &only("k0", &[10, 20], 2), &options);
    assert_eq!(v.status, Status::Failed);
    assert_eq!(
        kinds(&v, Severity::Failure),
        [&FindingKind::ControlLostNothing]
    );
    assert!(v.to_string().contains("unfenced control"));
}
