//! Secrets: every configuration and every connection error that can carry a
//! credential, formatted every way a program prints it (Display, Debug, pretty Debug, the whole
//! source chain) and logged at TRACE while it happens, never shows the secret. The credentials
//! sit in every place a URL can carry them: the user info, `?password=`, `?sslpassword=`, and a
//! URL refused for another reason. Connections go to a closed port, so each attempt ends with a
//! typed error within its timeout (a hang fails the test), no server needed.
#![cfg(all(
    feature = "postgres",
    feature = "mysql",
    feature = "redis",
    feature = "etcd",
    feature = "zookeeper",
    feature = "sqlite"
))]

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold::etcd::EtcdConfig;
use leasehold::mysql::MysqlConfig;
use leasehold::postgres::PostgresConfig;
use leasehold::redis::RedisConfig;
use leasehold::sqlite::SqliteConfig;
use leasehold::zookeeper::ZkConfig;
use leasehold_conformance::kit::{OrFail, TestResult};
use leasehold_conformance::Failure;

const SECRET: &str = "S3cr3t-xyzzy";

/// A port nothing listens on (bound, then closed).
fn closed_port() -> TestResult<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").or_fail("bind a free port")?;
    Ok(listener
        .local_addr()
        .or_fail("the free port's address")?
        .port())
}

fn urls(port: u16) -> Vec<String> {
    let s = SECRET;
    vec![
        format!("postgres://u:{s}@127.0.0.1:{port}/db?timeout_ms=500"),
        format!("postgres://u@127.0.0.1:{port}/db?password={s}&timeout_ms=500"),
        format!("postgres://u@127.0.0.1:{port}/db?sslpassword={s}&timeout_ms=500"),
        format!("postgres://u:{s}@127.0.0.1:{port}/db?no_such_option=1"),
        format!("postgres://u:{s}@127.0.0.1:{port}/db?password={s}"),
        format!("mysql://u:{s}@127.0.0.1:{port}/db?timeout_ms=500"),
        format!("mariadb://u@127.0.0.1:{port}/db?password={s}&timeout_ms=500"),
        format!("mysql://u:{s}@127.0.0.1:{port}/db?no_such_option=1"),
        format!("mysql://u:{s}@127.0.0.1:{port}/db?password={s}"),
        format!("redis://u:{s}@127.0.0.1:{port}/?timeout_ms=500"),
        format!("redis://:{s}@127.0.0.1:{port}/?timeout_ms=500"),
        format!("rediss://u:{s}@127.0.0.1:{port}/?timeout_ms=500"),
        format!("redis://u:{s}@127.0.0.1:{port}/?no_such_option=1"),
        format!("redis+sentinel://u:{s}@127.0.0.1:{port}/mymaster?timeout_ms=500"),
        format!(
            "redis+sentinel://127.0.0.1:{port},127.0.0.1:{port}/mymaster?sentinel_password={s}&timeout_ms=500"
        ),
        format!("redis+sentinel://u:{s}@127.0.0.1:{port},[::1]:{port}/m?sentinel_password={s}&no_such_option=1"),
        format!("redis+sentinel://:{s}@127.0.0.1:{port}?timeout_ms=500"),
        format!("rediss+sentinel://:{s}@127.0.0.1:{port}/m?sentinel_password={s}"),
        format!("redis+cluster://u:{s}@127.0.0.1:{port},127.0.0.1:{port}?timeout_ms=500"),
        format!("redis+cluster://:{s}@127.0.0.1:{port}?timeout_ms=500"),
        format!("redis+cluster://u:{s}@127.0.0.1:{port}?no_such_option=1"),
        format!("redis+cluster://u:{s}@127.0.0.1:{port}/2?timeout_ms=500"),
        format!("redis+cluster://u:{s}@127.0.0.1:{port}?wait_replicas=1"),
        format!("rediss+cluster://:{s}@127.0.0.1:{port}"),
        format!("etcd://u:{s}@127.0.0.1:{port}?timeout_ms=500"),
        format!("etcd://u:{s}@127.0.0.1:{port}?no_such_option=1"),
        format!("zk://u:{s}@127.0.0.1:{port}/locks?timeout_ms=500"),
        format!("zk://u:{s}@127.0.0.1:{port}/locks?no_such_option=1"),
        format!("zks://u:{s}@127.0.0.1:{port}/locks?tls_ca=/nonexistent-dir-for-secrets/ca.pem"),
        format!("zks://u:{s}@127.0.0.1:{port}/locks?tls_ca=/etc/ssl/certs/ca-certificates.crt&timeout_ms=500"),
        format!("zks://u:{s}@127.0.0.1:{port}/locks?timeout_ms=500"),
        format!("sqlite:///nonexistent-dir-for-secrets/locks.db?password={s}"),
        format!("nosuchscheme://u:{s}@127.0.0.1:{port}/"),
        format!("postgres://u:{s}@[not-a-host/db"),
    ]
}

