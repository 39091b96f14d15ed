//! The etcd authority given bad input, against a real server: unreachable endpoints, refused
//! credentials, TTLs etcd cannot grant, TLS with the server's minimum TTL, and durations too
//! large to add to an instant.

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{Authority, Error, Instant, Lease, LeaseOptions, Released};
use leasehold_etcd::EtcdAuthority;
use leasehold_servers::{
    self as servers, etcdctl_command, CommandSpec, ManagedProcess, READY_TIMEOUT,
};

mod common;

use common::{connect, key, keys_under, lease_alive, raw_client, start, url, OrFail, Result};

/// The error of a call that must fail, or a failure naming `what` succeeded.
fn refused<T>(what: &str, result: leasehold_core::Result<T>) -> Result<Error> {
    match result {
        Ok(_) => Err(format!("{what}: succeeded").into()),
        Err(e) => Ok(e),
    }
}

/// Bad input and refused credentials: typed errors, fast, and no password in any of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_typed_errors() -> Result {
    // Nobody listens on this port: Unavailable within the timeout, retryable.
    let port = servers::free_port().or_fail("a free port")?;
    let started = Instant::now();
    let err = refused(
        "connect to nothing",
        EtcdAuthority::connect(&format!("etcd://127.0.0.1:{port}?timeout_ms=500")).await,
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

    // Enable authentication, then a wrong password (and none at all) is Unauthorized.
    let server = start().await?;
    let etcdctl = |args: &[&str]| -> Result {
        let out = server
            .etcdctl()
            .or_fail("etcdctl")?
            .args(args)
            .output()
            .or_fail(format!("run etcdctl {args:?}"))?;
        assert!(
            out.status.success(),
            "etcdctl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(())
    };
    etcdctl(&["user", "add", "root:s3cret-pw"])?;
    etcdctl(&["auth", "enable"])?;
    let wrong = format!(
        "etcd://root:hunter2-wrong@{}?timeout_ms=2000",
        server.endpoint()
    );
    let err = refused(
        "connect with a wrong password",
        EtcdAuthority::connect(&wrong).await,
    )?;
    assert!(matches!(err, Error::Unauthorized { .. }), "{err:?}");
    assert!(!err.is_retryable());
    assert!(!format!("{err} {err:?}").contains("hunter2"), "{err:?}");
    let anonymous = refused(
        "connect without a password",
        EtcdAuthority::connect(&format!("etcd://{}?timeout_ms=2000", server.endpoint())).await,
    )?;
    assert!(
        matches!(anonymous, Error::Unauthorized { .. }),
        "{anonymous:?}"
    );
    let good = connect(&format!(
        "etcd://root:s3cret-pw@{}?timeout_ms=2000",
        server.endpoint()
    ))
    .await?;
    assert!(!format!("{good:?}").contains("s3cret"), "{good:?}");
    let key = key("authed")?;
    let g = good
        .try_acquire(&key, Duration::from_secs(1))
        .await
        .or_fail("acquire with the password")?
        .or_fail("acquire with the password: a fresh key was held")?;
    assert_eq!(
        good.release(&g).await.or_fail("release")?,
        Released::Released
    );

    // TTLs etcd cannot grant exactly: below its minimum, or not whole seconds.
    for ttl in [
        Duration::from_millis(500),
        Duration::from_millis(1500),
        Duration::ZERO,
    ] {
        let err = refused(
            &format!("acquire for {ttl:?}"),
            good.try_acquire(&key, ttl).await,
        )?;
        assert!(matches!(err, Error::InvalidTtl { .. }), "{ttl:?}: {err:?}");
    }

    // Malformed URLs never reach the network.
    for bad in [
        "etcd://root:hunter2@h:2379?unknown=1",
        "etcd://root:hunter2@",
        "etcds://root:hunter2@h?tls_cert=/only-the-cert.pem",
    ] {
        let err = refused(
            &format!("connect {}", leasehold_core::backend::redact_url(bad)),
            EtcdAuthority::connect(bad).await,
        )?;
        assert!(matches!(err, Error::InvalidUrl { .. }), "{bad}: {err:?}");
        assert!(!format!("{err} {err:?}").contains("hunter2"));
    }
    Ok(())
}

/// An etcd with TLS, client certificates required, and a longer election timeout (so a higher
/// minimum lease TTL), started as a plain process by the harness, with certificates made for
/// the test.
struct TlsEtcd {
    process: ManagedProcess,
    port: u16,
    certs: servers::TestCerts,
}

fn start_tls_etcd() -> Result<TlsEtcd> {
    let dir = servers::process::server_dir("etcd-tls").or_fail("a directory for etcd")?;
    let d = dir.path();
    let certs = servers::TestCerts::generate().or_fail("the test certificates")?;
    let ports = servers::free_ports(2).or_fail("two free ports")?;
    let (port, peer) = (ports[0], ports[1]);
    let etcd = servers::process::find_program("etcd").or_fail("the etcd program")?;
    let path = |f: &str| d.join(f).display().to_string();
    let args = vec![
        "--name=tls".to_string(),
        format!("--data-dir={}", path("data")),
        format!("--listen-client-urls=https://127.0.0.1:{port}"),
        format!("--advertise-client-urls=https://127.0.0.1:{port}"),
        format!("--listen-peer-urls=http://127.0.0.1:{peer}"),
        format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer}"),
        format!("--initial-cluster=tls=http://127.0.0.1:{peer}"),
        format!("--cert-file={}", certs.server_cert().display()),
        format!("--key-file={}", certs.server_key().display()),
        "--client-cert-auth=true".into(),
        format!("--trusted-ca-file={}", certs.ca().display()),
        // A 2 s election timeout makes etcd's minimum lease TTL 3 s.
        "--heartbeat-interval=200".into(),
        "--election-timeout=2000".into(),
    ];
    let process = ManagedProcess::spawn("etcd-tls", dir, CommandSpec::new(etcd, args))
        .or_fail("start etcd with TLS")?;
    let mut command = etcdctl_command(&[format!("127.0.0.1:{port}")]).or_fail("etcdctl")?;
    command
        .arg(format!("--cacert={}", certs.ca().display()))
        .arg(format!("--cert={}", certs.client_cert().display()))
        .arg(format!("--key={}", certs.client_key().display()))
        .args(["endpoint", "health"]);
    process
        .wait_ready(READY_TIMEOUT, || match command.output() {
            Ok(o) if o.status.success() => Ok(()),
            Ok(o) => Err(String::from_utf8_lossy(&o.stderr).into_owned()),
            Err(e) => Err(e.to_string()),
        })
        .or_fail("etcd with TLS gets ready")?;
    Ok(TlsEtcd {
        process,
        port,
        certs,
    })
}

