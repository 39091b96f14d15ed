//! How a lease statement runs on a lane's connection: to its answer, again after a conflict,
//! bounded by its caller's time; or, for an acquisition, given up unanswered with its
//! connection kept for its late answer.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::backend::Backoff;
use leasehold_core::time::saturating_add;
use leasehold_core::{Instant, Result};
use leasehold_sql_common::Lanes;
use sqlx::MySqlConnection;

use crate::errors;
use crate::table::TableName;

/// One try at a lease statement on one connection.
pub(crate) type Once<'c, T> =
    Pin<Box<dyn Future<Output = std::result::Result<T, sqlx::Error>> + Send + 'c>>;

/// A lease statement that can be sent again, or waited on by a task of its own.
pub(crate) type Statement<T> =
    Arc<dyn for<'c> Fn(&'c mut MySqlConnection) -> Once<'c, T> + Send + Sync>;

/// A statement unanswered when its caller's time ran out, still owning its connection.
pub(crate) type LateStatement<T> =
    Pin<Box<dyn Future<Output = std::result::Result<T, sqlx::Error>> + Send>>;

/// What became of a statement sent by [`send`].
pub(crate) enum Sent<T> {
    Answered(std::result::Result<T, sqlx::Error>),
    /// Unanswered in time; it may still take effect.
    Late(LateStatement<T>),
}

/// Sends `once` on a lane's connection (see [`Lanes`]) and waits until `give_up`: the wait for
/// a lane and the wait for the answer both end then. A deadlock or lock wait timeout (a
/// caller's own transaction holding a lease row) changed nothing: it is sent again until
/// `give_up`. A connection that broke, or reaches a server that takes no writes, is closed and
/// its lane connects afresh next time. A statement unanswered at `give_up` lets its lane go
/// (which connects afresh for the next statement: nobody can tell a frozen server from a slow
/// one) and is returned still owning its connection, so that whoever needs its answer can
/// wait for it; dropped, it closes that connection.
///
/// `hedge`: the answer is waited for only half the time left once the statement is sent (the
/// lane, however long it takes to get, is waited for until `give_up`), so that an acquisition
/// can be sent again on a fresh connection in the other half.
pub(crate) async fn send<T: Send + 'static>(
    lanes: &Lanes<MySqlConnection>,
    give_up: Instant,
    hedge: bool,
    once: Statement<T>,
) -> Sent<T> {
    let mut backoff = Backoff::new(Duration::from_millis(1), Duration::from_millis(20));
    loop {
        let mut lane = match tokio::time::timeout_at(give_up, lanes.take(give_up)).await {
            Ok(Ok(lane)) => lane,
            Ok(Err(e)) => return Sent::Answered(Err(e)),
            Err(_) => {
                let why = "no lane with a working connection in time";
                return Sent::Answered(Err(errors::unanswered(why)));
            }
        };
        let mut conn = match lane.connection() {
            Ok(conn) => conn,
            Err(e) => return Sent::Answered(Err(e)),
        };
        let now = Instant::now();
        let answer_by = if hedge {
            saturating_add(now, give_up.saturating_duration_since(now) / 2)
        } else {
            give_up
        };
        let once = once.clone();
        let mut statement = Box::pin(async move {
            let answer = once(&mut conn).await;
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
            Err(e) if errors::is_conflict(&e) && Instant::now() < give_up => {
                lane.put_back(conn);
                drop(lane);
                let next = saturating_add(Instant::now(), backoff.next_delay());
                tokio::time::sleep_until(next.min(give_up)).await;
            }
            Err(e) => {
                if !errors::discards_connection(&e) {
                    lane.put_back(conn);
                }
                return Sent::Answered(Err(e));
            }
        }
    }
}

/// [`send`], for statements whose late answer nobody needs: unanswered at `give_up`, the
/// statement is dropped with its connection.
pub(crate) async fn run<T: Send + 'static>(
    lanes: &Lanes<MySqlConnection>,
    give_up: Instant,
    once: Statement<T>,
) -> std::result::Result<T, sqlx::Error> {
    match send(lanes, give_up, false, once).await {
        Sent::Answered(answer) => answer,
        Sent::Late(_) => Err(errors::unanswered("no answer in time")),
    }
}

/// [`run`] with leasehold's errors: an unanswered statement is a request timeout after
/// `timeout`.
pub(crate) async fn bounded<T: Send + 'static>(
    lanes: &Lanes<MySqlConnection>,
    table: &TableName,
    what: &str,
    give_up: Instant,
    timeout: Duration,
    once: Statement<T>,
) -> Result<T> {
    tokio::time::timeout_at(give_up, run(lanes, give_up, once))
        .await
        .map_err(|_| errors::timed_out(what, timeout))?
        .map_err(|e| errors::map(e, what, table))
}
