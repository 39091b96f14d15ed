//! The driver's pool an authority opens at connect: for what is not a lease statement (reading
//! the server's settings, `migrate`, the caller's guarded writes and tools).

use std::future::Future;
use std::time::Duration;

use leasehold_core::time::{saturating_add, FOREVER};
use leasehold_core::{Error, FenceSafety, Instant, Result};
use sqlx::pool::PoolOptions;
use sqlx::Pool;

use crate::errors::timed_out;
use crate::{FenceSafetyOption, SqlDialect};

/// Opens a pool of `size` connections with `connect` and reads what the backend needs of the
/// server on it (`read`: its replication settings), both within `timeout`: a server that does
/// not answer fails the connect as a request timeout, and the driver's errors are `map`ped.
pub async fn open_pool<D, S, Fut>(
    connect: &<D::Connection as sqlx::Connection>::Options,
    size: u32,
    timeout: Duration,
    read: impl FnOnce(Pool<D::Database>) -> Fut,
    map: impl FnOnce(sqlx::Error) -> Error,
) -> Result<(Pool<D::Database>, S)>
where
    D: SqlDialect,
    Fut: Future<Output = std::result::Result<S, sqlx::Error>>,
{
    let give_up = saturating_add(Instant::now(), timeout);
    let connected = async {
        let pool = PoolOptions::<D::Database>::new()
            .max_connections(size)
            .acquire_timeout(timeout.min(FOREVER))
            .connect_with(connect.clone())
            .await?;
        let read = read(pool.clone()).await?;
        Ok::<_, sqlx::Error>((pool, read))
    };
    tokio::time::timeout_at(give_up, connected)
        .await
        .map_err(|_| timed_out::<D>("connect", timeout))?
        .map_err(map)
}

/// Warns when the operator's `fence_safety=linearizable` does not hold: the server's settings
/// (`why`) lose commits even without a failover.
pub fn warn_if_overridden(option: FenceSafetyOption, declared: FenceSafety, why: &str) {
    if option == FenceSafetyOption::Linearizable && declared != FenceSafety::Linearizable {
        tracing::warn!("fence_safety=linearizable is overridden: {why}");
    }
}
