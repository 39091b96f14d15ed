//! The PostgreSQL authority against a real PostgreSQL started by the harness: the whole
//! conformance suite with faults, PostgreSQL as the protected resource too, a crash while a lease
//! is held, guarded writes, and bad input.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use leasehold_conformance::harness_call;
use leasehold_conformance::scenarios::{self, run_all, run_selected};
use leasehold_conformance::{Connector, Context, Faults, ResourceFactory, Verdict};
use leasehold_core::{
    Authority, Error, FencedResource, Instant, Lease, LeaseOptions, LockKey, LostReason,
    OwnerToken, Released,
};
use leasehold_postgres::guarded::{Claimed, FencedTable, Guarded, PgFencedRegister};
use leasehold_postgres::PostgresAuthority;
use leasehold_servers::PostgresServer;

mod common;
mod suite;

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
        suite::revoke(&self.url, key).await
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
        .with_residue(Arc::new(suite::LiveRows(url.clone())))
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
/// session is really encrypted; without the CA, or trusting another CA, the certificate is
/// refused with a typed error. The certificates are made for this test (rcgen).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_through_the_url() {
    use leasehold_servers::TestCerts;
    let server = start().await;
    // Hand the server its certificate (readable by the server's user only) and turn TLS on.
    let certs = TestCerts::generate().unwrap();
    certs
        .copy_server_pair_to(server.data_dir(), "tls.crt", "tls.key")
        .unwrap();
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
    let ca = certs.ca().display().to_string();
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
    // Trusting another CA: refused too.
    let other = TestCerts::generate().unwrap();
    let wrong_ca = format!(
        "postgres://leasehold@localhost:{}/postgres?sslmode=verify-full&sslrootcert={}&timeout_ms=2000",
        server.port(),
        other.ca().display()
    );
    let err = PostgresAuthority::connect(&wrong_ca).await.unwrap_err();
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
}

// ---- proclaimed values and wait_for_change ------------------------------------------------------

/// The value a grant proclaims belongs to that grant: a later grant on the key starts with none,
/// a stale grant's proclaim is refused with `LeaseLost` and leaves the holder's value as it was,
/// a released key shows no value, and a value over the limit is refused before any request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proclaimed_value_belongs_to_its_grant() {
    let server = start().await;
    let url = url(&server);
    let (a, b) = (
        PostgresAuthority::connect(&url).await.unwrap(),
        PostgresAuthority::connect(&url).await.unwrap(),
    );
    a.migrate().await.unwrap();
    let key = LockKey::new("proclaim/owned").unwrap();
    let ttl = Duration::from_millis(400);
    let old = a.try_acquire(&key, ttl).await.unwrap().unwrap();
    a.proclaim(&old, b"old leader").await.unwrap();
    let seen = b.inspect(&key).await.unwrap();
    assert_eq!(seen.value.as_deref(), Some(&b"old leader"[..]), "{seen:?}");

    // The old grant runs out; the next one starts without a value.
    tokio::time::sleep(ttl + Duration::from_millis(100)).await;
    let new = b.try_acquire(&key, ttl * 10).await.unwrap().unwrap();
    assert!(new.fence() > old.fence());
    let seen = a.inspect(&key).await.unwrap();
    assert!(seen.held && seen.value.is_none(), "{seen:?}");

    // The stale grant cannot write over the new holder's value, nor set one where it has none.
    let err = a.proclaim(&old, b"stale").await.unwrap_err();
    assert!(
        matches!(
            &err,
            Error::LeaseLost {
                reason: LostReason::Refused,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(a.inspect(&key).await.unwrap().value.is_none());
    b.proclaim(&new, b"new leader").await.unwrap();
    let err = a.proclaim(&old, b"stale").await.unwrap_err();
    assert!(matches!(err, Error::LeaseLost { .. }), "{err:?}");
    let seen = a.inspect(&key).await.unwrap();
    assert_eq!(seen.value.as_deref(), Some(&b"new leader"[..]), "{seen:?}");
    assert_eq!(seen.fence, Some(new.fence()));

    // An owner token that never held the key is refused the same way.
    let forged = leasehold_core::Grant::new(
        key.clone(),
        OwnerToken::generate().unwrap(),
        new.fence(),
        ttl,
        Instant::now() + ttl,
    );
    let err = a.proclaim(&forged, b"forged").await.unwrap_err();
    assert!(matches!(err, Error::LeaseLost { .. }), "{err:?}");

    // Too long: refused before anything is sent; the value stays.
    let err = b
        .proclaim(&new, &vec![b'x'; leasehold_core::MAX_VALUE_LEN + 1])
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidConfig { .. }), "{err:?}");
    b.proclaim(&new, &vec![b'y'; leasehold_core::MAX_VALUE_LEN])
        .await
        .unwrap();
    assert_eq!(
        a.inspect(&key).await.unwrap().value.map(|v| v.len()),
        Some(leasehold_core::MAX_VALUE_LEN)
    );

    // Released: free, no value; the next grant (the same client's) starts without one too.
    let _ = b.release(&new).await.unwrap();
    let seen = a.inspect(&key).await.unwrap();
    assert!(!seen.held && seen.value.is_none(), "{seen:?}");
    let again = b.try_acquire(&key, ttl * 10).await.unwrap().unwrap();
    assert!(b.inspect(&key).await.unwrap().value.is_none());
    let err = b.proclaim(&new, b"released").await.unwrap_err();
    assert!(matches!(err, Error::LeaseLost { .. }), "{err:?}");
    let _ = b.release(&again).await.unwrap();
}

