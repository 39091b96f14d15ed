//! The PostgreSQL authority through a real PgBouncer (Debian's package) in transaction pooling
//! mode, as docs/postgres.md says it works: the whole conformance suite, its clients connected
//! through the pooler, PostgreSQL itself faulted underneath.

use std::sync::Arc;

use async_trait::async_trait;
use leasehold_conformance::scenarios::run_all;
use leasehold_conformance::{harness_call, Connector, Context, Faults};
use leasehold_core::{Authority, LockKey};
use leasehold_postgres::PostgresAuthority;
use leasehold_servers::{PgBouncer, PostgresServer};

mod common;
mod suite;

/// Clients of one URL.
struct Clients(String);

#[async_trait]
impl Connector for Clients {
    async fn connect(&self) -> leasehold_core::Result<Arc<dyn Authority>> {
        Ok(Arc::new(PostgresAuthority::connect(&self.0).await?))
    }
}

/// Crash and freeze faults on the PostgreSQL server behind the pooler (the clients' server as
/// they see it), and an operator ending a lease through a direct connection.
struct ServerFaults {
    server: Arc<PostgresServer>,
    direct: String,
}

#[async_trait]
impl Faults for ServerFaults {
    async fn restart(&self) -> leasehold_core::Result<()> {
        let server = self.server.clone();
        harness_call(move || server.restart()).await
    }

    async fn pause(&self) -> leasehold_core::Result<()> {
        let server = self.server.clone();
        harness_call(move || server.pause()).await
    }

    async fn resume(&self) -> leasehold_core::Result<()> {
        let server = self.server.clone();
        harness_call(move || server.resume()).await
    }

    /// The lease's row expires now; the row, and with it the fence counter, stays.
    async fn revoke(&self, key: &LockKey) -> leasehold_core::Result<()> {
        suite::revoke(&self.direct, key).await
    }
}

/// The conformance suite with every client connected through PgBouncer in transaction mode
/// (two server connections, so consecutive transactions of one client often run on different
/// ones), declared with `pooler=transaction`, and `more` in the URL. Returns the report.
async fn suite_through_pgbouncer(more: &str) -> Result<String, String> {
    let server = common::start().await;
    let bouncer = {
        let server = server.clone();
        tokio::task::spawn_blocking(move || PgBouncer::start_transaction_pooling(&server, 2))
            .await
            .map_err(|e| format!("starting PgBouncer: {e}"))?
            .map_err(|e| format!("PgBouncer must start for this test: {e}"))?
    };
    let direct = common::url(&server);
    PostgresAuthority::connect(&direct)
        .await
        .map_err(|e| format!("connect: {e}"))?
        .migrate()
        .await
        .map_err(|e| format!("migrate: {e}"))?;
    let pooled = format!(
        "{}?timeout_ms=1000&pooler=transaction{}",
        bouncer.url(),
        more.replace("{port}", &server.port().to_string())
    );
    let ctx = Context::new(Arc::new(Clients(pooled)))
        .await
        .map_err(|e| format!("the suite's context: {e}"))?
        .with_residue(Arc::new(suite::LiveRows(direct.clone())))
        .with_faults(Arc::new(ServerFaults {
            server: server.clone(),
            direct,
        }));
    let report = run_all("postgres through PgBouncer (transaction mode)", &ctx).await;
    println!("{report}");
    if !report.failures().is_empty() {
        return Err(format!("conformance failed through PgBouncer:\n{report}"));
    }
    drop(bouncer);
    Ok(report.to_string())
}

/// Without a direct address to listen at, waiters poll, as declared.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_the_conformance_suite_through_pgbouncer_in_transaction_mode() -> Result<(), String>
{
    let report = suite_through_pgbouncer("").await?;
    if !report.contains("waits by Polling") {
        return Err(format!("not declared as polling:\n{report}"));
    }
    Ok(())
}

/// With the database's own address for the listening connection, waiters are woken by
/// `LISTEN`, as declared, while every lease statement still goes through the pooler.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_the_conformance_suite_through_pgbouncer_listening_directly() -> Result<(), String> {
    let report = suite_through_pgbouncer("&listen_host=127.0.0.1&listen_port={port}").await?;
    if !report.contains("waits by Notification") {
        return Err(format!("not declared as notifying:\n{report}"));
    }
    Ok(())
}

/// Through a transaction-pooling proxy that was not declared, the statements the driver
/// prepares under a name meet another client's statement of the same name on the proxy's one
/// server connection (SQLSTATE 42P05): the error is permanent and says to declare the pooler.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undeclared_transaction_pooler_is_named_in_the_error() -> Result<(), String> {
    let server = common::start().await;
    let bouncer = {
        let server = server.clone();
        tokio::task::spawn_blocking(move || PgBouncer::start_transaction_pooling(&server, 1))
            .await
            .map_err(|e| format!("starting PgBouncer: {e}"))?
            .map_err(|e| format!("PgBouncer must start for this test: {e}"))?
    };
    PostgresAuthority::connect(&common::url(&server))
        .await
        .map_err(|e| format!("connect: {e}"))?
        .migrate()
        .await
        .map_err(|e| format!("migrate: {e}"))?;
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
        )),
    }
}

/// Through a transaction pooler an acquisition is a transaction of its own: when its statement
/// took the key but the COMMIT's answer is lost (here PgBouncer dies while a deferred trigger
/// holds the COMMIT up, and the server commits anyway), the caller gets an error, and the
/// lease it was not told about is given back once the pooler is back, instead of holding the
/// key for its TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquisition_whose_commit_went_unanswered_is_given_back() -> Result<(), String> {
    let server = common::start().await;
    let bouncer = {
        let server = server.clone();
        tokio::task::spawn_blocking(move || PgBouncer::start_transaction_pooling(&server, 2))
            .await
            .map_err(|e| format!("starting PgBouncer: {e}"))?
            .map_err(|e| format!("PgBouncer must start for this test: {e}"))?
    };
    let bouncer = Arc::new(bouncer);
    let direct = PostgresAuthority::connect(&common::url(&server))
        .await
        .map_err(|e| format!("connect: {e}"))?;
    direct
        .migrate()
        .await
        .map_err(|e| format!("migrate: {e}"))?;
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
            .map_err(|e| format!("making the commit slow: {e}"))?;
    }
    let pooled = PostgresAuthority::connect(&format!(
        "{}?timeout_ms=3000&pooler=transaction",
        bouncer.url()
    ))
    .await
    .map_err(|e| format!("connect through PgBouncer: {e}"))?;
    let ttl = std::time::Duration::from_secs(30);
    let key = LockKey::new(slow).map_err(|e| e.to_string())?;
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
            .map_err(|e| format!("restarting PgBouncer: {e}"))?
            .map_err(|e| format!("restarting PgBouncer: {e}"))?;
    }
    match acquiring
        .await
        .map_err(|e| format!("the acquisition's task: {e}"))?
    {
        Err(e) if e.is_retryable() => {}
        other => {
            return Err(format!(
                "an acquisition whose COMMIT went unanswered: {other:?}"
            ))
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
        .map_err(|e| format!("reading the key's row: {e}"))?;
        if rows == 1 && live == 0 {
            return Ok(());
        }
        if started.elapsed() > ttl / 4 {
            return Err(format!(
                "{rows} rows, {live} live {:?} after the COMMIT went unanswered: the grant was \
                 not given back",
                started.elapsed()
            ));
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}
