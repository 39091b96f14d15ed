//! How a lease statement runs on a lane's connection: to its answer, again after a conflict,
//! bounded by its caller's time.

use std::future::Future;
use std::pin::Pin;
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

/// Runs `once` on a lane's connection (see [`Lanes`]) until `give_up`: the wait for a lane and
/// the wait for the answer both end then. A deadlock or lock wait timeout (a caller's own
/// transaction holding a lease row) changed nothing: it runs again until `give_up`. A
/// connection that broke, or reaches a server that takes no writes, is closed and its lane
/// connects afresh next time; so is one whose statement is given up or dropped unanswered (the
/// statement future owns the connection), so no later statement waits behind a lost reply.
pub(crate) async fn run<T>(
    lanes: &Lanes<MySqlConnection>,
    give_up: Instant,
    once: impl for<'c> Fn(&'c mut MySqlConnection) -> Once<'c, T>,
) -> std::result::Result<T, sqlx::Error> {
    let mut backoff = Backoff::new(Duration::from_millis(1), Duration::from_millis(20));
    loop {
        let mut lane = match tokio::time::timeout_at(give_up, lanes.take(give_up)).await {
            Ok(lane) => lane?,
            Err(_) => {
                return Err(errors::unanswered(
                    "no lane with a working connection in time",
                ))
            }
        };
        let mut conn = lane.connection()?;
        let answer = tokio::time::timeout_at(give_up, async {
            let answer = once(&mut conn).await;
            (conn, answer)
        })
        .await;
        let (conn, answer) = match answer {
            Ok(answered) => answered,
            // Dropped with its statement: the connection is closed.
            Err(_) => return Err(errors::unanswered("no answer in time")),
        };
        match answer {
            Ok(v) => {
                lane.put_back(conn);
                return Ok(v);
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
                return Err(e);
            }
        }
    }
}

/// [`run`] with leasehold's errors: an unanswered statement is a request timeout after
/// `timeout`.
pub(crate) async fn bounded<T>(
    lanes: &Lanes<MySqlConnection>,
    table: &TableName,
    what: &str,
    give_up: Instant,
    timeout: Duration,
    once: impl for<'c> Fn(&'c mut MySqlConnection) -> Once<'c, T>,
) -> Result<T> {
    tokio::time::timeout_at(give_up, run(lanes, give_up, once))
        .await
        .map_err(|_| errors::timed_out(what, timeout))?
        .map_err(|e| errors::map(e, what, table))
}