/// A lease table made by the version before proclaim (created here by hand with that version's
/// SQL, in a table of its own) keeps working for leases, waiting included (the statements fall
/// back to the forms before `waited_until`); inspect and proclaim fail with a clear
/// permanent error that says to run migrate; `migrate()` adds the columns in place, keeping the
/// rows (the live lease, its fence and the fence counter), and is idempotent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_of_the_previous_version_says_to_migrate_and_is_upgraded_in_place() {
    let server = start().await;
    let url = format!("{}&table=leases_v0", url(&server));
    let a = PostgresAuthority::connect(&url).await.unwrap();
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS \"leases_v0\" (
            lock_key   text        PRIMARY KEY,
            owner      text        NOT NULL,
            fence      bigint      NOT NULL CHECK (fence > 0),
            expires_at timestamptz NOT NULL
        ) WITH (fillfactor = 70)",
    )
    .execute(a.pool())
    .await
    .unwrap();
    let key = LockKey::new("upgrade/held").unwrap();
    let ttl = Duration::from_secs(30);
    // Leases work on the old table: their statements did not change.
    let first = a.try_acquire(&key, ttl).await.unwrap().unwrap();
    let _ = a.release(&first).await.unwrap();
    let held = a.try_acquire(&key, ttl).await.unwrap().unwrap();
    let renewed = a.renew(&held, ttl).await;
    assert!(renewed.is_ok(), "{renewed:?}");
    // Waiting works too: without `waited_until`, waiters mark nothing and releases always notify.
    let other = LockKey::new("upgrade/waited").unwrap();
    let waited = a
        .acquire(&other, ttl, Duration::from_secs(1))
        .await
        .unwrap();
    a.wait_for_change(&other, Duration::from_millis(50))
        .await
        .unwrap();
    let _ = a.release(&waited).await.unwrap();

    for err in [
        a.inspect(&key).await.unwrap_err(),
        a.proclaim(&held, b"v").await.unwrap_err(),
    ] {
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
        let text = err.to_string();
        assert!(
            text.contains("migrate()") && text.contains("leases_v0"),
            "{text}"
        );
    }

    a.migrate().await.unwrap();
    let seen = a.inspect(&key).await.unwrap();
    assert!(seen.held && seen.value.is_none(), "{seen:?}");
    assert_eq!(seen.fence, Some(held.fence()));
    a.proclaim(&held, b"after migrate").await.unwrap();
    assert_eq!(
        a.inspect(&key).await.unwrap().value.as_deref(),
        Some(&b"after migrate"[..])
    );
    // Idempotent, by migrate and by the published SQL, and leaves the value in place.
    a.migrate().await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(leasehold_postgres::schema_sql(
        a.table(),
    )))
    .execute(a.pool())
    .await
    .unwrap();
    assert_eq!(
        a.inspect(&key).await.unwrap().value.as_deref(),
        Some(&b"after migrate"[..])
    );
    let _ = a.release(&held).await.unwrap();
    let next = a.try_acquire(&key, ttl).await.unwrap().unwrap();
    assert!(next.fence() > held.fence() && held.fence() > first.fence());
    let _ = a.release(&next).await.unwrap();
}

