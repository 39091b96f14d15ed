//! The whole conformance suite against Azure Blob as Azurite serves it (started by the harness,
//! data on disk), with the faults the harness has for it: Azurite stopped and started again on
//! its data (a clean stop: Azurite's own crash recovery is not the store it emulates), Azurite
//! paused (SIGSTOP), and an operator freeing a key. Azurite keeps its objects across a
//! restart as the store it emulates does, so every scenario runs here; moto runs those whose
//! behaviour differs by store (s3_conformance.rs).
#![cfg(feature = "azure")]

mod support;

use std::sync::Arc;

use leasehold_conformance::kit::{self, TestResult};
use leasehold_conformance::scenarios;
use leasehold_conformance::{Failure, Verdict};
use leasehold_servers::AzuriteServer;

fn server(azurite: &Arc<AzuriteServer>) -> TestResult<support::suite::Server> {
    let port = azurite.port();
    let clients = support::Clients::new(move || support::azure(port), support::config());
    let faults = store_faults!(azurite, clients.store()?);
    Ok(support::suite::Server {
        clients: Arc::new(clients),
        faults: Arc::new(faults),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn azure_blob_on_azurite_passes_the_conformance_suite_with_faults() -> TestResult {
    // One Azurite for the scenarios that run side by side, one for those that pause or restart
    // their server, which run beside them.
    let (shared, faulted) = tokio::try_join!(
        kit::start("Azurite", AzuriteServer::start),
        kit::start("Azurite", AzuriteServer::start),
    )?;
    let report = support::suite::run(
        "object-store: azure blob on azurite",
        server(&shared)?,
        server(&faulted)?,
        &scenarios::all(),
    )
    .await?;
    println!("{report}");
    if !report.failures().is_empty() {
        return Err(Failure::new(format!("scenarios failed:\n{report}")));
    }
    for line in &report.lines {
        // One store, no standby: nothing to fail over to.
        if line.scenario != "fences_survive_failover"
            && !report.declared_absent(line)
            && line.outcome != Ok(Verdict::Passed)
        {
            return Err(Failure::new(format!(
                "{} did not pass:\n{report}",
                line.scenario
            )));
        }
    }
    Ok(())
}
