//! `zks://`: TLS on ZooKeeper's client port, against real standalone servers started by the
//! harness with the Netty connection factory and a `secureClientPort`, with certificates made
//! at test time ([`TestCerts`]).
//!
//! What is shown: a client that trusts the servers' CA (and, where the server asks for one,
//! presents a certificate of that CA) gets leases whose fences grow; a server certificate from
//! another CA or not naming the host, a missing or foreign client certificate, and a plain
//! client at the TLS port (or a TLS client at the plain port) all end in a typed, retryable
//! error within the configured request timeout, never a hang; bad files are typed
//! configuration errors; digest ACLs keep lock nodes creator-only over TLS; and the conformance
//! suite passes over TLS.

mod common;

use std::net::Ipv4Addr;
use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use leasehold_conformance::kit::{ErrOrFail, OrFail, TestResult};
use leasehold_conformance::scenarios::run_all;
use leasehold_conformance::{harness_call, Context, Failure, Verdict};
use leasehold_core::{Authority, Error, Instant, Released};
use leasehold_servers::zookeeper::ZkClientAuth;
use leasehold_servers::{TestCerts, ZkServer};
use leasehold_zookeeper::ZkAuthority;

use common::{clients, contenders, key, raw, standalone_faults, ZkResidue, IDLE_CLEANUP};

/// The request timeout every client here uses.
const TIMEOUT: Duration = Duration::from_millis(1000);

/// How long a refused connection may take to fail: connecting opens one session first, bounded
/// by the request timeout, and gives up when it fails; twice that plus slack for a loaded
/// machine.
fn refused_within() -> Duration {
    TIMEOUT * 2 + Duration::from_secs(2)
}

/// A server with TLS on its secure port and `ssl.clientAuth=need`, and the certificates it was
/// made with (kept for the clients' CA and client certificate). Shared by the tests that do not
/// fault it; each uses a chroot of its own.
fn need_auth() -> &'static Started {
    static SERVER: OnceLock<Started> = OnceLock::new();
    SERVER.get_or_init(|| start(ZkClientAuth::Need))
}

/// A server with TLS that asks for no client certificate.
fn no_client_auth() -> &'static Started {
    static SERVER: OnceLock<Started> = OnceLock::new();
    SERVER.get_or_init(|| start(ZkClientAuth::None))
}

/// A TLS server and its certificates, or why they could not be made.
type Started = Result<(TestCerts, ZkServer), String>;

fn start(client_auth: ZkClientAuth) -> Started {
    let certs = TestCerts::generate().map_err(|e| format!("test certificates: {e}"))?;
    let server = ZkServer::start_tls(&certs, client_auth)
        .map_err(|e| format!("ZooKeeper with TLS must start for these tests: {e}"))?;
    warm_up(&certs, &server)?;
    Ok((certs, server))
}

/// One TLS session opened and closed with a generous timeout before the tests use the server:
/// the JVM's first TLS handshake loads and compiles its TLS code, which on a loaded machine
/// took longer than the tests' one-second request timeout (a bound on the client, not on the
/// server's warm-up).
fn warm_up(certs: &TestCerts, server: &ZkServer) -> Result<(), String> {
    let hosts = server
        .secure_connect_string()
        .ok_or("started with TLS, so it has a secure port")?;
    let url = client_url(certs, &hosts, "/tls-warm-up").replace(
        &format!("timeout_ms={}", TIMEOUT.as_millis()),
        "timeout_ms=30000",
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("a runtime for the warm-up: {e}"))?;
    runtime.block_on(async {
        let authority = ZkAuthority::connect(&url)
            .await
            .map_err(|e| format!("the TLS warm-up session: {e}"))?;
        let _ = leasehold_core::Authority::close(&authority).await;
        Ok(())
    })
}

