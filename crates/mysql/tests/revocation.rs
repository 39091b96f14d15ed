//! Who may revoke: a user that may only read the lease table gets MariaDB's permission error,
//! and the holder keeps its lease; granted UPDATE, the same user revokes it.

use std::time::{Duration, Instant};

use leasehold_core::{Authority, Error, Revoked};

mod common;

use common::{connect, key, start_server, url, OrFail, Result};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_without_update_cannot_revoke_and_the_holder_keeps_its_lease() -> Result {
    let started = Instant::now();
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

    let refused = reader.revoke(&k).await;
    match &refused {
        Err(e @ Error::Unauthorized { .. }) => {
            assert!(!e.is_retryable(), "{e}");
            assert!(e.to_string().contains("UPDATE command denied"), "{e}");
        }
        other => panic!("a user with SELECT only revoked: {other:?}"),
    }
    admin
        .renew(&grant, ttl)
        .await
        .or_fail("the holder renews after the refused revoke")?;
    let seen = reader.inspect(&k).await.or_fail("inspect")?;
    assert!(
        seen.held && seen.fence == Some(grant.fence()),
        "after a refused revoke the key is {seen:?}"
    );

    root("GRANT UPDATE ON leasehold.leasehold_leases TO 'lease_reader'@'%'").await?;
    let revoked = reader.revoke(&k).await.or_fail("revoke with UPDATE")?;
    assert_eq!(
        revoked,
        Revoked::Revoked {
            fence: grant.fence()
        }
    );
    let renewed = admin.renew(&grant, ttl).await;
    assert!(
        matches!(renewed, Err(Error::LeaseLost { .. })),
        "the revoked holder renewed: {renewed:?}"
    );
    eprintln!("took {:?}", started.elapsed());
    Ok(())
}