/// A process that fell back to the previous statements (its table lacked `waited_until`) goes
/// back to the current ones once `migrate()` has run in another process: its waiter marks the
/// key again, so the other process's release, which notifies only a marked key, wakes it long
/// before the holder's expiry. Kept on the previous statements, it marked nothing and slept
/// until the holder's TTL ran out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_on_the_previous_statements_returns_to_the_current_after_migrate_elsewhere(
) -> Result<(), String> {
    let server = start().await;
    let url = format!("{}&table=leases_v1", url(&server));
    let old = PostgresAuthority::connect(&url)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    sqlx::query(
        "CREATE TABLE \"leases_v1\" (
            lock_key   text        PRIMARY KEY,
            owner      text        NOT NULL,
            fence      bigint      NOT NULL CHECK (fence > 0),
            expires_at timestamptz NOT NULL
        ) WITH (fillfactor = 70)",
    )
    .execute(old.pool())
    .await
    .map_err(|e| format!("creating the previous version's table: {e}"))?;
    let ttl = Duration::from_secs(20);
    // A release is the first statement that needs `waited_until`: this process falls back.
    let first = LockKey::new("returns/first").map_err(|e| e.to_string())?;
    let g = old
        .try_acquire(&first, ttl)
        .await
        .map_err(|e| format!("acquire on the old table: {e}"))?
        .ok_or("a fresh key was held")?;
    if old
        .release(&g)
        .await
        .map_err(|e| format!("release on the old table: {e}"))?
        != Released::Released
    {
        return Err("the lease on the old table was gone before its release".into());
    }
    // Another process upgrades the table and holds a key the first one waits for.
    let new = PostgresAuthority::connect(&url)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    new.migrate().await.map_err(|e| format!("migrate: {e}"))?;
    let k = LockKey::new("returns/handoff").map_err(|e| e.to_string())?;
    let held = new
        .try_acquire(&k, ttl)
        .await
        .map_err(|e| format!("acquire after migrate: {e}"))?
        .ok_or("a fresh key was held")?;
    let waiter = {
        let (old, k) = (old.clone(), k.clone());
        tokio::spawn(async move { old.acquire(&k, ttl, ttl).await })
    };
    let started = Instant::now();
    loop {
        let marked: Option<bool> = sqlx::query_scalar(
            "SELECT waited_until > statement_timestamp() FROM leases_v1 WHERE lock_key = $1",
        )
        .bind(k.as_str())
        .fetch_optional(new.pool())
        .await
        .map_err(|e| format!("reading the mark: {e}"))?
        .flatten();
        if marked == Some(true) {
            break;
        }
        if started.elapsed() > ttl / 4 {
            return Err(format!(
                "the waiter never marked the key in {:?}: it still sends the previous statements",
                started.elapsed()
            ));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let released_at = Instant::now();
    if new
        .release(&held)
        .await
        .map_err(|e| format!("release: {e}"))?
        != Released::Released
    {
        return Err("the holder's lease was gone before its release".into());
    }
    let grant = tokio::time::timeout(ttl / 4, waiter)
        .await
        .map_err(|_| "the release did not reach the waiter within TTL/4".to_string())?
        .map_err(|e| format!("the waiter's task: {e}"))?
        .map_err(|e| format!("the waiter: {e}"))?;
    println!("hand-off {:?} after the release", released_at.elapsed());
    if grant.fence() <= held.fence() {
        return Err(format!("fence {} after {}", grant.fence(), held.fence()));
    }
    if old
        .release(&grant)
        .await
        .map_err(|e| format!("release: {e}"))?
        != Released::Released
    {
        return Err("the waiter's lease was gone before its release".into());
    }
    Ok(())
}

/// `wait_for_change` is woken by the key's proclaim and release through another client (by
/// NOTIFY, long before its bound), not by another key's; it returns at `max_wait` when nothing
/// happens, and `Duration::MAX` waits without panicking and can be dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_for_change_is_woken_by_proclaim_and_release() {
    let server = start().await;
    let url = url(&server);
    let holder = PostgresAuthority::connect(&url).await.unwrap();
    holder.migrate().await.unwrap();
    let observer = Arc::new(PostgresAuthority::connect(&url).await.unwrap());
    let key = LockKey::new("wait/changes").unwrap();
    let other = LockKey::new("wait/other").unwrap();
    let ttl = Duration::from_secs(30);
    let long = Duration::from_secs(20);

    // Nothing happens: back at max_wait. This also starts the observer's listener.
    let started = Instant::now();
    observer
        .wait_for_change(&key, Duration::from_millis(300))
        .await
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(2));
    tokio::time::sleep(Duration::from_millis(500)).await;

    let g = holder.try_acquire(&key, ttl).await.unwrap().unwrap();
    let elsewhere = holder.try_acquire(&other, ttl).await.unwrap().unwrap();
    let waiting = |key: LockKey| {
        let observer = observer.clone();
        tokio::spawn(async move {
            observer.wait_for_change(&key, long).await.unwrap();
            Instant::now()
        })
    };

    // Another key's proclaim does not wake it; this key's does.
    let w = waiting(key.clone());
    tokio::time::sleep(Duration::from_millis(300)).await;
    holder.proclaim(&elsewhere, b"elsewhere").await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!w.is_finished(), "woken by another key's proclaim");
    let sent = Instant::now();
    holder.proclaim(&g, b"here").await.unwrap();
    let woken = tokio::time::timeout(Duration::from_secs(5), w)
        .await
        .expect("a proclaim wakes wait_for_change")
        .unwrap();
    assert!(woken - sent < Duration::from_secs(2), "{:?}", woken - sent);

    // A release wakes it.
    let w = waiting(key.clone());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!w.is_finished(), "woken with nothing changed");
    let sent = Instant::now();
    let _ = holder.release(&g).await.unwrap();
    let woken = tokio::time::timeout(Duration::from_secs(5), w)
        .await
        .expect("a release wakes wait_for_change")
        .unwrap();
    assert!(woken - sent < Duration::from_secs(2), "{:?}", woken - sent);

    // No bound: no panic, still waiting, and dropping it is fine. (Read first, as callers do:
    // a wait after a change this client has not read returns at once.)
    assert!(!observer.inspect(&key).await.unwrap().held);
    let forever = tokio::time::timeout(
        Duration::from_millis(300),
        observer.wait_for_change(&key, Duration::MAX),
    )
    .await;
    assert!(forever.is_err(), "returned with nothing changed");
    let _ = holder.release(&elsewhere).await.unwrap();
}

