//! Connecting to PostgreSQL, each against a real server started by the harness: bad input and
//! a wrong password get typed errors, TLS is configured through the URL, a password in the
//! query string is used and never printed, and fences declare what the connected server promises.

use std::time::Duration;

use leasehold_core::{Authority, Error, FenceSafety, Instant, Released};
use leasehold_postgres::PostgresAuthority;
use leasehold_servers::PostgresServer;

mod common;

use common::{connect, exec, key, start_server, url, OrFail, Result};

/// The error of a call that must fail, or a failure naming `what` succeeded.
fn refused<T>(what: &str, result: leasehold_core::Result<T>) -> Result<Error> {
    match result {
        Ok(_) => Err(format!("{what}: succeeded").into()),
        Err(e) => Ok(e),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_typed_errors() -> Result {
    let server = tokio::task::spawn_blocking(|| PostgresServer::start_with_password("s3cret-pw"))
        .await
        .or_fail("the harness task")?
        .or_fail("PostgreSQL with a password must start")?;
    // The right password works; a wrong one is Unauthorized and never printed.
    let good = format!("{}?timeout_ms=2000", server.url_with_password("s3cret-pw"));
    let a = connect(&good).await?;
    let wrong = format!(
        "{}?timeout_ms=2000",
        server.url_with_password("hunter2-wrong")
    );
    let err = refused(
        "connect with a wrong password",
        PostgresAuthority::connect(&wrong).await,
    )?;
    assert!(matches!(err, Error::Unauthorized { .. }), "{err:?}");
    assert!(
        !format!("{err} {err:?} {a:?}").contains("hunter2") && !format!("{a:?}").contains("s3cret")
    );

    // A missing table, before migrate(): a clear permanent error that says what to do.
    let key = key("k")?;
    let err = refused(
        "acquire before migrate",
        a.try_acquire(&key, Duration::from_secs(1)).await,
    )?;
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
    let err = refused(
        "connect with an invalid table name",
        PostgresAuthority::connect(&format!("{good}&table=x;drop")).await,
    )?;
    assert!(matches!(err, Error::InvalidConfig { .. }), "{err:?}");

    // An unreachable server: Unavailable within the timeout, retryable.
    let port = leasehold_servers::free_port().or_fail("a free port")?;
    let started = Instant::now();
    let err = refused(
        "connect to nothing",
        PostgresAuthority::connect(&format!(
            "postgres://leasehold@127.0.0.1:{port}/postgres?timeout_ms=500"
        ))
        .await,
    )?;
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
    a.migrate().await.or_fail("migrate")?;
    a.migrate().await.or_fail("migrate again")?;
    assert!(a
        .try_acquire(&key, Duration::from_secs(1))
        .await
        .or_fail("acquire after migrate")?
        .is_some());
    let err = refused(
        "acquire with a TTL out of range",
        a.try_acquire(&key, Duration::from_micros(1500)).await,
    )?;
    assert!(matches!(err, Error::InvalidTtl { .. }), "{err:?}");
    Ok(())
}

/// TLS through the URL: `sslmode=verify-full` with the CA from `sslrootcert` connects and the
/// session is really encrypted; without the CA, or trusting another CA, the certificate is
/// refused with a typed error. The certificates are made for this test (rcgen).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_through_the_url() -> Result {
    use leasehold_servers::TestCerts;
    let server = start_server().await?;
    // Hand the server its certificate (readable by the server's user only) and turn TLS on.
    let certs = TestCerts::generate().or_fail("the test certificates")?;
    certs
        .copy_server_pair_to(server.data_dir(), "tls.crt", "tls.key")
        .or_fail("hand the server its certificate")?;
    let admin = connect(&url(&server)).await?;
    for setting in [
        "ALTER SYSTEM SET ssl_cert_file = 'tls.crt'",
        "ALTER SYSTEM SET ssl_key_file = 'tls.key'",
        "ALTER SYSTEM SET ssl = on",
    ] {
        exec(&admin, setting).await?;
    }
    exec(&admin, "SELECT pg_reload_conf()").await?;
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
            Err(e) => return Err(format!("TLS connection failed: {e:?}").into()),
        }
    };
    let encrypted: bool =
        sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
            .fetch_one(tls.pool())
            .await
            .or_fail("read pg_stat_ssl")?;
    assert!(encrypted, "the session is not encrypted");
    tls.migrate().await.or_fail("migrate over TLS")?;
    let key = key("tls")?;
    let g = tls
        .try_acquire(&key, Duration::from_secs(1))
        .await
        .or_fail("acquire over TLS")?
        .or_fail("acquire over TLS: a fresh key was held")?;
    assert_eq!(
        tls.release(&g).await.or_fail("release over TLS")?,
        Released::Released
    );

    // Without the CA, the server's certificate is not trusted.
    let untrusted = format!(
        "postgres://leasehold@localhost:{}/postgres?sslmode=verify-full&timeout_ms=2000",
        server.port()
    );
    let err = refused(
        "connect without the CA",
        PostgresAuthority::connect(&untrusted).await,
    )?;
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
    // Trusting another CA: refused too.
    let other = TestCerts::generate().or_fail("another CA")?;
    let wrong_ca = format!(
        "postgres://leasehold@localhost:{}/postgres?sslmode=verify-full&sslrootcert={}&timeout_ms=2000",
        server.port(),
        other.ca().display()
    );
    let err = refused(
        "connect trusting another CA",
        PostgresAuthority::connect(&wrong_ca).await,
    )?;
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// `?password=` is the password, and no secret parameter is ever printed.

