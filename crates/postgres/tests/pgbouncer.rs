//! The PostgreSQL authority through a real PgBouncer (Debian's package) in transaction pooling
//! mode, as docs/postgres.md says it works: the whole conformance suite, its clients connected
//! through the pooler, PostgreSQL itself faulted underneath.

use std::sync::Arc;

use leasehold_conformance::kit::HarnessServer;
use leasehold_conformance::scenarios::run_all;
use leasehold_conformance::Context;
use leasehold_core::{Authority, LockKey};
use leasehold_postgres::PostgresAuthority;
use leasehold_servers::{PgBouncer, PostgresServer};

mod common;
mod suite;

use common::{connect, key, start_server, url, Failure, OrFail, Result};

/// A PgBouncer in transaction pooling mode in front of `server`, with `pool_size` server
/// connections; one that cannot start fails the test.
async fn start_pgbouncer(server: &Arc<PostgresServer>, pool_size: u32) -> Result<PgBouncer> {
    let server = server.clone();
    tokio::task::spawn_blocking(move || PgBouncer::start_transaction_pooling(&server, pool_size))
        .await
        .or_fail("starting PgBouncer")?
        .or_fail("PgBouncer must start for this test")
}

/// The PostgreSQL server behind a PgBouncer, faulted as the suite asks. PgBouncer refuses every
/// client of a pool whose server login failed (the server restarting) until a login succeeds
/// again, and may not try one by itself: after a restart it is given three seconds to serve
/// again, and is restarted itself if it does not (a pooler that holds on to a failed login is
/// PgBouncer's behaviour, not the authority's).
struct BehindPooler {
    server: Arc<PostgresServer>,
    bouncer: Arc<PgBouncer>,
}

impl HarnessServer for BehindPooler {
    fn restart(&self) -> leasehold_servers::Result<()> {
        self.server.restart()?;
        let until = std::time::Instant::now() + std::time::Duration::from_secs(3);
        while std::time::Instant::now() < until {
            if self.bouncer.accepts_logins().is_ok() {
                return Ok(());
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        self.bouncer.restart()
    }

    fn pause(&self) -> leasehold_servers::Result<()> {
        self.server.pause()
    }

    fn resume(&self) -> leasehold_servers::Result<()> {
        self.server.resume()
    }
}

/// The conformance suite with every client connected through PgBouncer in transaction mode
/// (two server connections, so consecutive transactions of one client often run on different
/// ones), declared with `pooler=transaction`, and `more` in the URL. Returns the report.
async fn suite_through_pgbouncer(more: &str) -> Result<String> {
    let server = start_server().await?;
    let bouncer = Arc::new(start_pgbouncer(&server, 2).await?);
    let direct = url(&server);
    connect(&direct).await?.migrate().await.or_fail("migrate")?;
    let pooled = format!(
        "{}?timeout_ms=1000&pooler=transaction{}",
        bouncer.url(),
        more.replace("{port}", &server.port().to_string())
    );
    let ctx = Context::new(Arc::new(suite::clients(&pooled)))
        .await
        .or_fail("the suite's context")?
        .with_residue(Arc::new(suite::LiveRows(direct.clone())))
        .with_faults(Arc::new(suite::faults(
            Arc::new(BehindPooler {
                server: server.clone(),
                bouncer: bouncer.clone(),
            }),
            direct,
        )));
    let report = run_all("postgres through PgBouncer (transaction mode)", &ctx).await;
    println!("{report}");
    if !report.failures().is_empty() {
        return Err(Failure::from(format!(
            "conformance failed through PgBouncer:\n{report}"
        )));
    }
    drop(bouncer);
    Ok(report.to_string())
}

/// Without a direct address to listen at, waiters poll, as declared.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_the_conformance_suite_through_pgbouncer_in_transaction_mode() -> Result {
    let report = suite_through_pgbouncer("").await?;
    if !report.contains("waits by Polling") {
        return Err(format!("not declared as polling:\n{report}").into());
    }
    Ok(())
}

/// With the database's own address for the listening connection, waiters are woken by
/// `LISTEN`, as declared, while every lease statement still goes through the pooler.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_the_conformance_suite_through_pgbouncer_listening_directly() -> Result {
    let report = suite_through_pgbouncer("&listen_host=127.0.0.1&listen_port={port}").await?;
    if !report.contains("waits by Notification") {
        return Err(format!("not declared as notifying:\n{report}").into());
    }
    Ok(())
}

