//! `connect` picks the MySQL/MariaDB authority for both of its schemes: clients of `mysql://`
//! and `mariadb://` URLs of one real MariaDB share its lease table, and the authority declares
//! what it does (polling, fences failover-unsafe on a server without a replica to wait for).
#![cfg(feature = "mysql")]

use std::time::Duration;

use leasehold::{connect, FenceSafety, LockKey, WaitStrategy};
use leasehold_conformance::kit::{OrFail, TestResult};
use leasehold_servers::MariaDbServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_and_mariadb_urls_reach_one_lease_table() -> TestResult {
    let server = tokio::task::spawn_blocking(MariaDbServer::start)
        .await
        .or_fail("the harness task")?
        .or_fail("MariaDB must start")?;
    let mysql_url = format!("{}?timeout_ms=2000", server.url());
    let mariadb_url = mysql_url.replacen("mysql://", "mariadb://", 1);
    leasehold::mysql::MysqlAuthority::connect(&mysql_url)
        .await
        .or_fail("connect to migrate")?
        .migrate()
        .await
        .or_fail("migrate")?;
    let a = connect(&mysql_url).await.or_fail("connect mysql://")?;
    let b = connect(&mariadb_url).await.or_fail("connect mariadb://")?;
    for c in [&a, &b] {
        let caps = c.capabilities();
        assert_eq!(caps.backend, "mysql");
        assert_eq!(caps.wait, WaitStrategy::Polling);
        assert_eq!(caps.fence_safety, FenceSafety::FailoverUnsafe);
    }
    let key = LockKey::new("facade").or_fail("the key")?;
    let ttl = Duration::from_secs(10);
    let g = a
        .try_acquire(&key, ttl)
        .await
        .or_fail("acquire through mysql://")?
        .or_fail("a fresh key was held")?;
    assert!(b
        .try_acquire(&key, ttl)
        .await
        .or_fail("try through mariadb://")?
        .is_none());
    let _ = a.release(&g).await.or_fail("release")?;
    let h = b
        .acquire(&key, ttl, Duration::from_secs(2))
        .await
        .or_fail("acquire through mariadb:// after the release")?;
    assert!(h.fence() > g.fence());
    Ok(())
}
