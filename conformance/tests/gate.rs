//! The resource suite against the in-memory reference gate, and every broken gate it must catch.

use std::sync::Arc;

use leasehold_conformance::gate::mutants::{self, GateMutant};
use leasehold_conformance::gate::{run_all, GateContext, InMemoryGates};
use leasehold_conformance::kit::TestResult;
use leasehold_conformance::Failure;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_in_memory_register_passes_the_resource_suite() -> TestResult {
    let report = run_all(
        "in-memory register",
        &GateContext::new(Arc::new(InMemoryGates)),
    )
    .await;
    println!("{report}");
    report.passed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_broken_gate_fails_a_scenario_aimed_at_it() -> TestResult {
    for mutant in GateMutant::ALL {
        let report = run_all(&format!("{mutant:?}"), &mutants::context(mutant)).await;
        println!("{report}");
        let caught: Vec<&str> = report.failures().iter().map(|l| l.scenario).collect();
        if !mutant.aimed_at().iter().any(|s| caught.contains(s)) {
            return Err(Failure::new(format!(
                "{mutant:?} was not caught by {:?}; failed: {caught:?}",
                mutant.aimed_at()
            )));
        }
    }
    Ok(())
}