/// Display and Debug of an error and of every error in its source chain.
fn everything_printed(err: &Error) -> String {
    let mut shown = format!("{err}\n{err:?}\n");
    let mut source = std::error::Error::source(err);
    while let Some(s) = source {
        shown.push_str(&format!("{s}\n{s:?}\n"));
        source = s.source();
    }
    shown
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_in_the_query_string_is_used_and_never_printed() -> Result {
    let server = tokio::task::spawn_blocking(|| PostgresServer::start_with_password("s3cret pw&x"))
        .await
        .or_fail("the harness task")?
        .or_fail("PostgreSQL with a password must start")?;
    let base = format!("postgres://leasehold@127.0.0.1:{}/postgres", server.port());
    // The right password, percent-encoded in the query string, connects.
    let good = format!("{base}?password=s3cret%20pw%26x&timeout_ms=2000");
    let a = connect(&good).await?;
    a.migrate().await.or_fail("migrate")?;
    let shown = format!("{a:?}");
    assert!(!shown.contains("s3cret"), "{shown}");

    // A wrong one is Unauthorized, and no part of the error shows it.
    let wrong = format!("{base}?timeout_ms=2000&password=hunter2");
    let err = refused(
        "connect with a wrong password",
        PostgresAuthority::connect(&wrong).await,
    )?;
    assert!(matches!(err, Error::Unauthorized { .. }), "{err:?}");
    let shown = everything_printed(&err);
    assert!(!shown.contains("hunter2"), "{shown}");

    // Every way a URL with a secret parameter can be refused keeps the secret out.
    for bad in [
        format!("{base}?password=hunter2&tabel=x"),
        format!("{base}?password=hunter2&pool_size=0"),
        format!("{base}?password=hunter2&epoch=x"),
        format!("{base}?password=hunter2&timeout_ms=0"),
        format!("{base}?password=hunter2&sslmode=sometimes"),
        format!("{base}?password=hunter2&password=hunter2"),
        format!("{base}?sslpassword=hunter2"),
        "postgres://leasehold:hunter2@127.0.0.1:1/postgres?password=hunter2".to_string(),
        "postgres://leasehold:hunter2@127.0.0.1:1/postgres?bogus=1".to_string(),
        "postgres://leasehold@127.0.0.1:1/postgres?password=hunter%zz2".to_string(),
    ] {
        let err = refused(
            &format!("connect {}", leasehold_core::backend::redact_url(&bad)),
            PostgresAuthority::connect(&bad).await,
        )?;
        assert!(
            matches!(err, Error::InvalidUrl { .. } | Error::InvalidConfig { .. }),
            "{bad}: {err:?}"
        );
        let shown = everything_printed(&err);
        assert!(
            !shown.contains("hunter2") && !shown.contains("hunter%32"),
            "{shown}"
        );
    }
    // The configuration's Debug hides it too.
    let config = leasehold_postgres::PostgresConfig::from_url(&wrong)
        .or_fail("the configuration of a URL with a password")?;
    let shown = format!("{config:?}");
    assert!(!shown.contains("hunter2"), "{shown}");
    // An unreachable server with the password in the query: Unavailable, nothing printed.
    let port = leasehold_servers::free_port().or_fail("a free port")?;
    let err = refused(
        "connect to nothing",
        PostgresAuthority::connect(&format!(
            "postgres://leasehold@127.0.0.1:{port}/postgres?password=hunter%32&timeout_ms=500"
        ))
        .await,
    )?;
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
    let shown = everything_printed(&err);
    assert!(
        !shown.contains("hunter2") && !shown.contains("hunter%32"),
        "{shown}"
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Fences declare what the connected server promises.

/// Sets `synchronous_standby_names` (empty: none) and waits until the server uses it. Reads and
/// `ALTER SYSTEM` need no commit, so this works while commits would wait for a standby.
async fn standbys(admin: &PostgresAuthority, names: &str) -> Result {
    if names.is_empty() {
        exec(admin, "ALTER SYSTEM RESET synchronous_standby_names").await?;
    } else {
        exec(
            admin,
            &format!("ALTER SYSTEM SET synchronous_standby_names = '{names}'"),
        )
        .await?;
    }
    exec(admin, "SELECT pg_reload_conf()").await?;
    let started = Instant::now();
    loop {
        let now: String = sqlx::query_scalar("SELECT current_setting('synchronous_standby_names')")
            .fetch_one(admin.pool())
            .await
            .or_fail("read synchronous_standby_names")?;
        if now == names {
            return Ok(());
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the reload did not apply"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn declared(url: &str) -> Result<(FenceSafety, bool, FenceSafety)> {
    let a = connect(url).await?;
    let c = a.capabilities().clone();
    let k = key("declared")?;
    let g = a
        .try_acquire(&k, Duration::from_secs(1))
        .await
        .or_fail("acquire")?
        .or_fail("acquire: the key was held")?;
    let _ = a.release(&g).await.or_fail("release")?;
    Ok((c.fence_safety, c.durable_fences, g.fence().safety()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_declare_what_the_server_promises() -> Result {
    let server = start_server().await?;
    let base = url(&server);
    let admin = connect(&base).await?;
    admin.migrate().await.or_fail("migrate")?;

    // No synchronous standby: a failover may lose the last acquisitions.
    let (safety, durable, fence) = declared(&base).await?;
    assert_eq!(safety, FenceSafety::FailoverUnsafe);
    assert!(durable);
    assert_eq!(
        fence, safety,
        "a fence must carry what the backend declares"
    );

    // The operator vouches for synchronous replication the server cannot show (a managed
    // service replicating storage): linearizable.
    let vouched = format!("{base}&fence_safety=linearizable");
    let (safety, durable, fence) = declared(&vouched).await?;
    assert_eq!(
        (safety, durable, fence),
        (FenceSafety::Linearizable, true, FenceSafety::Linearizable)
    );
    let forced = format!("{base}&fence_safety=failover-unsafe");
    assert_eq!(declared(&forced).await?.0, FenceSafety::FailoverUnsafe);
    let err = refused(
        "connect with fence_safety=maybe",
        PostgresAuthority::connect(&format!("{base}&fence_safety=maybe")).await,
    )?;
    assert!(matches!(err, Error::InvalidUrl { .. }), "{err:?}");

    // A synchronous standby named, and commits wait for it: linearizable. (No standby runs, so
    // nothing may commit meanwhile: only connect and read the declaration.)
    standbys(&admin, "standby1").await?;
    let c = connect(&base).await?.capabilities().clone();
    assert_eq!(c.fence_safety, FenceSafety::Linearizable);
    assert!(c.durable_fences);
    standbys(&admin, "").await?;
    // ... but not where the role's commits do not wait for it, unless the operator vouches.
    exec(
        &admin,
        "ALTER ROLE leasehold SET synchronous_commit = local",
    )
    .await?;
    standbys(&admin, "standby1").await?;
    let c = connect(&base).await?.capabilities().clone();
    assert_eq!(c.fence_safety, FenceSafety::FailoverUnsafe);
    assert!(c.durable_fences);
    let c = connect(&vouched).await?.capabilities().clone();
    assert_eq!(
        c.fence_safety,
        FenceSafety::Linearizable,
        "vouched for: storage replication"
    );
    standbys(&admin, "").await?;

    // `synchronous_commit = off`: even a crash of this one server can lose the last commits.
    exec(&admin, "ALTER ROLE leasehold SET synchronous_commit = off").await?;
    for url in [&base, &vouched] {
        let (safety, durable, fence) = declared(url).await?;
        assert_eq!(safety, FenceSafety::FailoverUnsafe, "{url}");
        assert!(!durable, "{url}");
        assert_eq!(fence, safety);
    }
    exec(&admin, "ALTER ROLE leasehold RESET synchronous_commit").await?;
    Ok(())
}
