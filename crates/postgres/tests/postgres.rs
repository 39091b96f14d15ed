//! The PostgreSQL authority against a real PostgreSQL started by the harness: the whole
//! conformance suite with faults, PostgreSQL as the protected resource too, a crash while a lease
//! is held, guarded writes, and bad input.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use leasehold_conformance::scenarios::{self, run_all, run_selected};
use leasehold_conformance::{harness_call, harness_error};
use leasehold_conformance::{Connector, Context, Faults, Residue, ResourceFactory, Verdict};
use leasehold_core::{
    Authority, Error, FencedResource, Instant, Lease, LeaseOptions, LockKey, LostReason, OwnerToken,
};
use leasehold_postgres::guarded::{Claimed, FencedTable, Guarded, PgFencedRegister};
use leasehold_postgres::PostgresAuthority;
use leasehold_servers::PostgresServer;

mod common;

use common::{start, url};

struct Clients(String);

#[async_trait]
impl Connector for Clients {
    async fn connect(&self) -> leasehold_core::Result<Arc<dyn Authority>> {
        Ok(Arc::new(PostgresAuthority::connect(&self.0).await?))
    }
}

/// Crash, freeze and operator faults on the harness's server.
struct PgFaults {
    server: Arc<PostgresServer>,
    url: String,
}

impl PgFaults {
    async fn blocking(
        &self,
        f: impl FnOnce(&PostgresServer) -> leasehold_servers::Result<()> + Send + 'static,
    ) -> leasehold_core::Result<()> {
        let server = self.server.clone();
        harness_call(move || f(&server)).await
    }
}

#[async_trait]
impl Faults for PgFaults {
    async fn restart(&self) -> leasehold_core::Result<()> {
        self.blocking(|s| s.restart()).await
    }

    async fn pause(&self) -> leasehold_core::Result<()> {
        self.blocking(|s| s.pause()).await
    }

    async fn resume(&self) -> leasehold_core::Result<()> {
        self.blocking(|s| s.resume()).await
    }

    /// An operator ends the lease by hand (keeping the row, so the fence counter survives).
    async fn revoke(&self, key: &LockKey) -> leasehold_core::Result<()> {
        let admin = PostgresAuthority::connect(&self.url).await?;
        sqlx::query(
            "UPDATE leasehold_leases SET expires_at = statement_timestamp() WHERE lock_key = $1",
        )
        .bind(key.as_str())
        .execute(admin.pool())
        .await
        .map_err(harness_error)?;
        Ok(())
    }
}

/// What is left for a key: a live lease row (the row itself, with its fence counter, stays on
/// purpose).
struct PgResidue(String);

#[async_trait]
impl Residue for PgResidue {
    async fn leftovers(&self, key: &LockKey) -> leasehold_core::Result<Vec<String>> {
        let admin = PostgresAuthority::connect(&self.0).await?;
        let live: Vec<(i64, String)> = sqlx::query_as(
            "SELECT fence, owner FROM leasehold_leases \
             WHERE lock_key = $1 AND expires_at > statement_timestamp()",
        )
        .bind(key.as_str())
        .fetch_all(admin.pool())
        .await
        .map_err(harness_error)?;
        Ok(live
            .into_iter()
            .map(|(fence, owner)| format!("a live lease row: fence {fence}, owner {owner}"))
            .collect())
    }
}

struct PgRegisters(sqlx::PgPool);

#[async_trait]
impl ResourceFactory for PgRegisters {
    async fn resource(&self) -> leasehold_core::Result<Arc<dyn FencedResource>> {
        let id = OwnerToken::generate()?.to_hex();
        Ok(Arc::new(
            PgFencedRegister::create(&self.0, "conformance_register", &id).await?,
        ))
    }
}

