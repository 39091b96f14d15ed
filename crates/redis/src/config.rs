//! What a `redis://` or `rediss://` URL configures.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use leasehold_core::{redact_url, ClientOptions, Error, Result, UrlParams};
use redis::{ConnectionInfo, IntoConnectionInfo};

use crate::keys::{check_channel, KeyLayout, DEFAULT_CHANNEL};

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
/// refused; trust a private CA with `tls_ca_file` instead). Parameters:
///
/// | parameter | default | meaning |
/// |---|---|---|
/// | `prefix` | `leasehold:` | put in front of every lock key (may be empty: `prefix=`) |
/// | `channel` | `leasehold:released` | the pub/sub channel releases are announced on |
/// | `wait_replicas` | 0 (off) | after an acquisition, `WAIT` for this many replicas |
/// | `wait_timeout_ms` | 100 | how long that `WAIT` may take |
/// | `tls_ca_file` | system roots | a PEM file of CA certificates to trust (`rediss://` only) |
/// | `epoch`, `safety_margin_ms`, `clock_drift_per_mille`, `timeout_ms` | | shared by every backend |
///
/// An unknown parameter is an error. The password is kept only in the client library's
/// connection info and never printed.
#[derive(Clone)]
pub struct RedisConfig {
    pub(crate) info: ConnectionInfo,
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
    /// Parses a `redis://` or `rediss://` URL.
    pub fn from_url(url: &str) -> Result<Self> {
        let redacted_url = redact_url(url);
        let invalid = |reason: String| Error::InvalidUrl {
            url: redacted_url.clone(),
            reason,
        };
        let scheme = url.split_once("://").map(|(s, _)| s.to_ascii_lowercase());
        let tls = match scheme.as_deref() {
            Some("redis") => false,
            Some("rediss") => true,
            _ => return Err(invalid("expected a redis:// or rediss:// URL".into())),
        };
        let mut params = UrlParams::parse(url)?;
        let client = params.take_client_options()?;
        let layout = match params.take("prefix") {
            Some(prefix) => KeyLayout::new(&prefix)?,
            None => KeyLayout::default(),
        };
        let channel = params
            .take("channel")
            .unwrap_or_else(|| DEFAULT_CHANNEL.to_string());
        check_channel(&channel)?;
        let replicas = params.take_parsed::<u32>("wait_replicas")?.unwrap_or(0);
        let wait_timeout = params
            .take_parsed::<u64>("wait_timeout_ms")?
            .map(Duration::from_millis);
        let tls_ca_file = params.take("tls_ca_file").map(PathBuf::from);
        params.finish()?;
        if tls_ca_file.is_some() && !tls {
            return Err(invalid("tls_ca_file needs a rediss:// URL".into()));
        }
        let wait = match (replicas, wait_timeout) {
            (0, None) => None,
            (0, Some(_)) => return Err(invalid("wait_timeout_ms needs wait_replicas".into())),
            (replicas, timeout) => Some(WaitReplicas {
                replicas,
                timeout: timeout.unwrap_or(DEFAULT_WAIT_TIMEOUT),
            }),
        };
        // The client library gets the URL without our parameters.
        if let Some((_, fragment)) = url.split_once('#') {
            return Err(invalid(format!(
                "`#{fragment}` is not supported: certificates are always verified; trust a \
                 private CA with tls_ca_file"
            )));
        }
        let driver_url = url.split('?').next().unwrap_or(url);
        let info = driver_url.into_connection_info().map_err(|e| {
            invalid(format!(
                "the Redis client rejected it: {}",
                redact_url(&e.to_string())
            ))
        })?;
        let config = RedisConfig {
            info,
            redacted_url,
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ours_and_the_clients_and_rejects_the_rest() {
        let c = RedisConfig::from_url(
            "redis://app:hunter2@cache:6380/2?prefix=locks/&channel=c1&wait_replicas=1&wait_timeout_ms=50&epoch=2&timeout_ms=800",
        )
        .unwrap();
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
        assert_eq!(c.info.redis_settings().db(), 2);
        assert_eq!(c.info.redis_settings().username(), Some("app"));
        assert_eq!(c.info.redis_settings().password(), Some("hunter2"));
        let shown = format!("{c:?}");
        assert!(!shown.contains("hunter2"), "{shown}");

        let empty = RedisConfig::from_url("redis://h?prefix=").unwrap();
        assert_eq!(empty.layout.prefix(), "");
        let tls = RedisConfig::from_url("rediss://:pw@h:6390?tls_ca_file=/ca.pem").unwrap();
        assert!(tls.tls_ca_file.is_some());
        assert!(RedisConfig::from_url("redis://h").unwrap().wait.is_none());

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
        ] {
            let err = RedisConfig::from_url(bad).unwrap_err();
            let shown = format!("{err} {err:?}");
            assert!(!shown.contains("hunter2"), "{shown}");
            assert!(
                matches!(err, Error::InvalidUrl { .. } | Error::InvalidConfig { .. }),
                "{bad}: {err}"
            );
        }
    }
}
