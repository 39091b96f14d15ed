//! Who may revoke: a user that may only read the lease table gets MariaDB's permission error,
//! and the holder keeps its lease; granted UPDATE, the same user revokes it.

use std::time::Duration;

use leasehold_core::Authority;

mod common;

use leasehold_conformance::kit;

use common::{connect, key, start_server, url, OrFail, Result};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_without_update_cannot_revoke_and_the_holder_keeps_its_lease() -> Result {
    let server = start_server().await?;
    let admin = connect(&url(&server)).await?;
    admin.migrate().await.or_fail("migrate")?;
    let root = |sql: &'static str| {
        let server = server.clone();
        async move {
            tokio::task::spawn_blocking(move || server.command(sql))
                .await
                .or_fail("the harness task")?
                .or_fail(sql)
        }
    };
    root(
        "CREATE USER 'lease_reader'@'%'; \
          GRANT SELECT ON leasehold.leasehold_leases TO 'lease_reader'@'%'",
    )
    .await?;
    let reader = connect(&format!(
        "mysql://lease_reader@127.0.0.1:{}/leasehold?timeout_ms=1000",
        server.port()
    ))
    .await?;
    let k = key("revoke-denied")?;
    let ttl = Duration::from_secs(10);
    let grant = admin
        .try_acquire(&k, ttl)
        .await
        .or_fail("the holder acquires")?
        .or_fail("the key must be free")?;

    kit::revoke_is_refused_and_the_holder_keeps_its_lease(
        &admin,
        &grant,
        ttl,
        &reader,
        "UPDATE command denied",
        &[],
    )
    .await?;

    root("GRANT UPDATE ON leasehold.leasehold_leases TO 'lease_reader'@'%'").await?;
    kit::revoke_ends_the_holder(&admin, &grant, ttl, &reader).await?;
    Ok(())
}
