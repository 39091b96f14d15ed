//! The history format: slices for a report, typed errors for a malformed line, the writer and
//! the merge, and the round trip of every event (a property test).

use proptest::prelude::*;

use super::*;

#[test]
fn slice_shows_the_key_and_faults_around_the_focus() {
    let mut s = Script::default();
    s.run(true, false)
        .acquire(100, 1, "k0", 1)
        .acquire(110, 2, "k1", 1)
        .fault(120, 130, 1, FaultKind::PauseLeader, 0)
        .write(200, 1, "k0", 1, 10)
        .write(210, 2, "k1", 1, 11);
    let h = s.history();
    let focus = h
        .events()
        .iter()
        .position(|e| matches!(e.what, What::WriteOk { element: 10, .. }))
        .expect("the write");
    let slice = h.slice_around(focus, Some("k0"), 10, 10);
    assert_eq!(slice.focus, focus);
    assert!(slice
        .events
        .iter()
        .all(|(_, e)| e.key() == Some("k0") || e.what.is_fault()));
    assert_eq!(slice.events.len(), 6, "{slice}");
    let text = slice.to_string();
    assert_eq!(text.lines().filter(|l| l.starts_with(">>")).count(), 1);
    assert_eq!(
        h.slice_around(focus, None, 1, 1).events.len(),
        3,
        "without a key, the neighbours are taken as they come"
    );
}

