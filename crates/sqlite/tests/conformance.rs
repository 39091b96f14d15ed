//! The whole conformance suite, faults included, against the SQLite authority on a file in a
//! temporary directory.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use leasehold_conformance::kit::{OrFail, TestResult, UrlConnector};
use leasehold_conformance::scenarios::run_all;
use leasehold_conformance::{harness_error, Context, Faults, Residue, Verdict};
use leasehold_core::LockKey;
use leasehold_sqlite::SqliteAuthority;
use sqlx::{Connection, SqliteConnection};

mod common;

use common::{live_rows, url};

/// The clients made so far, so that a restart can close them all.
type Made = Arc<Mutex<Vec<SqliteAuthority>>>;

/// Faults of an embedded authority:
/// * restart: every connection of every client is closed (the file alone remains, as after all
///   processes exited), and later clients open the same file again;
/// * pause: another connection takes the database's write lock and keeps it (a hung writer:
///   every request waits for it, as for a frozen server), resume rolls it back;
/// * revoke: an operator expires the row (the fence counter stays).
struct SqliteFaults {
    made: Made,
    path: PathBuf,
    pauser: tokio::sync::Mutex<Option<SqliteConnection>>,
}

impl SqliteFaults {
    async fn admin(&self) -> leasehold_core::Result<SqliteConnection> {
        SqliteConnection::connect(&format!("sqlite://{}", self.path.display()))
            .await
            .map_err(harness_error)
    }
}

#[async_trait]
impl Faults for SqliteFaults {
    async fn restart(&self) -> leasehold_core::Result<()> {
        let made: Vec<_> =
            std::mem::take(&mut *self.made.lock().unwrap_or_else(|e| e.into_inner()));
        for client in made {
            client.close().await;
        }
        Ok(())
    }

    async fn pause(&self) -> leasehold_core::Result<()> {
        let mut conn = self.admin().await?;
        sqlx::query("BEGIN IMMEDIATE")
            .execute(&mut conn)
            .await
            .map_err(harness_error)?;
        *self.pauser.lock().await = Some(conn);
        Ok(())
    }

    /// Another connection holding the write lock leaves the file answering, busy.
    fn pause_is_contention(&self) -> bool {
        true
    }

    async fn resume(&self) -> leasehold_core::Result<()> {
        if let Some(mut conn) = self.pauser.lock().await.take() {
            sqlx::query("ROLLBACK")
                .execute(&mut conn)
                .await
                .map_err(harness_error)?;
            conn.close().await.map_err(harness_error)?;
        }
        Ok(())
    }

    async fn revoke(&self, key: &LockKey) -> leasehold_core::Result<()> {
        let mut conn = self.admin().await?;
        sqlx::query("UPDATE leasehold_leases SET expires_ns = 0 WHERE lock_key = ?1")
            .bind(key.as_str())
            .execute(&mut conn)
            .await
            .map_err(harness_error)?;
        Ok(())
    }
}

/// What is left for a key: a live lease row (the row itself, with its fence counter, stays on
/// purpose).
struct LiveRows(PathBuf);

#[async_trait]
impl Residue for LiveRows {
    async fn leftovers(&self, key: &LockKey) -> leasehold_core::Result<Vec<String>> {
        live_rows(&self.0, key.as_str()).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_the_conformance_suite_with_faults() -> TestResult {
    let dir = tempfile::tempdir().or_fail("a temporary directory")?;
    let path = dir.path().join("locks.db");
    // Each client has its own pool, as a separate process would have.
    let made = Made::default();
    let clients = UrlConnector::new(url(&path), {
        let made = made.clone();
        move |url| {
            let made = made.clone();
            async move {
                let a = SqliteAuthority::connect(&url).await?;
                made.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(a.clone());
                Ok(a)
            }
        }
    });
    let ctx = Context::new(Arc::new(clients))
        .await
        .or_fail("connect the first client")?
        .with_residue(Arc::new(LiveRows(path.clone())))
        .with_faults(Arc::new(SqliteFaults {
            made,
            path,
            pauser: tokio::sync::Mutex::new(None),
        }));
    let report = run_all("sqlite", &ctx).await;
    println!("{report}");
    report.assert_passed();
    for line in &report.lines {
        // One file on one machine has no standby to fail over to.
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
