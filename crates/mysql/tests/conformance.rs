//! The MySQL authority against a real MariaDB started by the harness: the whole conformance
//! suite with faults (the server killed and restarted, paused, a lease revoked by hand). The
//! failover is in failover.rs (it needs a replica).

use std::sync::Arc;

use leasehold_conformance::scenarios::run_all;
use leasehold_conformance::{Context, Verdict};

mod common;
mod suite;

use common::{connect, start_server, url, OrFail, Result};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_the_conformance_suite_with_faults() -> Result {
    let server = start_server().await?;
    let url = url(&server);
    connect(&url).await?.migrate().await.or_fail("migrate")?;
    let ctx = Context::new(Arc::new(suite::clients(&url)))
        .await
        .or_fail("the suite's context")?
        .with_residue(Arc::new(suite::LiveRows(url.clone())))
        .with_faults(Arc::new(suite::faults(server, url)));
    let report = run_all("mysql (MariaDB)", &ctx).await;
    println!("{report}");
    report.assert_passed();
    for line in &report.lines {
        // Only failover needs a replica, which failover.rs runs.
        if line.scenario != "fences_survive_failover" {
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