async fn server(which: fn() -> &'static Started) -> TestResult<&'static (TestCerts, ZkServer)> {
    tokio::task::spawn_blocking(which)
        .await
        .or_fail("start the shared server")?
        .as_ref()
        .map_err(|e| Failure::new(e.clone()))
}

fn secure_hosts(server: &ZkServer) -> TestResult<String> {
    server
        .secure_connect_string()
        .or_fail("started with TLS, so it has a secure port")
}

/// A `zks://` URL for `hosts` trusting `ca`, presenting `identity` when given.
fn zks(hosts: &str, chroot: &str, ca: &Path, identity: Option<(&Path, &Path)>) -> String {
    let mut url = format!(
        "zks://{hosts}{chroot}?timeout_ms={}&tls_ca={}",
        TIMEOUT.as_millis(),
        ca.display()
    );
    if let Some((cert, key)) = identity {
        url.push_str(&format!(
            "&tls_cert={}&tls_key={}",
            cert.display(),
            key.display()
        ));
    }
    url
}

/// The URL of a client of `certs` with its client certificate.
fn client_url(certs: &TestCerts, hosts: &str, chroot: &str) -> String {
    zks(
        hosts,
        chroot,
        &certs.ca(),
        Some((&certs.client_cert(), &certs.client_key())),
    )
}

/// Connects with `url` and expects a refusal: `Unavailable` (retryable) within
/// [`refused_within`]. Returns the error.
async fn refused(url: &str, why: &str) -> TestResult<Error> {
    let started = Instant::now();
    let outcome = tokio::time::timeout(Duration::from_secs(30), ZkAuthority::connect(url))
        .await
        .or_fail(format!("{why}: connecting hung for 30 s"))?;
    let elapsed = started.elapsed();
    let err = outcome.err_or_fail(format!("{why}: connected"))?;
    assert!(
        matches!(err, Error::Unavailable { .. }) && err.is_retryable(),
        "{why}: {err:?}"
    );
    assert!(
        elapsed < refused_within(),
        "{why}: refused only after {elapsed:?}, more than {:?}",
        refused_within()
    );
    println!("{why}: refused after {elapsed:?}: {err}");
    Ok(err)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_with_the_ca_and_its_certificate_gets_leases_whose_fences_grow() -> TestResult {
    let (certs, server) = server(need_auth).await?;
    let hosts = secure_hosts(server)?;
    let raw = raw(&server.connect_string()).await?;
    // By IP address and by name: the server's certificate names both.
    let by_name = hosts.replace("127.0.0.1", "localhost");
    for hosts in [hosts.clone(), by_name] {
        let authority = ZkAuthority::connect(&client_url(certs, &hosts, "/tls-fences"))
            .await
            .or_fail(&hosts)?;
        assert!(authority.config().is_tls());
        let k = key("invoice:tls")?;
        let ttl = Duration::from_secs(2);
        let first = authority
            .try_acquire(&k, ttl)
            .await
            .or_fail("acquire")?
            .or_fail("a free key is granted")?;
        let before = Instant::now();
        let deadline = authority.renew(&first, ttl).await.or_fail("renew")?;
        assert!(
            deadline > before && deadline <= Instant::now() + ttl,
            "a renewal over TLS extends the lease by at most its TTL"
        );
        // Held: another acquisition over TLS sees it so.
        assert!(authority
            .try_acquire(&k, ttl)
            .await
            .or_fail("try the held key")?
            .is_none());
        assert_eq!(
            authority.release(&first).await.or_fail("release")?,
            Released::Released
        );
        let second = authority
            .try_acquire(&k, ttl)
            .await
            .or_fail("acquire again")?
            .or_fail("released, so granted again")?;
        assert!(
            second.fence() > first.fence(),
            "{hosts}: fences grow: {:?} then {:?}",
            first.fence(),
            second.fence()
        );
        // Over the plain port, the same server shows the grant's node while it is held.
        let parent = authority.lock_path(&k);
        assert_eq!(contenders(&raw, &parent).await?.len(), 1);
        assert_eq!(
            authority.release(&second).await.or_fail("release again")?,
            Released::Released
        );
        assert!(contenders(&raw, &parent).await?.is_empty());
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_whose_certificate_another_ca_signed_is_refused_within_the_timeout() -> TestResult
{
    let (certs, server) = server(need_auth).await?;
    let hosts = secure_hosts(server)?;
    let stranger = TestCerts::generate().or_fail("another CA")?;
    // Trusting another CA: the server's certificate does not verify. The client certificate is
    // the server's CA's, so only the server's verification can fail.
    let url = zks(
        &hosts,
        "/tls-untrusted",
        &stranger.ca(),
        Some((&certs.client_cert(), &certs.client_key())),
    );
    let err = refused(&url, "a server certificate from an unknown CA").await?;
    assert!(err.to_string().contains("TLS"), "{err}");
    // A CA file with no certificate in it (here: a private key) is a configuration error, not
    // something to wait for.
    let url = zks(&hosts, "/tls-untrusted", &certs.client_key(), None);
    let started = Instant::now();
    let err = ZkAuthority::connect(&url)
        .await
        .err_or_fail("connect with a key as the CA")?;
    assert!(
        matches!(err, Error::InvalidConfig { .. }) && !err.is_retryable(),
        "{err:?}"
    );
    assert!(started.elapsed() < TIMEOUT, "{:?}", started.elapsed());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_whose_certificate_does_not_name_the_host_is_refused_within_the_timeout(
) -> TestResult {
    // A server on 127.0.0.2 with a certificate for 127.0.0.1 and localhost, from the CA the
    // client trusts: only the host name can fail.
    let (certs, server) = harness_call(|| {
        let certs = TestCerts::generate()?;
        let server =
            ZkServer::start_tls_on(Ipv4Addr::new(127, 0, 0, 2), &certs, ZkClientAuth::None)?;
        Ok((certs, server))
    })
    .await
    .or_fail("ZooKeeper with TLS must start on 127.0.0.2")?;
    let hosts = secure_hosts(&server)?;
    assert!(hosts.starts_with("127.0.0.2:"), "{hosts}");
    refused(
        &client_url(&certs, &hosts, "/tls-name"),
        "a server certificate that does not name the host",
    )
    .await?;
    // The control: the server is up and serves, over its plain port.
    let plain = format!(
        "zk://{}/tls-name?timeout_ms={}",
        server.connect_string(),
        TIMEOUT.as_millis()
    );
    ZkAuthority::connect(&plain)
        .await
        .or_fail("connect over the plain port")?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_needs_client_certificates_refuses_clients_without_a_good_one() -> TestResult
{
    let (certs, server) = server(need_auth).await?;
    let hosts = secure_hosts(server)?;
    // No client certificate at all.
    refused(
        &zks(&hosts, "/tls-need", &certs.ca(), None),
        "no client certificate",
    )
    .await?;
    // A client certificate of another CA (which the server does not trust).
    let stranger = TestCerts::generate().or_fail("another CA")?;
    refused(
        &zks(
            &hosts,
            "/tls-need",
            &certs.ca(),
            Some((&stranger.client_cert(), &stranger.client_key())),
        ),
        "a client certificate from another CA",
    )
    .await?;
    // The same server takes a client with a good certificate (the control).
    let authority = ZkAuthority::connect(&client_url(certs, &hosts, "/tls-need"))
        .await
        .or_fail("connect with a good certificate")?;
    let grant = authority
        .try_acquire(&key("need")?, Duration::from_secs(2))
        .await
        .or_fail("acquire")?
        .or_fail("the key is free")?;
    assert_eq!(
        authority.release(&grant).await.or_fail("release")?,
        Released::Released
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_asks_for_no_certificate_takes_a_client_with_only_the_ca() -> TestResult {
    let (certs, server) = server(no_client_auth).await?;
    let hosts = secure_hosts(server)?;
    let authority = ZkAuthority::connect(&zks(&hosts, "/tls-open", &certs.ca(), None))
        .await
        .or_fail("connect with the CA alone")?;
    let k = key("open")?;
    let grant = authority
        .try_acquire(&k, Duration::from_secs(2))
        .await
        .or_fail("acquire")?
        .or_fail("the key is free")?;
    assert_eq!(
        authority.release(&grant).await.or_fail("release")?,
        Released::Released
    );
    // Still verified: trusting another CA is refused here too.
    let stranger = TestCerts::generate().or_fail("another CA")?;
    refused(
        &zks(&hosts, "/tls-open", &stranger.ca(), None),
        "no client auth, but a server certificate from an unknown CA",
    )
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_and_tls_clients_at_each_others_ports_fail_within_the_timeout() -> TestResult {
    let (certs, server) = server(no_client_auth).await?;
    let secure = server.secure_port().or_fail("the secure port")?;
    let url = format!(
        "zk://127.0.0.1:{secure}/tls-mixed?timeout_ms={}",
        TIMEOUT.as_millis()
    );
    refused(&url, "a plain client at the TLS port").await?;
    let url = zks(&server.connect_string(), "/tls-mixed", &certs.ca(), None);
    refused(&url, "a TLS client at the plain port").await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unusable_tls_files_are_configuration_errors_that_show_no_password() -> TestResult {
    let (certs, server) = server(need_auth).await?;
    let hosts = secure_hosts(server)?.replace("127.0.0.1", "app:pw-hunter2@127.0.0.1");
    let missing = certs.dir().join("no-such-file.pem");
    let empty = certs.dir().join("empty.pem");
    std::fs::write(&empty, "").or_fail("write an empty file")?;
    let cases = [
        (
            "a missing CA file",
            zks(&hosts, "/tls-files", &missing, None),
        ),
        ("an empty CA file", zks(&hosts, "/tls-files", &empty, None)),
        (
            "a missing client key",
            zks(
                &hosts,
                "/tls-files",
                &certs.ca(),
                Some((&certs.client_cert(), &missing)),
            ),
        ),
        (
            "a key file holding a certificate",
            zks(
                &hosts,
                "/tls-files",
                &certs.ca(),
                Some((&certs.client_cert(), &certs.client_cert())),
            ),
        ),
        (
            "a certificate file holding a key",
            zks(
                &hosts,
                "/tls-files",
                &certs.ca(),
                Some((&certs.client_key(), &certs.client_key())),
            ),
        ),
        (
            "a directory as the CA",
            zks(&hosts, "/tls-files", certs.dir(), None),
        ),
    ];
    for (why, url) in cases {
        let started = Instant::now();
        let err = ZkAuthority::connect(&url).await.err_or_fail(why)?;
        assert!(
            matches!(err, Error::InvalidConfig { .. }) && !err.is_retryable(),
            "{why}: {err:?}"
        );
        assert!(
            started.elapsed() < TIMEOUT,
            "{why}: {:?}",
            started.elapsed()
        );
        let shown = format!("{err} {err:?}");
        assert!(!shown.contains("hunter2"), "{why}: {shown}");
        assert!(
            !shown.contains("PRIVATE KEY"),
            "{why}: a key's content: {shown}"
        );
    }
    // A certificate with somebody else's key: refused by rustls before anything is sent.
    let stranger = TestCerts::generate().or_fail("another CA")?;
    let url = zks(
        &hosts,
        "/tls-files",
        &certs.ca(),
        Some((&certs.client_cert(), &stranger.client_key())),
    );
    let started = Instant::now();
    let err = ZkAuthority::connect(&url)
        .await
        .err_or_fail("connect with a certificate and another key")?;
    assert!(
        matches!(err, Error::InvalidConfig { .. }) && !err.is_retryable(),
        "a certificate with another key: {err:?}"
    );
    assert!(started.elapsed() < TIMEOUT, "{:?}", started.elapsed());
    let shown = format!("{err} {err:?}");
    assert!(
        !shown.contains("hunter2") && !shown.contains("PRIVATE KEY"),
        "{shown}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn digest_acls_keep_lock_nodes_creator_only_over_tls() -> TestResult {
    // On a server that asks for no client certificate, the creator is alice's digest user
    // alone; on one that needs a certificate, its subject is an identity of her session too.
    for (which, expected_x509) in [
        (no_client_auth as fn() -> &'static Started, None),
        (need_auth, Some("x509:CN=client")),
    ] {
        let (certs, server) = server(which).await?;
        creator_only_over_tls(certs, server, expected_x509).await?;
    }
    Ok(())
}

async fn creator_only_over_tls(
    certs: &TestCerts,
    server: &ZkServer,
    expected_x509: Option<&str>,
) -> TestResult {
    let secure = secure_hosts(server)?;
    let with_user = |who: &str| secure.replace("127.0.0.1", &format!("{who}@127.0.0.1"));
    // Alice presents the client certificate (CN=client) and digest credentials.
    // Sessions here are opened while the binary's other tests start JVMs and handshake: the
    // connects get time for that, as the ACLs, not the timeout, are under test.
    let patient = |url: String| {
        url.replace(
            &format!("timeout_ms={}", TIMEOUT.as_millis()),
            "timeout_ms=10000",
        )
    };
    let alice = ZkAuthority::connect(&patient(client_url(
        certs,
        &with_user("alice:s3cret-pw"),
        "/tls-acl",
    )))
    .await
    .or_fail("connect as alice")?;
    let k = key("payout:tls")?;
    // Nothing renews the grant while the checks below open TLS sessions one after another,
    // which takes seconds on a loaded machine: the TTL outlasts them, as this is about ACLs.
    let ttl = Duration::from_secs(30);
    let grant = alice
        .try_acquire(&k, ttl)
        .await
        .or_fail("alice acquires")?
        .or_fail("the key is free")?;
    let parent = alice.lock_path(&k);

    let read = |path: &Path| std::fs::read_to_string(path).or_fail(path.display());
    let ca_only = zookeeper_client::TlsOptions::new()
        .with_pem_ca(&read(&certs.ca())?)
        .or_fail("the CA")?;
    let with_cert = ca_only
        .clone()
        .with_pem_identity(&read(&certs.client_cert())?, &read(&certs.client_key())?)
        .or_fail("the client certificate")?;
    let as_alice = zookeeper_client::Client::connector()
        .with_tls(with_cert)
        .with_auth("digest", b"alice:s3cret-pw")
        .secure_connect(&secure)
        .await
        .or_fail("a raw client as alice")?;
    let node = contenders(&as_alice, &parent)
        .await?
        .into_iter()
        .next()
        .or_fail("alice's node")?;
    let node_path = format!("{parent}/{node}");
    // The creator-only ACL names every identity alice's session authenticated with: her digest
    // user and, where the server took her certificate, its subject (ZooKeeper's x509 provider).
    let (acl, _) = as_alice
        .get_acl(&node_path)
        .await
        .or_fail("read the node's ACL")?;
    let mut ids: Vec<String> = acl
        .iter()
        .map(|a| format!("{}:{}", a.scheme(), a.id()))
        .collect();
    ids.sort();
    assert!(ids[0].starts_with("digest:alice:"), "{ids:?}");
    assert_eq!(ids.get(1).map(String::as_str), expected_x509, "{ids:?}");
    assert_eq!(
        ids.len(),
        1 + usize::from(expected_x509.is_some()),
        "{ids:?}"
    );

    // Another digest principal over TLS may neither queue nor delete. Where the server needs a
    // certificate it presents one of the same CA; else none.
    let mallory_url = if expected_x509.is_some() {
        client_url(certs, &with_user("mallory:hunter2"), "/tls-acl")
    } else {
        zks(&with_user("mallory:hunter2"), "/tls-acl", &certs.ca(), None)
    };
    let mallory = ZkAuthority::connect(&patient(mallory_url))
        .await
        .or_fail("connect as mallory")?;
    let outcome = mallory.try_acquire(&k, ttl).await;
    let shown = format!("{outcome:?} {mallory:?} {alice:?}");
    assert!(
        !shown.contains("hunter2") && !shown.contains("s3cret"),
        "{shown}"
    );
    match expected_x509 {
        None => {
            let err = outcome.err_or_fail("mallory tries alice's key")?;
            assert!(matches!(err, Error::Unauthorized { .. }), "{err:?}");
            let as_mallory = zookeeper_client::Client::connector()
                .with_tls(ca_only)
                .with_auth("digest", b"mallory:hunter2")
                .secure_connect(&secure)
                .await
                .or_fail("a raw client as mallory")?;
            assert!(matches!(
                as_mallory.delete(&node_path, None).await,
                Err(zookeeper_client::Error::NoAuth)
            ));
        }
        Some(_) => {
            // A session presenting a certificate with the same subject is a creator too, so
            // mallory may queue (and sees the lock held): the reason docs/zookeeper.md asks for
            // a certificate per application.
            assert!(matches!(outcome, Ok(None)), "{outcome:?}");
        }
    }
    // Nor may an unauthenticated client on the plain port.
    let plain = raw(&server.connect_string()).await?;
    assert!(matches!(
        plain.delete(&node_path, None).await,
        Err(zookeeper_client::Error::NoAuth)
    ));
    // The node is still there, and still alice's lock.
    assert_eq!(contenders(&as_alice, &parent).await?, vec![node]);
    alice.renew(&grant, ttl).await.or_fail("alice renews")?;
    assert_eq!(
        alice.release(&grant).await.or_fail("alice releases")?,
        Released::Released
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_the_conformance_suite_over_tls() -> TestResult {
    // A server of its own: the suite restarts and freezes it.
    let (certs, server) = tokio::task::spawn_blocking(|| start(ZkClientAuth::Need))
        .await
        .or_fail("start a server of its own")?
        .map_err(Failure::new)?;
    let server = Arc::new(server);
    let url = client_url(&certs, &secure_hosts(&server)?, "/conformance");
    let ctx = Context::new(Arc::new(clients(&url)))
        .await
        .or_fail("connect the first client")?
        .with_idle_cleanup(IDLE_CLEANUP)
        .with_residue(Arc::new(ZkResidue {
            // The residue check looks over the plain port; the chroot comes from the URL.
            hosts: server.connect_string(),
            url: url.clone(),
        }))
        .with_faults(Arc::new(standalone_faults(server, url)));
    let report = run_all("zookeeper-tls", &ctx).await;
    println!("{report}");
    report.assert_passed();
    for line in &report.lines {
        if line.scenario != "fences_survive_failover" && !report.declared_absent(line) {
            assert_eq!(
                line.outcome,
                Ok(Verdict::Passed),
                "{}:\n{report}",
                line.scenario
            );
        }
    }
    Ok(())
}
