//! How a lease statement is sent on a lane's connection: run to its answer, retried after a
//! conflict, bounded by its caller's time; or, for an acquisition, given up unanswered with its
//! connection kept for its late answer.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::backend::Backoff;
use leasehold_core::time::saturating_add;
use leasehold_core::{Instant, Result};
use sqlx::{AssertSqlSafe, PgConnection};

use super::Inner;
use crate::errors;

/// One try at a lease statement on one pooled connection.
pub(super) type Once<'c, T> =
    Pin<Box<dyn Future<Output = std::result::Result<T, sqlx::Error>> + Send + 'c>>;

/// A lease statement that can be sent again, or waited on by a task of its own.
pub(super) type Statement<T> =
    Arc<dyn for<'c> Fn(&'c mut PgConnection) -> Once<'c, T> + Send + Sync>;

/// A statement unanswered when its caller stopped waiting, still owning its connection.
pub(super) type LateStatement<T> =
    Pin<Box<dyn Future<Output = std::result::Result<T, Failed<T>>> + Send>>;

/// What became of a statement sent by [`Inner::send`].
pub(super) enum Sent<T> {
    Answered(std::result::Result<T, Failed<T>>),
    /// Unanswered in time; it may still take effect.
    Late(LateStatement<T>),
}

impl Inner {
    /// Runs `once` on a lane's connection (see [`Lanes`](leasehold_sql_common::Lanes)). A conflict with a concurrent transaction (SQLSTATE
    /// 40001 or 40P01, under a `repeatable read` or `serializable` default) changed nothing: it
    /// is run again, with a fresh snapshot, until `give_up`. A connection that broke or reaches
    /// a read-only server is closed, and its lane connects afresh next time; so is one whose
    /// statement is dropped unanswered.
    pub(super) async fn run<T>(
        &self,
        give_up: Instant,
        once: impl for<'c> Fn(&'c mut PgConnection) -> Once<'c, T>,
    ) -> std::result::Result<T, sqlx::Error> {
        let mut backoff = Backoff::new(Duration::from_millis(1), Duration::from_millis(20));
        loop {
            let mut lane = self.lanes.take(give_up).await?;
            let mut conn = lane.connection()?;
            match statement_on(&mut conn, !self.named(), &once).await {
                Ok(v) => {
                    lane.put_back(conn);
                    return Ok(v);
                }
                Err(Failed::Statement(e))
                    if errors::is_conflict(&e) && Instant::now() < give_up =>
                {
                    lane.put_back(conn);
                    drop(lane);
                    let next = saturating_add(Instant::now(), backoff.next_delay());
                    tokio::time::sleep_until(next.min(give_up)).await;
                }
                Err(Failed::Statement(e)) => {
                    if !errors::discards_connection(&e) {
                        lane.put_back(conn);
                    }
                    return Err(e);
                }
                // Its outcome is not known, which is an error for everything but an
                // acquisition (see `Inner::send`).
                Err(Failed::Commit { error, .. }) => return Err(error),
            }
        }
    }

    /// Sends an acquisition statement on a lane's connection, as [`Inner::run`] runs one, and
    /// waits for its answer until `give_up`. An acquisition's statement may take the key after
    /// its caller stopped waiting, and its answer is needed to give that lease back: unanswered
    /// at `give_up`, the statement lets its lane go (which connects afresh for the next
    /// statement, as nobody can tell a frozen backend from a slow one) and is returned still
    /// owning its connection, for [`Inner::outlive`] to wait on.
    ///
    /// `hedge`: the answer is waited for only half the time left once the statement is sent
    /// (the lane, however long it takes to get, is waited for until `give_up`).
    pub(super) async fn send<T: Send + 'static>(
        &self,
        give_up: Instant,
        hedge: bool,
        once: Statement<T>,
    ) -> Sent<T> {
        let mut backoff = Backoff::new(Duration::from_millis(1), Duration::from_millis(20));
        loop {
            // Nobody waits for a lane past `give_up` (a caller that left, or timed out).
            let mut lane = match tokio::time::timeout_at(give_up, self.lanes.take(give_up)).await {
                Ok(Ok(lane)) => lane,
                Ok(Err(e)) => return Sent::Answered(Err(Failed::Statement(e))),
                Err(_) => {
                    let why = "no lane with a working connection in time";
                    return Sent::Answered(Err(Failed::Statement(unanswered(why))));
                }
            };
            let mut conn = match lane.connection() {
                Ok(conn) => conn,
                Err(e) => return Sent::Answered(Err(Failed::Statement(e))),
            };
            let now = Instant::now();
            let answer_by = if hedge {
                saturating_add(now, give_up.saturating_duration_since(now) / 2)
            } else {
                give_up
            };
            let (pooled, once) = (!self.named(), once.clone());
            let mut statement = Box::pin(async move {
                let answer = statement_on(&mut conn, pooled, &*once).await;
                (conn, answer)
            });
            let (conn, answer) = tokio::select! {
                biased;
                answered = &mut statement => answered,
                _ = tokio::time::sleep_until(answer_by) => {
                    drop(lane);
                    return Sent::Late(Box::pin(async move { statement.await.1 }));
                }
            };
            match answer {
                Ok(v) => {
                    lane.put_back(conn);
                    return Sent::Answered(Ok(v));
                }
                Err(Failed::Statement(e))
                    if errors::is_conflict(&e) && Instant::now() < give_up =>
                {
                    lane.put_back(conn);
                    drop(lane);
                    let next = saturating_add(Instant::now(), backoff.next_delay());
                    tokio::time::sleep_until(next.min(give_up)).await;
                }
                Err(Failed::Statement(e)) => {
                    if !errors::discards_connection(&e) {
                        lane.put_back(conn);
                    }
                    return Sent::Answered(Err(Failed::Statement(e)));
                }
                Err(unconfirmed) => return Sent::Answered(Err(unconfirmed)),
            }
        }
    }

    /// Waits for a late statement's answer on its own connection until `until`; past that,
    /// its connection is closed, and a lease it took ends at its TTL. At most one such wait
    /// per lane goes on at a time: with as many already waiting as there are lanes, the
    /// connection is closed now.
    pub(super) async fn outlive<T>(
        &self,
        late: LateStatement<T>,
        until: Instant,
    ) -> std::result::Result<T, Failed<T>> {
        let Ok(_kept) = self.outliving.clone().try_acquire_owned() else {
            drop(late);
            let why = "no answer in time, and as many abandoned acquisitions as lanes already \
                       wait for theirs";
            return Err(Failed::Statement(unanswered(why)));
        };
        tokio::time::timeout_at(until, late)
            .await
            .unwrap_or_else(|_| {
                let why = "no answer before the lease would have ended";
                Err(Failed::Statement(unanswered(why)))
            })
    }

    /// [`Inner::run`] bounded by `give_up`, with leasehold's errors.
    pub(super) async fn bounded<T>(
        &self,
        what: &str,
        give_up: Instant,
        once: impl for<'c> Fn(&'c mut PgConnection) -> Once<'c, T>,
    ) -> Result<T> {
        tokio::time::timeout_at(give_up, self.run(give_up, once))
            .await
            .map_err(|_| errors::timed_out(what, self.timeout()))?
            .map_err(|e| errors::map_lease(e, what, &self.config.table))
    }
}

