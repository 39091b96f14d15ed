//! Reaching a real Redis: credentials and ACL users (never printed), unreachable and frozen
//! servers within the timeout, a server frozen mid-acquire, TLS with a CA from the URL, huge
//! durations in the URL, and `WAIT` for replicas.

use std::sync::Arc;
use std::time::Duration;

use leasehold_conformance::harness_call;
use leasehold_conformance::kit::{self, ErrOrFail, OrFail, TestResult};
use leasehold_core::{Authority, Error, Instant, LockKey, Released};
use leasehold_redis::{KeyLayout, RedisAuthority};
use leasehold_servers::{free_port, RedisServer};

mod common;

use common::{blocking, command, raw, start, start_pair};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_credentials_are_unauthorized_and_never_printed() -> TestResult {
    let server = kit::start("Redis with a password", || {
        RedisServer::start_with_password("s3cret-pw")
    })
    .await?;
    let good = format!("{}?timeout_ms=2000", server.url_with_password("s3cret-pw"));
    let a = RedisAuthority::connect(&good)
        .await
        .or_fail("connect with the password")?;
    assert!(!format!("{a:?} {:?}", a.config()).contains("s3cret"));
    let key = LockKey::new("auth").or_fail("the key")?;
    assert!(a
        .try_acquire(&key, Duration::from_secs(1))
        .await
        .or_fail("acquire")?
        .is_some());

    let wrong = format!(
        "{}?timeout_ms=2000",
        server.url_with_password("hunter2-wrong")
    );
    let started = Instant::now();
    let err = RedisAuthority::connect(&wrong)
        .await
        .err_or_fail("connect with a wrong password")?;
    assert!(
        matches!(err, Error::Unauthorized { .. }) && !err.is_retryable(),
        "{err:?}"
    );
    // At once, not after retries: a refused password is not an outage.
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "took {:?}",
        started.elapsed()
    );
    assert!(!format!("{err} {err:?}").contains("hunter2"), "{err:?}");

    let none = format!("redis://127.0.0.1:{}?timeout_ms=2000", server.port());
    let err = RedisAuthority::connect(&none)
        .await
        .err_or_fail("connect without a password")?;
    assert!(matches!(err, Error::Unauthorized { .. }), "{err:?}");

    // ACL users: the right one works, an unknown one is refused, and one that may not run
    // scripts is refused at its first acquisition.
    let plain = start().await?;
    command(
        &plain,
        &[
            "ACL",
            "SETUSER",
            "locker",
            "on",
            ">locker-pw",
            "~*",
            "&*",
            "+@all",
        ],
    )
    .await?;
    command(
        &plain,
        &[
            "ACL",
            "SETUSER",
            "reader",
            "on",
            ">reader-pw",
            "~*",
            "&*",
            "+@read",
            "+ping",
        ],
    )
    .await?;
    let acl = |user: &str, pw: &str| {
        format!(
            "redis://{user}:{pw}@127.0.0.1:{}?timeout_ms=2000",
            plain.port()
        )
    };
    let locker = RedisAuthority::connect(&acl("locker", "locker-pw"))
        .await
        .or_fail("connect as locker")?;
    let g = locker
        .try_acquire(&key, Duration::from_secs(1))
        .await
        .or_fail("locker acquires")?
        .or_fail("the key is free")?;
    assert_eq!(
        locker.release(&g).await.or_fail("locker releases")?,
        Released::Released
    );
    let err = RedisAuthority::connect(&acl("nobody", "locker-pw"))
        .await
        .err_or_fail("connect as an unknown user")?;
    assert!(matches!(err, Error::Unauthorized { .. }), "{err:?}");
    let err = RedisAuthority::connect(&acl("locker", "hunter2"))
        .await
        .err_or_fail("connect as locker with a wrong password")?;
    assert!(
        matches!(err, Error::Unauthorized { .. }) && !format!("{err:?}").contains("hunter2"),
        "{err:?}"
    );
    let reader = RedisAuthority::connect(&acl("reader", "reader-pw"))
        .await
        .or_fail("connect as reader")?;
    let err = reader
        .try_acquire(&key, Duration::from_secs(1))
        .await
        .err_or_fail("reader acquires")?;
    assert!(matches!(err, Error::Unauthorized { .. }), "{err:?}");
    assert!(!format!("{err:?}").contains("reader-pw"));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_or_frozen_server_is_unavailable_within_the_timeout() -> TestResult {
    let port = free_port().or_fail("a free port")?;
    let started = Instant::now();
    let err = RedisAuthority::connect(&format!("redis://127.0.0.1:{port}?timeout_ms=500"))
        .await
        .err_or_fail("connect to nobody")?;
    assert!(
        matches!(err, Error::Unavailable { .. }) && err.is_retryable(),
        "{err:?}"
    );
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "took {:?}",
        started.elapsed()
    );

    // A frozen server accepts the TCP connection (the kernel does) but never answers.
    let server = start().await?;
    {
        let s = server.clone();
        harness_call(move || s.pause())
            .await
            .or_fail("pause the server")?;
    }
    let started = Instant::now();
    let err = RedisAuthority::connect(&format!("{}?timeout_ms=500", server.url()))
        .await
        .err_or_fail("connect to a frozen server")?;
    let took = started.elapsed();
    {
        let s = server.clone();
        harness_call(move || s.resume())
            .await
            .or_fail("resume the server")?;
    }
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
    assert!(
        took >= Duration::from_millis(450) && took < Duration::from_millis(1500),
        "took {took:?}"
    );
    Ok(())
}

