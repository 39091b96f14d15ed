//! The conformance scenarios whose behaviour differs by store, against S3 as moto's server mode
//! serves it (started by the harness). Azurite runs the whole suite (azure_conformance.rs);
//! what the authority does above the `ObjectStore` calls is the same on every store, so here
//! run the scenarios that rest on what S3's client and server do differently: conditional puts
//! (`If-None-Match: *` to create, `If-Match` on the ETag to change), expiry judged by moto's
//! last-modified times, listing by prefix, a store that answers nothing (paused, SIGSTOP), and
//! a restart, after which moto has forgotten every object (it keeps them in memory), so fences
//! start again: declared by the test's configuration, not by the authority, since S3 itself
//! keeps them.
#![cfg(feature = "aws")]

mod support;

use std::sync::Arc;

use leasehold_conformance::kit::{self, TestResult};
use leasehold_conformance::scenarios;
use leasehold_conformance::{Failure, Verdict};
use leasehold_servers::MotoServer;

/// The scenarios run on moto, each for what it proves of S3 in particular.
const ON_S3: [&str; 19] = [
    // Conditional puts: one holder at a time, a fence that only rises, and a write on a version
    // someone else has replaced refused.
    "exclusion",
    "contention",
    "fences_increase",
    "stale_release_after_reacquire_keeps_new_grant",
    "release_after_expiry_keeps_new_holder",
    "renew_after_expiry_is_refused",
    "lost_fires_on_refused_renewal",
    "renewal_refusal_loses_only_that_lease",
    // A revoke: the holder's object rewritten free with `If-Match` on the version it read.
    "revoke_ends_the_holder_and_fences_it_out",
    "cancelled_try_acquire_leaves_nothing",
    "semaphore_never_exceeds_its_permits",
    "election_one_leader_at_a_time",
    "election_deposed_leader_is_refused",
    // Expiry by moto's clock (its objects' last-modified times).
    "vanished_holder_frees_within_ttl",
    "inspect_reports_holder_and_fence",
    // Listing by prefix, which S3 answers in its own form.
    "list_keys_finds_held_keys_under_a_prefix",
    // A store that answers nothing, through the S3 client's timeouts and retries.
    "unresponsive_authority",
    // A restart that forgets every object.
    "fences_survive_restart",
    "election_epochs_survive_restart",
];

fn server(moto: &Arc<MotoServer>) -> TestResult<support::suite::Server> {
    let url = moto.url();
    let clients = support::Clients::new(
        move || support::s3(&url),
        support::config().store_forgets_on_restart(),
    );
    let faults = store_faults!(moto, clients.store()?);
    Ok(support::suite::Server {
        clients: Arc::new(clients),
        faults: Arc::new(faults),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_on_moto_passes_the_scenarios_that_differ_by_store() -> TestResult {
    // One moto for the scenarios that run side by side, one for those that pause or restart
    // their server, which run beside them.
    let (shared, faulted) = tokio::try_join!(
        kit::start("moto", MotoServer::start),
        kit::start("moto", MotoServer::start),
    )?;
    let selected: Vec<_> = scenarios::all()
        .into_iter()
        .filter(|s| ON_S3.contains(&s.name))
        .collect();
    if selected.len() != ON_S3.len() {
        return Err(Failure::new(format!(
            "the suite has {} of the {} scenarios named for S3",
            selected.len(),
            ON_S3.len()
        )));
    }
    let report = support::suite::run(
        "object-store: s3 on moto",
        server(&shared)?,
        server(&faulted)?,
        &selected,
    )
    .await?;
    println!("{report}");
    if !report.failures().is_empty() {
        return Err(Failure::new(format!("scenarios failed:\n{report}")));
    }
    for line in &report.lines {
        // moto forgets everything on a restart (declared).
        let allowed = matches!(
            line.scenario,
            "fences_survive_restart" | "election_epochs_survive_restart"
        );
        if !allowed && !report.declared_absent(line) && line.outcome != Ok(Verdict::Passed) {
            return Err(Failure::new(format!(
                "{} did not pass:\n{report}",
                line.scenario
            )));
        }
    }
    Ok(())
}
