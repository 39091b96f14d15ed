//! The `fenced_row` example's story on each database, against the harness's servers (or, with
//! `LEASEHOLD_POSTGRES_URL` / `LEASEHOLD_MARIADB_URL` set, against those, e.g. docker compose's):
//! the paused holder's late charge is refused with the new holder's fence, and the invoice is
//! paid once, by the new holder.
#![cfg(all(feature = "postgres", feature = "mysql", feature = "sqlite"))]

#[path = "../examples/fenced_row.rs"]
mod example;

use leasehold_conformance::kit::{self, OrFail, TestResult};
use leasehold_conformance::Failure;
use leasehold_memory::MemoryAuthority;
use leasehold_servers::{external, MariaDbServer, PostgresServer};
use sqlx::{MySqlPool, PgPool};

use example::{Db, Outcome};

/// Runs the story and checks what it reports, beyond its own verdict.
async fn refuses_the_paused_holder(db: Db) -> TestResult {
    let outcome = example::run(&MemoryAuthority::standalone(), &db)
        .await
        .or_fail("the example's story")?;
    let Outcome {
        stale_fence,
        fence,
        refused_by,
        paid_by,
    } = outcome;
    if stale_fence >= fence || refused_by != fence || paid_by != "holder-2" {
        return Err(Failure::new(format!(
            "fence {stale_fence} should be refused by {fence} (the row named {refused_by}), \
             and holder-2 should pay (paid by {paid_by:?})"
        )));
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_row_example_refuses_the_paused_holder_on_postgres() -> TestResult {
    let (url, _server) = kit::external_or_start(
        external::postgres_url(),
        "PostgreSQL",
        PostgresServer::start,
        PostgresServer::url,
    )
    .await?;
    let pool = PgPool::connect(&url).await.or_fail("connect")?;
    refuses_the_paused_holder(Db::Postgres(pool)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_row_example_refuses_the_paused_holder_on_mariadb() -> TestResult {
    let (url, _server) = kit::external_or_start(
        external::mariadb_url(),
        "MariaDB",
        MariaDbServer::start,
        MariaDbServer::url,
    )
    .await?;
    let pool = MySqlPool::connect(&url).await.or_fail("connect")?;
    refuses_the_paused_holder(Db::MySql(pool)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_row_example_refuses_the_paused_holder_on_sqlite() -> TestResult {
    let dir = tempfile::tempdir().or_fail("a temp dir")?;
    let pool = example::open_sqlite(&dir.path().join("invoices.db"))
        .await
        .or_fail("open the file")?;
    refuses_the_paused_holder(Db::Sqlite(pool)).await
}
