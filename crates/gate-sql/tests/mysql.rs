//! The SQL gate on MariaDB (Debian's, for MySQL's protocol): the resource suite against
//! registers in a table, with the registers' connections killed and the server restarted by the
//! harness.
#![cfg(feature = "mysql")]

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use leasehold_conformance::gate::{run_all, GateContext, GateFactory, GateFaults, Probed};
use leasehold_conformance::kit::{self, OrFail, TestResult};
use leasehold_conformance::{harness_call, Failure, Verdict};
use leasehold_core::OwnerToken;
use leasehold_gate_sql::SqlRegister;
use leasehold_servers::MariaDbServer;
use sqlx::mysql::MySqlPoolOptions;
use sqlx::{MySql, MySqlPool};

struct Registers {
    pool: MySqlPool,
    server: Arc<MariaDbServer>,
}

#[async_trait]
impl GateFactory for Registers {
    async fn resource(&self) -> leasehold_core::Result<Probed> {
        let id = OwnerToken::generate()?.to_hex();
        let register =
            Arc::new(SqlRegister::<MySql>::create(&self.pool, "gate_sql_register", &id).await?);
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
        let server = self.server.clone();
        // Every connection of the URL's user: the registers' pool is its only client.
        harness_call(move || {
            let ids = server.command(
                "SELECT id FROM information_schema.processlist WHERE user = 'leasehold'",
            )?;
            for id in ids.lines().filter_map(|l| l.trim().parse::<u64>().ok()) {
                // A connection that closed since the listing is cut already.
                let _ = server.command(&format!("KILL {id}"));
            }
            Ok(())
        })
        .await
    }

    async fn restart(&self) -> leasehold_core::Result<()> {
        let server = self.server.clone();
        harness_call(move || server.restart()).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mariadb_table_behind_the_gate_passes_the_resource_suite_with_faults() -> TestResult {
    let server = kit::start("MariaDB", MariaDbServer::start).await?;
    let pool = MySqlPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(10))
        .connect(&server.url())
        .await
        .or_fail("connect the registers' pool")?;
    let registers = Arc::new(Registers { pool, server });
    let ctx = GateContext::new(registers.clone()).with_faults(registers);
    let report = run_all("mariadb table (sql gate)", &ctx).await;
    println!("{report}");
    report.passed()?;
    if report
        .lines
        .iter()
        .any(|l| l.outcome != Ok(Verdict::Passed))
    {
        return Err(Failure::new(format!(
            "every scenario applies to a managed MariaDB:\n{report}"
        )));
    }
    Ok(())
}
