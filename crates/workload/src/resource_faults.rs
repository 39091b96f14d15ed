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

/// How long the nemesis waits for the table lock; a worker's transaction holding it that long is
/// itself mid-write, and the next look terminates it.
const LOCK_TIMEOUT: &str = "SET LOCAL lock_timeout = '200ms'";

/// Terminates the worker connections (`application_name` = $1) that are mid-write, or with $2
/// every worker connection. A worker's backend counts as mid-write while it sits inside the
/// guarded write's transaction: running its `SELECT ... FOR UPDATE`, or idle between that and
/// `COMMIT`. Nothing of it is committed yet, so the worker's next statement fails and it cannot
/// know the outcome. A single-statement write that shows `active` may already have answered
/// its worker (the state is updated after the reply), so it is not a target. The second
/// argument of `pg_terminate_backend` waits until the backend is gone.
const TERMINATE: &str = "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 5000)) \
     FROM pg_stat_activity WHERE application_name = $1 AND pid <> pg_backend_pid() \
     AND ($2 OR state = 'idle in transaction' \
     OR (state = 'active' AND query LIKE '%FOR UPDATE%'))";

/// Terminates the worker connections whose write (either arm's: the guarded write's row lock, or
/// the control's upsert) waits for a lock. While the nemesis holds the table lock, such a write
/// cannot have committed, so its worker cannot know the outcome. Claims (which also wait) are
/// left alone: a claim cut off is a failed read for its worker, not a write of unknown outcome.
const TERMINATE_BLOCKED_WRITES: &str =
    "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 5000)) \
     FROM pg_stat_activity WHERE application_name = $1 AND pid <> pg_backend_pid() \
     AND wait_event_type = 'Lock' \
     AND (query LIKE '%FOR UPDATE%' OR query LIKE '%elements = EXCLUDED.elements%')";

/// Terminates (`pg_terminate_backend`) worker connections in the middle of a write. A write takes
/// a few milliseconds between sleeps of hundreds, so instead of hoping to see one, the nemesis
/// holds the table's write lock (`EXCLUSIVE`: reads go on, writes and claims wait) until a write
/// arrives and waits for it, then terminates that connection and lets the others go. After
/// [`WAIT_FOR_A_WRITE`] without one it terminates every worker connection. Returns what was hit,
/// for the history, or `None` when there was no worker connection at all (every worker between
/// rounds, or killed).
pub async fn kill_worker_connections(url: &str) -> Result<Option<String>, ResourceError> {
    let options: PgConnectOptions = url.parse()?;
    let mut admin = options
        .application_name("leasehold-workload-nemesis")
        .connect()
        .await?;
    let give_up = Instant::now() + WAIT_FOR_A_WRITE;
    while Instant::now() < give_up {
        let killed: i64 = sqlx::query_scalar(TERMINATE)
            .bind(WORKER_APPLICATION)
            .bind(false)
            .fetch_one(&mut admin)
            .await?;
        if killed > 0 {
            let _ = admin.close().await;
            return Ok(Some(format!("{killed} worker connection(s) mid-write")));
        }
        let mut tx = admin.begin().await?;
        sqlx::query(LOCK_TIMEOUT).execute(&mut *tx).await?;
        let locked = sqlx::query("LOCK TABLE leasehold_workload_sets IN EXCLUSIVE MODE")
            .execute(&mut *tx)
            .await;
        match locked {
            Ok(_) => {}
            // A worker's transaction holds the table (lock_not_available): it is mid-write, and
            // the next look sees it.
            Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("55P03") => {
                tx.rollback().await?;
                continue;
            }
            Err(e) => return Err(e.into()),
        }
        while Instant::now() < give_up {
            // Inside a transaction pg_stat_activity is read once and kept; look afresh.
            sqlx::query("SELECT pg_stat_clear_snapshot()")
                .execute(&mut *tx)
                .await?;
            let killed: i64 = sqlx::query_scalar(TERMINATE_BLOCKED_WRITES)
                .bind(WORKER_APPLICATION)
                .fetch_one(&mut *tx)
                .await?;
            if killed > 0 {
                tx.rollback().await?;
                let _ = admin.close().await;
                return Ok(Some(format!(
                    "{killed} worker connection(s) waiting to write"
                )));
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        tx.rollback().await?;
    }
    let killed: i64 = sqlx::query_scalar(TERMINATE)
        .bind(WORKER_APPLICATION)
        .bind(true)
        .fetch_one(&mut admin)
        .await?;
    let _ = admin.close().await;
    if killed == 0 {
        return Ok(None);
    }
    Ok(Some(format!(
        "{killed} worker connection(s), none mid-write within {WAIT_FOR_A_WRITE:?}"
    )))
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
        assert_eq!(hit.as_deref(), Some("1 worker connection(s) mid-write"));
        assert!(
            tx.commit().await.is_err(),
            "the connection survived pg_terminate_backend"
        );
        restart(server.clone()).await?;
        let sets = PgSets::connect(&url, "t").await?;
        assert_eq!(sets.read("k", Some(2)).await?, Outcome::Done(vec![7]));
        Ok(())
    }

    /// A write that arrives while no worker is mid-write is held at the table lock and its
    /// connection terminated: the writer gets an error (its outcome unknown to it) and nothing
    /// was written, in both the guarded write and the control's upsert.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_write_arriving_later_is_held_and_terminated_before_it_commits(
    ) -> Result<(), ResourceError> {
        let server = tokio::task::spawn_blocking(PostgresServer::start).await??;
        let url = server.url();
        let sets = PgSets::create(&url, "t").await?;
        assert_eq!(sets.write("k", &[1], 1, true).await?, Outcome::Done(None));
        for fenced in [true, false] {
            let writer = sets.clone();
            let write = tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(300)).await;
                writer.write("k", &[1, 2], 2, fenced).await
            });
            let hit = kill_worker_connections(&url).await?;
            assert_eq!(
                hit.as_deref(),
                Some("1 worker connection(s) waiting to write"),
                "fenced {fenced}"
            );
            let written = write.await?;
            assert!(
                written.is_err(),
                "fenced {fenced}: the held write answered {written:?}"
            );
            assert_eq!(sets.read("k", None).await?, Outcome::Done(vec![1]));
        }
        Ok(())
    }
}
