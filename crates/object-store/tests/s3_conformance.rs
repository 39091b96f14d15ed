//! The whole conformance suite against S3 as moto's server mode serves it (started by the
//! harness), with the faults the harness has for it: moto killed and restarted (it keeps its
//! objects in memory, so fences start again: declared by the test's configuration, not by the
//! authority, since S3 itself keeps them), moto paused (SIGSTOP), and an operator freeing a key.
#![cfg(feature = "aws")]

mod support;

use std::sync::Arc;

use leasehold_conformance::kit::{self, OrFail, TestResult};
use leasehold_conformance::scenarios::run_all;
use leasehold_conformance::{Context, Failure, Verdict};
use leasehold_servers::MotoServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_on_moto_passes_the_conformance_suite_with_faults() -> TestResult {
    let moto = kit::start("moto", MotoServer::start).await?;
    let url = moto.url();
    let clients = support::Clients::new(
        move || support::s3(&url),
        support::config().store_forgets_on_restart(),
    );
    let faults = store_faults!(moto, clients.store()?);
    let ctx = Context::new(Arc::new(clients))
        .await
        .or_fail("connect the first client")?
        .with_faults(Arc::new(faults));
    let report = run_all("object-store: s3 on moto", &ctx).await;
    println!("{report}");
    if !report.failures().is_empty() {
        return Err(Failure::new(format!("scenarios failed:\n{report}")));
    }
    for line in &report.lines {
        let allowed = match line.scenario {
            // One store, no standby: nothing to fail over to.
            "fences_survive_failover" => true,
            // moto forgets everything on a restart (declared).
            "fences_survive_restart" | "election_epochs_survive_restart" => true,
            _ => false,
        };
        if !allowed && line.outcome != Ok(Verdict::Passed) {
            return Err(Failure::new(format!(
                "{} did not pass:\n{report}",
                line.scenario
            )));
        }
    }
    Ok(())
}
