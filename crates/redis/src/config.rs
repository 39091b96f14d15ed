//! What a `redis://`, `rediss://`, `redis+sentinel://` or `redis+cluster://` URL configures.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use leasehold_core::backend::{redact_url, ConnectionUrl};
use leasehold_core::{ClientOptions, Error, Result};
use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo};

use crate::cluster::{ClusterTarget, DEFAULT_PORT};
use crate::keys::{check_channel, KeyLayout, DEFAULT_CHANNEL};
use crate::sentinel::{node_settings, parse_target, SentinelTarget};

/// Where the authority finds its server.
#[derive(Clone)]
pub(crate) enum Target {
    /// One address (`redis://`, `rediss://`).
    Direct(ConnectionInfo),
    /// Whichever server the sentinels name as the primary (`redis+sentinel://`).
    Sentinel(SentinelTarget),
    /// A Redis Cluster, found through its seed nodes (`redis+cluster://`).
    Cluster(ClusterTarget),
}

impl fmt::Debug for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The connection info holds the password: the redacted URL says the rest.
        match self {
            Target::Direct(_) => f.write_str("Direct"),
            Target::Sentinel(target) => target.fmt(f),
            Target::Cluster(target) => target.fmt(f),
        }
    }
}

/// After each acquisition, `WAIT` until this many replicas acknowledged it, at most `timeout`.
///
/// This narrows the window in which a failover loses a fresh lock and its fence; it is not
/// consensus. Replicas acknowledge receipt, not durability, and a failover may still promote a
/// replica that did not acknowledge (see docs/redis.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaitReplicas {
    /// How many replicas must acknowledge (at least 1).
    pub replicas: u32,
    /// How long to wait for them (more than zero: `WAIT` with 0 would block forever).
    pub timeout: Duration,
}

/// Settings of a Redis authority.
///
/// From a URL: `redis://[user][:password@]host[:port][/db][?params]`, or `rediss://` for TLS,
/// which always verifies the server's certificate (the client library's `#insecure` is
/// refused; trust a private CA with `tls_ca_file` instead); or, behind Redis Sentinel,
/// `redis+sentinel://[user][:password@]host[:port][,host[:port]...]/<master name>[/db][?params]`:
/// the hosts are sentinels (port 26379 by default), the user and password are the primary's,
/// and the authority connects to whichever server the sentinels name as the primary, again
/// after every failover (see docs/redis.md). Parameters:
///
/// | parameter | default | meaning |
/// |---|---|---|
/// | `prefix` | `leasehold:` | put in front of every lock key (may be empty: `prefix=`) |
/// | `channel` | `leasehold:released` | the pub/sub channel releases are announced on |
/// | `wait_replicas` | 0 (off) | after an acquisition, `WAIT` for this many replicas |
/// | `wait_timeout_ms` | 100 | how long that `WAIT` may take |
/// | `tls_ca_file` | system roots | a PEM file of CA certificates to trust (`rediss://` only) |
/// | `sentinel_user`, `sentinel_password` | none | credentials for the sentinels themselves (`redis+sentinel://` only; percent-encoded) |
/// | `epoch`, `safety_margin_ms`, `clock_drift_per_mille`, `timeout_ms` | | shared by every backend; with Sentinel, one round of asking the sentinels fits in `timeout_ms` |
///
/// An unknown parameter is an error. Passwords are kept only in the client library's
/// connection info and never printed.
#[derive(Clone)]
pub struct RedisConfig {
    pub(crate) target: Target,
    pub(crate) redacted_url: String,
    pub(crate) layout: KeyLayout,
    pub(crate) channel: String,
    pub(crate) wait: Option<WaitReplicas>,
    pub(crate) tls_ca_file: Option<PathBuf>,
    pub(crate) client: ClientOptions,
}

impl fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisConfig")
            .field("url", &self.redacted_url)
            .field("target", &self.target)
            .field("layout", &self.layout)
            .field("channel", &self.channel)
            .field("wait", &self.wait)
            .field("tls_ca_file", &self.tls_ca_file)
            .field("client", &self.client)
            .finish()
    }
}

const DEFAULT_WAIT_TIMEOUT: Duration = Duration::from_millis(100);

