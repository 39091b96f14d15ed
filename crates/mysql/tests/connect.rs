//! Connecting and the errors a caller sees: bad credentials are `Unauthorized` without the
//! password in the message, an address nobody answers is `Unavailable`, a missing table says
//! to migrate, `migrate` runs twice harmlessly, and a read-only replica refuses leases as
//! unavailable (a new connection may reach a new primary), not as held.

use std::time::Duration;

use leasehold_conformance::kit;
use leasehold_core::{Authority, Error};
use leasehold_mysql::MysqlAuthority;
use leasehold_servers::MariaDbServer;

mod common;

use common::{connect, key, start_server, url, OrFail, Result};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_is_unauthorized_and_never_printed() -> Result {
    let server = tokio::task::spawn_blocking(|| MariaDbServer::start_with_password("right-one"))
        .await
        .or_fail("the harness task")?
        .or_fail("MariaDB must start")?;
    let bad = format!(
        "{}?timeout_ms=2000",
        server.url_with_password("hunter2-wrong")
    );
    match MysqlAuthority::connect(&bad).await {
        Err(e @ Error::Unauthorized { .. }) => {
            let shown = format!("{e} {e:?}");
            assert!(!shown.contains("hunter2-wrong"), "{shown}");
        }
        other => return Err(format!("expected Unauthorized, got {other:?}").into()),
    }
    connect(&format!("{}?timeout_ms=2000", server.url())).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nobody_listening_is_unavailable_within_the_timeout() -> Result {
    let port = leasehold_servers::free_ports(1).or_fail("a free port")?[0];
    let started = std::time::Instant::now();
    let answer = MysqlAuthority::connect(&format!(
        "mysql://leasehold@127.0.0.1:{port}/x?timeout_ms=500"
    ))
    .await;
    assert!(
        matches!(
            answer,
            Err(Error::Unavailable { .. } | Error::Timeout { .. })
        ),
        "{answer:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(3));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_table_says_to_migrate_and_migrate_is_idempotent() -> Result {
    let server = start_server().await?;
    let a = connect(&url(&server)).await?;
    let k = key("before-migrate")?;
    match a.try_acquire(&k, Duration::from_secs(5)).await {
        Err(
            e @ Error::Backend {
                retryable: false, ..
            },
        ) => {
            assert!(e.to_string().contains("migrate"), "{e}");
        }
        other => return Err(format!("expected a non-retryable error, got {other:?}").into()),
    }
    a.migrate().await.or_fail("migrate")?;
    a.migrate().await.or_fail("migrate again")?;
    a.try_acquire(&k, Duration::from_secs(5))
        .await
        .or_fail("acquire after migrate")?
        .or_fail("a fresh key was held")?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_replica_refuses_leases_as_unavailable() -> Result {
    let primary = start_server().await?;
    connect(&url(&primary))
        .await?
        .migrate()
        .await
        .or_fail("migrate the primary")?;
    let replica = {
        let primary = primary.clone();
        kit::start("the replica", move || {
            MariaDbServer::start_replica_of(&primary)
        })
        .await?
    };
    {
        let replica_wait = Duration::from_secs(10);
        let r = &replica;
        tokio::task::block_in_place(|| r.wait_caught_up(replica_wait))
            .or_fail("the replica catches up")?;
    }
    let on_replica = connect(&format!("{}?timeout_ms=1000", replica.url())).await?;
    let answer = on_replica
        .try_acquire(&key("on-a-replica")?, Duration::from_secs(5))
        .await;
    match answer {
        Err(e @ Error::Unavailable { .. }) => assert!(e.is_retryable()),
        other => return Err(format!("expected Unavailable, got {other:?}").into()),
    }
    Ok(())
}