/// `etcds://` with the server's CA and a client certificate works; without the CA, trusting
/// another CA, without a client certificate, or with one from another CA, the connection is
/// refused with a typed error; the server's minimum TTL (3 s with a 2 s election timeout) is learned and declared, and a TTL
/// below it is InvalidTtl, never raised silently.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_and_the_servers_minimum_ttl() -> Result {
    let etcd = tokio::task::spawn_blocking(start_tls_etcd)
        .await
        .or_fail("the harness task")??;
    let certs = &etcd.certs;
    let with = |ca: &servers::TestCerts, client: Option<&servers::TestCerts>, timeout_ms: u32| {
        let mut url = format!(
            "etcds://127.0.0.1:{}?tls_ca={}&timeout_ms={timeout_ms}",
            etcd.port,
            ca.ca().display()
        );
        if let Some(c) = client {
            url.push_str(&format!(
                "&tls_cert={}&tls_key={}",
                c.client_cert().display(),
                c.client_key().display()
            ));
        }
        url
    };
    let secure = with(certs, Some(certs), 3000);
    let a = EtcdAuthority::connect(&secure)
        .await
        .or_fail("TLS with the CA")?;
    assert_eq!(a.capabilities().ttl.min, Duration::from_secs(3));
    let key = key("tls")?;
    for short in [Duration::from_secs(1), Duration::from_secs(2)] {
        let err = refused(
            &format!("acquire for {short:?}"),
            a.try_acquire(&key, short).await,
        )?;
        assert!(
            matches!(err, Error::InvalidTtl { .. }),
            "{short:?}: {err:?}"
        );
    }
    let g = a
        .try_acquire(&key, Duration::from_secs(3))
        .await
        .or_fail("acquire for the minimum TTL")?
        .or_fail("acquire for the minimum TTL: a fresh key was held")?;
    assert_eq!(a.release(&g).await.or_fail("release")?, Released::Released);

    let untrusted = refused(
        "connect without the CA",
        EtcdAuthority::connect(&format!("etcds://127.0.0.1:{}?timeout_ms=1000", etcd.port)).await,
    )?;
    assert!(
        matches!(untrusted, Error::Unavailable { .. }),
        "{untrusted:?}"
    );
    let other = servers::TestCerts::generate().or_fail("another CA")?;
    for (what, url) in [
        ("trusting another CA", with(&other, Some(certs), 1000)),
        ("without a client certificate", with(certs, None, 1000)),
        (
            "with another CA's client certificate",
            with(certs, Some(&other), 1000),
        ),
    ] {
        let started = Instant::now();
        let err = refused(what, EtcdAuthority::connect(&url).await)?;
        assert!(
            matches!(err, Error::Unavailable { .. } | Error::Unauthorized { .. }),
            "{what}: {err:?}"
        );
        // Bounded by the request timeout (1 s), with room for a loaded machine.
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{what}: refused only after {:?}",
            started.elapsed()
        );
    }
    let plain = refused(
        "connect without TLS",
        EtcdAuthority::connect(&format!("etcd://127.0.0.1:{}?timeout_ms=1000", etcd.port)).await,
    )?;
    assert!(matches!(plain, Error::Unavailable { .. }), "{plain:?}");
    drop(etcd.process);
    Ok(())
}