/// The longest `WAIT` accepted: the longest TTL granted. A wait longer than any lease it
/// protects means nothing, and Redis refuses timeouts near `i64::MAX` ms, so a larger value
/// would make every acquisition fail.
const MAX_WAIT_TIMEOUT: Duration = Duration::from_secs(30 * 24 * 3600);

impl RedisConfig {
    /// Parses a `redis://`, `rediss://`, `redis+sentinel://` or `redis+cluster://` URL.
    pub fn from_url(url: &str) -> Result<Self> {
        let wrong = |reason: &str| Error::InvalidUrl {
            url: redact_url(url),
            reason: reason.into(),
        };
        let (tls, sentinel, cluster) = match ConnectionUrl::scheme_of(url).as_deref() {
            Some("redis") => (false, false, false),
            Some("rediss") => (true, false, false),
            Some("redis+sentinel") => (false, true, false),
            Some("redis+cluster") => (false, false, true),
            Some("rediss+cluster") => {
                return Err(wrong(
                    "TLS to a Redis Cluster is not supported yet; use redis+cluster:// on a \
                     trusted network",
                ))
            }
            Some("rediss+sentinel") => return Err(wrong(
                "TLS to a Sentinel deployment is not supported yet; use redis+sentinel:// on a \
                     trusted network, or rediss:// to an address that follows the primary",
            )),
            _ => {
                return Err(wrong(
                    "expected a redis://, rediss://, redis+sentinel:// or redis+cluster:// URL",
                ))
            }
        };
        let mut url = ConnectionUrl::parse(url)?;
        let client = url.params().take_client_options()?;
        let layout = match url.params().take("prefix") {
            Some(prefix) => KeyLayout::new(&prefix)?,
            None => KeyLayout::default(),
        };
        let channel = url
            .params()
            .take("channel")
            .unwrap_or_else(|| DEFAULT_CHANNEL.to_string());
        check_channel(&channel)?;
        let replicas = url
            .params()
            .take_parsed::<u32>("wait_replicas")?
            .unwrap_or(0);
        let wait_timeout = url
            .params()
            .take_parsed::<u64>("wait_timeout_ms")?
            .map(Duration::from_millis);
        let tls_ca_file = url.params().take("tls_ca_file").map(PathBuf::from);
        let (sentinel_user, sentinel_password) = if sentinel {
            (
                url.params().take_decoded("sentinel_user")?,
                url.params().take_secret("sentinel_password")?,
            )
        } else {
            (None, None)
        };
        url.finish_params()?;
        if tls_ca_file.is_some() && !tls {
            return Err(url.invalid("tls_ca_file needs a rediss:// URL"));
        }
        if cluster && replicas > 0 {
            // WAIT counts the replicas of the connection it is sent on, and the cluster client
            // sends a keyless command to any node: it would count another shard's replicas.
            return Err(url.invalid(
                "wait_replicas is not supported on redis+cluster:// (WAIT cannot be sent on \
                 the connection that took the write through the cluster client)",
            ));
        }
        let wait = match (replicas, wait_timeout) {
            (0, None) => None,
            (0, Some(_)) => return Err(url.invalid("wait_timeout_ms needs wait_replicas")),
            (replicas, timeout) => Some(WaitReplicas {
                replicas,
                timeout: timeout.unwrap_or(DEFAULT_WAIT_TIMEOUT),
            }),
        };
        if let Some(fragment) = url.fragment() {
            return Err(url.invalid(format!(
                "`#{fragment}` is not supported: certificates are always verified; trust a \
                 private CA with tls_ca_file"
            )));
        }
        let target = if cluster {
            Target::Cluster(crate::cluster::parse_target(&url)?)
        } else if sentinel {
            Target::Sentinel(parse_target(&url, sentinel_user, sentinel_password)?)
        } else {
            Target::Direct(direct_target(&url, tls)?)
        };
        let config = RedisConfig {
            target,
            redacted_url: url.redacted().to_string(),
            layout,
            channel,
            wait: None,
            tls_ca_file,
            client,
        };
        match wait {
            Some(w) => config.with_wait_replicas(w),
            None => Ok(config),
        }
    }

    /// Uses another key prefix (see [`KeyLayout::new`]).
    pub fn with_prefix(mut self, prefix: &str) -> Result<Self> {
        self.layout = KeyLayout::new(prefix)?;
        Ok(self)
    }

