//! The whole conformance suite against Azure Blob as Azurite serves it (started by the harness,
//! data on disk), with the faults the harness has for it: Azurite stopped and started again on
//! its data (a clean stop: Azurite's own crash recovery is not the store it emulates), Azurite
//! paused (SIGSTOP), and an operator freeing a key.
#![cfg(feature = "azure")]

mod support;

use std::sync::Arc;

use leasehold_conformance::kit::{self, OrFail, TestResult};
use leasehold_conformance::scenarios::run_all;
use leasehold_conformance::{Context, Failure, Verdict};
use leasehold_servers::AzuriteServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn azure_blob_on_azurite_passes_the_conformance_suite_with_faults() -> TestResult {
    let azurite = kit::start("Azurite", AzuriteServer::start).await?;
    let port = azurite.port();
    let clients = support::Clients::new(move || support::azure(port), support::config());
    let faults = store_faults!(azurite, clients.store()?);
    let ctx = Context::new(Arc::new(clients))
        .await
        .or_fail("connect the first client")?
        .with_faults(Arc::new(faults));
    let report = run_all("object-store: azure blob on azurite", &ctx).await;
    println!("{report}");
    if !report.failures().is_empty() {
        return Err(Failure::new(format!("scenarios failed:\n{report}")));
    }
    for line in &report.lines {
        // One store, no standby: nothing to fail over to.
        if line.scenario != "fences_survive_failover" && line.outcome != Ok(Verdict::Passed) {
            return Err(Failure::new(format!(
                "{} did not pass:\n{report}",
                line.scenario
            )));
        }
    }
    Ok(())
}
