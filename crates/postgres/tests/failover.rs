//! PostgreSQL failovers against real servers: a streaming standby promoted while the old primary
//! may still grant once more. An asynchronous standby reissues a fence, which the conformance
//! scenario shows as declared (and as a failure when linearizable fences are claimed for the same
//! setup); a synchronous standby keeps fences growing.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use leasehold_conformance::scenarios::{self, run_all, run_selected};
use leasehold_conformance::{harness_error, Connector, Context, Faults, Verdict};
use leasehold_core::{Authority, FenceSafety, Instant, LockKey};
use leasehold_postgres::PostgresAuthority;
use leasehold_servers::PostgresServer;

mod common;

use common::{start, url};

async fn connect(url: &str) -> PostgresAuthority {
    PostgresAuthority::connect(url)
        .await
        .unwrap_or_else(|e| panic!("connect {url}: {e:?}"))
}

/// A primary (the harness's server) and a streaming standby of it.
struct Pair {
    primary: Arc<PostgresServer>,
    standby: PostgresServer,
    /// Where clients connect: the primary until the failover completes.
    url: Mutex<String>,
    /// Whether the standby was promoted: then it is the server the other faults act on.
    failed_over: AtomicBool,
    replication: Replication,
    options: String,
}

impl Pair {
    /// Waits (at most 20 s) until the primary has a synchronous standby streaming from it.
    async fn wait_for_sync_standby(&self) -> leasehold_core::Result<()> {
        let primary = self.primary_url();
        let p = sqlx::PgPool::connect(primary.split('?').next().unwrap())
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

    /// The server clients reach now: the primary, or the standby once promoted.
    fn current(&self) -> &PostgresServer {
        if self.failed_over.load(Ordering::Acquire) {
            &self.standby
        } else {
            &self.primary
        }
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

async fn pair_with(options: &str, replication: Replication) -> Arc<Pair> {
    let primary = start().await;
    connect(&url(&primary)).await.migrate().await.unwrap();
    let standby = {
        let primary = primary.clone();
        tokio::task::spawn_blocking(move || PostgresServer::start_standby_of(&primary))
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("the standby must start for this test: {e}"))
    };
    let pair = Arc::new(Pair {
        url: Mutex::new(String::new()),
        failed_over: AtomicBool::new(false),
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
        .await;
        sql_on(&primary_url, "ALTER SYSTEM SET synchronous_commit = 'on'").await;
        sql_on(&primary_url, "SELECT pg_reload_conf()").await;
    }
    *pair.url.lock().unwrap() = pair.primary_url();
    // The standby serves reads once it is consistent.
    let started = Instant::now();
    while PostgresAuthority::connect(&pair.standby_url())
        .await
        .is_err()
    {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the standby did not start: {}",
            pair.standby.process().logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // After a restart of the primary, the standby reconnects within 100 ms instead of the
    // default 5 s (a synchronous primary's commits wait for it meanwhile).
    sql_on(
        &pair.standby_url(),
        "ALTER SYSTEM SET wal_retrieve_retry_interval = '100ms'",
    )
    .await;
    sql_on(&pair.standby_url(), "SELECT pg_reload_conf()").await;
    pair
}

async fn sql_on(url: &str, statement: &str) {
    let pool = sqlx::PgPool::connect(url.split('?').next().unwrap())
        .await
        .unwrap();
    sqlx::query(sqlx::AssertSqlSafe(statement.to_string()))
        .execute(&pool)
        .await
        .unwrap_or_else(|e| panic!("{statement}: {e}"));
    pool.close().await;
}

struct Clients(Arc<Pair>);

#[async_trait]
impl Connector for Clients {
    async fn connect(&self) -> leasehold_core::Result<Arc<dyn Authority>> {
        let url = self.0.url.lock().unwrap().clone();
        Ok(Arc::new(PostgresAuthority::connect(&url).await?))
    }
}

struct Failover(Arc<Pair>);

impl Failover {
    async fn on_current(
        &self,
        f: impl FnOnce(&PostgresServer) -> leasehold_servers::Result<()> + Send + 'static,
    ) -> leasehold_core::Result<()> {
        let pair = self.0.clone();
        tokio::task::spawn_blocking(move || f(pair.current()))
            .await
            .unwrap()
            .map_err(harness_error)
    }
}

/// Every fault of the suite acts on the server clients reach now (the primary, then the
/// promoted standby), so the whole suite runs on the replicated deployment, not only the
/// failover scenario.
#[async_trait]
impl Faults for Failover {
    /// A restart is over when the deployment takes writes again: with a synchronous
    /// standby, that is when the standby streams from the restarted primary once more (until
    /// then every commit waits for it, as it would in production).
    async fn restart(&self) -> leasehold_core::Result<()> {
        self.on_current(|s| s.restart()).await?;
        if self.0.replication == Replication::Synchronous
            && !self.0.failed_over.load(Ordering::Acquire)
        {
            self.0.wait_for_sync_standby().await?;
        }
        Ok(())
    }

    async fn pause(&self) -> leasehold_core::Result<()> {
        self.on_current(|s| s.pause()).await
    }

    async fn resume(&self) -> leasehold_core::Result<()> {
        self.on_current(|s| s.resume()).await
    }

    /// An operator ends the lease by hand (keeping the row and its fence counter).
    async fn revoke(&self, key: &LockKey) -> leasehold_core::Result<()> {
        let url = self.0.url.lock().unwrap().clone();
        let admin = PostgresAuthority::connect(&url).await?;
        sqlx::query(
            "UPDATE leasehold_leases SET expires_at = statement_timestamp() \
             WHERE lock_key = $1",
        )
        .bind(key.as_str())
        .execute(admin.pool())
        .await
        .map_err(harness_error)?;
        Ok(())
    }

    /// Lets the standby catch up, then cuts its replication: the primary (asynchronous)
    /// still commits, and the standby never sees it.
    async fn begin_failover(&self) -> leasehold_core::Result<()> {
        let (primary, standby) = (self.0.primary_url(), self.0.standby_url());
        let p = sqlx::PgPool::connect(primary.split('?').next().unwrap())
            .await
            .map_err(harness_error)?;
        let s = sqlx::PgPool::connect(standby.split('?').next().unwrap())
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
            assert!(started.elapsed() < Duration::from_secs(10), "no catch-up");
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
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "still replicating"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        p.close().await;
        s.close().await;
        Ok(())
    }

    /// The old primary dies; the standby is promoted and clients connect to it.
    async fn complete_failover(&self) -> leasehold_core::Result<()> {
        let primary = self.0.primary.clone();
        tokio::task::spawn_blocking(move || primary.kill())
            .await
            .unwrap()
            .map_err(harness_error)?;
        sql_on(&self.0.standby_url(), "SELECT pg_promote()").await;
        *self.0.url.lock().unwrap() = self.0.standby_url();
        self.0.failed_over.store(true, Ordering::Release);
        Ok(())
    }
}

/// The whole suite on a primary with a standby of the given kind, the standby's promotion
/// as the failover fault; returns the declared fence safety, the report's failures, and the
/// failover scenario's outcome.
async fn whole_suite_with(
    replication: Replication,
) -> (FenceSafety, Vec<String>, Result<Verdict, String>) {
    let pair = pair_with("", replication).await;
    let ctx = Context::new(Arc::new(Clients(pair.clone())))
        .await
        .unwrap()
        .with_faults(Arc::new(Failover(pair.clone())));
    let report = run_all(&format!("postgres, {replication:?} standby"), &ctx).await;
    println!("{report}");
    let failures = report
        .lines
        .iter()
        .filter_map(|l| {
            l.outcome
                .as_ref()
                .err()
                .map(|f| format!("{}: {f}", l.scenario))
        })
        .collect();
    let failover = report
        .lines
        .iter()
        .find(|l| l.scenario == "fences_survive_failover")
        .expect("the suite has the failover scenario")
        .outcome
        .clone()
        .map_err(|f| f.to_string());
    (ctx.capabilities().fence_safety, failures, failover)
}

async fn failover_verdict(options: &str) -> (FenceSafety, Result<Verdict, String>) {
    failover_verdict_with(options, Replication::Asynchronous).await
}

async fn failover_verdict_with(
    options: &str,
    replication: Replication,
) -> (FenceSafety, Result<Verdict, String>) {
    let pair = pair_with(options, replication).await;
    let ctx = Context::new(Arc::new(Clients(pair.clone())))
        .await
        .unwrap()
        .with_faults(Arc::new(Failover(pair.clone())));
    let selected: Vec<_> = scenarios::all()
        .into_iter()
        .filter(|s| s.name == "fences_survive_failover")
        .collect();
    assert_eq!(selected.len(), 1);
    let report = run_selected("postgres failover", &ctx, &selected).await;
    println!("{report}");
    let outcome = report.lines[0].outcome.clone().map_err(|f| f.to_string());
    (ctx.capabilities().fence_safety, outcome)
}

/// With a synchronous standby, every acquisition the primary confirmed is on the
/// standby, so after the standby is promoted the next fence is greater than every fence
/// handed out before: the backend declares linearizable fences and the scenario passes. (The
/// old primary, cut off from its standby, cannot confirm the acquisition tried during the
/// failover: it waits for the standby until the request times out.)
///
/// The whole suite runs on the pair, every other fault acting on the server clients reach.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_to_a_synchronous_standby_keeps_fences_growing() {
    let (safety, failures, outcome) = whole_suite_with(Replication::Synchronous).await;
    assert_eq!(safety, FenceSafety::Linearizable);
    assert!(failures.is_empty(), "conformance failed: {failures:#?}");
    assert!(
        matches!(outcome, Ok(Verdict::Passed)),
        "fences must survive a failover to a synchronous standby: {outcome:?}"
    );
}

/// The whole suite on a primary with an asynchronous standby: everything passes, and the
/// failover, which reissues a fence, shows as the declared weakness it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_to_an_async_standby_reissues_a_fence_as_declared() {
    let (safety, failures, outcome) = whole_suite_with(Replication::Asynchronous).await;
    assert_eq!(safety, FenceSafety::FailoverUnsafe);
    assert!(failures.is_empty(), "conformance failed: {failures:#?}");
    assert!(
        matches!(outcome, Ok(Verdict::Declared(_))),
        "the failover must reissue a fence, and it must be declared: {outcome:?}"
    );
    // The same setup, declared linearizable (an overclaim): caught.
    let (safety, outcome) = failover_verdict("&fence_safety=linearizable").await;
    assert_eq!(safety, FenceSafety::Linearizable);
    assert!(outcome.is_err(), "an overclaim must fail: {outcome:?}");
}
