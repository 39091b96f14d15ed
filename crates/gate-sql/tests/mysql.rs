//! The SQL gate on MariaDB (Debian's, for MySQL's protocol): the resource suite against
//! registers in a table, with the registers' connections killed and the server restarted by the
//! harness.
#![cfg(feature = "mysql")]

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use leasehold_conformance::gate::{
    run_all, GateContext, GateFactory, GateFaults, HeldWrites, Probed,
};
use leasehold_conformance::kit::{self, OrFail, TestResult};
use leasehold_conformance::{harness_call, harness_error};
use leasehold_core::OwnerToken;
use leasehold_gate_sql::{map_error, SqlRegister};
use leasehold_servers::mariadb::MARIADB_DATABASE;
use leasehold_servers::MariaDbServer;
use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
use sqlx::{Connection, MySql, MySqlConnection, MySqlPool};

/// The registers' table.
const TABLE: &str = "gate_sql_register";

/// Writes held by a transaction of the harness's own (as `root` over the socket, which the cut
/// leaves alone) that locks every row of the registers' table: reads go on, every claim's
/// `SELECT ... FOR UPDATE` waits for the row lock. A killed connection's transaction is rolled
/// back, and sqlx never sends a statement again: a held write is lost for good.
struct RowsLocked {
    lock: Mutex<Option<MySqlConnection>>,
    server: Arc<MariaDbServer>,
}

#[async_trait]
impl HeldWrites for RowsLocked {
    async fn waiting(&self) -> leasehold_core::Result<Option<usize>> {
        let server = self.server.clone();
        let waiting = harness_call(move || {
            server.command(
                "SELECT COUNT(*) FROM information_schema.innodb_trx WHERE trx_state = 'LOCK WAIT'",
            )
        })
        .await?;
        let count = waiting
            .trim()
            .parse()
            .map_err(|e| harness_error(format!("the count of lock waits {waiting:?}: {e}")))?;
        Ok(Some(count))
    }

    fn cut_loses_held_writes(&self) -> bool {
        true
    }

    async fn release(self: Box<Self>) -> leasehold_core::Result<()> {
        support::roll_back_and_close(&self.lock).await?;
        Ok(())
    }
}

struct Registers {
    pool: MySqlPool,
    server: Arc<MariaDbServer>,
}

#[async_trait]
impl GateFactory for Registers {
    async fn resource(&self) -> leasehold_core::Result<Probed> {
        let id = OwnerToken::generate()?.to_hex();
        let register = Arc::new(SqlRegister::<MySql>::create(&self.pool, TABLE, &id).await?);
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

    async fn hold_writes(&self) -> leasehold_core::Result<Box<dyn HeldWrites>> {
        let options = MySqlConnectOptions::new()
            .socket(self.server.socket_path())
            .username("root")
            .database(MARIADB_DATABASE);
        let lock = MySqlConnection::connect_with(&options)
            .await
            .map_err(map_error)?;
        let lock =
            support::begin_holding(lock, format!("SELECT id FROM {TABLE} FOR UPDATE")).await?;
        Ok(Box::new(RowsLocked {
            lock,
            server: self.server.clone(),
        }))
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
    // Every scenario applies to a managed server.
    report.passed_except(&[])
}
