//! The workload has teeth: run through the same worker loop and checker as the real backends,
//! the in-process reference authority passes, and every conformance mutant whose defect a
//! lock-set history can show fails the run. The three it cannot show reliably are listed with
//! the reason and the scenarios that catch them instead.
//!
//! On tokio's paused clock, so a minute of workload per authority takes under a second.

use leasehold_conformance::kit::{OrFail, TestResult};
use std::sync::Arc;
use std::time::Duration;

use leasehold_conformance::memory::{MemoryConnector, MemoryFaults, Replication};
use leasehold_conformance::mutants::{self, Mutant};
use leasehold_conformance::workload::{check_recorded, RunVerdict, Severity, Status};
use leasehold_conformance::Context;
use leasehold_core::ClientOptions;
use leasehold_memory::MemoryServer;
use leasehold_workload::in_process::{invisible_to_the_workload, run_in_process, InProcessOptions};

fn options() -> InProcessOptions {
    InProcessOptions {
        duration: Duration::from_secs(60),
        ..InProcessOptions::default()
    }
}

async fn judge(context: &Context, name: &str) -> TestResult<RunVerdict> {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("workload-mutants")
        .join(name);
    let history = run_in_process(context, name, &options(), &dir)
        .await
        .or_fail("the in-process run completes")?;
    check_recorded(&history).or_fail("the history has its run line")
}

#[tokio::test(start_paused = true)]
async fn the_reference_authority_passes_the_workload() -> TestResult {
    let server = MemoryServer::new();
    let context = Context::new(Arc::new(MemoryConnector::new(
        server.clone(),
        ClientOptions::default(),
    )))
    .await
    .or_fail("a context for the mutant")?
    .with_faults(Arc::new(MemoryFaults::new(
        server,
        Replication::Synchronous,
    )));
    let verdict = judge(&context, "reference").await?;
    println!("{verdict}");
    assert_eq!(verdict.status, Status::Passed, "{verdict}");
    let f = &verdict.figures;
    assert!(f.writes_acknowledged > 100, "{verdict}");
    assert!(
        f.writes_refused_stale > 0,
        "the pauses must make stale writes for the fence to refuse:\n{verdict}"
    );
    Ok(())
}

/// The finding each mutant's defect must produce: failing on something else (a stuck key for a
/// broken exclusion, say) would not show that the check aimed at the defect works.
fn expected_finding(mutant: Mutant) -> &'static str {
    match mutant {
        Mutant::FenceRestartsAfterRelease
        | Mutant::FenceRestartsAfterIdle
        | Mutant::LiesAboutFailoverSafety => "fence reissued",
        Mutant::CancelledAttemptKeepsKey => "key blocked with no holder",
        _ => "key granted while another lease was valid",
    }
}

fn caught_as_expected(mutant: Mutant, verdict: &RunVerdict) -> bool {
    verdict.status == Status::Failed
        && verdict
            .findings_of(Severity::Failure)
            .any(|f| f.kind.label() == expected_finding(mutant))
}

/// An authority that grants a key to everyone at once while its fences keep rising: the
/// resource refuses every older fence, so nothing acknowledged is lost and no stale write is
/// accepted, and only the lock's own evidence can fail the run. It must.
#[tokio::test(start_paused = true)]
async fn a_lock_that_ignores_the_holder_fails_on_exclusion_though_nothing_is_lost() -> TestResult {
    let mutant = Mutant::AcquireIgnoresHolder;
    let context = mutants::context(mutant)
        .await
        .or_fail("a context for the mutant")?;
    let verdict = judge(&context, "ignores-holder-headline").await?;
    assert!(caught_as_expected(mutant, &verdict), "{verdict}");
    assert!(verdict.figures.valid_overlaps > 0, "{verdict}");
    assert_eq!(verdict.figures.lost_acks, 0, "{verdict}");
    assert_eq!(verdict.figures.stale_accepted, 0, "{verdict}");
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn every_mutant_a_history_can_show_fails_the_workload() -> TestResult {
    let mut survivors = Vec::new();
    for mutant in Mutant::ALL {
        let context = mutants::context(mutant)
            .await
            .or_fail("a context for the mutant")?;
        let verdict = judge(&context, &mutant.to_string()).await?;
        match invisible_to_the_workload(mutant) {
            Some(why) => println!(
                "mutant {mutant:<28} not reliably visible to the workload ({}): {why}",
                if verdict.status == Status::Failed {
                    "caught in this run"
                } else {
                    "not caught in this run"
                }
            ),
            None if caught_as_expected(mutant, &verdict) => println!(
                "mutant {mutant:<28} caught: {}",
                verdict.reasons.first().map(String::as_str).unwrap_or("")
            ),
            None => survivors.push(format!(
                "{mutant} (expected a failure for {:?}):\n{verdict}",
                expected_finding(mutant)
            )),
        }
    }
    assert!(
        survivors.is_empty(),
        "mutants the workload did not catch:\n{}",
        survivors.join("\n")
    );
    Ok(())
}
