//! `leasehold console` against every backend the CLI's tests can start cheaply, each a real
//! server (SQLite file, PostgreSQL, MariaDB, Redis, etcd, ZooKeeper, S3 by moto, Azure Blob by
//! Azurite): the index lists a key a `leasehold run` holds, with its fence.

use std::time::Duration;

mod common;
mod console_support;

use common::{code, leasehold, text, OrFail, Result};
use console_support::{eventually, sqlite_url, Console, Holder};

/// A run holds `job:console`; the console's index shows the key and the run's fence within a
/// few looks; the key's page too.
fn lists_a_held_key(url: &str, name: &str, env: &[(&str, &str)]) -> Result {
    let dir = leasehold_servers::process::server_dir(name).or_fail("a scratch directory")?;
    let key = "job:console";
    let holder = Holder::start(url, key, "10s", &[], dir.path(), "holder", env)?;
    let console = Console::start(url, &["--prefix", "job:"], env)?;
    let row = format!("<td class=\"fence\">{}</td>", holder.fence);
    let page = eventually(Duration::from_secs(10), "the held key on the index", || {
        let page = console.get("/", &[])?;
        Ok(
            (page.body.contains("data-key=\"job:console\"") && page.body.contains(&row))
                .then_some(page),
        )
    })
    .map_err(|e| format!("{e} ({name})"))?;
    assert_eq!(page.status, 200);
    let own = console.get("/key/job%3Aconsole", &[])?;
    assert!(own.body.contains(&row), "the key's page: {}", own.body);
    assert!(
        !own.body.contains("The last look at the authority failed"),
        "{}",
        own.body
    );
    assert_eq!(console.stop()?, Some(0), "{name}: SIGTERM stops it");
    holder.finish()?;
    Ok(())
}

#[test]
fn sqlite() -> Result {
    let dir =
        leasehold_servers::process::server_dir("console-sqlite").or_fail("a scratch directory")?;
    lists_a_held_key(&sqlite_url(dir.path()), "console-be-sqlite", &[])
}

#[test]
fn postgres() -> Result {
    let server = leasehold_servers::PostgresServer::start().or_fail("PostgreSQL must start")?;
    let url = format!("{}?timeout_ms=1000", server.url());
    let out = leasehold(&["migrate", "--url", &url])?;
    assert_eq!(code(&out), 0, "{}", text(&out));
    lists_a_held_key(&url, "console-be-postgres", &[])
}

#[test]
fn mariadb() -> Result {
    let server = leasehold_servers::MariaDbServer::start().or_fail("MariaDB must start")?;
    let url = server.url();
    let out = leasehold(&["migrate", "--url", &url])?;
    assert_eq!(code(&out), 0, "{}", text(&out));
    lists_a_held_key(&url, "console-be-mariadb", &[])
}

#[test]
fn redis() -> Result {
    let server = common::redis()?;
    lists_a_held_key(&common::url(&server), "console-be-redis", &[])
}

#[test]
fn etcd() -> Result {
    let server = leasehold_servers::EtcdServer::start().or_fail("etcd must start")?;
    let url = format!("etcd://{}?timeout_ms=1000", server.endpoint());
    lists_a_held_key(&url, "console-be-etcd", &[])
}

#[test]
fn zookeeper() -> Result {
    let server = leasehold_servers::ZkServer::start().or_fail("ZooKeeper must start")?;
    let url = format!("zk://{}/console?timeout_ms=2000", server.connect_string());
    lists_a_held_key(&url, "console-be-zookeeper", &[])
}

#[test]
fn s3() -> Result {
    let moto = leasehold_servers::MotoServer::start().or_fail("moto must start")?;
    let url = common::s3_url(&moto, "console");
    lists_a_held_key(&url, "console-be-s3", &common::S3_CREDENTIALS)
}

#[test]
fn azure() -> Result {
    let azurite = leasehold_servers::AzuriteServer::start().or_fail("Azurite must start")?;
    let url = common::azure_url(&azurite, "console");
    lists_a_held_key(&url, "console-be-azure", &common::AZURE_CREDENTIALS)
}
