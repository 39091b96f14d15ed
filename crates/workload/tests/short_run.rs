//! The short seeded workload run per backend that `./scripts/test` includes: both arms side by
//! side on real servers for about 30 s, every fault kind of the backend at least once, and the
//! faults at the worker's edges (a worker cut off from the authority, the resource's
//! connections killed mid-write and the resource restarted, a worker taking its leases through
//! the `leasehold` command). It fails on any acknowledged write lost or stale write accepted in
//! the fenced arm, and on a control arm that lost nothing (the nemesis would be too weak to
//! prove anything).
//!
//! The runs take turns (one lock): each starts a cluster, a resource server and eight worker
//! processes, and two at once on two cores would measure the machine, not the backend.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;

use leasehold_conformance::workload::{check_recorded, FaultKind, History, Status, What};

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// The seed of every short run; a failure prints it with the command that reproduces the run.
const SEED: u64 = 11;

fn short_run(backend: &str, server_faults: &[FaultKind]) {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("workload-{backend}"));
    let _ = std::fs::remove_dir_all(&out);
    let args = [
        "run",
        "--backend",
        backend,
        "--duration",
        "30s",
        "--seed",
        &SEED.to_string(),
        "--fault-gap",
        "500ms..1500ms",
        "--out",
        out.to_str().unwrap(),
    ];
    let output = Command::new(env!("CARGO_BIN_EXE_leasehold-workload"))
        .args(args)
        .output()
        .expect("the workload binary runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    println!("{stdout}");
    eprintln!("{stderr}");
    assert!(
        output.status.success(),
        "the {backend} workload failed; reproduce with: cargo run -p leasehold-workload -- {}",
        args.join(" ")
    );

    let mut writes_unknown = 0;
    // Cut lengths, and the TTLs asked for, over both arms.
    let (mut cuts, mut ttls) = (Vec::new(), Vec::new());
    for (arm, cli_worker) in [("fenced", 3), ("control", 7)] {
        let path = out.join(format!("{backend}-{arm}.history.jsonl"));
        let history = History::read_file(&path).expect("the merged history reads back");
        let mut cut_started = BTreeMap::new();
        for event in history.events() {
            match &event.what {
                What::AcquireInvoke { ttl_ns, .. } => ttls.push(*ttl_ns),
                What::FaultStart {
                    fault,
                    kind: FaultKind::CutWorker,
                    ..
                } => {
                    cut_started.insert(*fault, event.t);
                }
                What::FaultEnd {
                    fault,
                    kind: FaultKind::CutWorker,
                    ..
                } => cuts.extend(cut_started.get(fault).map(|&t| event.t - t)),
                _ => {}
            }
        }
        // The arm's last worker runs its rounds under `leasehold run`: it must have held leases
        // and had its tree killed (the fault's end is recorded only once everything its
        // command started died with `leasehold`).
        let cli_events: Vec<&What> = history
            .events()
            .iter()
            .map(|e| &e.what)
            .filter(|w| w.worker() == Some(cli_worker) || w.fault_worker() == Some(cli_worker))
            .collect();
        assert!(
            cli_events.iter().any(|w| matches!(
                w,
                What::AcquireOk {
                    deadline: Some(_),
                    ..
                }
            )),
            "{arm}: the CLI worker {cli_worker} never held a lease"
        );
        assert!(
            cli_events.iter().any(|w| matches!(
                w,
                What::FaultEnd {
                    kind: FaultKind::KillWorker,
                    node: Some(node),
                    ..
                } if node.starts_with("leasehold pid")
            )),
            "{arm}: the CLI worker {cli_worker}'s tree was never killed"
        );
        let verdict = check_recorded(&history).expect("the history has its run line");
        assert_ne!(verdict.status, Status::Failed, "{verdict}");
        let figures = &verdict.figures;
        writes_unknown += figures.writes_unknown;
        assert!(
            figures.writes_acknowledged > 0,
            "{arm}: no write was acknowledged:\n{verdict}"
        );
        if arm == "fenced" {
            // Redis declares its fences failover-unsafe: a write lost through a fence reissued
            // after a failover is shown and labelled declared, not failed (checked above).
            if verdict.status != Status::Declared {
                assert_eq!(figures.lost_acks, 0, "{verdict}");
            }
            assert_eq!(figures.stale_accepted, 0, "{verdict}");
        } else {
            assert!(
                figures.lost_acks > 0,
                "the control lost nothing:\n{verdict}"
            );
        }
        let seen: BTreeSet<FaultKind> = figures.faults.keys().copied().collect();
        for kind in [
            FaultKind::PauseWorker,
            FaultKind::KillWorker,
            FaultKind::CutWorker,
            FaultKind::KillResourceConnection,
            FaultKind::RestartResource,
        ]
        .iter()
        .chain(server_faults)
        {
            assert!(
                seen.contains(kind),
                "{arm}: no {kind:?} fault in the run: {seen:?}"
            );
        }
    }
    // The resource's connections are killed while a write is in flight: its worker cannot
    // know whether it landed.
    // A worker cut off for less than any lease's TTL, and one for more than every lease's.
    let (shortest, longest) = (ttls.iter().min(), ttls.iter().max());
    assert!(
        cuts.iter().any(|c| Some(c) < shortest),
        "no cut shorter than the shortest TTL ({shortest:?} ns): {cuts:?}"
    );
    assert!(
        cuts.iter().any(|c| Some(c) > longest),
        "no cut longer than the longest TTL ({longest:?} ns): {cuts:?}"
    );
    assert!(
        writes_unknown > 0,
        "no write_unknown in either arm although the resource's connections were killed"
    );
}

