//! The SQL gate on SQLite: the resource suite against registers in a table of one file, shared
//! by a pool of connections (SQLite takes the file's write lock for each claim).
#![cfg(feature = "sqlite")]

use std::sync::Arc;

use async_trait::async_trait;
use leasehold_conformance::gate::{run_all, GateContext, GateFactory, Probed, NEEDS_FAULTS};
use leasehold_conformance::kit::{OrFail, TestResult};
use leasehold_core::OwnerToken;
use leasehold_gate_sql::SqlRegister;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use sqlx::{Sqlite, SqlitePool};

struct Registers(SqlitePool);

#[async_trait]
impl GateFactory for Registers {
    async fn resource(&self) -> leasehold_core::Result<Probed> {
        let id = OwnerToken::generate()?.to_hex();
        let register =
            Arc::new(SqlRegister::<Sqlite>::create(&self.0, "gate_sql_register", &id).await?);
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sqlite_table_behind_the_gate_passes_the_resource_suite() -> TestResult {
    let dir = tempfile::tempdir().or_fail("a temp dir")?;
    let options = SqliteConnectOptions::new()
        .filename(dir.path().join("gate.db"))
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(std::time::Duration::from_secs(10));
    let pool = SqlitePoolOptions::new()
        .max_connections(4)
        .connect_with(options)
        .await
        .or_fail("open the file")?;
    let ctx = GateContext::new(Arc::new(Registers(pool)));
    let report = run_all("sqlite table (sql gate)", &ctx).await;
    println!("{report}");
    // An embedded file has no server to cut or restart.
    report.passed_except(&NEEDS_FAULTS)
}
