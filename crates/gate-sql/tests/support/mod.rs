//! What the gate's tests against a server share.

use std::sync::Mutex;

use leasehold_gate_sql::map_error;
use sqlx::{Connection, Executor};

/// `conn` in a transaction of the harness's own that has run `hold`, whose lock holds the
/// registers' writes until [`roll_back_and_close`].
pub async fn begin_holding<C>(mut conn: C, hold: String) -> leasehold_core::Result<Mutex<Option<C>>>
where
    C: Connection,
    for<'c> &'c mut C: Executor<'c, Database = C::Database>,
{
    (&mut conn).execute("BEGIN").await.map_err(map_error)?;
    (&mut conn)
        .execute(sqlx::AssertSqlSafe(hold))
        .await
        .map_err(map_error)?;
    Ok(Mutex::new(Some(conn)))
}

/// Ends the harness's own transaction that holds the registers' writes, if it is still open on
/// the connection in `lock`, and closes the connection: the held writes go on (or, where the cut
/// killed them, stay lost).
pub async fn roll_back_and_close<C>(lock: &Mutex<Option<C>>) -> leasehold_core::Result<()>
where
    C: Connection,
    for<'c> &'c mut C: Executor<'c, Database = C::Database>,
{
    let lock = lock.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(mut lock) = lock {
        (&mut lock).execute("ROLLBACK").await.map_err(map_error)?;
        lock.close().await.map_err(map_error)?;
    }
    Ok(())
}
