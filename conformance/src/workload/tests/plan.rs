//! The checks that make a run able to fail for the lock itself: windows that stay open to the
//! holder's deadline, declarations that need the fault they declare, plans that must land, a
//! guard that must be needed, keys excused only by the faults that touched them, and reads
//! that must not lose what an earlier read saw.

use super::*;

fn lost(worker: WorkerId, key: &str, fence: u64) -> What {
    What::Lost {
        worker,
        key: key.into(),
        fence,
        reason: "the authority refused the renewal".into(),
    }
}

fn planned(s: &mut Script, fenced: bool, kinds: &[FaultKind]) {
    s.events[0].what = What::Run {
        seed: 7,
        backend: "hand-made".into(),
        fenced,
        failover_unsafe: false,
        early_revocation: false,
        one_writer: false,
        planned_faults: kinds.to_vec(),
        commit: None,
        versions: Default::default(),
        command: None,
        resource: None,
    };
}

fn has(v: &RunVerdict, severity: Severity, label: &str) -> bool {
    v.findings_of(severity).any(|f| f.kind.label() == label)
}

/// Worker 1's lease (deadline 1100) is ended by the authority at 300 and logged; worker 2 is
/// granted at 510. Worker 1 may sit between its validity check and its write until 1100, so
/// the grant broke exclusion although the loss was logged first; the early end is a finding of
/// its own.
#[test]
fn a_loss_logged_before_the_next_grant_leaves_the_window_open_to_the_deadline() {
    let mut s = Script::default();
    s.run(true, false)
        .acquire(100, 1, "k0", 1)
        .at(300, lost(1, "k0", 1))
        .acquire(500, 2, "k0", 2)
        .release(800, 2, "k0", 2)
        .release(900, 1, "k0", 1);
    let v = check(&s.history(), &only("k0", &[], 2), &fenced());
    assert_eq!(v.status, Status::Failed, "{v}");
    let broken: Vec<_> = kinds(&v, Severity::Failure)
        .into_iter()
        .filter(|k| matches!(k, FindingKind::ExclusionBroken { .. }))
        .collect();
    assert_eq!(
        broken,
        [&FindingKind::ExclusionBroken {
            older: (1, 1),
            newer: (2, 2),
            overlap_ns: 800 - 510,
        }],
        "{v}"
    );
    assert_eq!(
        kinds(&v, Severity::Noted),
        [&FindingKind::EndedEarly {
            holder: (1, 1),
            early_ns: 1_100 - 300,
        }],
        "{v}"
    );
    assert_eq!(v.figures.leases_ended_early, 1);

    // Ended early with nobody granted before the deadline: noted, and the run passes.
    let mut quiet = Script::default();
    quiet
        .run(true, false)
        .acquire(100, 1, "k0", 1)
        .at(300, lost(1, "k0", 1))
        .release(350, 1, "k0", 1)
        .acquire(1_200, 2, "k0", 2)
        .release(1_300, 2, "k0", 2);
    let v = check(&quiet.history(), &only("k0", &[], 2), &fenced());
    assert_eq!(v.status, Status::Passed, "{v}");
    assert!(has(
        &v,
        Severity::Noted,
        "lease ended before its holder's deadline"
    ));
    // Its release at 350 ended its claim: a grant after that is no overlap.
    let mut released = Script::default();
    released
        .run(true, false)
        .acquire(100, 1, "k0", 1)
        .at(300, lost(1, "k0", 1))
        .release(350, 1, "k0", 1)
        .acquire(500, 2, "k0", 2)
        .release(800, 2, "k0", 2);
    let v = check(&released.history(), &only("k0", &[], 2), &fenced());
    assert_eq!(v.status, Status::Passed, "{v}");
}