/// Everything a program might print about `e`.
fn printed(e: &dyn std::error::Error) -> String {
    let mut out = format!("{e}\n{e:?}\n{e:#?}\n");
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(&format!("{s}\n{s:?}\n"));
        source = s.source();
    }
    out
}

/// A writer that keeps what the log subscriber writes.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn configurations_hide_their_secrets() -> TestResult {
    let port = closed_port()?;
    for url in urls(port) {
        let shown = match () {
            _ if url.starts_with("postgres") => PostgresConfig::from_url(&url)
                .map(|c| format!("{c:?}\n{c:#?}"))
                .unwrap_or_else(|e| printed(&e)),
            _ if url.starts_with("mysql") || url.starts_with("mariadb") => {
                MysqlConfig::from_url(&url)
                    .map(|c| format!("{c:?}\n{c:#?}"))
                    .unwrap_or_else(|e| printed(&e))
            }
            _ if url.starts_with("redis") => RedisConfig::from_url(&url)
                .map(|c| format!("{c:?}\n{c:#?}"))
                .unwrap_or_else(|e| printed(&e)),
            _ if url.starts_with("etcd") => EtcdConfig::from_url(&url)
                .map(|c| format!("{c:?}\n{c:#?}"))
                .unwrap_or_else(|e| printed(&e)),
            _ if url.starts_with("zk") => ZkConfig::from_url(&url)
                .map(|c| format!("{c:?}\n{c:#?}"))
                .unwrap_or_else(|e| printed(&e)),
            _ if url.starts_with("sqlite") => SqliteConfig::from_url(&url)
                .map(|c| format!("{c:?}\n{c:#?}"))
                .unwrap_or_else(|e| printed(&e)),
            _ => continue,
        };
        assert!(
            !shown.contains(SECRET),
            "{url}: the secret is shown:\n{shown}"
        );
    }
    Ok(())
}

#[tokio::test]
async fn failed_connections_and_their_logs_hide_the_secrets() -> TestResult {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let port = closed_port()?;
    for url in urls(port) {
        let attempt = tokio::time::timeout(Duration::from_secs(10), leasehold::connect(&url)).await;
        let shown = match attempt {
            Err(_) => return Err(Failure::new(format!("connecting to {url} hung past 10 s"))),
            Ok(Ok(authority)) => {
                let shown = format!("{authority:?}\n{authority:#?}");
                let _ = authority.close().await;
                shown
            }
            Ok(Err(e)) => {
                tracing::error!(error = %e, "connect failed");
                printed(&e)
            }
        };
        assert!(
            !shown.contains(SECRET),
            "{url}: the secret is shown:\n{shown}"
        );
    }
    let logs =
        String::from_utf8_lossy(&captured.0.lock().or_fail("the captured log")?).into_owned();
    assert!(!logs.is_empty(), "nothing was logged at TRACE");
    assert!(
        !logs.contains(SECRET),
        "a log line shows the secret:\n{logs}"
    );
    Ok(())
}