/// With `LEASEHOLD_POSTGRES_URL` set (external mode, e.g. docker compose), the suite runs against
/// that server without faults, which then show as not applicable; otherwise against a managed one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_the_conformance_suite_with_faults() {
    if let Some(external) = leasehold_servers::external::postgres_url() {
        let sep = if external.contains('?') { '&' } else { '?' };
        let url = format!("{external}{sep}timeout_ms=1000");
        PostgresAuthority::connect(&url)
            .await
            .unwrap()
            .migrate()
            .await
            .unwrap();
        let ctx = Context::new(Arc::new(Clients(url))).await.unwrap();
        let report = run_all("postgres (external)", &ctx).await;
        println!("{report}");
        report.assert_passed();
        return;
    }
    let server = start().await;
    let url = url(&server);
    PostgresAuthority::connect(&url)
        .await
        .unwrap()
        .migrate()
        .await
        .unwrap();
    let ctx = Context::new(Arc::new(Clients(url.clone())))
        .await
        .unwrap()
        .with_residue(Arc::new(PgResidue(url.clone())))
        .with_faults(Arc::new(PgFaults { server, url }));
    let report = run_all("postgres", &ctx).await;
    println!("{report}");
    report.assert_passed();
    for line in &report.lines {
        // Only failover needs a standby this harness does not run for PostgreSQL.
        if line.scenario != "fences_survive_failover" {
            assert_eq!(
                line.outcome,
                Ok(Verdict::Passed),
                "{}:\n{report}",
                line.scenario
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_writes_are_refused_by_a_postgres_resource() {
    let server = start().await;
    let url = url(&server);
    let admin = PostgresAuthority::connect(&url).await.unwrap();
    admin.migrate().await.unwrap();
    let ctx = Context::new(Arc::new(Clients(url)))
        .await
        .unwrap()
        .with_resources(Arc::new(PgRegisters(admin.pool().clone())));
    let selected: Vec<_> = scenarios::all()
        .into_iter()
        .filter(|s| s.name.starts_with("stale_write") || s.name == "contention")
        .collect();
    assert_eq!(selected.len(), 3);
    let report = run_selected("postgres, resource in postgres", &ctx, &selected).await;
    println!("{report}");
    assert!(
        report
            .lines
            .iter()
            .all(|l| l.outcome == Ok(Verdict::Passed)),
        "{report}"
    );
}

/// Kill PostgreSQL while a lease is held: the holder's renewal fails and `lost()` fires by its
/// deadline; after the restart the key is free within a TTL, and fences are greater than every
/// fence before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_while_held_loses_the_lease_and_keeps_the_fence_counter() {
    let server = start().await;
    let url = url(&server);
    let a = Arc::new(PostgresAuthority::connect(&url).await.unwrap());
    a.migrate().await.unwrap();
    let key = LockKey::new("crash-while-held").unwrap();
    let ttl = Duration::from_millis(1500);
    let first = a.try_acquire(&key, ttl).await.unwrap().unwrap();
    let _ = a.release(&first).await.unwrap();
    let lease = Lease::try_acquire(a.clone(), &key, ttl, LeaseOptions::default())
        .await
        .unwrap()
        .unwrap();
    let held_fence = lease.fence();
    let deadline = lease.deadline();
    {
        let s = server.clone();
        tokio::task::spawn_blocking(move || s.kill())
            .await
            .unwrap()
            .unwrap();
    }
    let reason = tokio::time::timeout_at(deadline + Duration::from_millis(500), lease.lost())
        .await
        .expect("lost() must fire by the deadline while the server is down");
    assert!(
        matches!(
            reason,
            LostReason::RenewalFailed(_) | LostReason::DeadlinePassed
        ),
        "{reason:?}"
    );
    assert!(lease.ensure_valid().is_err());
    {
        let s = server.clone();
        tokio::task::spawn_blocking(move || s.restart())
            .await
            .unwrap()
            .unwrap();
    }
    let b = PostgresAuthority::connect(&url).await.unwrap();
    let restarted = Instant::now();
    let after = loop {
        if let Some(g) = b.try_acquire(&key, ttl).await.unwrap() {
            break g;
        }
        assert!(
            restarted.elapsed() < ttl * 2,
            "the key stayed held after the restart beyond the TTL"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        after.fence() > held_fence,
        "{} after the crash, {} before",
        after.fence(),
        held_fence
    );
    assert!(held_fence > first.fence());
    drop(lease);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guarded_updates_tell_stale_from_precondition_from_missing() {
    // The guarded statements run in this task, on this thread: its recorder sees them.
    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _recording = metrics::set_default_local_recorder(&recorder);
    let server = start().await;
    let a = PostgresAuthority::connect(&url(&server)).await.unwrap();
    let pool = a.pool().clone();
    sqlx::query(
        "CREATE TABLE invoices (id text PRIMARY KEY, state text NOT NULL, paid_by text, \
         last_fence bigint NOT NULL DEFAULT 0)",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query("INSERT INTO invoices (id, state) VALUES ('inv_1', 'open')")
        .execute(&pool)
        .await
        .unwrap();
    a.migrate().await.unwrap();
    let key = LockKey::new("invoice:inv_1").unwrap();
    let ttl = Duration::from_secs(5);
    let old = a.try_acquire(&key, ttl).await.unwrap().unwrap();
    let _ = a.release(&old).await.unwrap();
    let new = a.try_acquire(&key, ttl).await.unwrap().unwrap();
    let invoices = FencedTable::new("invoices", "id").unwrap();
    let mut tx = pool.begin().await.unwrap();

    let claimed: Claimed<(String, i64)> = invoices
        .claim(&mut tx, "inv_1", new.fence(), "state, last_fence")
        .await
        .unwrap();
    assert_eq!(
        claimed,
        Claimed::Claimed(("open".to_string(), new.fence().as_i64()))
    );
    let stale: Claimed<(String,)> = invoices
        .claim(&mut tx, "inv_1", old.fence(), "state")
        .await
        .unwrap();
    assert_eq!(
        stale,
        Claimed::Stale {
            newest: new.fence().value()
        }
    );
    let missing: Claimed<(String,)> = invoices
        .claim(&mut tx, "inv_404", new.fence(), "state")
        .await
        .unwrap();
    assert_eq!(missing, Claimed::Missing);

    let pay = |who: &'static str| {
        move |q: sqlx::query::Query<'static, sqlx::Postgres, sqlx::postgres::PgArguments>| {
            q.bind(who)
        }
    };
    let set = "state = 'paid', paid_by = $3";
    assert_eq!(
        invoices
            .update(
                &mut tx,
                "inv_1",
                old.fence(),
                set,
                "state = 'open'",
                pay("old")
            )
            .await
            .unwrap(),
        Guarded::Stale {
            newest: new.fence().value()
        }
    );
    assert_eq!(
        invoices
            .update(
                &mut tx,
                "inv_1",
                new.fence(),
                set,
                "state = 'open'",
                pay("new")
            )
            .await
            .unwrap(),
        Guarded::Applied
    );
    assert_eq!(
        invoices
            .update(
                &mut tx,
                "inv_1",
                new.fence(),
                set,
                "state = 'open'",
                pay("again")
            )
            .await
            .unwrap(),
        Guarded::PreconditionFailed
    );
    assert_eq!(
        invoices
            .update(&mut tx, "inv_404", new.fence(), set, "true", pay("x"))
            .await
            .unwrap(),
        Guarded::Missing
    );
    tx.commit().await.unwrap();
    let paid_by: String = sqlx::query_scalar("SELECT paid_by FROM invoices WHERE id = 'inv_1'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(paid_by, "new");
    // Two stale holders caught (the old claim and the old update); a missing row or a failed
    // precondition is not a stale fence.
    let rejected: u64 = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(k, _, _, _)| {
            k.key().name() == "leasehold_fence_rejections_total"
                && k.key()
                    .labels()
                    .any(|l| l.key() == "resource" && l.value() == "postgres_table")
        })
        .map(|(_, _, _, v)| match v {
            metrics_util::debugging::DebugValue::Counter(n) => n,
            other => panic!("not a counter: {other:?}"),
        })
        .sum();
    assert_eq!(rejected, 2);
    assert!(FencedTable::new("invoices; drop table x", "id").is_err());
    assert!(FencedTable::new("invoices", "id")
        .unwrap()
        .with_fence_column("a.b")
        .is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_typed_errors() {
    let server = tokio::task::spawn_blocking(|| PostgresServer::start_with_password("s3cret-pw"))
        .await
        .unwrap()
        .unwrap();
    // The right password works; a wrong one is Unauthorized and never printed.
    let good = format!("{}?timeout_ms=2000", server.url_with_password("s3cret-pw"));
    let a = PostgresAuthority::connect(&good).await.unwrap();
    let wrong = format!(
        "{}?timeout_ms=2000",
        server.url_with_password("hunter2-wrong")
    );
    let err = PostgresAuthority::connect(&wrong).await.unwrap_err();
    assert!(matches!(err, Error::Unauthorized { .. }), "{err:?}");
    assert!(
        !format!("{err} {err:?} {a:?}").contains("hunter2") && !format!("{a:?}").contains("s3cret")
    );

    // A missing table, before migrate(): a clear permanent error that says what to do.
    let key = LockKey::new("k").unwrap();
    let err = a
        .try_acquire(&key, Duration::from_secs(1))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Backend {
                retryable: false,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("migrate()"), "{err}");

    // An invalid table name never reaches the server.
    let err = PostgresAuthority::connect(&format!("{good}&table=x;drop"))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidConfig { .. }), "{err:?}");

    // An unreachable server: Unavailable within the timeout, retryable.
    let port = leasehold_servers::free_port().unwrap();
    let started = Instant::now();
    let err = PostgresAuthority::connect(&format!(
        "postgres://leasehold@127.0.0.1:{port}/postgres?timeout_ms=500"
    ))
    .await
    .unwrap_err();
    assert!(
        matches!(err, Error::Unavailable { .. }) && err.is_retryable(),
        "{err:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "took {:?}",
        started.elapsed()
    );

    // After migrate() the same client works; TTLs out of range are InvalidTtl.
    a.migrate().await.unwrap();
    a.migrate().await.unwrap();
    assert!(a
        .try_acquire(&key, Duration::from_secs(1))
        .await
        .unwrap()
        .is_some());
    let err = a
        .try_acquire(&key, Duration::from_micros(1500))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidTtl { .. }), "{err:?}");
}

/// TLS through the URL: `sslmode=verify-full` with the CA from `sslrootcert` connects and the
/// session is really encrypted; without the CA the certificate is refused with a typed error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_through_the_url() {
    use leasehold_servers::test_tls_file;
    let server = start().await;
    // Hand the server the test certificate (readable by the server's user only) and turn TLS on.
    let data = server.data_dir().to_path_buf();
    let owner = std::fs::metadata(&data)
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m))
        .unwrap();
    let group = std::fs::metadata(&data)
        .map(|m| std::os::unix::fs::MetadataExt::gid(&m))
        .unwrap();
    for (from, to) in [("server.pem", "tls.crt"), ("server.key", "tls.key")] {
        let dest = data.join(to);
        std::fs::copy(test_tls_file(from), &dest).unwrap();
        std::os::unix::fs::chown(&dest, Some(owner), Some(group)).unwrap();
        std::fs::set_permissions(&dest, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .unwrap();
    }
    let admin = PostgresAuthority::connect(&url(&server)).await.unwrap();
    for setting in [
        "ALTER SYSTEM SET ssl_cert_file = 'tls.crt'",
        "ALTER SYSTEM SET ssl_key_file = 'tls.key'",
        "ALTER SYSTEM SET ssl = on",
    ] {
        sqlx::query(setting).execute(admin.pool()).await.unwrap();
    }
    sqlx::query("SELECT pg_reload_conf()")
        .execute(admin.pool())
        .await
        .unwrap();
    let ca = test_tls_file("ca.pem").display().to_string();
    let tls_url = format!(
        "postgres://leasehold@localhost:{}/postgres?sslmode=verify-full&sslrootcert={ca}&timeout_ms=2000",
        server.port()
    );
    // The reload is asynchronous: give the postmaster a moment, bounded.
    let started = Instant::now();
    let tls = loop {
        match PostgresAuthority::connect(&tls_url).await {
            Ok(a) => break a,
            Err(_) if started.elapsed() < Duration::from_secs(5) => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("TLS connection failed: {e:?}"),
        }
    };
    let encrypted: bool =
        sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
            .fetch_one(tls.pool())
            .await
            .unwrap();
    assert!(encrypted, "the session is not encrypted");
    tls.migrate().await.unwrap();
    let key = LockKey::new("tls").unwrap();
    let g = tls
        .try_acquire(&key, Duration::from_secs(1))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        tls.release(&g).await.unwrap(),
        leasehold_core::Released::Released
    );

    // Without the CA, the server's certificate is not trusted.
    let untrusted = format!(
        "postgres://leasehold@localhost:{}/postgres?sslmode=verify-full&timeout_ms=2000",
        server.port()
    );
    let err = PostgresAuthority::connect(&untrusted).await.unwrap_err();
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
}