/// Through a transaction-pooling proxy that was not declared, the statements the driver
/// prepares under a name meet another client's statement of the same name on the proxy's one
/// server connection (SQLSTATE 42P05): the error is permanent and says to declare the pooler.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undeclared_transaction_pooler_is_named_in_the_error() -> Result {
    let server = start_server().await?;
    let bouncer = start_pgbouncer(&server, 1).await?;
    connect(&url(&server))
        .await?
        .migrate()
        .await
        .or_fail("migrate")?;
    let undeclared = format!("{}?timeout_ms=1000", bouncer.url());
    let ttl = std::time::Duration::from_secs(5);
    // Two clients, each preparing its statements under the driver's names (`sqlx_s_1`, ...),
    // on the proxy's one server connection: the second name taken meets the first.
    let mut first_error = None;
    for client in ["a", "b"] {
        let outcome = async {
            let authority = PostgresAuthority::connect(&undeclared).await?;
            let key = LockKey::new(format!("undeclared/{client}"))?;
            authority.try_acquire(&key, ttl).await
        }
        .await;
        if let Err(e) = outcome {
            first_error = Some(e);
            break;
        }
    }
    match first_error {
        Some(e) if !e.is_retryable() && e.to_string().contains("pooler=transaction") => Ok(()),
        other => Err(format!(
            "two clients' statements under the same names through the pooler: {other:?}"
        )
        .into()),
    }
}

/// Through a transaction pooler an acquisition is a transaction of its own: when its statement
/// took the key but the COMMIT's answer is lost (here PgBouncer dies while a deferred trigger
/// holds the COMMIT up, and the server commits anyway), the caller gets an error, and the
/// lease it was not told about is given back once the pooler is back, instead of holding the
/// key for its TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquisition_whose_commit_went_unanswered_is_given_back() -> Result {
    let server = start_server().await?;
    let bouncer = start_pgbouncer(&server, 2).await?;
    let bouncer = Arc::new(bouncer);
    let direct = connect(&url(&server)).await?;
    direct.migrate().await.or_fail("migrate")?;
    let slow = "commit-lost/key";
    for statement in [
        "CREATE OR REPLACE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS \
         $$ BEGIN PERFORM pg_sleep(1); RETURN NULL; END $$"
            .to_string(),
        format!(
            "CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON leasehold_leases \
             DEFERRABLE INITIALLY DEFERRED FOR EACH ROW \
             WHEN (NEW.lock_key = '{slow}') EXECUTE FUNCTION slow_commit()"
        ),
    ] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(statement))
            .execute(direct.pool())
            .await
            .or_fail("making the commit slow")?;
    }
    let pooled = connect(&format!(
        "{}?timeout_ms=3000&pooler=transaction",
        bouncer.url()
    ))
    .await?;
    let ttl = std::time::Duration::from_secs(30);
    let key = key(slow)?;
    let acquiring = {
        let (pooled, key) = (pooled.clone(), key.clone());
        tokio::spawn(async move { pooled.try_acquire(&key, ttl).await })
    };
    // The COMMIT is under way (the upsert answers at once; the deferred trigger sleeps a
    // second at COMMIT): PgBouncer dies and comes back.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    {
        let bouncer = bouncer.clone();
        tokio::task::spawn_blocking(move || bouncer.restart())
            .await
            .or_fail("the task restarting PgBouncer")?
            .or_fail("restarting PgBouncer")?;
    }
    match acquiring.await.or_fail("the acquisition's task")? {
        Err(e) if e.is_retryable() => {}
        other => {
            return Err(format!("an acquisition whose COMMIT went unanswered: {other:?}").into())
        }
    }
    // The server committed the grant after its trigger; the give-back ends it long before
    // its TTL.
    let started = tokio::time::Instant::now();
    loop {
        let (rows, live): (i64, i64) = sqlx::query_as(
            "SELECT count(*), count(*) FILTER (WHERE expires_at > statement_timestamp()) \
             FROM leasehold_leases WHERE lock_key = $1",
        )
        .bind(slow)
        .fetch_one(direct.pool())
        .await
        .or_fail("reading the key's row")?;
        if rows == 1 && live == 0 {
            return Ok(());
        }
        if started.elapsed() > ttl / 4 {
            return Err(format!(
                "{rows} rows, {live} live {:?} after the COMMIT went unanswered: the grant was \
                 not given back",
                started.elapsed()
            )
            .into());
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}
