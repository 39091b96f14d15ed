//! The MySQL authority against a real MariaDB started by the harness: the whole conformance
//! suite with faults (the server killed and restarted, paused, a lease revoked by hand), and
//! MariaDB as the protected resource too, guarded through the SQL gate. The failover is in
//! failover.rs (it needs a replica).

use std::sync::Arc;

use async_trait::async_trait;
use leasehold_conformance::kit;
use leasehold_conformance::{Context, ResourceFactory};
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
    // Only failover needs a replica, which failover.rs runs.
    kit::passes_all_but_failover("mysql (MariaDB)", &ctx).await
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
    kit::stale_writes_are_refused("mysql, resource in MariaDB", &ctx).await
}