/// The server freezes while an acquisition is on the wire. The client gets `Unavailable`
/// within its timeout; when the server resumes it runs that acquisition after all (the fence
/// counter moved), and the compare-and-delete the client queued behind it frees the key at
/// once, long before the lease's TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_frozen_mid_acquire_leaves_no_lock_behind() -> TestResult {
    let server = start().await?;
    let a = RedisAuthority::connect(&format!("{}?timeout_ms=500", server.url()))
        .await
        .or_fail("connect")?;
    let key = LockKey::new("frozen").or_fail("the key")?;
    let ttl = Duration::from_secs(20);
    // Warm the script cache, so the frozen request is the acquisition itself.
    let warm = a
        .try_acquire(&key, ttl)
        .await
        .or_fail("warm up")?
        .or_fail("the key is free")?;
    assert_eq!(
        a.release(&warm).await.or_fail("release the warm-up")?,
        Released::Released
    );
    {
        let s = server.clone();
        harness_call(move || s.pause())
            .await
            .or_fail("pause the server")?;
    }
    let started = Instant::now();
    let err = a
        .try_acquire(&key, ttl)
        .await
        .err_or_fail("acquire from a frozen server")?;
    let took = started.elapsed();
    {
        let s = server.clone();
        harness_call(move || s.resume())
            .await
            .or_fail("resume the server")?;
    }
    assert!(
        matches!(err, Error::Unavailable { .. }) && err.is_retryable(),
        "{err:?}"
    );
    assert!(took < Duration::from_millis(1500), "took {took:?}");

    let layout = KeyLayout::default();
    let mut con = raw(&server).await?;
    let resumed = Instant::now();
    loop {
        let (holder, fence): (Option<String>, Option<u64>) = redis::pipe()
            .get(layout.lock_key(&key))
            .get(layout.fence_key(&key))
            .query_async(&mut con)
            .await
            .or_fail("read the lock key and the counter")?;
        if holder.is_none() && fence == Some(2) {
            break;
        }
        assert!(
            resumed.elapsed() < ttl / 10,
            "after the resume: holder {holder:?}, fence counter {fence:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let g = a
        .try_acquire(&key, ttl)
        .await
        .or_fail("acquire after the resume")?
        .or_fail("the key is free")?;
    assert_eq!(g.fence().raw(), 3);
    Ok(())
}

/// A Redis that speaks only TLS, with certificates made for the test (started with the
/// harness's process management, since its Redis servers are plain-text).
struct TlsRedis {
    port: u16,
    certs: leasehold_servers::TestCerts,
    _process: leasehold_servers::ManagedProcess,
}

fn start_tls_redis() -> Result<TlsRedis, String> {
    let certs = leasehold_servers::TestCerts::generate().map_err(|e| e.to_string())?;
    let file = |p: std::path::PathBuf| p.display().to_string();
    use leasehold_servers::process::{find_program, server_dir};
    use leasehold_servers::{CommandSpec, ManagedProcess, READY_TIMEOUT};
    let program = find_program("redis-server").ok_or("redis-server must be installed")?;
    let port = free_port().map_err(|e| e.to_string())?;
    let dir = server_dir("redis-tls").map_err(|e| e.to_string())?;
    let args = vec![
        "--port".to_string(),
        "0".into(),
        "--tls-port".into(),
        port.to_string(),
        "--bind".into(),
        "127.0.0.1".into(),
        "--tls-cert-file".into(),
        file(certs.server_cert()),
        "--tls-key-file".into(),
        file(certs.server_key()),
        "--tls-ca-cert-file".into(),
        file(certs.ca()),
        "--tls-auth-clients".into(),
        "no".into(),
        "--requirepass".into(),
        "tls-pw".into(),
        "--save".into(),
        String::new(),
        "--appendonly".into(),
        "no".into(),
        "--dir".into(),
        dir.path().display().to_string(),
    ];
    let process = ManagedProcess::spawn("redis-tls", dir, CommandSpec::new(program, args))
        .map_err(|e| e.to_string())?;
    process
        .wait_ready(READY_TIMEOUT, || {
            if process
                .current_log()
                .contains("Ready to accept connections")
            {
                Ok(())
            } else {
                Err("not ready yet".into())
            }
        })
        .map_err(|e| format!("the TLS Redis must start for this test: {e}"))?;
    Ok(TlsRedis {
        port,
        certs,
        _process: process,
    })
}

/// `rediss://` with the CA from the URL: acquire, hand-off through the (TLS) subscription,
/// release. Without that CA the certificate is refused; plain text to a TLS port fails; no
/// failure prints the password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_a_ca_from_the_url() -> TestResult {
    let server = blocking(start_tls_redis)
        .await
        .map_err(leasehold_conformance::Failure::new)?;
    let base = format!("rediss://:tls-pw@127.0.0.1:{}", server.port);
    let url = format!(
        "{base}?timeout_ms=2000&tls_ca_file={}",
        server.certs.ca().display()
    );
    let a = Arc::new(RedisAuthority::connect(&url).await.or_fail("connect A")?);
    let b = RedisAuthority::connect(&url).await.or_fail("connect B")?;
    let key = LockKey::new("tls").or_fail("the key")?;
    let ttl = Duration::from_secs(10);
    let held = a
        .try_acquire(&key, ttl)
        .await
        .or_fail("A acquires")?
        .or_fail("the key is free")?;
    let waiter = {
        let (a, key) = (a.clone(), key.clone());
        tokio::spawn(async move { a.acquire(&key, ttl, Duration::from_secs(5)).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let released = Instant::now();
    assert_eq!(
        b.release(&held).await.or_fail("B releases A's grant")?,
        Released::Released
    );
    let next = waiter
        .await
        .or_fail("the waiting task")?
        .or_fail("the waiter acquires")?;
    assert!(
        released.elapsed() < ttl / 4,
        "the hand-off over TLS took {:?}",
        released.elapsed()
    );
    assert!(next.fence() > held.fence());

    let untrusted = RedisAuthority::connect(&format!("{base}?timeout_ms=2000"))
        .await
        .err_or_fail("connect without the CA")?;
    assert!(
        matches!(untrusted, Error::Unavailable { .. }),
        "{untrusted:?}"
    );
    // Trusting another CA is no better.
    let other = leasehold_servers::TestCerts::generate().or_fail("another CA")?;
    let wrong_ca = RedisAuthority::connect(&format!(
        "{base}?timeout_ms=2000&tls_ca_file={}",
        other.ca().display()
    ))
    .await
    .err_or_fail("connect trusting another CA")?;
    assert!(
        matches!(wrong_ca, Error::Unavailable { .. }),
        "{wrong_ca:?}"
    );
    let plain = RedisAuthority::connect(&format!(
        "redis://:tls-pw@127.0.0.1:{}?timeout_ms=500",
        server.port
    ))
    .await
    .err_or_fail("connect in plain text to the TLS port")?;
    assert!(matches!(plain, Error::Unavailable { .. }), "{plain:?}");
    for err in [&untrusted, &wrong_ca, &plain] {
        assert!(!format!("{err} {err:?}").contains("tls-pw"), "{err:?}");
    }
    let missing = RedisAuthority::connect(&format!("{base}?tls_ca_file=/nonexistent/ca.pem"))
        .await
        .err_or_fail("connect with a missing CA file")?;
    assert!(
        matches!(missing, Error::InvalidConfig { .. }),
        "{missing:?}"
    );
    Ok(())
}

/// Huge durations in the URL (`timeout_ms`, `safety_margin_ms`, `wait_timeout_ms`) are either
/// refused as invalid or mean "very long"; none of them panics at connect, in a request or
/// while waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_durations_in_the_url_do_not_panic() -> TestResult {
    let server = start().await?;
    let max = u64::MAX;
    let huge_timeout = format!("{}?timeout_ms={max}", server.url());
    let a = Arc::new(
        tokio::spawn(async move { RedisAuthority::connect(&huge_timeout).await })
            .await
            .or_fail("connect with timeout_ms = u64::MAX panicked")?
            .or_fail("connect with timeout_ms = u64::MAX")?,
    );
    let key = LockKey::new("huge-url").or_fail("the key")?;
    let ttl = Duration::from_secs(10);
    let (g, waited) = tokio::spawn({
        let (a, key) = (a.clone(), key.clone());
        async move {
            let g = a
                .try_acquire(&key, ttl)
                .await
                .or_fail("acquire")?
                .or_fail("the key is free")?;
            // Held by ourselves: the wait ends by max_wait, with the request timeout huge.
            let waited = a.acquire(&key, ttl, Duration::from_millis(100)).await;
            TestResult::Ok((g, waited))
        }
    })
    .await
    .or_fail("a request with timeout_ms = u64::MAX panicked")??;
    assert!(matches!(waited, Err(Error::Timeout { .. })), "{waited:?}");
    assert_eq!(a.release(&g).await.or_fail("release")?, Released::Released);

    for params in [
        format!("safety_margin_ms={max}"),
        format!(
            "wait_replicas=1&wait_timeout_ms={}&timeout_ms={max}",
            max - 1
        ),
    ] {
        let url = format!("{}?{params}", server.url());
        let outcome = tokio::spawn(async move {
            match RedisAuthority::connect(&url).await {
                Ok(a) => {
                    let key = LockKey::new("huge-url-2")?;
                    match a.try_acquire(&key, Duration::from_secs(1)).await {
                        Ok(Some(g)) => a.release(&g).await.map(|_| ()),
                        Ok(None) => panic!("nobody holds the key"),
                        Err(e) => Err(e),
                    }
                }
                Err(e) => Err(e),
            }
        })
        .await
        .or_fail(format!("{params} panicked"))?;
        match outcome {
            Ok(()) => {}
            Err(e) => assert!(
                matches!(e, Error::InvalidUrl { .. } | Error::InvalidConfig { .. }),
                "{params}: {e:?}"
            ),
        }
    }
    Ok(())
}

/// With `wait_replicas`, an acquisition returns only once a replica has it; when no replica
/// acknowledges in time the acquisition fails, retryably, and leaves no lock behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_replicas_confirms_or_gives_the_lock_back() -> TestResult {
    let (primary, replica) = start_pair().await?;
    // Generous for the replica that answers (a loaded machine), short for the frozen one.
    let a = RedisAuthority::connect(&format!(
        "{}?timeout_ms=3000&wait_replicas=1&wait_timeout_ms=2000",
        primary.url()
    ))
    .await
    .or_fail("connect A")?;
    let impatient = RedisAuthority::connect(&format!(
        "{}?timeout_ms=1000&wait_replicas=1&wait_timeout_ms=200",
        primary.url()
    ))
    .await
    .or_fail("connect the impatient client")?;
    let layout = KeyLayout::default();
    let key = LockKey::new("replicated").or_fail("a key")?;
    let ttl = Duration::from_secs(10);
    let g = a
        .try_acquire(&key, ttl)
        .await
        .or_fail("A acquires")?
        .or_fail("the key is free")?;
    let mut on_replica = raw(&replica).await?;
    let (value, fence): (Option<String>, Option<u64>) = redis::pipe()
        .get(layout.lock_key(&key))
        .get(layout.fence_key(&key))
        .query_async(&mut on_replica)
        .await
        .or_fail("read the replica")?;
    assert_eq!(
        value,
        Some(g.owner().to_hex()),
        "the replica has the lock when acquire returns"
    );
    assert_eq!(fence, Some(g.fence().raw()));

    {
        let r = replica.clone();
        harness_call(move || r.pause())
            .await
            .or_fail("pause the replica")?;
    }
    let other = LockKey::new("unreplicated").or_fail("a key")?;
    let started = Instant::now();
    let err = impatient
        .try_acquire(&other, ttl)
        .await
        .err_or_fail("acquire with the replica frozen")?;
    let took = started.elapsed();
    {
        let r = replica.clone();
        harness_call(move || r.resume())
            .await
            .or_fail("resume the replica")?;
    }
    assert!(
        matches!(
            err,
            Error::Backend {
                retryable: true,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("0 of 1 replicas"), "{err}");
    assert!(
        took >= Duration::from_millis(190) && took < Duration::from_millis(1500),
        "took {took:?}"
    );
    let mut on_primary = raw(&primary).await?;
    let gave_back = Instant::now();
    loop {
        let holder: Option<String> = redis::cmd("GET")
            .arg(layout.lock_key(&other))
            .query_async(&mut on_primary)
            .await
            .or_fail("read the primary")?;
        if holder.is_none() {
            break;
        }
        assert!(
            gave_back.elapsed() < Duration::from_secs(1),
            "the unconfirmed lock was kept"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        a.release(&g).await.or_fail("A releases")?,
        Released::Released
    );
    Ok(())
}
