//! The SQL gate on PostgreSQL: the resource suite against registers in a table, with the
//! registers' connections cut and the server restarted by the harness.
#![cfg(feature = "postgres")]

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use leasehold_conformance::gate::{
    run_all, GateContext, GateFactory, GateFaults, HeldWrites, Probed,
};
use leasehold_conformance::harness_call;
use leasehold_conformance::kit::{self, OrFail, TestResult};
use leasehold_core::OwnerToken;
use leasehold_gate_sql::{map_error, SqlRegister};
use leasehold_servers::PostgresServer;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgConnection, PgPool, Postgres};

/// The application name of the registers' connections, by which the cut finds them.
const REGISTERS: &str = "leasehold-gate-sql-suite";

/// The registers' table.
const TABLE: &str = "gate_sql_register";

/// Writes held by a transaction of the harness's own that holds the registers' table in
/// `EXCLUSIVE` mode: reads go on, every claim's `UPDATE` waits for the lock. The cut terminates
/// the registers' connections only (by application name), so the lock outlives it, and a
/// terminated backend's transaction is rolled back: a held write is lost for good (sqlx never
/// sends a statement again).
struct TableLocked {
    lock: Mutex<Option<PgConnection>>,
    admin: PgPool,
}

#[async_trait]
impl HeldWrites for TableLocked {
    async fn waiting(&self) -> leasehold_core::Result<Option<usize>> {
        // From another connection: pg_stat_activity is read once per transaction, and the
        // lock's transaction stays open.
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE application_name = $1 AND wait_event_type = 'Lock'",
        )
        .bind(REGISTERS)
        .fetch_one(&self.admin)
        .await
        .map_err(map_error)?;
        Ok(Some(usize::try_from(waiting).unwrap_or(0)))
    }

    fn cut_loses_held_writes(&self) -> bool {
        true
    }

    async fn release(self: Box<Self>) -> leasehold_core::Result<()> {
        support::roll_back_and_close(&self.lock).await?;
        self.admin.close().await;
        Ok(())
    }
}

struct Registers {
    pool: PgPool,
    server: Arc<PostgresServer>,
}

#[async_trait]
impl GateFactory for Registers {
    async fn resource(&self) -> leasehold_core::Result<Probed> {
        let id = OwnerToken::generate()?.to_hex();
        let register = Arc::new(SqlRegister::<Postgres>::create(&self.pool, TABLE, &id).await?);
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

    async fn hold_writes(&self) -> leasehold_core::Result<Box<dyn HeldWrites>> {
        let lock = PgConnection::connect(&self.server.url())
            .await
            .map_err(map_error)?;
        let lock =
            support::begin_holding(lock, format!("LOCK TABLE {TABLE} IN EXCLUSIVE MODE")).await?;
        let admin = PgPoolOptions::new()
            .max_connections(1)
            .connect(&self.server.url())
            .await
            .map_err(map_error)?;
        Ok(Box::new(TableLocked { lock, admin }))
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
    // Every scenario applies to a managed server.
    report.passed_except(&[])
}