/// Why [`statement_on`] failed.
pub(super) enum Failed<T> {
    /// The statement failed (and through a transaction pooler, its transaction was ended).
    Statement(sqlx::Error),
    /// Through a transaction pooler: the statement answered, but its transaction's COMMIT
    /// failed, so whether it took effect is not known.
    Commit { answer: T, error: sqlx::Error },
}

/// Runs `once` on `conn`. Through a transaction-pooling proxy (`pooled`), in a transaction of
/// its own: the driver parses a statement and executes it in two exchanges, each ending in a
/// Sync, and between them such a proxy may hand the client's next exchange to another server
/// connection, where the statement does not exist (SQLSTATE 26000) or another client's does.
/// A transaction keeps one server connection until it ends. That costs two round trips more
/// (`BEGIN`, `COMMIT`).
pub(super) async fn statement_on<T>(
    conn: &mut PgConnection,
    pooled: bool,
    once: &(impl for<'c> Fn(&'c mut PgConnection) -> Once<'c, T> + ?Sized),
) -> std::result::Result<T, Failed<T>> {
    if !pooled {
        return once(conn).await.map_err(Failed::Statement);
    }
    sqlx::raw_sql(AssertSqlSafe("BEGIN"))
        .execute(&mut *conn)
        .await
        .map_err(Failed::Statement)?;
    match once(&mut *conn).await {
        Ok(answer) => match sqlx::raw_sql(AssertSqlSafe("COMMIT"))
            .execute(&mut *conn)
            .await
        {
            Ok(_) => Ok(answer),
            Err(error) => Err(Failed::Commit { answer, error }),
        },
        Err(e) => {
            // The transaction is aborted; ending it gives the proxy its server connection back.
            // A connection that cannot end it is closed with the error it failed with.
            match sqlx::raw_sql(AssertSqlSafe("ROLLBACK"))
                .execute(&mut *conn)
                .await
            {
                Ok(_) => Err(Failed::Statement(e)),
                Err(rollback) => Err(Failed::Statement(rollback)),
            }
        }
    }
}

/// A statement given up without its answer: the connection is closed, which is an outage as
/// the caller sees it (retryable).
pub(super) fn unanswered(why: &str) -> sqlx::Error {
    sqlx::Error::Io(std::io::Error::new(std::io::ErrorKind::TimedOut, why))
}