/// A release announces itself (NOTIFY, which PostgreSQL delivers by signalling every
/// listening server process) only when a waiter marked the key, so an uncontended acquire and
/// release costs the bare pair. Nobody waits: neither form of acquire nor the release sends a
/// notification, even while another client listens. A waiter in another client marks the key
/// and the release wakes it by notification, far sooner than its fallback timer (the holder's
/// 30 s TTL) could.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_notifies_only_when_somebody_waits() {
    let server = start().await;
    let url = url(&server);
    let a = PostgresAuthority::connect(&url).await.unwrap();
    a.migrate().await.unwrap();
    let b = Arc::new(PostgresAuthority::connect(&url).await.unwrap());
    let mut heard = sqlx::postgres::PgListener::connect(&server.url())
        .await
        .unwrap();
    heard.listen("leasehold_release").await.unwrap();
    let key = LockKey::new("notify/only-when-waited").unwrap();
    let ttl = Duration::from_secs(30);
    // b's listener is up too: a release with nobody waiting has nobody to wake either way.
    b.wait_for_change(
        &LockKey::new("notify/elsewhere").unwrap(),
        Duration::from_millis(100),
    )
    .await
    .unwrap();

    let waited = a.acquire(&key, ttl, Duration::from_secs(1)).await.unwrap();
    let _ = a.release(&waited).await.unwrap();
    let tried = a.try_acquire(&key, ttl).await.unwrap().unwrap();
    let _ = a.release(&tried).await.unwrap();
    // NOTIFY is delivered at commit, before the release returns: 500 ms is ample.
    let none = tokio::time::timeout(Duration::from_millis(500), heard.recv()).await;
    assert!(
        none.is_err(),
        "a release nobody waited for notified: {none:?}"
    );

    let held = a.try_acquire(&key, ttl).await.unwrap().unwrap();
    let waiter = {
        let (b, key) = (b.clone(), key.clone());
        tokio::spawn(async move {
            let grant = b.acquire(&key, ttl, Duration::from_secs(20)).await.unwrap();
            (Instant::now(), grant)
        })
    };
    // The waiter's waiting form marks the key (after its first attempt, the plain upsert).
    wait_for_mark(a.pool(), &key, Duration::from_secs(10)).await;
    let sent = Instant::now();
    let _ = a.release(&held).await.unwrap();
    let note = tokio::time::timeout(Duration::from_secs(5), heard.recv())
        .await
        .expect("a release somebody waits for notifies")
        .unwrap();
    assert_eq!(note.payload(), format!("leasehold_leases {}", key.as_str()));
    let (took, grant) = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter holds long before its timer")
        .unwrap();
    assert!(took - sent < Duration::from_secs(5), "{:?}", took - sent);
    assert!(grant.fence() > held.fence());
    let _ = b.release(&grant).await.unwrap();
}

