//! PostgreSQL failovers against real servers: a streaming standby promoted while the old primary
//! may still grant once more. An asynchronous standby reissues a fence, which the conformance
//! scenario shows as declared (and as a failure when linearizable fences are claimed for the same
//! setup); a synchronous standby keeps fences growing.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use leasehold_conformance::kit::{
    self, run_with_failover, FailoverFaults, FailoverRun, ReplicatedPair, UrlConnector,
};
use leasehold_conformance::{harness_call, harness_error, Context};
use leasehold_core::{Instant, LockKey};
use leasehold_postgres::PostgresAuthority;
use leasehold_servers::PostgresServer;

mod common;
mod suite;

use common::{connect, start_server, url, Failure, OrFail, Result};

/// A primary (the harness's server) and a streaming standby of it.
struct Pair {
    primary: Arc<PostgresServer>,
    standby: Arc<PostgresServer>,
    replication: Replication,
    options: String,
}

impl Pair {
    /// Waits (at most 20 s) until the primary has a synchronous standby streaming from it.
    async fn wait_for_sync_standby(&self) -> leasehold_core::Result<()> {
        let primary = self.primary_url();
        let p = sqlx::PgPool::connect(without_params(&primary))
            .await
            .map_err(harness_error)?;
        let started = Instant::now();
        loop {
            let streaming: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_replication \
                 WHERE state = 'streaming' AND sync_state = 'sync'",
            )
            .fetch_one(&p)
            .await
            .map_err(harness_error)?;
            if streaming > 0 {
                break;
            }
            if started.elapsed() > Duration::from_secs(20) {
                return Err(harness_error(
                    "the standby did not stream again within 20 s",
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        p.close().await;
        Ok(())
    }

    fn primary_url(&self) -> String {
        format!("{}?timeout_ms=1000{}", self.primary.url(), self.options)
    }

    fn standby_url(&self) -> String {
        format!("{}?timeout_ms=1000{}", self.standby.url(), self.options)
    }
}

/// How the primary replicates to its standby.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Replication {
    /// The default: commits do not wait for the standby.
    Asynchronous,
    /// `synchronous_standby_names = '*'` with `synchronous_commit = on`: a commit returns
    /// only once the standby has it.
    Synchronous,
}

/// The URL without its parameters, for sqlx, which knows none of the authority's.
fn without_params(url: &str) -> &str {
    url.split('?').next().unwrap_or(url)
}

/// The pair, and its clients: they connect at the pair's URL, which the failover moves from the
/// primary to the promoted standby.
async fn pair_with(options: &str, replication: Replication) -> Result<(Arc<Pair>, UrlConnector)> {
    let primary = start_server().await?;
    connect(&url(&primary))
        .await?
        .migrate()
        .await
        .or_fail("migrate the primary")?;
    let standby = {
        let primary = primary.clone();
        kit::start("the standby", move || {
            PostgresServer::start_standby_of(&primary)
        })
        .await?
    };
    let clients = suite::clients("");
    let pair = Arc::new(Pair {
        replication,
        primary,
        standby,
        options: options.to_string(),
    });
    if replication == Replication::Synchronous {
        let primary_url = pair.primary_url();
        sql_on(
            &primary_url,
            "ALTER SYSTEM SET synchronous_standby_names = '*'",
        )
        .await
        .or_fail("on the primary")?;
        sql_on(&primary_url, "ALTER SYSTEM SET synchronous_commit = 'on'")
            .await
            .or_fail("on the primary")?;
        sql_on(&primary_url, "SELECT pg_reload_conf()")
            .await
            .or_fail("on the primary")?;
    }
    clients.url().set(pair.primary_url());
    // The standby serves reads once it is consistent.
    let started = Instant::now();
    while PostgresAuthority::connect(&pair.standby_url())
        .await
        .is_err()
    {
        if started.elapsed() >= Duration::from_secs(20) {
            return Err(Failure::from(format!(
                "the standby did not start: {}",
                pair.standby.process().logs()
            )));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // After a restart of the primary, the standby reconnects within 100 ms instead of the
    // default 5 s (a synchronous primary's commits wait for it meanwhile).
    sql_on(
        &pair.standby_url(),
        "ALTER SYSTEM SET wal_retrieve_retry_interval = '100ms'",
    )
    .await
    .or_fail("on the standby")?;
    sql_on(&pair.standby_url(), "SELECT pg_reload_conf()")
        .await
        .or_fail("on the standby")?;
    Ok((pair, clients))
}

/// Runs `statement` on the server at `url`; an error names the statement.
async fn sql_on(url: &str, statement: &str) -> leasehold_core::Result<()> {
    let failed = |e: sqlx::Error| harness_error(format!("{statement}: {e}"));
    let pool = sqlx::PgPool::connect(without_params(url))
        .await
        .map_err(failed)?;
    sqlx::query(sqlx::AssertSqlSafe(statement.to_string()))
        .execute(&pool)
        .await
        .map_err(failed)?;
    pool.close().await;
    Ok(())
}

/// The standby is promoted with `pg_promote()`.
#[async_trait]
impl ReplicatedPair for Pair {
    type Server = PostgresServer;

    fn primary(&self) -> &PostgresServer {
        &self.primary
    }

    fn replica(&self) -> &PostgresServer {
        &self.standby
    }

    fn replica_url(&self) -> String {
        self.standby_url()
    }

    /// With a synchronous standby, the deployment takes writes again when the standby streams
    /// from the restarted primary once more.
    async fn primary_restarted(&self) -> leasehold_core::Result<()> {
        if self.replication == Replication::Synchronous {
            self.wait_for_sync_standby().await?;
        }
        Ok(())
    }

    async fn revoke(&self, url: &str, key: &LockKey) -> leasehold_core::Result<()> {
        suite::revoke(url, key).await
    }

    /// Lets the standby catch up, then cuts its replication: the primary (asynchronous)
    /// still commits, and the standby never sees it.
    async fn cut_replication(&self) -> leasehold_core::Result<()> {
        let (primary, standby) = (self.primary_url(), self.standby_url());
        let p = sqlx::PgPool::connect(without_params(&primary))
            .await
            .map_err(harness_error)?;
        let s = sqlx::PgPool::connect(without_params(&standby))
            .await
            .map_err(harness_error)?;
        let lsn: String = sqlx::query_scalar("SELECT pg_current_wal_lsn()::text")
            .fetch_one(&p)
            .await
            .map_err(harness_error)?;
        let started = Instant::now();
        loop {
            let caught_up: bool = sqlx::query_scalar(
                "SELECT coalesce(pg_last_wal_replay_lsn() >= $1::pg_lsn, false)",
            )
            .bind(&lsn)
            .fetch_one(&s)
            .await
            .map_err(harness_error)?;
            if caught_up {
                break;
            }
            if started.elapsed() >= Duration::from_secs(10) {
                return Err(harness_error("the standby did not catch up within 10 s"));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        sqlx::query("ALTER SYSTEM SET primary_conninfo = ''")
            .execute(&s)
            .await
            .map_err(harness_error)?;
        sqlx::query("SELECT pg_reload_conf()")
            .execute(&s)
            .await
            .map_err(harness_error)?;
        let started = Instant::now();
        loop {
            let receiving: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_stat_wal_receiver")
                .fetch_one(&s)
                .await
                .map_err(harness_error)?;
            if receiving == 0 {
                break;
            }
            if started.elapsed() >= Duration::from_secs(10) {
                return Err(harness_error("the standby still replicates after 10 s"));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        p.close().await;
        s.close().await;
        Ok(())
    }

    /// The old primary dies; the standby is promoted.
    async fn promote_replica(&self) -> leasehold_core::Result<()> {
        let primary = self.primary.clone();
        harness_call(move || primary.kill()).await?;
        sql_on(&self.standby_url(), "SELECT pg_promote()").await
    }
}

/// The whole suite (or only the failover scenario) on a primary with a standby of the given
/// kind, the standby's promotion as the failover fault.
async fn run_on_pair(replication: Replication, options: &str, whole: bool) -> Result<FailoverRun> {
    let (pair, clients) = pair_with(options, replication).await?;
    let faults = FailoverFaults::new(pair, clients.url());
    let ctx = Context::new(Arc::new(clients))
        .await
        .or_fail("the suite's context")?
        .with_faults(Arc::new(faults));
    let title = if whole {
        format!("postgres, {replication:?} standby")
    } else {
        "postgres failover".to_string()
    };
    run_with_failover(&title, &ctx, whole).await
}

/// With a synchronous standby, every acquisition the primary confirmed is on the
/// standby, so after the standby is promoted the next fence is greater than every fence
/// handed out before: the backend declares linearizable fences and the scenario passes. (The
/// old primary, cut off from its standby, cannot confirm the acquisition tried during the
/// failover: it waits for the standby until the request times out.)
///
/// The whole suite runs on the pair, every other fault acting on the server clients reach.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_to_a_synchronous_standby_keeps_fences_growing() -> Result {
    run_on_pair(Replication::Synchronous, "", true)
        .await?
        .fences_survived("a synchronous standby")
}

/// The whole suite on a primary with an asynchronous standby: everything passes, and the
/// failover, which reissues a fence, shows as the declared weakness it is. The same setup
/// declared linearizable (an overclaim) is caught.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_to_an_async_standby_reissues_a_fence_as_declared() -> Result {
    run_on_pair(Replication::Asynchronous, "", true)
        .await?
        .reissue_declared("an asynchronous standby")?;
    run_on_pair(
        Replication::Asynchronous,
        "&fence_safety=linearizable",
        false,
    )
    .await?
    .overclaim_caught()
}
