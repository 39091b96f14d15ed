//! Cancellation against a real MariaDB: acquisitions cut off at random points around one round
//! trip leave nothing live behind, and an acquisition whose caller timed out while its
//! statement waited on a row lock is given back when it lands, instead of holding the key for
//! its TTL. The scenarios are the conformance kit's, shared with PostgreSQL's tests.

use async_trait::async_trait;
use leasehold_conformance::kit::{self, LeaseTable, LockedRow};
use leasehold_core::LockKey;
use leasehold_mysql::MysqlAuthority;
use sqlx::{MySql, MySqlPool, Transaction};

mod common;

use common::{connect, start_server, url, OrFail, Result};

/// The lease table, read and locked by an operator through the admin client's pool.
struct Table(MySqlPool);

/// A lease row an operator's transaction holds locked.
struct Locked(Transaction<'static, MySql>, String);

#[async_trait]
impl LeaseTable for Table {
    async fn live_rows(&self, key: &LockKey) -> Result<i64> {
        sqlx::query_scalar(
            "SELECT count(*) FROM leasehold_leases WHERE lock_key = ? AND expires_at > UTC_TIMESTAMP(6)",
        )
        .bind(key.as_str())
        .fetch_one(&self.0)
        .await
        .or_fail(format!("count the live leases of {key}"))
    }

    async fn lock_row(&self, key: &LockKey) -> Result<Box<dyn LockedRow>> {
        let mut tx = self.0.begin().await.or_fail("the operator's begin")?;
        sqlx::query("SELECT 1 FROM leasehold_leases WHERE lock_key = ? FOR UPDATE")
            .bind(key.as_str())
            .execute(&mut *tx)
            .await
            .or_fail("the operator locks the row")?;
        Ok(Box::new(Locked(tx, key.as_str().to_string())))
    }
}

#[async_trait]
impl LockedRow for Locked {
    async fn expire_and_commit(self: Box<Self>) -> Result {
        let Locked(mut tx, key) = *self;
        sqlx::query(
            "UPDATE leasehold_leases SET expires_at = UTC_TIMESTAMP(6) - INTERVAL 1 HOUR \
             WHERE lock_key = ?",
        )
        .bind(key)
        .execute(&mut *tx)
        .await
        .or_fail("the operator ends the lease")?;
        tx.commit().await.or_fail("the operator's commit")
    }
}

/// A server, its table migrated, and two clients of it: the admin and the one under test.
async fn clients() -> Result<(impl Sized, String, MysqlAuthority, MysqlAuthority)> {
    let server = start_server().await?;
    let url = url(&server);
    let admin = connect(&url).await?;
    admin.migrate().await.or_fail("migrate")?;
    let a = connect(&url).await?;
    Ok((server, url, admin, a))
}

/// [`kit::cancelled_acquisitions_leave_no_lease_behind`], 300 rounds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_acquisitions_leave_no_lease_behind() -> Result {
    let (_server, url, admin, a) = clients().await?;
    let table = Table(admin.pool().clone());
    kit::cancelled_acquisitions_leave_no_lease_behind(&admin, &a, || connect(&url), &table, 300)
        .await
}

/// [`kit::a_timed_out_acquisition_is_given_back_when_it_lands`]: the operator's row lock is
/// InnoDB's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_acquisition_is_given_back_when_it_lands() -> Result {
    let (_server, url, admin, a) = clients().await?;
    let table = Table(admin.pool().clone());
    kit::a_timed_out_acquisition_is_given_back_when_it_lands(&admin, &a, || connect(&url), &table)
        .await
}