/// A failover-unsafe backend declares what a failover does to it, nothing else: an overlap or
/// a reissued fence with no grant-losing fault between the two grants fails the run.
#[test]
fn a_failover_unsafe_backend_fails_without_a_failover_between_the_grants() {
    let unsafe_fences = CheckOptions::fenced(FenceSafety::FailoverUnsafe);
    let history = |fault: Option<FaultKind>| {
        let mut s = Script::default();
        s.run(true, true).acquire(100, 1, "k0", 1);
        match fault {
            Some(FaultKind::PauseWorker) => {
                s.fault(300, 310, 1, FaultKind::PauseWorker, 3);
            }
            Some(kind) => {
                s.server_fault(300, 310, 1, kind);
            }
            None => {}
        }
        s.acquire(500, 2, "k0", 1).release(800, 2, "k0", 1);
        s.history()
    };
    // Re-provisioned sentinels alone lose nothing: only an observed change of primary (or a
    // failover the nemesis made) explains a reissue.
    for fault in [
        None,
        Some(FaultKind::PauseWorker),
        Some(FaultKind::ReprovisionSentinels),
    ] {
        let v = check(&history(fault), &only("k0", &[], 1), &unsafe_fences);
        assert_eq!(v.status, Status::Failed, "{fault:?}: {v}");
        for label in [
            "fence reissued",
            "key granted while another lease was valid",
        ] {
            assert!(has(&v, Severity::Failure, label), "{fault:?}, {label}: {v}");
        }
    }
    for kind in [
        FaultKind::KillAuthority,
        FaultKind::PromoteReplica,
        FaultKind::PrimaryChanged,
    ] {
        let v = check(&history(Some(kind)), &only("k0", &[], 1), &unsafe_fences);
        assert_eq!(v.status, Status::Declared, "{kind:?}: {v}");
    }
    // A fault healed longer than its aftermath before both grants explains neither; one healed
    // just before them does (the deployment may not have settled yet).
    for (gap, status) in [
        (FAILOVER_AFTERMATH + 100, Status::Failed),
        (FAILOVER_AFTERMATH / 4, Status::Declared),
    ] {
        let mut early = Script::default();
        early
            .run(true, true)
            .server_fault(10, 20, 1, FaultKind::KillAuthority)
            .acquire(20 + gap, 1, "k0", 1)
            .acquire(20 + gap + 400, 2, "k0", 1);
        let v = check(&early.history(), &only("k0", &[], 1), &unsafe_fences);
        assert_eq!(v.status, status, "healed {gap} ns before: {v}");
    }
    // A failover that began before both grants and was still under way (two servers may each
    // act as the primary until it heals) explains them.
    let mut under_way = Script::default();
    under_way
        .run(true, true)
        .server_fault(10, 700, 1, FaultKind::SentinelFailover)
        .acquire(100, 1, "k0", 1)
        .acquire(500, 2, "k0", 1);
    let v = check(&under_way.history(), &only("k0", &[], 1), &unsafe_fences);
    assert_eq!(v.status, Status::Declared, "{v}");
}

#[test]
fn a_planned_fault_that_never_landed_fails_the_run() {
    let mut s = clean_script();
    planned(&mut s, true, &[FaultKind::IsolateMember]);
    let v = check(&s.history(), &only("k0", &[10, 20], 2), &fenced());
    assert_eq!(v.status, Status::Failed, "{v}");
    assert_eq!(
        kinds(&v, Severity::Failure),
        [&FindingKind::FaultNeverLanded {
            kind: FaultKind::IsolateMember
        }]
    );
    s.server_fault(900, 950, 1, FaultKind::IsolateMember);
    let v = check(&s.history(), &only("k0", &[10, 20], 2), &fenced());
    assert_eq!(v.status, Status::Passed, "{v}");
}

/// Under planned worker pauses a fenced run must show its guard at work: a key handed on
/// while its holder sat paused, and that holder's late write refused. Zero losses without
/// either prove nothing about the lock.
#[test]
fn a_fenced_run_under_pauses_must_need_its_fence() {
    // Pauses happened, but never to a holder.
    let mut idle = clean_script();
    idle.fault(50, 90, 1, FaultKind::PauseWorker, 3);
    planned(&mut idle, true, &[FaultKind::PauseWorker]);
    let v = check(&idle.history(), &only("k0", &[10, 20], 2), &fenced());
    assert_eq!(v.status, Status::Failed, "{v}");
    let FindingKind::GuardNotExercised { missing } = kinds(&v, Severity::Failure)[0] else {
        panic!("expected the guard finding: {v}");
    };
    assert!(missing.contains("no stale write refused"), "{missing}");
    assert!(missing.contains("paused"), "{missing}");
    // The unfenced control is not held to it.
    let mut control = idle.clone();
    planned(&mut control, false, &[FaultKind::PauseWorker]);
    let v = check(
        &control.history(),
        &only("k0", &[10, 20], 2),
        &CheckOptions::unfenced_control(FenceSafety::Linearizable),
    );
    assert!(!has(&v, Severity::Failure, "fence never needed"), "{v}");

    // Worker 1 is paused holding k0 past its deadline; worker 2 gets the key meanwhile and
    // worker 1's late write is refused.
    let mut s = Script::default();
    s.run(true, false)
        .acquire(100, 1, "k0", 1)
        .read(200, 1, "k0", 1, &[])
        .fault(300, 3_000, 1, FaultKind::PauseWorker, 1)
        .acquire(1_500, 2, "k0", 2)
        .read(1_600, 2, "k0", 2, &[])
        .write(1_700, 2, "k0", 2, 20)
        .release(1_800, 2, "k0", 2)
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
        .release(3_100, 1, "k0", 1);
    planned(&mut s, true, &[FaultKind::PauseWorker]);
    let v = check(&s.history(), &only("k0", &[20], 2), &fenced());
    assert_eq!(v.status, Status::Passed, "{v}");
    assert_eq!(v.figures.handoffs_during_pause, 1);
}

