//! How a lease statement is sent: on the lanes every SQL backend shares (see
//! [`Sender`](leasehold_sql_common::Sender)), and through a transaction-pooling proxy in a
//! transaction of its own.

use std::sync::Arc;

use leasehold_core::{Instant, Result};
use leasehold_sql_common::{Attempt, Failed, Once, Statement};
use sqlx::{AssertSqlSafe, PgConnection};

use super::Inner;
use crate::errors;

impl Inner {
    /// `once` as this authority sends it: as it is, or through a transaction-pooling proxy in
    /// a transaction of its own (see [`statement_on`]).
    pub(super) fn statement<T: Send + 'static>(
        &self,
        once: impl for<'c> Fn(&'c mut PgConnection) -> Once<'c, T> + Send + Sync + 'static,
    ) -> Statement<PgConnection, T> {
        let pooled = !self.named();
        let once = Arc::new(once);
        Arc::new(move |c: &mut PgConnection| -> Attempt<'_, T> {
            let once = once.clone();
            Box::pin(async move { statement_on(c, pooled, &*once).await })
        })
    }

    /// Runs `once` on a lane's connection (see
    /// [`Sender::run`](leasehold_sql_common::Sender::run)). A conflict with a concurrent
    /// transaction (SQLSTATE 40001 or 40P01, under a `repeatable read` or `serializable`
    /// default) changed nothing: it is run again, with a fresh snapshot, until `give_up`.
    pub(super) async fn run<T: Send + 'static>(
        &self,
        give_up: Instant,
        once: impl for<'c> Fn(&'c mut PgConnection) -> Once<'c, T> + Send + Sync + 'static,
    ) -> std::result::Result<T, sqlx::Error> {
        self.sender.run(give_up, &self.statement(once)).await
    }

    /// [`Inner::run`] bounded by `give_up`, with leasehold's errors.
    pub(super) async fn bounded<T: Send + 'static>(
        &self,
        what: &str,
        give_up: Instant,
        once: impl for<'c> Fn(&'c mut PgConnection) -> Once<'c, T> + Send + Sync + 'static,
    ) -> Result<T> {
        let table = &self.config.table;
        self.sender
            .bounded(what, give_up, self.timeout(), self.statement(once), |e| {
                errors::map_lease(e, what, table)
            })
            .await
    }
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
