//! `connect(url)`: pick the backend per deployment, not per build of the code.

use std::sync::Arc;

use leasehold_core::backend::{redact_url, ConnectionUrl};
use leasehold_core::{Authority, Error, Instrumented, Result};

/// The URL schemes and the cargo feature that brings each backend in.
const SCHEMES: &[(&str, &str)] = &[
    ("memory", "memory"),
    ("postgres", "postgres"),
    ("postgresql", "postgres"),
    ("mysql", "mysql"),
    ("mariadb", "mysql"),
    ("sqlite", "sqlite"),
    ("redis", "redis"),
    ("rediss", "redis"),
    ("redis+sentinel", "redis"),
    ("redis+cluster", "redis"),
    ("etcd", "etcd"),
    ("etcds", "etcd"),
    ("zk", "zookeeper"),
    ("zks", "zookeeper"),
    ("s3", "object-store"),
    ("az", "object-store"),
    ("gs", "object-store"),
];

/// Connects to the authority a URL names, so an application picks its backend per deployment
/// and can swap it without code changes:
///
/// | URL | backend | feature |
/// |---|---|---|
/// | `memory://` or `memory://name` | in-process reference authority (tests, one process) | `memory` (default) |
/// | `postgres://user:pass@host/db` | PostgreSQL lease table | `postgres` |
/// | `mysql://user:pass@host/db`, `mariadb://` | MySQL/MariaDB lease table | `mysql` |
/// | `sqlite:///abs/path.db`, `sqlite://relative/path.db` | embedded SQLite file, for the processes of one machine | `sqlite` |
/// | `redis://host:6379`, `rediss://` | Redis | `redis` |
/// | `redis+sentinel://s1:26379,s2:26379/mymaster` | Redis behind Sentinel (follows failovers) | `redis` |
/// | `redis+cluster://n1:6379,n2:6379,n3:6379` | Redis Cluster (sharded pub/sub, follows slot moves) | `redis` |
/// | `etcd://h1:2379,h2:2379`, `etcds://` | etcd | `etcd` |
/// | `zk://h1:2181,h2:2181/chroot`, `zks://...?tls_ca=ca.pem` | ZooKeeper | `zookeeper` |
/// | `s3://bucket/prefix`, `az://container/prefix`, `gs://bucket/prefix` | objects in S3, Azure Blob or GCS (credentials from the environment) | `object-store` |
///
/// Every backend understands the common query parameters `epoch` (the deployment epoch in the
/// top bits of every fence), `safety_margin_ms` and `clock_drift_per_mille` (what a grant's local
/// deadline gives up), and `timeout_ms` (per request). An unknown parameter is an error, never
/// silently ignored. The returned authority records `tracing` spans for every call.
///
/// # Errors
/// [`Error::InvalidUrl`] for a malformed URL, an unknown scheme, or a scheme whose feature is not
/// enabled (the message names the feature); the backend's own errors when it cannot connect.
/// Passwords never appear in the errors.
pub async fn connect(url: &str) -> Result<Arc<dyn Authority>> {
    let Some(scheme) = ConnectionUrl::scheme_of(url) else {
        return Err(Error::InvalidUrl {
            url: redact_url(url),
            reason: "expected `scheme://...`".into(),
        });
    };
    let inner: Arc<dyn Authority> = match scheme.as_str() {
        #[cfg(feature = "memory")]
        "memory" => Arc::new(memory(url)?),
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => {
            Arc::new(leasehold_postgres::PostgresAuthority::connect(url).await?)
        }
        #[cfg(feature = "mysql")]
        "mysql" | "mariadb" => Arc::new(leasehold_mysql::MysqlAuthority::connect(url).await?),
        #[cfg(feature = "sqlite")]
        "sqlite" => Arc::new(leasehold_sqlite::SqliteAuthority::connect(url).await?),
        #[cfg(feature = "redis")]
        "redis" | "rediss" | "redis+sentinel" | "redis+cluster" => {
            Arc::new(leasehold_redis::RedisAuthority::connect(url).await?)
        }
        #[cfg(feature = "etcd")]
        "etcd" | "etcds" => Arc::new(leasehold_etcd::EtcdAuthority::connect(url).await?),
        #[cfg(feature = "zookeeper")]
        "zk" | "zks" => Arc::new(leasehold_zookeeper::ZkAuthority::connect(url).await?),
        #[cfg(feature = "object-store")]
        "s3" | "az" | "gs" => {
            Arc::new(leasehold_object_store::ObjectStoreAuthority::connect(url).await?)
        }
        other => return Err(not_built_in(other, url)),
    };
    Ok(Arc::new(Instrumented::new(inner)))
}

