//! The SQL gate on PostgreSQL: the resource suite against registers in a table, with the
//! registers' connections cut and the server restarted by the harness.
#![cfg(feature = "postgres")]

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use leasehold_conformance::gate::{run_all, GateContext, GateFactory, GateFaults, Probed};
use leasehold_conformance::kit::{self, OrFail, TestResult};
use leasehold_conformance::{harness_call, Failure, Verdict};
use leasehold_core::OwnerToken;
use leasehold_gate_sql::{map_error, SqlRegister};
use leasehold_servers::PostgresServer;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgPool, Postgres};

/// The application name of the registers' connections, by which the cut finds them.
const REGISTERS: &str = "leasehold-gate-sql-suite";

struct Registers {
    pool: PgPool,
    server: Arc<PostgresServer>,
}

#[async_trait]
impl GateFactory for Registers {
    async fn resource(&self) -> leasehold_core::Result<Probed> {
        let id = OwnerToken::generate()?.to_hex();
        let register =
            Arc::new(SqlRegister::<Postgres>::create(&self.pool, "gate_sql_register", &id).await?);
        let read = register.clone();
        Ok(Probed {
            resource: register,
            value: Arc::new(move || {
                let read = read.clone();
                Box::pin(async move { read.value().await })
            }),
        })
    }
}

#[async_trait]
impl GateFaults for Registers {
    async fn cut_connections(&self) -> leasehold_core::Result<()> {
        let admin = PgPool::connect(&self.server.url())
            .await
            .map_err(map_error)?;
        let cut = sqlx::query(
            "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity \
             WHERE application_name = $1",
        )
        .bind(REGISTERS)
        .execute(&admin)
        .await;
        admin.close().await;
        cut.map(|_| ()).map_err(map_error)
    }

    async fn restart(&self) -> leasehold_core::Result<()> {
        let server = self.server.clone();
        harness_call(move || server.restart()).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_table_behind_the_gate_passes_the_resource_suite_with_faults() -> TestResult {
    let server = kit::start("PostgreSQL", PostgresServer::start).await?;
    let options: PgConnectOptions = server.url().parse().or_fail("the server's URL")?;
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(10))
        .connect_with(options.application_name(REGISTERS))
        .await
        .or_fail("connect the registers' pool")?;
    let registers = Arc::new(Registers { pool, server });
    let ctx = GateContext::new(registers.clone()).with_faults(registers);
    let report = run_all("postgres table (sql gate)", &ctx).await;
    println!("{report}");
    report.passed()?;
    if report
        .lines
        .iter()
        .any(|l| l.outcome != Ok(Verdict::Passed))
    {
        return Err(Failure::new(format!(
            "every scenario applies to a managed PostgreSQL:\n{report}"
        )));
    }
    Ok(())
}