/// Worker faults come every second or two; each excuses only the keys its worker held or was
/// acquiring, so a key blocked with no holder is found although other keys' holders keep
/// being paused.
#[test]
fn a_worker_fault_excuses_only_the_keys_it_touched() {
    let second = 1_000_000_000;
    let stuck_on_k0 = |pause_k0_waiter: bool| {
        let mut s = Script::default();
        s.run(true, false)
            .acquire(100, 1, "k0", 1)
            .release(500, 1, "k0", 1);
        let mut t = 600;
        for round in 0..8u64 {
            let worker = 2 + (round % 2) as WorkerId;
            s.acquire_invoke(t, worker, "k0").at(
                t + second / 2,
                What::AcquireTimeout {
                    worker,
                    key: "k0".into(),
                },
            );
            // Worker 9 holds k1 throughout and is paused now and then; or the worker waiting
            // for k0 is (its pending acquire may have been granted while it could not see it).
            let paused = if pause_k0_waiter { worker } else { 9 };
            s.fault(t + 10, t + 20, round + 1, FaultKind::PauseWorker, paused);
            t += second / 2 + 1_000;
        }
        s.acquire_invoke(50, 9, "k1")
            .acquire_ok(60, 9, "k1", 1, Some(t + second));
        let v = check(&s.history(), &FinalState::new(), &fenced());
        v.findings
            .iter()
            .any(|f| matches!(f.kind, FindingKind::KeyStuck { .. }))
    };
    assert!(
        stuck_on_k0(false),
        "pauses of k1's holder must not excuse k0"
    );
    assert!(
        !stuck_on_k0(true),
        "pauses of a worker acquiring k0 explain the wait"
    );
}

/// An element one read returned and a later read lacks is a lost update, acknowledged or not,
/// even if a still later read shows it again.
#[test]
fn an_element_read_then_missing_is_lost_even_if_it_comes_back() {
    let history = |fenced: bool| {
        let mut s = Script::default();
        s.run(fenced, false)
            .acquire(100, 1, "k0", 1)
            .write_invoke(150, 1, "k0", 1, 10)
            .at(
                160,
                What::WriteUnknown {
                    worker: 1,
                    key: "k0".into(),
                    fence: 1,
                    element: 10,
                    error: "connection reset".into(),
                },
            )
            .release(170, 1, "k0", 1)
            .acquire(200, 2, "k0", 2)
            .read(300, 2, "k0", 2, &[10])
            .release(400, 2, "k0", 2)
            .acquire(500, 3, "k0", 3)
            .read(600, 3, "k0", 3, &[])
            .release(700, 3, "k0", 3)
            .acquire(800, 4, "k0", 4)
            .read(900, 4, "k0", 4, &[10])
            .release(1_000, 4, "k0", 4);
        s.history()
    };
    let v = check(&history(true), &only("k0", &[10], 4), &fenced());
    assert_eq!(v.status, Status::Failed, "{v}");
    assert_eq!(
        kinds(&v, Severity::Failure),
        [&FindingKind::ReadLost {
            element: 10,
            first_read_at: 10,
        }],
        "{v}"
    );
    assert_eq!(v.figures.reads_lost, 1);
    // Missing from the final set after a read saw it: lost too.
    let mut s = Script::default();
    s.run(true, false)
        .acquire(100, 1, "k0", 1)
        .write_invoke(150, 1, "k0", 1, 10)
        .release(170, 1, "k0", 1)
        .acquire(200, 2, "k0", 2)
        .read(300, 2, "k0", 2, &[10])
        .release(400, 2, "k0", 2);
    let v = check(&s.history(), &only("k0", &[], 2), &fenced());
    assert_eq!(v.figures.reads_lost, 1, "{v}");
    assert!(
        has(&v, Severity::Failure, "element read, then missing"),
        "{v}"
    );
    // In the control, it is the nemesis doing its work.
    let v = check(
        &history(false),
        &only("k0", &[10], 4),
        &CheckOptions::unfenced_control(FenceSafety::Linearizable),
    );
    assert!(
        has(&v, Severity::Control, "element read, then missing"),
        "{v}"
    );
}
