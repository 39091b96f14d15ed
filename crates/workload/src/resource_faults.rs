//! Faults of the resource server (the PostgreSQL that holds the protected sets), apart from the
//! authority's: its connections to workers terminated while writes are in flight, and the whole
//! server restarted. A worker must survive both (its pool connects again), a write whose commit
//! it never saw must be recorded as `write_unknown`, and the final-state read after the run must
//! still work.

use std::sync::Arc;
use std::time::Duration;

use leasehold_servers::PostgresServer;
use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, Connection};
use tokio::time::Instant;

use crate::resource::{ResourceError, WORKER_APPLICATION};

/// How long a connection kill waits for a write in flight before it terminates whatever worker
/// connections there are.
const WAIT_FOR_A_WRITE: Duration = Duration::from_secs(5);

/// Terminates the worker connections (`application_name` = $1) that are mid-write, or with $2
/// every worker connection. A worker's backend counts as mid-write while it sits inside the
/// guarded write's transaction: running its `SELECT ... FOR UPDATE`, or idle between that and
/// `COMMIT`. Nothing of it is committed yet, so the worker's next statement fails and it cannot
/// know the outcome. A single-statement write that shows `active` may already have answered
/// its worker (the state is updated after the reply), so it is not a target.
const TERMINATE: &str = "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) \
     FROM pg_stat_activity WHERE application_name = $1 AND pid <> pg_backend_pid() \
     AND ($2 OR state = 'idle in transaction' \
     OR (state = 'active' AND query LIKE '%FOR UPDATE%'))";

/// Terminates (`pg_terminate_backend`) the worker connections that are mid-write, polling until
/// there are some (at most [`WAIT_FOR_A_WRITE`], then every worker connection). Returns what was
/// hit, for the history: an error when no worker connection was terminated at all.
pub async fn kill_worker_connections(url: &str) -> Result<String, ResourceError> {
    let options: PgConnectOptions = url.parse()?;
    let mut admin = options
        .application_name("leasehold-workload-nemesis")
        .connect()
        .await?;
    let give_up = Instant::now() + WAIT_FOR_A_WRITE;
    loop {
        let killed: i64 = sqlx::query_scalar(TERMINATE)
            .bind(WORKER_APPLICATION)
            .bind(false)
            .fetch_one(&mut admin)
            .await?;
        if killed > 0 {
            let _ = admin.close().await;
            return Ok(format!("{killed} worker connection(s) mid-write"));
        }
        if Instant::now() >= give_up {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let killed: i64 = sqlx::query_scalar(TERMINATE)
        .bind(WORKER_APPLICATION)
        .bind(true)
        .fetch_one(&mut admin)
        .await?;
    let _ = admin.close().await;
    if killed == 0 {
        return Err("no worker connection to the resource to terminate".into());
    }
    Ok(format!(
        "{killed} worker connection(s), none mid-write within {WAIT_FOR_A_WRITE:?}"
    ))
}

/// Kills the resource server and starts it again on the same data; returns once it accepts
/// connections.
pub async fn restart(server: Arc<PostgresServer>) -> Result<(), ResourceError> {
    tokio::task::spawn_blocking(move || server.restart()).await??;
    Ok(())
}

#[cfg(test)]
mod tests {
    use sqlx::postgres::PgConnection;

    use super::*;
    use crate::resource::{Outcome, PgSets, SetResource};

    /// A worker connection inside the guarded write's transaction (between the row lock and the
    /// commit) is found and terminated, and only it: the pool's idle connection is left alone.
    /// After a restart the resource serves the same rows again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_connection_mid_write_is_terminated_and_a_restart_keeps_the_rows(
    ) -> Result<(), ResourceError> {
        let server = Arc::new(tokio::task::spawn_blocking(PostgresServer::start).await??);
        let url = server.url();
        let sets = PgSets::create(&url, "t").await?;
        assert_eq!(sets.write("k", &[7], 1, true).await?, Outcome::Done(None));
        let options: PgConnectOptions = url
            .parse::<PgConnectOptions>()?
            .application_name(WORKER_APPLICATION);
        let mut conn: PgConnection = options.connect().await?;
        let mut tx = conn.begin().await?;
        sqlx::query(
            "SELECT last_fence FROM leasehold_workload_sets WHERE run = 't' AND key = 'k' \
             FOR UPDATE",
        )
        .execute(&mut *tx)
        .await?;
        let hit = kill_worker_connections(&url).await?;
        assert_eq!(hit, "1 worker connection(s) mid-write");
        assert!(
            tx.commit().await.is_err(),
            "the connection survived pg_terminate_backend"
        );
        restart(server.clone()).await?;
        let sets = PgSets::connect(&url, "t").await?;
        assert_eq!(sets.read("k", Some(2)).await?, Outcome::Done(vec![7]));
        Ok(())
    }
}
