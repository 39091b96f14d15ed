//! The resource suite against PostgreSQL as the protected store: fenced registers in a table
//! (`PgFencedRegister`, on `FencedTable`), with the server's connections cut and the server
//! restarted by the harness.

use std::sync::Arc;

use async_trait::async_trait;
use leasehold_conformance::gate::{run_all, GateContext, GateFaults};
use leasehold_conformance::{harness_call, ResourceFactory};
use leasehold_core::{FencedResource, OwnerToken};
use leasehold_postgres::guarded::PgFencedRegister;
use leasehold_servers::PostgresServer;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;

mod common;

use common::{start_server, url, OrFail, Result};

/// The application name of the registers' connections, by which the cut finds them.
const GATE_APPLICATION: &str = "leasehold-gate-suite";

struct Registers {
    pool: PgPool,
    server: Arc<PostgresServer>,
}

#[async_trait]
impl ResourceFactory for Registers {
    async fn resource(&self) -> leasehold_core::Result<Arc<dyn FencedResource>> {
        let id = OwnerToken::generate()?.to_hex();
        Ok(Arc::new(
            PgFencedRegister::create(&self.pool, "gate_register", &id).await?,
        ))
    }
}

#[async_trait]
impl GateFaults for Registers {
    async fn cut_connections(&self) -> leasehold_core::Result<()> {
        let admin = PgPool::connect(&self.server.url()).await.map_err(|e| {
            leasehold_core::Error::Backend {
                backend: "postgres",
                message: format!("the admin connection: {e}"),
                retryable: true,
                source: None,
            }
        })?;
        let cut = sqlx::query(
            "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity \
             WHERE application_name = $1",
        )
        .bind(GATE_APPLICATION)
        .execute(&admin)
        .await;
        admin.close().await;
        cut.map(|_| ()).map_err(|e| leasehold_core::Error::Backend {
            backend: "postgres",
            message: format!("pg_terminate_backend: {e}"),
            retryable: true,
            source: None,
        })
    }

    async fn restart(&self) -> leasehold_core::Result<()> {
        let server = self.server.clone();
        harness_call(move || server.restart()).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_table_passes_the_resource_suite_with_faults() -> Result {
    let server = start_server().await?;
    let options: sqlx::postgres::PgConnectOptions =
        url(&server).parse().or_fail("the server's URL")?;
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(std::time::Duration::from_secs(2))
        .connect_with(options.application_name(GATE_APPLICATION))
        .await
        .or_fail("connect the registers' pool")?;
    let registers = Arc::new(Registers { pool, server });
    let ctx = GateContext::new(registers.clone()).with_faults(registers);
    let report = run_all("postgres table", &ctx).await;
    println!("{report}");
    report.passed()?;
    let applied = report
        .lines
        .iter()
        .filter(|l| l.outcome == Ok(leasehold_conformance::Verdict::Passed))
        .count();
    if applied != report.lines.len() {
        return Err(leasehold_conformance::Failure::new(format!(
            "every scenario applies to a managed PostgreSQL:\n{report}"
        )));
    }
    Ok(())
}
