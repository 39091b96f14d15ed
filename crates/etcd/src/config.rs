//! What an `etcd://` or `etcds://` URL configures.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use leasehold_core::backend::{redact_url, ConnectionUrl, Secret};
use leasehold_core::{ClientOptions, Error, Result};

/// etcd's default client port, used when an endpoint names none.
const DEFAULT_PORT: u16 = 2379;

/// The namespace (key prefix) when the URL has no path.
pub const DEFAULT_NAMESPACE: &str = "leasehold";

/// How long a session with no contender keys lives before its lease is revoked.
const DEFAULT_SESSION_IDLE: Duration = Duration::from_secs(60);

/// TLS material for `etcds://`, read from files when the client connects.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct TlsFiles {
    pub ca: Option<PathBuf>,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    pub domain: Option<String>,
}

/// Settings of an etcd authority.
///
/// From a URL:
/// `etcd://user:password@h1:2379,h2:2379,h3:2379/namespace?timeout_ms=2000&session_idle_ms=30000`
/// or `etcds://...?tls_ca=/etc/etcd/ca.pem&tls_cert=client.pem&tls_key=client-key.pem`.
///
/// * Endpoints: one or more `host:port` separated by commas (port 2379 when left out).
/// * User and password (optional, percent-encoded): etcd's own authentication. The password is
///   kept in a [`Secret`] and never printed.
/// * Path: the namespace every lock key lives under (default `leasehold`): lock key `k` is the
///   etcd prefix `<namespace>/<k with / and % escaped>/`, the same layout `etcdctl lock
///   <namespace>/<k>` uses.
/// * `session_idle_ms`: how long a session that holds no contender key keeps its lease before
///   revoking it (default 60 s).
/// * `tls_ca`, `tls_cert` + `tls_key`, `tls_domain`: TLS files for `etcds://` (PEM). Without
///   `tls_ca`, only the roots compiled into etcd-client's TLS stack are trusted (none with the
///   workspace's `tls` feature), so give it.
/// * The common parameters `epoch`, `safety_margin_ms`, `clock_drift_per_mille`, `timeout_ms`.
///
/// An unknown parameter is an error, never ignored.
#[derive(Clone)]
pub struct EtcdConfig {
    pub(crate) endpoints: Vec<String>,
    pub(crate) tls: Option<TlsFiles>,
    pub(crate) user: Option<(String, Secret)>,
    pub(crate) namespace: String,
    pub(crate) session_idle: Duration,
    pub(crate) client: ClientOptions,
    pub(crate) redacted_url: String,
}

impl fmt::Debug for EtcdConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdConfig")
            .field("url", &self.redacted_url)
            .field("endpoints", &self.endpoints)
            .field("tls", &self.tls)
            .field("user", &self.user.as_ref().map(|(u, _)| u))
            .field("namespace", &self.namespace)
            .field("session_idle", &self.session_idle)
            .field("client", &self.client)
            .finish()
    }
}

impl EtcdConfig {
    /// Parses an `etcd://` or `etcds://` URL.
    pub fn from_url(url: &str) -> Result<Self> {
        let tls = match ConnectionUrl::scheme_of(url).as_deref() {
            Some("etcd") => false,
            Some("etcds") => true,
            _ => {
                return Err(Error::InvalidUrl {
                    url: redact_url(url),
                    reason: "expected an etcd:// or etcds:// URL".into(),
                })
            }
        };
        let mut url = ConnectionUrl::parse(url)?;
        let client = url.params().take_client_options()?;
        let session_idle = match url.params().take_parsed::<u64>("session_idle_ms")? {
            Some(0) => return Err(url.invalid("session_idle_ms must be at least 1")),
            Some(ms) => Duration::from_millis(ms),
            None => DEFAULT_SESSION_IDLE,
        };
        let files = TlsFiles {
            ca: url.params().take("tls_ca").map(PathBuf::from),
            cert: url.params().take("tls_cert").map(PathBuf::from),
            key: url.params().take("tls_key").map(PathBuf::from),
            domain: url.params().take("tls_domain"),
        };
        url.finish_params()?;
        if !tls && files != TlsFiles::default() {
            return Err(
                url.invalid("tls_ca, tls_cert, tls_key and tls_domain need an etcds:// URL")
            );
        }
        if files.cert.is_some() != files.key.is_some() {
            return Err(url.invalid(
                "tls_cert and tls_key must be given together (a client certificate and its key)",
            ));
        }
        let user = match url.user() {
            None => None,
            Some("") => return Err(url.invalid("a password needs a user name")),
            Some(name) => Some((
                name.to_string(),
                url.password().cloned().unwrap_or_else(|| Secret::new("")),
            )),
        };
        if url.hosts().is_empty() {
            return Err(url.invalid("no endpoint: expected etcd://host:port[,host:port...]"));
        }
        let scheme = if tls { "https" } else { "http" };
        let endpoints = url
            .hosts()
            .iter()
            .map(|host| format!("{scheme}://{}", host.address(DEFAULT_PORT)))
            .collect();
        let namespace = url.decode("namespace", url.path().trim_matches('/'))?;
        let namespace = if namespace.is_empty() {
            DEFAULT_NAMESPACE.to_string()
        } else {
            namespace
        };
        check_namespace(&namespace).map_err(|reason| url.invalid(reason))?;
        Ok(EtcdConfig {
            endpoints,
            tls: tls.then_some(files),
            user,
            namespace,
            session_idle,
            client,
            redacted_url: url.redacted().to_string(),
        })
    }