#[test]
fn malformed_line_is_a_typed_error_with_its_line_number() {
    let good = clean_script().history().to_jsonl();
    let mut lines: Vec<&str> = good.lines().collect();
    lines.insert(2, r#"{"t":5,"event":"acquire_ok","worker":1}"#);
    let text = lines.join("\n") + "\n";
    match History::from_jsonl(&text) {
        Err(HistoryError::Malformed { line: 3, .. }) => {}
        other => panic!("expected a malformed line 3, got {other:?}"),
    }
    for (bad, line) in [
        ("not json\n", 1),
        ("{\"t\":1,\"event\":\"no_such_event\"}\n", 1),
        (
            "{\"t\":-1,\"event\":\"acquire_timeout\",\"worker\":1,\"key\":\"k\"}\n",
            1,
        ),
        (
            "{\"t\":1,\"event\":\"acquire_timeout\",\"worker\":1,\"key\":\"k\"}\n\n",
            2,
        ),
    ] {
        let err = History::from_jsonl(bad).expect_err(bad);
        assert!(
            matches!(err, HistoryError::Malformed { .. }),
            "{bad}: {err}"
        );
        assert_eq!(err.line(), line, "{bad}: {err}");
        assert!(err.to_string().contains(&format!("line {line}")));
    }
    // A writer killed mid-line leaves a last line without its newline.
    let cut = &good[..good.len() - 5];
    let err = History::from_jsonl(cut).expect_err("cut short");
    assert!(matches!(err, HistoryError::Truncated { .. }), "{err}");
    assert_eq!(err.line(), good.lines().count());
    // A complete last line without a newline is fine.
    let parsed = History::from_jsonl(good.trim_end()).expect("parses");
    assert_eq!(parsed, clean_script().history());
    assert_eq!(History::from_jsonl("").expect("empty"), History::default());
}

#[test]
fn writer_and_merge_keep_processes_apart_and_time_ordered() {
    let mut w1 = HistoryWriter::new(Vec::new());
    let mut w2 = HistoryWriter::new(Vec::new());
    let e = |t, worker| {
        Event::new(
            t,
            What::AcquireTimeout {
                worker,
                key: "k".into(),
            },
        )
    };
    for ev in [e(10, 1), e(30, 1), e(50, 1)] {
        w1.record(&ev).expect("written");
    }
    for ev in [e(20, 2), e(30, 2)] {
        w2.record(&ev).expect("written");
    }
    let a = History::read(w1.into_inner().as_slice()).expect("parses");
    let b = History::read(w2.into_inner().as_slice()).expect("parses");
    let merged = History::merge([a, b]);
    let order: Vec<(Nanos, Option<WorkerId>)> =
        merged.events().iter().map(|e| (e.t, e.worker())).collect();
    assert_eq!(
        order,
        [
            (10, Some(1)),
            (20, Some(2)),
            (30, Some(1)),
            (30, Some(2)),
            (50, Some(1))
        ]
    );
}

#[test]
fn the_documented_example_is_a_valid_history() {
    let page = include_str!("../../../../docs/workload.md");
    let lines: String = page
        .lines()
        .filter(|l| l.starts_with("{\"t\""))
        .map(|l| format!("{l}\n"))
        .collect();
    let h = History::from_jsonl(&lines).expect("the example in docs/workload.md parses");
    assert_eq!(h.len(), 10);
    let v = check_recorded(&h).expect("it has a run line");
    assert_eq!(v.figures.writes_acknowledged, 1);
    assert_eq!(v.figures.lost_acks, 0);
}

fn text() -> impl Strategy<Value = String> {
    proptest::collection::vec(any::<char>(), 0..8).prop_map(String::from_iter)
}

fn fault_kind() -> impl Strategy<Value = FaultKind> {
    prop_oneof![
        Just(FaultKind::PauseWorker),
        Just(FaultKind::KillWorker),
        Just(FaultKind::KillAuthority),
        Just(FaultKind::KillMember),
        Just(FaultKind::KillLeader),
        Just(FaultKind::IsolateMember),
        Just(FaultKind::PauseLeader),
        Just(FaultKind::PromoteReplica),
        Just(FaultKind::SlowReplies),
        Just(FaultKind::RestartPooler),
        Just(FaultKind::SentinelFailover),
        Just(FaultKind::ReprovisionSentinels),
        Just(FaultKind::KillPrimary),
        Just(FaultKind::MigrateSlot),
        Just(FaultKind::KillWorkerInTransaction),
        Just(FaultKind::HandoffLeaderChange),
        Just(FaultKind::CutWorker),
        Just(FaultKind::KillResourceConnection),
        Just(FaultKind::RestartResource),
        Just(FaultKind::PrimaryChanged),
        Just(FaultKind::StallResource),
        Just(FaultKind::PauseAuthority),
        Just(FaultKind::RestartAuthority),
    ]
}

fn what() -> impl Strategy<Value = What> {
    let w = any::<WorkerId>;
    let f = any::<u64>;
    let of = any::<Option<u64>>;
    let elements = || proptest::collection::vec(any::<u64>(), 0..5);
    prop_oneof![
        (
            (
                f(),
                text(),
                any::<bool>(),
                any::<bool>(),
                any::<(bool, bool)>()
            ),
            (
                proptest::option::of(text()),
                proptest::collection::btree_map(text(), text(), 0..3),
                proptest::option::of(text()),
                proptest::collection::vec(fault_kind(), 0..3),
                proptest::option::of(text()),
            )
        )
            .prop_map(
                |(
                    (seed, backend, fenced, u, (early, one)),
                    (commit, versions, command, planned_faults, resource),
                )| What::Run {
                    seed,
                    backend,
                    fenced,
                    failover_unsafe: u,
                    early_revocation: early,
                    one_writer: one,
                    planned_faults,
                    commit,
                    versions,
                    command,
                    resource,
                }
            ),
        (w(), text(), f(), of()).prop_map(|(worker, key, ttl_ns, max_wait_ns)| {
            What::AcquireInvoke {
                worker,
                key,
                ttl_ns,
                max_wait_ns,
            }
        }),
        (w(), text(), f(), of()).prop_map(|(worker, key, fence, deadline)| What::AcquireOk {
            worker,
            key,
            fence,
            deadline
        }),
        (w(), text(), text()).prop_map(|(worker, key, error)| What::AcquireFail {
            worker,
            key,
            error
        }),
        (w(), text()).prop_map(|(worker, key)| What::AcquireTimeout { worker, key }),
        (w(), text()).prop_map(|(worker, key)| What::AcquireCancelled { worker, key }),
        (w(), text(), f(), f()).prop_map(|(worker, key, fence, deadline)| What::Renewed {
            worker,
            key,
            fence,
            deadline
        }),
        (w(), text(), f(), text()).prop_map(|(worker, key, fence, reason)| What::Lost {
            worker,
            key,
            fence,
            reason
        }),
        (w(), text(), of()).prop_map(|(worker, key, fence)| What::ReadInvoke {
            worker,
            key,
            fence
        }),
        (w(), text(), of(), elements()).prop_map(|(worker, key, fence, elements)| {
            What::ReadOk {
                worker,
                key,
                fence,
                elements,
            }
        }),
        (w(), text(), f(), f()).prop_map(|(worker, key, fence, newest)| What::ReadStale {
            worker,
            key,
            fence,
            newest
        }),
        (w(), text(), of(), text()).prop_map(|(worker, key, fence, error)| What::ReadFail {
            worker,
            key,
            fence,
            error
        }),
        (w(), text(), f(), f()).prop_map(|(worker, key, fence, element)| What::WriteInvoke {
            worker,
            key,
            fence,
            element
        }),
        (w(), text(), f(), f(), of()).prop_map(|(worker, key, fence, element, prior)| {
            What::WriteOk {
                worker,
                key,
                fence,
                element,
                prior,
            }
        }),
        (w(), text(), f(), f(), f()).prop_map(|(worker, key, fence, element, newest)| {
            What::WriteStale {
                worker,
                key,
                fence,
                element,
                newest,
            }
        }),
        (w(), text(), f(), f(), text()).prop_map(|(worker, key, fence, element, error)| {
            What::WriteUnknown {
                worker,
                key,
                fence,
                element,
                error,
            }
        }),
        (w(), text(), f()).prop_map(|(worker, key, fence)| What::ReleaseInvoke {
            worker,
            key,
            fence
        }),
        (w(), text(), f()).prop_map(|(worker, key, fence)| What::ReleaseOk { worker, key, fence }),
        (w(), text(), f(), text()).prop_map(|(worker, key, fence, error)| What::ReleaseFail {
            worker,
            key,
            fence,
            error
        }),
        (
            f(),
            fault_kind(),
            any::<Option<WorkerId>>(),
            proptest::option::of(text())
        )
            .prop_map(|(fault, kind, worker, node)| What::FaultStart {
                fault,
                kind,
                worker,
                node
            }),
        (
            f(),
            fault_kind(),
            any::<Option<WorkerId>>(),
            proptest::option::of(text())
        )
            .prop_map(|(fault, kind, worker, node)| What::FaultEnd {
                fault,
                kind,
                worker,
                node
            }),
        (text(), elements(), of()).prop_map(|(key, elements, last_fence)| What::Final {
            key,
            elements,
            last_fence
        }),
    ]
}

fn event() -> impl Strategy<Value = Event> {
    (any::<u64>(), what()).prop_map(|(t, what)| Event::new(t, what))
}

proptest! {
    #[test]
    fn serialize_then_parse_round_trips_exactly(
        events in proptest::collection::vec(event(), 0..20)
    ) {
        let history = History::new(events);
        let text = history.to_jsonl();
        prop_assert_eq!(text.lines().count(), history.len());
        let parsed = History::from_jsonl(&text).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(&parsed, &history);
        let mut written = Vec::new();
        history.write_to(&mut written).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(written, text.into_bytes());
    }

    #[test]
    fn the_checker_never_panics_on_arbitrary_histories(
        events in proptest::collection::vec(event(), 0..40)
    ) {
        let history = History::new(events);
        let finals = history.final_state();
        for options in [fenced(), CheckOptions::unfenced_control(FenceSafety::FailoverUnsafe)] {
            let verdict = check(&history, &finals, &options);
            let _ = verdict.to_string();
        }
    }
}

/// The deployment forms' fault kinds as the history spells them.
#[test]
fn form_fault_kinds_are_snake_case() {
    for (kind, name) in [
        (FaultKind::RestartPooler, "restart_pooler"),
        (FaultKind::SentinelFailover, "sentinel_failover"),
        (FaultKind::ReprovisionSentinels, "reprovision_sentinels"),
        (FaultKind::KillPrimary, "kill_primary"),
        (FaultKind::MigrateSlot, "migrate_slot"),
        (
            FaultKind::KillWorkerInTransaction,
            "kill_worker_in_transaction",
        ),
    ] {
        assert_eq!(
            serde_json::to_string(&kind).expect("a kind serializes"),
            format!("\"{name}\"")
        );
    }
}
