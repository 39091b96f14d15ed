//! The whole conformance suite, faults included, against a standalone ZooKeeper started by the
//! harness.

mod common;

use std::sync::Arc;

use leasehold_conformance::kit::{OrFail, TestResult};
use leasehold_conformance::scenarios::run_all;
use leasehold_conformance::{Context, Verdict};

use common::{clients, standalone, standalone_faults, url, ZkResidue, IDLE_CLEANUP};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_the_conformance_suite_with_faults() -> TestResult {
    let server = standalone().await?;
    let url = url(&server.connect_string(), "/conformance");
    let ctx = Context::new(Arc::new(clients(&url)))
        .await
        .or_fail("connect the first client")?
        .with_idle_cleanup(IDLE_CLEANUP)
        .with_residue(Arc::new(ZkResidue {
            hosts: server.connect_string(),
            url: url.clone(),
        }))
        .with_faults(Arc::new(standalone_faults(server, url)));
    assert_eq!(
        ctx.ttl().as_millis(),
        500,
        "the harness's tickTime of 200 ms allows 400 ms sessions, so the suite runs with 500 ms"
    );
    let report = run_all("zookeeper", &ctx).await;
    println!("{report}");
    report.assert_passed();
    for line in &report.lines {
        // A standalone server has no standby to fail over to; the ensemble tests cover failover.
        if line.scenario != "fences_survive_failover" && !report.declared_absent(line) {
            assert_eq!(
                line.outcome,
                Ok(Verdict::Passed),
                "{}:\n{report}",
                line.scenario
            );
        }
    }
    Ok(())
}