#[test]
fn etcd_three_members() {
    short_run(
        "etcd",
        &[
            FaultKind::KillMember,
            FaultKind::KillLeader,
            FaultKind::PauseLeader,
        ],
    );
}

#[test]
fn zookeeper_three_members() {
    short_run(
        "zookeeper",
        &[
            FaultKind::KillMember,
            FaultKind::KillLeader,
            FaultKind::PauseLeader,
        ],
    );
}

#[test]
fn postgres() {
    short_run("postgres", &[FaultKind::KillAuthority]);
}

#[test]
fn redis_primary_and_replica() {
    short_run(
        "redis",
        &[FaultKind::KillAuthority, FaultKind::PromoteReplica],
    );
}

/// Servers someone else started, by URL: the runner injects worker faults only, and says so in
/// the history (no server fault), and the run still judges both the authority and the resource.
#[test]
fn servers_given_by_url() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let authority = leasehold_servers::PostgresServer::start().expect("PostgreSQL starts");
    let resource = leasehold_servers::PostgresServer::start().expect("PostgreSQL starts");
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("workload-by-url");
    let _ = std::fs::remove_dir_all(&out);
    let output = Command::new(env!("CARGO_BIN_EXE_leasehold-workload"))
        .args([
            "run",
            "--backend",
            "postgres",
            "--duration",
            "8s",
            "--arms",
            "fenced",
        ])
        .args(["--url", &authority.url(), "--resource-url", &resource.url()])
        .args(["--out", out.to_str().unwrap()])
        .output()
        .expect("the workload binary runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let history = History::read_file(out.join("postgres-fenced.history.jsonl")).unwrap();
    let verdict = check_recorded(&history).unwrap();
    assert_eq!(verdict.status, Status::Passed, "{verdict}");
    assert!(verdict.figures.writes_acknowledged > 0, "{verdict}");
    let kinds: BTreeSet<FaultKind> = verdict.figures.faults.keys().copied().collect();
    assert!(
        kinds.is_subset(
            &[
                FaultKind::PauseWorker,
                FaultKind::KillWorker,
                FaultKind::CutWorker
            ]
            .into()
        ),
        "servers someone else runs are not faulted: {kinds:?}"
    );
    assert!(!out.join("control-worker-4.jsonl").exists());
}