/// The error for a scheme this build cannot serve: it names the feature to enable for a known
/// scheme, and lists the known schemes otherwise.
fn not_built_in(scheme: &str, url: &str) -> Error {
    let reason = match SCHEMES.iter().find(|(s, _)| *s == scheme) {
        Some((_, feature)) => format!(
            "the `{scheme}` scheme needs leasehold's `{feature}` feature, which this build does not enable"
        ),
        None => format!(
            "unknown scheme `{scheme}`; known schemes: {}",
            SCHEMES.iter().map(|(s, _)| *s).collect::<Vec<_>>().join(", ")
        ),
    };
    Error::InvalidUrl {
        url: redact_url(url),
        reason,
    }
}

/// `memory://name?params`: the process-wide in-memory server `name` (empty: `default`).
#[cfg(feature = "memory")]
fn memory(url: &str) -> Result<leasehold_memory::MemoryAuthority> {
    // The name is the whole text before the query, checked as one piece.
    let mut url = ConnectionUrl::parse_opaque(url)?;
    let options = url.params().take_client_options()?;
    url.finish_params()?;
    let name = url.path().trim_end_matches('/');
    if name.contains(['/', '@', ':']) {
        return Err(url.invalid("a memory URL is `memory://` or `memory://name`"));
    }
    let name = if name.is_empty() { "default" } else { name };
    Ok(leasehold_memory::MemoryServer::named(name).authority(options))
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold_conformance::kit::{ErrOrFail, OrFail, TestResult};

    #[tokio::test]
    async fn memory_urls_share_by_name() -> TestResult {
        let a = connect("memory://billing-test")
            .await
            .or_fail("connecting A to memory://billing-test")?;
        let b = connect("memory://billing-test?epoch=0")
            .await
            .or_fail("connecting B to memory://billing-test?epoch=0")?;
        let key = leasehold_core::LockKey::new("k").or_fail("the key `k`")?;
        let ttl = std::time::Duration::from_secs(1);
        let g = a
            .try_acquire(&key, ttl)
            .await
            .or_fail("A tries to acquire k")?
            .or_fail("A acquires k")?;
        assert!(b
            .try_acquire(&key, ttl)
            .await
            .or_fail("B tries to acquire k while A holds it")?
            .is_none());
        let _ = a.release(&g).await.or_fail("A releases k")?;
        Ok(())
    }

    #[tokio::test]
    async fn epoch_from_the_url_is_in_the_fence() -> TestResult {
        let a = connect("memory://epoch-test?epoch=2")
            .await
            .or_fail("connecting to memory://epoch-test?epoch=2")?;
        let key = leasehold_core::LockKey::new("k").or_fail("the key `k`")?;
        let g = a
            .try_acquire(&key, std::time::Duration::from_secs(1))
            .await
            .or_fail("trying to acquire k")?
            .or_fail("acquiring k")?;
        assert_eq!(g.fence().epoch().get(), 2);
        assert!(g.fence().value() > 2 << 48);
        Ok(())
    }

    #[tokio::test]
    async fn bad_urls_are_typed_errors_that_hide_passwords() -> TestResult {
        for (url, says) in [
            ("nonsense", "scheme://"),
            ("ftp://x", "unknown scheme `ftp`"),
            ("memory://a/b", "memory://name"),
            ("memory://x?bogus=1", "unknown parameter `bogus`"),
            ("memory://x?epoch=40000", "epoch"),
        ] {
            let err = connect(url)
                .await
                .err_or_fail("connecting to a refused URL")?;
            assert!(
                matches!(err, Error::InvalidUrl { .. } | Error::InvalidConfig { .. }),
                "{url}: {err}"
            );
            assert!(err.to_string().contains(says), "{url}: {err}");
        }
        // A known scheme whose backend is not built in names the feature to enable.
        let err = not_built_in("mariadb", "mariadb://u:hunter2@localhost/db");
        let shown = format!("{err} {err:?}");
        assert!(shown.contains("`mysql` feature"), "{shown}");
        assert!(!shown.contains("hunter2"), "{shown}");
        let err = not_built_in("sqlite", "sqlite:///tmp/x.db");
        assert!(err.to_string().contains("`sqlite` feature"), "{err}");
        let err = not_built_in("rediss", "rediss://:hunter2@localhost");
        let shown = format!("{err} {err:?}");
        assert!(shown.contains("`redis` feature"), "{shown}");
        assert!(!shown.contains("hunter2"), "{shown}");
        let err = not_built_in("redis+sentinel", "redis+sentinel://:hunter2@h1,h2/m");
        let shown = format!("{err} {err:?}");
        assert!(shown.contains("`redis` feature"), "{shown}");
        let err = not_built_in("gs", "gs://bucket/locks");
        assert!(err.to_string().contains("`object-store` feature"), "{err}");
        let err = not_built_in("redis+cluster", "redis+cluster://:hunter2@h1:7000,h2:7001");
        let shown = format!("{err} {err:?}");
        assert!(shown.contains("`redis` feature"), "{shown}");
        assert!(!shown.contains("hunter2"), "{shown}");
        Ok(())
    }

    /// Object-store URLs reach their backend, which refuses a credential in the URL without
    /// showing it (no request is made).
    #[cfg(feature = "object-store")]
    #[tokio::test]
    async fn object_store_urls_refuse_credentials() -> TestResult {
        for url in [
            "s3://bucket/locks?secret_access_key=hunter2",
            "az://container/locks?access_key=hunter2",
        ] {
            let err = connect(url)
                .await
                .err_or_fail("connecting to a refused URL")?;
            let shown = format!("{err} {err:?}");
            assert!(matches!(err, Error::InvalidUrl { .. }), "{url}: {shown}");
            assert!(shown.contains("environment"), "{url}: {shown}");
            assert!(!shown.contains("hunter2"), "{url}: {shown}");
        }
        Ok(())
    }

    /// Two clients of one file exclude each other and share its fence counter.
    #[cfg(feature = "sqlite")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sqlite_urls_share_a_file() -> TestResult {
        let dir = std::env::temp_dir().join(format!(
            "leasehold-connect-{}",
            leasehold_core::OwnerToken::generate()
                .or_fail("a generated owner token")?
                .to_hex()
        ));
        std::fs::create_dir_all(&dir).or_fail("creating the database directory")?;
        let url = format!("sqlite://{}?epoch=1", dir.join("locks.db").display());
        let a = connect(&url)
            .await
            .or_fail("connecting A to the sqlite URL")?;
        let b = connect(&url)
            .await
            .or_fail("connecting B to the sqlite URL")?;
        assert_eq!(a.capabilities().backend, "sqlite");
        let key = leasehold_core::LockKey::new("k").or_fail("the key `k`")?;
        let ttl = std::time::Duration::from_secs(5);
        let g = a
            .try_acquire(&key, ttl)
            .await
            .or_fail("A tries to acquire k")?
            .or_fail("A acquires k")?;
        assert_eq!(g.fence().epoch().get(), 1);
        assert!(b
            .try_acquire(&key, ttl)
            .await
            .or_fail("B tries to acquire k while A holds it")?
            .is_none());
        let _ = a.release(&g).await.or_fail("A releases k")?;
        let h = b
            .try_acquire(&key, ttl)
            .await
            .or_fail("B tries to acquire k after A released it")?
            .or_fail("B acquires k after A released it")?;
        assert!(h.fence() > g.fence());
        let _ = b.release(&h).await.or_fail("B releases k")?;
        let err = connect("sqlite://:memory:")
            .await
            .err_or_fail("connecting to sqlite://:memory:")?;
        assert!(matches!(err, Error::InvalidUrl { .. }), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
        Ok(())
    }
}