    /// Announces releases on another channel.
    pub fn with_channel(mut self, channel: &str) -> Result<Self> {
        check_channel(channel)?;
        self.channel = channel.to_string();
        Ok(self)
    }

    /// Waits for replicas after every acquisition. The wait must be shorter than the request
    /// timeout, since it happens inside the acquiring request's budget.
    pub fn with_wait_replicas(mut self, wait: WaitReplicas) -> Result<Self> {
        if self.is_cluster() {
            return Err(Error::InvalidConfig {
                reason: "waiting for replicas is not supported on a Redis Cluster (WAIT cannot \
                         be sent on the connection that took the write)"
                    .into(),
            });
        }
        if wait.replicas == 0 || wait.timeout.is_zero() {
            return Err(Error::InvalidConfig {
                reason: "waiting for replicas needs at least one replica and a timeout above \
                         zero (WAIT with 0 blocks forever)"
                    .into(),
            });
        }
        if wait.timeout > MAX_WAIT_TIMEOUT {
            return Err(Error::InvalidConfig {
                reason: format!(
                    "wait_timeout_ms ({:?}) must be at most {:?}, the longest TTL",
                    wait.timeout, MAX_WAIT_TIMEOUT
                ),
            });
        }
        if wait.timeout >= self.client.request_timeout {
            return Err(Error::InvalidConfig {
                reason: format!(
                    "wait_timeout_ms ({:?}) must be below the request timeout ({:?})",
                    wait.timeout, self.client.request_timeout
                ),
            });
        }
        self.wait = Some(wait);
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

    /// The key layout.
    pub fn layout(&self) -> &KeyLayout {
        &self.layout
    }

    /// The release channel.
    pub fn channel(&self) -> &str {
        &self.channel
    }

    /// The replica wait after acquisitions, if configured.
    pub fn wait_replicas(&self) -> Option<WaitReplicas> {
        self.wait
    }

    /// The URL with its password masked.
    pub fn redacted_url(&self) -> &str {
        &self.redacted_url
    }

    /// For a `redis+sentinel://` URL, the name of the primary the sentinels are asked for.
    pub fn sentinel_master_name(&self) -> Option<&str> {
        match &self.target {
            Target::Sentinel(target) => Some(&target.master_name),
            Target::Direct(_) | Target::Cluster(_) => None,
        }
    }

    /// For a `redis+sentinel://` URL, the sentinels' addresses (`host:port`), in the URL's order.
    pub fn sentinels(&self) -> Vec<String> {
        match &self.target {
            Target::Sentinel(target) => target.sentinels.iter().map(|s| s.to_string()).collect(),
            Target::Direct(_) | Target::Cluster(_) => Vec::new(),
        }
    }

    /// For a `redis+cluster://` URL, the seed nodes (`host:port`), in the URL's order.
    pub fn cluster_seeds(&self) -> Vec<String> {
        match &self.target {
            Target::Cluster(target) => target.seeds.iter().map(|s| s.to_string()).collect(),
            Target::Direct(_) | Target::Sentinel(_) => Vec::new(),
        }
    }

    /// Whether this configuration names a Redis Cluster (`redis+cluster://`).
    pub fn is_cluster(&self) -> bool {
        matches!(self.target, Target::Cluster(_))
    }
}

/// The one server of a `redis://` or `rediss://` URL (`host[:port][/db]`, port 6379 by
/// default), with its database and the URL's credentials.
fn direct_target(url: &ConnectionUrl, tls: bool) -> Result<ConnectionInfo> {
    let host = match url.hosts() {
        [host] => host,
        [] => return Err(url.invalid("no host: expected redis://host[:port][/db]")),
        _ => {
            return Err(url.invalid(
                "a redis:// URL names one server; for several, use redis+sentinel:// or \
                 redis+cluster://",
            ))
        }
    };
    if matches!(host.name(), "0.0.0.0" | "::") {
        return Err(url.invalid("cannot connect to a wildcard address (0.0.0.0 or ::)"));
    }
    let db = match url.path().trim_matches('/') {
        "" => 0,
        db => db
            .parse::<i64>()
            .map_err(|_| url.invalid(format!("the database must be a number, not `{db}`")))?,
    };
    let (name, port) = (host.name().to_string(), host.port().unwrap_or(DEFAULT_PORT));
    let addr = match tls {
        true => ConnectionAddr::TcpTls {
            host: name,
            port,
            insecure: false,
            tls_params: None,
        },
        false => ConnectionAddr::Tcp(name, port),
    };
    let info = addr.into_connection_info().map_err(|e| {
        url.invalid(format!(
            "the Redis client rejected it: {}",
            redact_url(&e.to_string())
        ))
    })?;
    Ok(info.set_redis_settings(node_settings(url).set_db(db)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold_conformance::kit::{ErrOrFail, OrFail, TestResult};

    #[test]
    fn parses_ours_and_the_clients_and_rejects_the_rest() -> TestResult {
        let c = RedisConfig::from_url(
            "redis://app:hunter2@cache:6380/2?prefix=locks/&channel=c1&wait_replicas=1&wait_timeout_ms=50&epoch=2&timeout_ms=800",
        )
        .or_fail("the redis URL")?;
        assert_eq!(c.layout.prefix(), "locks/");
        assert_eq!(c.channel, "c1");
        assert_eq!(
            c.wait,
            Some(WaitReplicas {
                replicas: 1,
                timeout: Duration::from_millis(50)
            })
        );
        assert_eq!(c.client.epoch.get(), 2);
        let Target::Direct(info) = &c.target else {
            panic!("not a direct target")
        };
        assert_eq!(info.redis_settings().db(), 2);
        assert_eq!(info.redis_settings().username(), Some("app"));
        assert_eq!(info.redis_settings().password(), Some("hunter2"));
        assert_eq!(c.sentinel_master_name(), None);
        let shown = format!("{c:?}");
        assert!(!shown.contains("hunter2"), "{shown}");

        let empty = RedisConfig::from_url("redis://h?prefix=")
            .or_fail("the redis URL with an empty prefix")?;
        assert_eq!(empty.layout.prefix(), "");
        let tls = RedisConfig::from_url("rediss://:pw@h:6390?tls_ca_file=/ca.pem")
            .or_fail("the rediss URL with a CA file")?;
        assert!(tls.tls_ca_file.is_some());
        assert!(RedisConfig::from_url("redis://h")
            .or_fail("the plain redis URL")?
            .wait
            .is_none());

        for bad in [
            "redis://:hunter2@h?prefx=x",
            "redis://:hunter2@h?prefix=a{b",
            "redis://:hunter2@h?wait_replicas=1&wait_timeout_ms=0",
            "redis://:hunter2@h?wait_timeout_ms=10",
            "redis://:hunter2@h?wait_replicas=1&wait_timeout_ms=6000",
            "redis://:hunter2@h?wait_replicas=-1",
            "redis://:hunter2@h?tls_ca_file=/ca.pem",
            "redis://:hunter2@h?channel=",
            "redis://:hunter2@h/notadb",
            "postgres://u:hunter2@h",
            "redis://:hunter2@h?timeout_ms=0",
            "rediss://:hunter2@h#insecure",
            "redis+sentinel://:hunter2@h",
            "redis+sentinel://:hunter2@h/m?tls_ca_file=/ca.pem",
            "redis+sentinel://:hunter2@h/m?sentinel_password=",
            "redis+sentinel://:hunter2@h/m?sentinel_user=u",
            "redis+sentinel://:hunter2@h/m#x",
            "redis+sentinel://:hunter2@h:70000/m",
            "rediss+sentinel://:hunter2@h/m",
            "redis://:hunter2@h?sentinel_password=x",
            "redis+cluster://:hunter2@h:7000,h:7001?wait_replicas=1",
            "redis+cluster://:hunter2@h:7000/3",
            "redis+cluster://:hunter2@h:7000?tls_ca_file=/ca.pem",
            "redis+cluster://:hunter2@h:7000?sentinel_password=x",
            "redis+cluster://:hunter2@h:99999",
            "redis+cluster://:hunter2@",
            "rediss+cluster://:hunter2@h:7000",
            "redis://:hunter2@h1,h2",
            "redis://:hunter2@",
            "redis://:hunter2@0.0.0.0",
            "redis://:hunter2@h:0",
        ] {
            let err = RedisConfig::from_url(bad).err_or_fail("a bad URL")?;
            let shown = format!("{err} {err:?}");
            assert!(!shown.contains("hunter2"), "{shown}");
            assert!(
                matches!(err, Error::InvalidUrl { .. } | Error::InvalidConfig { .. }),
                "{bad}: {err}"
            );
        }
        Ok(())
    }

    /// One server, by name or IPv6 address, with TLS and a database; the password
    /// percent-decoded and an empty one left out.
    #[test]
    fn a_direct_url_names_one_server() -> std::result::Result<(), String> {
        for (url, want_host, want_port, want_tls, want_db, want_password) in [
            (
                "rediss://u:p%40ss@[::1]:6390/3",
                "::1",
                6390,
                true,
                3,
                Some("p@ss"),
            ),
            ("redis://cache/", "cache", 6379, false, 0, None),
            ("redis://:@cache:7000", "cache", 7000, false, 0, None),
        ] {
            let config = RedisConfig::from_url(url).map_err(|e| format!("{url}: {e}"))?;
            let Target::Direct(info) = &config.target else {
                return Err(format!("{url}: not a direct target"));
            };
            let (host, port, tls) = match info.addr() {
                ConnectionAddr::Tcp(host, port) => (host, *port, false),
                ConnectionAddr::TcpTls {
                    host,
                    port,
                    insecure: false,
                    ..
                } => (host, *port, true),
                other => return Err(format!("{url}: {other:?}")),
            };
            let settings = info.redis_settings();
            let got = (host.as_str(), port, tls, settings.db(), settings.password());
            if got != (want_host, want_port, want_tls, want_db, want_password) {
                return Err(format!("{url}: {got:?}"));
            }
        }
        Ok(())
    }

    #[test]
    fn parses_sentinel_urls_without_showing_secrets() -> TestResult {
        let c = RedisConfig::from_url(
            "redis+sentinel://app:hunter2@10.0.0.1:26380,10.0.0.2/mymaster/4?prefix=p:&sentinel_user=mon&sentinel_password=hunter3&timeout_ms=700&wait_replicas=1&wait_timeout_ms=50",
        )
        .or_fail("the redis URL")?;
        assert_eq!(c.sentinel_master_name(), Some("mymaster"));
        assert_eq!(c.sentinels(), ["10.0.0.1:26380", "10.0.0.2:26379"]);
        assert_eq!(c.layout.prefix(), "p:");
        assert_eq!(c.client.request_timeout, Duration::from_millis(700));
        assert!(c.wait.is_some());
        let Target::Sentinel(target) = &c.target else {
            panic!("not a sentinel target")
        };
        assert_eq!(target.node.db(), 4);
        assert_eq!(target.node.password(), Some("hunter2"));
        assert_eq!(target.sentinel_auth.password(), Some("hunter3"));
        let shown = format!("{c:?} {c:#?} {}", c.redacted_url());
        assert!(
            !shown.contains("hunter2") && !shown.contains("hunter3"),
            "{shown}"
        );
        assert!(RedisConfig::from_url("REDIS+SENTINEL://h/m").is_ok());
        Ok(())
    }

    #[test]
    fn parses_cluster_urls_without_showing_secrets() -> TestResult {
        let c = RedisConfig::from_url(
            "redis+cluster://app:hunter2@10.0.0.1:7000,10.0.0.2/0?prefix=p:&channel=ch&timeout_ms=700",
        )
        .or_fail("the redis URL")?;
        assert!(c.is_cluster());
        assert_eq!(c.cluster_seeds(), ["10.0.0.1:7000", "10.0.0.2:6379"]);
        assert_eq!(c.layout.prefix(), "p:");
        assert_eq!(c.channel(), "ch");
        assert_eq!(c.sentinel_master_name(), None);
        let Target::Cluster(target) = &c.target else {
            panic!("not a cluster target")
        };
        assert_eq!(target.node.password(), Some("hunter2"));
        let shown = format!("{c:?} {c:#?} {}", c.redacted_url());
        assert!(!shown.contains("hunter2"), "{shown}");
        let wait = WaitReplicas {
            replicas: 1,
            timeout: Duration::from_millis(50),
        };
        assert!(matches!(
            c.with_wait_replicas(wait),
            Err(Error::InvalidConfig { .. })
        ));
        assert!(RedisConfig::from_url("REDIS+CLUSTER://h").is_ok());
        Ok(())
    }
}