/// Waits (at most `within`) until a waiter's mark on `key` is in the future.
async fn wait_for_mark(pool: &sqlx::PgPool, key: &LockKey, within: Duration) {
    let started = Instant::now();
    loop {
        let mark: Option<bool> = sqlx::query_scalar(
            "SELECT waited_until > statement_timestamp() FROM leasehold_leases WHERE lock_key = $1",
        )
        .bind(key.as_str())
        .fetch_optional(pool)
        .await
        .unwrap()
        .flatten();
        if mark == Some(true) {
            return;
        }
        assert!(
            started.elapsed() < within,
            "the waiter never marked the key"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Backends whose `application_name` is like `app` and whose last statement was `LISTEN`, or
/// the listener's periodic check that it still answers (every `listen_check_ms`).
async fn listening(pool: &sqlx::PgPool, app: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE $1 \
         AND (query LIKE 'LISTEN%' OR query = 'SELECT ''leasehold listener''')",
    )
    .bind(app)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// An `acquire` that finds the key free takes it with the plain upsert, as `try_acquire` does,
/// and opens no listening connection: the waiting form (which marks a held key) and LISTEN are
/// for a key that is held. With them, an uncontended `acquire()` pair cost 1.10x
/// `try_acquire()`'s on one core, and every listening server process is signalled
/// by every notification in the database. An authority that has to wait listens (the control:
/// it started after the other's acquires, so the other's listener, had one been started,
/// would be up first).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_that_need_not_wait_does_not_listen() {
    let server = start().await;
    let with_app = |app: &str| format!("{}&application_name={app}", url(&server));
    let uncontended = PostgresAuthority::connect(&with_app("uncontended"))
        .await
        .unwrap();
    uncontended.migrate().await.unwrap();
    let key = LockKey::new("unheard/free").unwrap();
    for _ in 0..3 {
        let grant = uncontended
            .acquire(&key, Duration::from_secs(5), Duration::from_secs(1))
            .await
            .unwrap();
        let _ = uncontended.release(&grant).await.unwrap();
    }

    let waiting = Arc::new(
        PostgresAuthority::connect(&with_app("waiting"))
            .await
            .unwrap(),
    );
    let held = uncontended
        .try_acquire(&key, Duration::from_secs(5))
        .await
        .unwrap()
        .unwrap();
    let waiter = {
        let (waiting, key) = (waiting.clone(), key.clone());
        tokio::spawn(async move {
            waiting
                .acquire(&key, Duration::from_secs(5), Duration::from_secs(10))
                .await
        })
    };
    let up = Instant::now();
    while listening(uncontended.pool(), "waiting").await == 0 {
        assert!(
            up.elapsed() < Duration::from_secs(5),
            "the waiter never listened"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        listening(uncontended.pool(), "uncontended").await,
        0,
        "an acquire that found its key free started a listening connection"
    );
    let _ = uncontended.release(&held).await.unwrap();
    let grant = waiter.await.unwrap().unwrap();
    assert!(grant.fence() > held.fence());
    let _ = waiting.release(&grant).await.unwrap();
}

/// A release nobody had marked is announced to nobody, so a waiter must not sleep through it:
/// * a release that commits while a waiter's attempt is blocked on the row (its statement's
///   snapshot still shows the old holder, 30 s from expiry) makes the attempt time its next look
///   by the newest row, and the waiter holds within seconds. The blocked attempt is the
///   waiter's form (it marks the key): the waiter has looked once and marked the key, and a
///   notification (as a proclaim sends) has it look again while an operator holds the row;
/// * a release between an observer's read and its `wait_for_change` returns that wait at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_nobody_announced_is_not_slept_through() {
    let server = start().await;
    let url = url(&server);
    let a = PostgresAuthority::connect(&url).await.unwrap();
    a.migrate().await.unwrap();
    // The waiter's attempt stays blocked on the row until the operator commits: its requests
    // may take longer than the other clients' second.
    let b = Arc::new(
        PostgresAuthority::connect(&url.replace("timeout_ms=1000", "timeout_ms=30000"))
            .await
            .unwrap(),
    );
    let ttl = Duration::from_secs(30);
    // b's listener is up first: when it starts listening it wakes every waiter to look again,
    // which would hide what this test is after.
    b.wait_for_change(
        &LockKey::new("race/elsewhere").unwrap(),
        Duration::from_millis(300),
    )
    .await
    .unwrap();
    let up = Instant::now();
    loop {
        if listening(a.pool(), "%").await > 0 {
            break;
        }
        assert!(
            up.elapsed() < Duration::from_secs(10),
            "b's listener never started"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let key = LockKey::new("race/attempt").unwrap();
    let _held = a.try_acquire(&key, ttl).await.unwrap().unwrap();
    let waiter = {
        let (b, key) = (b.clone(), key.clone());
        tokio::spawn(async move { b.acquire(&key, ttl, Duration::from_secs(20)).await })
    };
    // The waiter has marked the key, and sleeps until the holder's 30 s are up.
    wait_for_mark(a.pool(), &key, Duration::from_secs(10)).await;
    // An operator's transaction holds the row, and a notification on the key has the waiter
    // look again: its attempt blocks on the row, its snapshot showing the holder's 30 s.
    let mut tx = a.pool().begin().await.unwrap();
    sqlx::query("SELECT 1 FROM leasehold_leases WHERE lock_key = $1 FOR UPDATE")
        .bind(key.as_str())
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query("SELECT pg_notify('leasehold_release', 'leasehold_leases ' || $1)")
        .bind(key.as_str())
        .execute(a.pool())
        .await
        .unwrap();
    let blocked = Instant::now();
    loop {
        let waiting: i64 = sqlx::query_scalar(
            // The waiting form of the attempt: the upsert that takes the key or marks it.
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
             AND query LIKE 'INSERT INTO %' AND query LIKE '%waited_until = CASE%'",
        )
        .fetch_one(a.pool())
        .await
        .unwrap();
        if waiting > 0 {
            break;
        }
        assert!(
            blocked.elapsed() < Duration::from_secs(10),
            "the attempt never blocked"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The lease ends in that transaction, after the attempt's snapshot, with no notification.
    sqlx::query(
        "UPDATE leasehold_leases SET expires_at = statement_timestamp() WHERE lock_key = $1",
    )
    .bind(key.as_str())
    .execute(&mut *tx)
    .await
    .unwrap();
    let ended = Instant::now();
    tx.commit().await.unwrap();
    let grant = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter slept through a release it could not hear")
        .unwrap()
        .unwrap();
    assert!(ended.elapsed() < Duration::from_secs(10));
    let _ = b.release(&grant).await.unwrap();

    let key = LockKey::new("race/observer").unwrap();
    let held = a.try_acquire(&key, ttl).await.unwrap().unwrap();
    assert!(b.inspect(&key).await.unwrap().held);
    let _ = a.release(&held).await.unwrap();
    let started = Instant::now();
    b.wait_for_change(&key, Duration::from_secs(20))
        .await
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "a release between the read and the wait was slept through: {:?}",
        started.elapsed()
    );
    // Nothing changed since: the next wait waits.
    let quiet = tokio::time::timeout(
        Duration::from_millis(500),
        b.wait_for_change(&key, Duration::from_secs(20)),
    )
    .await;
    assert!(quiet.is_err(), "returned with nothing changed");
}

/// One statement renews a batch. A grant released behind its back and a stale grant
/// (its key since taken by another client) are refused, each alone; the others in the same batch
/// are renewed to their full TTL, by the database's clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renew_many_renews_a_batch_and_refuses_only_what_is_not_ours() {
    let server = start().await;
    let url = url(&server);
    let (a, b) = (
        PostgresAuthority::connect(&url).await.unwrap(),
        PostgresAuthority::connect(&url).await.unwrap(),
    );
    a.migrate().await.unwrap();
    assert!(a.capabilities().batch_renewal);
    let short = Duration::from_millis(300);
    let long = Duration::from_secs(20);
    let mut grants = Vec::new();
    for i in 0..5 {
        let key = LockKey::new(format!("batch/{i}")).unwrap();
        let ttl = if i == 3 { short } else { long };
        grants.push(a.try_acquire(&key, ttl).await.unwrap().unwrap());
    }
    let _ = a.release(&grants[1]).await.unwrap();
    tokio::time::sleep(short + Duration::from_millis(100)).await;
    let taken = b
        .try_acquire(grants[3].key(), long)
        .await
        .unwrap()
        .expect("grant 3 ran out");
    let results = a.renew_many(&grants).await;
    assert_eq!(results.len(), 5);
    for (i, result) in results.iter().enumerate() {
        match i {
            1 | 3 => assert!(
                matches!(
                    result,
                    Err(Error::LeaseLost {
                        reason: LostReason::Refused,
                        ..
                    })
                ),
                "grant {i}: {result:?}"
            ),
            _ => {
                let deadline = *result.as_ref().unwrap();
                assert!(deadline > Instant::now() + long / 2, "grant {i}");
                let seen = b.inspect(grants[i].key()).await.unwrap();
                assert!(
                    seen.held && seen.remaining.unwrap() > long - Duration::from_secs(2),
                    "grant {i}: {seen:?}"
                );
            }
        }
    }
    // The new holder of key 3 kept its own lease, untouched by the stale grant in the batch.
    let seen = a.inspect(taken.key()).await.unwrap();
    assert_eq!(seen.fence, Some(taken.fence()));
}
