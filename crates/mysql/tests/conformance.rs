//! The MySQL authority against a real MariaDB started by the harness: the whole conformance
//! suite with faults (the server killed and restarted, paused, a lease revoked by hand), and
//! MariaDB as the protected resource too, guarded through the SQL gate. The failover is in
//! failover.rs (it needs a replica).

use std::sync::Arc;

use async_trait::async_trait;
use leasehold_conformance::scenarios::{self, run_all, run_selected};
use leasehold_conformance::{Context, ResourceFactory, Verdict};
use leasehold_core::{FencedResource, OwnerToken};
use leasehold_gate_sql::SqlRegister;
use sqlx::{MySql, MySqlPool};

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

/// Registers in the lease table's database, each a row whose fence the SQL gate claims in the
/// writer's transaction.
struct Registers(MySqlPool);

#[async_trait]
impl ResourceFactory for Registers {
    async fn resource(&self) -> leasehold_core::Result<Arc<dyn FencedResource>> {
        let id = OwnerToken::generate()?.to_hex();
        Ok(Arc::new(
            SqlRegister::<MySql>::create(&self.0, "conformance_register", &id).await?,
        ))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_writes_are_refused_by_a_mysql_resource() -> Result {
    let server = start_server().await?;
    let url = url(&server);
    let admin = connect(&url).await?;
    admin.migrate().await.or_fail("migrate")?;
    let ctx = Context::new(Arc::new(suite::clients(&url)))
        .await
        .or_fail("the suite's context")?
        .with_resources(Arc::new(Registers(admin.pool().clone())));
    let selected: Vec<_> = scenarios::all()
        .into_iter()
        .filter(|s| s.name.starts_with("stale_write") || s.name == "contention")
        .collect();
    assert_eq!(selected.len(), 3);
    let report = run_selected("mysql, resource in MariaDB", &ctx, &selected).await;
    println!("{report}");
    assert!(
        report
            .lines
            .iter()
            .all(|l| l.outcome == Ok(Verdict::Passed)),
        "{report}"
    );
    Ok(())
}
