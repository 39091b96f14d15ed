//! The resource suite against the in-memory reference gate, and every broken gate it must catch.

use std::sync::Arc;
use std::time::Duration;

use leasehold_conformance::gate::mutants::{self, GateMutant};
use leasehold_conformance::gate::{run_all, GateContext, GateReport, InMemoryGates, NEEDS_FAULTS};
use leasehold_conformance::kit::{ErrOrFail, TestResult};
use leasehold_conformance::{Failure, Line, Verdict};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_in_memory_register_passes_the_resource_suite() -> TestResult {
    let report = run_all(
        "in-memory register",
        &GateContext::new(Arc::new(InMemoryGates)),
    )
    .await;
    println!("{report}");
    report.passed_except(&NEEDS_FAULTS)
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

/// `passed_except` holds a binding to its list both ways: an unnamed scenario that did not pass
/// fails it, and so does a named one that passed, a name the report does not have, and a
/// failure whether named or not.
#[test]
fn passed_except_holds_a_binding_to_its_list_both_ways() -> TestResult {
    let line = |scenario, outcome| Line {
        scenario,
        outcome,
        took: Duration::ZERO,
    };
    let mut report = GateReport {
        subject: "a store".into(),
        lines: vec![
            line("passes", Ok(Verdict::Passed)),
            line("declared", Ok(Verdict::Declared("forgets".into()))),
            line("n_a", Ok(Verdict::NotApplicable("no such fault".into()))),
        ],
    };
    report.passed_except(&["declared", "n_a"])?;
    for (expected, says) in [
        (&["declared"][..], r#"not so for ["n_a"]"#),
        (
            &["passes", "declared", "n_a"][..],
            r#"not so for ["passes"]"#,
        ),
        (
            &["declared", "n_a", "missing"][..],
            r#"["missing"] did not run"#,
        ),
    ] {
        let failure = report
            .passed_except(expected)
            .err_or_fail(format!("passed_except({expected:?})"))?;
        if !failure.to_string().contains(says) {
            return Err(Failure::new(format!(
                "passed_except({expected:?}) should say {says:?}: {failure}"
            )));
        }
    }
    report.lines.push(line(
        "fails",
        Err(Failure::new("a stale write was accepted")),
    ));
    report
        .passed_except(&["declared", "n_a", "fails"])
        .err_or_fail("passed_except with a failed scenario named")?;
    Ok(())
}