    /// The endpoints the client balances over, as `http://host:port` or `https://host:port`.
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// The namespace every lock key lives under.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// Uses another namespace.
    pub fn with_namespace(mut self, namespace: &str) -> Result<Self> {
        check_namespace(namespace).map_err(|reason| Error::InvalidConfig { reason })?;
        self.namespace = namespace.to_string();
        Ok(self)
    }

    /// The client options (epoch, safety margin, request timeout).
    pub fn client_options(&self) -> &ClientOptions {
        &self.client
    }

    /// Replaces the client options.
    pub fn with_client_options(mut self, client: ClientOptions) -> Self {
        self.client = client;
        self
    }

    /// How long an unused session keeps its lease.
    pub fn session_idle(&self) -> Duration {
        self.session_idle
    }

    /// Sets how long an unused session keeps its lease (at least 1 ms).
    pub fn with_session_idle(mut self, idle: Duration) -> Self {
        self.session_idle = idle.max(Duration::from_millis(1));
        self
    }

    /// The URL with the password masked.
    pub fn redacted_url(&self) -> &str {
        &self.redacted_url
    }
}

/// A namespace is printable ASCII without spaces, so keys print unambiguously, at most 100 bytes.
fn check_namespace(ns: &str) -> std::result::Result<(), String> {
    if ns.is_empty() || ns.len() > 100 {
        return Err("the namespace must be 1 to 100 bytes long".into());
    }
    if ns.chars().any(|c| !c.is_ascii_graphic()) {
        return Err(format!(
            "the namespace `{ns}` must be printable ASCII without spaces"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold_conformance::kit::{ErrOrFail, OrFail, TestResult};

    #[test]
    fn parses_endpoints_user_namespace_and_params() -> TestResult {
        let c = EtcdConfig::from_url(
            "etcd://root:hunter%402@h1:2379,h2,[::1]:2381/app/locks?timeout_ms=700&session_idle_ms=5000&epoch=2",
        )
        .or_fail("the etcd URL with credentials")?;
        assert_eq!(
            c.endpoints,
            vec!["http://h1:2379", "http://h2:2379", "http://[::1]:2381"]
        );
        let (user, password) = c.user.as_ref().or_fail("the credentials")?;
        assert_eq!(user, "root");
        assert_eq!(password.expose(), "hunter@2");
        assert_eq!(c.namespace, "app/locks");
        assert_eq!(c.session_idle, Duration::from_millis(5000));
        assert_eq!(c.client.request_timeout, Duration::from_millis(700));
        assert_eq!(c.client.epoch.get(), 2);
        assert!(c.tls.is_none());
        let shown = format!("{c:?}");
        assert!(!shown.contains("hunter"), "{shown}");

        let d = EtcdConfig::from_url("etcd://127.0.0.1:2379").or_fail("the plain etcd URL")?;
        assert_eq!(d.namespace, DEFAULT_NAMESPACE);
        assert!(d.user.is_none());

        let t = EtcdConfig::from_url("etcds://h:2379?tls_ca=/ca.pem&tls_domain=etcd.local")
            .or_fail("the etcds URL with TLS files")?;
        assert_eq!(t.endpoints, vec!["https://h:2379"]);
        let files = t.tls.or_fail("the TLS files")?;
        assert_eq!(files.ca, Some(PathBuf::from("/ca.pem")));
        assert_eq!(files.domain.as_deref(), Some("etcd.local"));
        Ok(())
    }

    #[test]
    fn rejects_bad_urls_without_printing_the_password() -> TestResult {
        for bad in [
            "etcd://u:hunter2@h:2379?bogus=1",
            "etcd://u:hunter2@h:2379?tls_ca=/ca.pem",
            "etcds://u:hunter2@h:2379?tls_cert=/c.pem",
            "etcd://u:hunter2@",
            "etcd://u:hunter2@h:notaport",
            "etcd://u:hunter2@h:0",
            "etcd://:hunter2@h:2379",
            "etcd://u:hunter2@h:2379?session_idle_ms=0",
            "etcd://u:hunter2@h:2379/name%20space",
            "redis://u:hunter2@h:2379",
            "etcd://u:hunter2@[::1:2379",
            "etcd://u:hunter2%zz@h",
            "etcd://u:hunter2@h1,,h2",
            "etcd://u:hunter2@h1, h2",
        ] {
            let err = EtcdConfig::from_url(bad).err_or_fail("a bad URL")?;
            let shown = format!("{err} {err:?}");
            assert!(!shown.contains("hunter2"), "{bad}: {shown}");
            assert!(
                matches!(err, Error::InvalidUrl { .. } | Error::InvalidConfig { .. }),
                "{bad}: {err}"
            );
        }
        Ok(())
    }
}