/// `Duration::MAX` is the natural "wait forever": an acquire with it gets a free key at once and
/// a held one when it is released, without a panic on `start + max_wait`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duration_max_waits_forever_without_a_panic() -> Result {
    let server = start().await?;
    let (a, b) = (
        Arc::new(connect(&url(&server)).await?),
        connect(&url(&server)).await?,
    );
    let key = key("forever")?;
    let ttl = Duration::from_secs(2);
    let held = a
        .acquire(&key, ttl, Duration::MAX)
        .await
        .or_fail("a free key")?;
    let waiter = {
        let (b, key) = (b.clone(), key.clone());
        tokio::spawn(async move { b.acquire(&key, ttl, Duration::MAX).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "the waiter did not wait");
    assert_eq!(
        a.release(&held).await.or_fail("A releases")?,
        Released::Released
    );
    let next = tokio::time::timeout(ttl, waiter)
        .await
        .or_fail("the waiter is woken by the release")?
        .or_fail("the waiter's task did not panic")?
        .or_fail("the waiter gets the key")?;
    assert!(next.fence() > held.fence());
    assert_eq!(
        b.release(&next).await.or_fail("B releases")?,
        Released::Released
    );
    let lease = Lease::acquire(a.clone(), &key, ttl, Duration::MAX, LeaseOptions::default())
        .await
        .or_fail("a lease that waits forever")?;
    assert_eq!(
        lease.release().await.or_fail("the lease released")?,
        Released::Released
    );
    Ok(())
}

/// Huge `timeout_ms` and `session_idle_ms` (u64::MAX milliseconds) mean "no limit": acquire,
/// renew and release work, and the session's task (which adds both to instants) lives on: its
/// lease is still kept alive three TTLs after the last key was released (a panicked task stops
/// the keep-alive and the lease would expire within one TTL).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_timeout_and_idle_options_do_not_panic_the_session() -> Result {
    let server = start().await?;
    let raw = raw_client(&server).await?;
    let huge = u64::MAX;
    let a = Arc::new(
        connect(&format!(
            "etcd://{}?timeout_ms={huge}&session_idle_ms={huge}",
            server.endpoint()
        ))
        .await?,
    );
    let key = key("huge-options")?;
    let ttl = Duration::from_secs(1);
    let grant = a
        .try_acquire(&key, ttl)
        .await
        .or_fail("acquire")?
        .or_fail("a free key")?;
    assert_eq!(
        a.release(&grant).await.or_fail("release")?,
        Released::Released
    );
    let lease = Lease::acquire(a.clone(), &key, ttl, Duration::MAX, LeaseOptions::default())
        .await
        .or_fail("the lease")?;
    tokio::time::sleep(ttl * 3).await;
    lease.ensure_valid().or_fail("renewed past three TTLs")?;
    // Not renewed: the session withdraws the grant at its TTL (a delete retried after the huge
    // timeout, computed in the session's task).
    let unrenewed = a
        .try_acquire(&common::key("huge-options/unrenewed")?, ttl)
        .await
        .or_fail("the unrenewed grant")?
        .or_fail("the unrenewed grant: a fresh key was held")?;
    assert_eq!(
        lease.release().await.or_fail("the lease released")?,
        Released::Released
    );
    let session = a.session_leases()[0];
    tokio::time::sleep(ttl * 3).await;
    assert!(
        lease_alive(&raw, session).await?,
        "the session's keep-alive stopped: its task died"
    );
    assert!(matches!(
        a.renew(&unrenewed, ttl).await,
        Err(Error::LeaseLost { .. })
    ));
    assert!(keys_under(&raw, &a.prefix(unrenewed.key()))
        .await?
        .is_empty());
    assert_eq!(a.session_leases(), vec![session], "still the same session");
    Ok(())
}
