//! The suite has teeth: the reference authority passes every scenario, and each deliberately
//! broken authority fails at least one. Runs on tokio's paused clock, so it takes milliseconds.

use std::sync::Arc;

use leasehold_conformance::memory::{MemoryConnector, MemoryFaults, MemoryResidue, Replication};
use leasehold_conformance::mutants::{self, Mutant};
use leasehold_conformance::scenarios::run_all;
use leasehold_conformance::{Context, Verdict};
use leasehold_core::{ClientOptions, FenceSafety};
use leasehold_memory::MemoryServer;

async fn reference(replication: Replication) -> Context {
    let server = MemoryServer::new();
    let connector = Arc::new(MemoryConnector::new(
        server.clone(),
        ClientOptions::default(),
    ));
    Context::new(connector)
        .await
        .unwrap()
        .with_residue(Arc::new(MemoryResidue::new(server.clone())))
        .with_faults(Arc::new(MemoryFaults::new(server, replication)))
}

#[tokio::test(start_paused = true)]
async fn the_reference_authority_passes_every_scenario() {
    let report = run_all("memory", &reference(Replication::Synchronous).await).await;
    println!("{report}");
    report.assert_passed();
    assert!(
        report
            .lines
            .iter()
            .all(|l| l.outcome == Ok(Verdict::Passed)),
        "with every fault available, every scenario must run and pass:\n{report}"
    );
}

/// Each mutant is caught by a scenario written for its rule, not only by some other scenario
/// failing along the way.
#[tokio::test(start_paused = true)]
async fn every_mutant_is_caught_by_its_scenario() {
    let mut survivors = Vec::new();
    for mutant in Mutant::ALL {
        let report = run_all(
            &mutant.to_string(),
            &mutants::context(mutant).await.unwrap(),
        )
        .await;
        let caught: Vec<_> = report.failures().iter().map(|l| l.scenario).collect();
        println!("mutant {mutant:<28} caught by {caught:?}");
        if !mutant.aimed_at().iter().any(|s| caught.contains(s)) {
            survivors.push(format!(
                "{mutant} (aimed at by {:?}):\n{report}",
                mutant.aimed_at()
            ));
        }
    }
    assert!(
        survivors.is_empty(),
        "mutants their scenarios did not catch:\n{}",
        survivors.join("\n")
    );
}

/// A backend that declares failover-unsafe fences passes, and the report shows the reissued
/// fence as declared; the same behaviour under a linearizable declaration is the
/// `LiesAboutFailoverSafety` mutant above, which fails.
#[tokio::test(start_paused = true)]
async fn a_declared_failover_weakness_is_reported_not_failed() {
    let server = MemoryServer::new();
    let connector = Arc::new(
        MemoryConnector::new(server.clone(), ClientOptions::default())
            .declaring(FenceSafety::FailoverUnsafe),
    );
    let ctx = Context::new(connector)
        .await
        .unwrap()
        .with_faults(Arc::new(MemoryFaults::new(
            server,
            Replication::Asynchronous,
        )));
    let report = run_all("memory, async standby", &ctx).await;
    println!("{report}");
    report.assert_passed();
    let declared: Vec<_> = report.declared().iter().map(|l| l.scenario).collect();
    assert_eq!(declared, ["fences_survive_failover"], "{report}");
}

/// Broken variants of the recipes, each run through the scenario written for its rule, fail
/// it: a scheduled claim counted from when its late tick fired (the next period skips), a
/// leader that resigns instead of yielding (a third candidate slips in), a follower that learns
/// epochs only from commands (a deposed leader's command passes).
#[tokio::test(start_paused = true)]
async fn broken_recipe_variants_fail_their_scenarios() {
    use leasehold_conformance::scenarios;
    let ctx = reference(Replication::Synchronous).await;
    let outcomes = [
        (
            "schedule_late_timer_anchored_at_firing",
            scenarios::schedule_late_timer_anchored_at_firing(&ctx).await,
        ),
        (
            "election_resign_leaves_a_gap_for_a_third",
            scenarios::election_resign_leaves_a_gap_for_a_third(&ctx).await,
        ),
        (
            "election_follower_without_watching_admits_a_deposed_leader",
            scenarios::election_follower_without_watching_admits_a_deposed_leader(&ctx).await,
        ),
    ];
    for (name, outcome) in outcomes {
        println!("{name}: {outcome:?}");
        assert!(
            outcome.is_err(),
            "the broken variant {name} passed: {outcome:?}"
        );
    }
}
