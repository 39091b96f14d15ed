//! The workload has teeth: run through the same worker loop and checker as the real backends,
//! the in-process reference authority passes, and every conformance mutant whose defect a
//! lock-set history can show fails the run. The three it cannot show reliably are listed with
//! the reason and the scenarios that catch them instead.
//!
//! On tokio's paused clock, so a minute of workload per authority takes under a second.

use std::sync::Arc;
use std::time::Duration;

use leasehold_conformance::memory::{MemoryConnector, MemoryFaults, Replication};
use leasehold_conformance::mutants::{self, Mutant};
use leasehold_conformance::workload::{check_recorded, RunVerdict, Status};
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

async fn judge(context: &Context, name: &str) -> RunVerdict {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("workload-mutants")
        .join(name);
    let history = run_in_process(context, name, &options(), &dir)
        .await
        .expect("the in-process run completes");
    check_recorded(&history).expect("the history has its run line")
}

#[tokio::test(start_paused = true)]
async fn the_reference_authority_passes_the_workload() {
    let server = MemoryServer::new();
    let context = Context::new(Arc::new(MemoryConnector::new(
        server.clone(),
        ClientOptions::default(),
    )))
    .await
    .unwrap()
    .with_faults(Arc::new(MemoryFaults::new(
        server,
        Replication::Synchronous,
    )));
    let verdict = judge(&context, "reference").await;
    println!("{verdict}");
    assert_eq!(verdict.status, Status::Passed, "{verdict}");
    let f = &verdict.figures;
    assert!(f.writes_acknowledged > 100, "{verdict}");
    assert!(
        f.writes_refused_stale > 0,
        "the pauses must make stale writes for the fence to refuse:\n{verdict}"
    );
}

#[tokio::test(start_paused = true)]
async fn every_mutant_a_history_can_show_fails_the_workload() {
    let mut survivors = Vec::new();
    for mutant in Mutant::ALL {
        let context = mutants::context(mutant).await.unwrap();
        let verdict = judge(&context, &mutant.to_string()).await;
        match invisible_to_the_workload(mutant) {
            Some(why) => println!(
                "mutant {mutant:<28} not reliably visible to the workload ({}): {why}",
                if verdict.status == Status::Failed {
                    "caught in this run"
                } else {
                    "not caught in this run"
                }
            ),
            None if verdict.status == Status::Failed => println!(
                "mutant {mutant:<28} caught: {}",
                verdict.reasons.first().map(String::as_str).unwrap_or("")
            ),
            None => survivors.push(format!("{mutant}:\n{verdict}")),
        }
    }
    assert!(
        survivors.is_empty(),
        "mutants the workload did not catch:\n{}",
        survivors.join("\n")
    );
}
