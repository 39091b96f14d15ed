//! What a `zk://` or `zks://` URL configures.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use leasehold_core::Instant;

use leasehold_core::backend::{percent_decode, redact_url, ConnectionUrl, Secret, UrlHost};
use leasehold_core::{ClientOptions, Error, Result, TtlRange};

/// The chroot used when the URL names none, so that lock nodes never land in the server's root
/// next to `/zookeeper`.
pub const DEFAULT_CHROOT: &str = "/leasehold";

/// Who may touch the nodes this authority creates (the chroot, the per-key parents and the
/// contender nodes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AclMode {
    /// `world:anyone` may do everything (ZooKeeper's `OPEN_ACL_UNSAFE`). The default without
    /// credentials.
    Open,
    /// Only sessions authenticated as the creator (`auth` scheme, `CREATOR_ALL_ACL`). The default
    /// with credentials: another principal cannot delete a holder's node or queue in front of
    /// it.
    CreatorOnly,
}

/// TLS material for `zks://`: PEM files, read each time a session is opened (so a rotated
/// certificate is picked up by the next session).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TlsFiles {
    /// The CA certificates the servers' certificates must chain to. Required: the server is
    /// always verified (chain and host name), there is no insecure mode.
    pub ca: PathBuf,
    /// The client certificate and its (unencrypted PKCS#8, PKCS#1 or SEC1) key, for servers with
    /// `ssl.clientAuth=need`.
    pub identity: Option<(PathBuf, PathBuf)>,
}

/// What kind of node a lock key's parent (`<chroot>/<escaped key>`) is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParentMode {
    /// A container node, as Curator makes them (the default): the server removes it once its
    /// last contender is gone (checked every `znode.container.checkIntervalMs`, a minute by
    /// default), so keys used once do not pile up. leasehold and Curator recreate it when they
    /// find it gone; kazoo's `Lock` does not (it makes sure of its path once), so do not use
    /// containers on keys a kazoo `Lock` shares.
    Container,
    /// A persistent node, as kazoo makes them: it stays until someone deletes it. For keys shared
    /// with kazoo; every key ever locked keeps its (empty) parent.
    Persistent,
}

/// Settings of a ZooKeeper authority.
///
/// From a URL: `zk://[user:password@]host1:2181,host2:2181[/chroot][?params]`, or
/// `zks://...?tls_ca=ca.pem[&tls_cert=client.pem&tls_key=client.key]` for TLS on every
/// connection (ZooKeeper's `secureClientPort`):
/// * the hosts are handed to the client as the connect string (port 2181 when omitted; with
///   `zks://` each must be a DNS name or an IP address, which the server's certificate must
///   name);
/// * the path is the chroot under which every lock lives (default [`DEFAULT_CHROOT`]; `/` for
///   the server's root). It is created as persistent nodes on connect when missing;
/// * `user:password` adds `digest` authentication to every session and makes lock nodes
///   creator-only (percent-encode `:`, `@` and `/` in the password);
/// * parameters: `acl=open|creator`, `parent=container|persistent` (see [`ParentMode`]), and
///   the common `epoch`, `safety_margin_ms`,
///   `clock_drift_per_mille`, `timeout_ms`. Anything else is an error.
/// * `zks://` only: `tls_ca` (required: the PEM CA certificates the servers' certificates must
///   chain to; the server is always verified, chain and host name), and `tls_cert` with
///   `tls_key` (a PEM client certificate and its unencrypted key, for servers that require one),
///   as percent-encoded paths. The files are read when a session is opened: a missing or
///   unusable file is an `InvalidConfig` error on connect.
///
/// The password lives in a [`Secret`] and never reaches `Debug`, `Display`, errors or logs.
#[derive(Clone)]
pub struct ZkConfig {
    pub(crate) hosts: String,
    pub(crate) chroot: String,
    pub(crate) credentials: Option<(String, Secret)>,
    pub(crate) tls: Option<TlsFiles>,
    pub(crate) acl: AclMode,
    pub(crate) parent: ParentMode,
    pub(crate) client: ClientOptions,
    pub(crate) ttl_range: Option<TtlRange>,
    pub(crate) server_version: Option<(u32, u32, u32)>,
    /// Half the server's (estimated) tick, how often a leader pings its followers, when the
    /// servers have followers (`None` for a standalone server). Set on connect; see
    /// [`ZkConfig::deadline`].
    pub(crate) half_tick: Option<Duration>,
    pub(crate) redacted_url: String,
}

impl fmt::Debug for ZkConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkConfig")
            .field("url", &self.redacted_url)
            .field("hosts", &self.hosts)
            .field("chroot", &self.chroot)
            .field("user", &self.credentials.as_ref().map(|(user, _)| user))
            .field("tls", &self.tls)
            .field("acl", &self.acl)
            .field("parent", &self.parent)
            .field("client", &self.client)
            .field("ttl_range", &self.ttl_range)
            .field("server_version", &self.server_version)
            .finish()
    }
}

impl ZkConfig {
    /// Parses a `zk://` or `zks://` URL.
    pub fn from_url(url: &str) -> Result<Self> {
        let secure = match ConnectionUrl::scheme_of(url).as_deref() {
            Some("zk") => false,
            Some("zks") => true,
            _ => {
                return Err(Error::InvalidUrl {
                    url: redact_url(url),
                    reason: "expected a zk:// or zks:// URL".into(),
                })
            }
        };
        let mut url = ConnectionUrl::parse(url)?;
        let client = url.params().take_client_options()?;
        let acl = url.params().take("acl");
        let parent = url.params().take("parent");
        let tls_ca = url.params().take("tls_ca");
        let tls_cert = url.params().take("tls_cert");
        let tls_key = url.params().take("tls_key");
        url.finish_params()?;
        let tls = tls_files(secure, tls_ca, tls_cert, tls_key).map_err(|r| url.invalid(r))?;

        let credentials = match (url.user(), url.password()) {
            (None, _) => None,
            (Some(_), None) => {
                return Err(
                    url.invalid("credentials must be `user:password` (digest authentication)")
                )
            }
            (Some(user), Some(_)) if user.is_empty() || user.contains(':') => {
                return Err(url.invalid("the user name must be non-empty and contain no `:`"))
            }
            (Some(user), Some(password)) => Some((user.to_string(), password.clone())),
        };
        let hosts = connect_string(url.hosts(), secure).map_err(|r| url.invalid(r))?;
        // The chroot is a ZooKeeper path as written: never percent-decoded.
        let chroot = match url.path() {
            "" => DEFAULT_CHROOT.to_string(),
            "/" => "/".to_string(),
            p => {
                validate_path(p)
                    .map_err(|why| url.invalid(format!("invalid chroot `{p}`: {why}")))?;
                p.to_string()
            }
        };
        let acl = match acl.as_deref() {
            None if credentials.is_some() => AclMode::CreatorOnly,
            None | Some("open") => AclMode::Open,
            Some("creator") if credentials.is_some() => AclMode::CreatorOnly,
            Some("creator") => {
                return Err(url.invalid("acl=creator needs credentials (zk://user:password@...)"))
            }
            Some(other) => {
                return Err(url.invalid(format!(
                    "parameter `acl` has an invalid value `{other}`; use `open` or `creator`"
                )))
            }
        };
        let parent = match parent.as_deref() {
            None | Some("container") => ParentMode::Container,
            Some("persistent") => ParentMode::Persistent,
            Some(other) => {
                return Err(url.invalid(format!(
                    "parameter `parent` has an invalid value `{other}`; use `container` or `persistent`"
                )))
            }
        };
        Ok(ZkConfig {
            hosts,
            chroot,
            credentials,
            tls,
            acl,
            parent,
            client,
            ttl_range: None,
            server_version: None,
            half_tick: None,
            redacted_url: url.redacted().to_string(),
        })
    }

    /// The connect string handed to the client: `host:port,host:port`, without chroot.
    pub fn hosts(&self) -> &str {
        &self.hosts
    }

    /// Whether every connection uses TLS (a `zks://` URL).
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// The CA file a `zks://` URL trusts (`tls_ca`), `None` for `zk://`.
    pub fn tls_ca(&self) -> Option<&Path> {
        self.tls.as_ref().map(|tls| tls.ca.as_path())
    }

    /// The client certificate and key files a `zks://` URL presents (`tls_cert`, `tls_key`).
    pub fn tls_identity(&self) -> Option<(&Path, &Path)> {
        self.tls
            .as_ref()
            .and_then(|tls| tls.identity.as_ref())
            .map(|(cert, key)| (cert.as_path(), key.as_path()))
    }

    /// The chroot every lock lives under (`/` for the root).
    pub fn chroot(&self) -> &str {
        &self.chroot
    }

    /// Who may touch the nodes this authority creates.
    pub fn acl(&self) -> AclMode {
        self.acl
    }

    /// What kind of node a lock key's parent is.
    pub fn parent_mode(&self) -> ParentMode {
        self.parent
    }

    /// Makes lock keys' parents containers or persistent nodes (the URL's `parent=`).
    pub fn with_parent_mode(mut self, parent: ParentMode) -> Self {
        self.parent = parent;
        self
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

    /// Declares the session timeouts the servers grant instead of measuring them on connect.
    ///
    /// By default, connecting opens two short-lived sessions asking for a very short and a very
    /// long timeout, and takes what the server granted as the TTL range (ZooKeeper clamps to its
    /// `minSessionTimeout..maxSessionTimeout`, by default 2 to 20 ticks). A declared range saves
    /// those two sessions; a TTL inside it that the server then does not grant exactly is still
    /// refused with `InvalidTtl` when its session is opened, never rounded.
    pub fn with_ttl_range(mut self, range: TtlRange) -> Self {
        self.ttl_range = Some(range);
        self
    }

    /// Speaks the protocol of an older server. Below 3.5.0 a create answers without the new
    /// node's `Stat`, so the fence is read back with `exists`; below 3.5.3 per-key parents are
    /// persistent nodes, because container nodes do not exist yet (they are then never removed
    /// by the server).
    pub fn with_server_version(mut self, major: u32, minor: u32, patch: u32) -> Self {
        self.server_version = Some((major, minor, patch));
        self
    }

    /// The local deadline of a lease whose session the leader knew alive after `sent` (it
    /// committed a write of that session sent then), the session having been quiet for at most
    /// `quiet` before.
    ///
    /// The leader expires a session a TTL after it last *touched* it, and a write it commits
    /// does not touch it: a client talking to a follower is touched when that follower reports
    /// the sessions it heard from, in its replies to the leader's pings, every half tick. If the
    /// follower is cut off right after our request, that report never comes, and the last touch
    /// is from the last report that did, which covered our session only if it sent something
    /// since the report before. So the leader may expire the session up to half a tick plus the
    /// quiet time before `sent` earlier than (sent + TTL). A standalone server touches a session
    /// on every request it receives.
    pub(crate) fn deadline(&self, sent: Instant, ttl: Duration, quiet: Duration) -> Instant {
        let touch_lag = self
            .half_tick
            .map_or(Duration::ZERO, |half| half.saturating_add(quiet));
        self.client
            .safety_margin
            .deadline(sent, ttl.saturating_sub(touch_lag))
    }

    /// Whether lock keys' parents are containers: asked for, and the server knows them (3.5.3
    /// and later, or unknown).
    pub(crate) fn containers(&self) -> bool {
        self.parent == ParentMode::Container && self.server_version.is_none_or(|v| v >= (3, 5, 3))
    }
}

/// Checks the TLS parameters against the scheme: `zks://` needs `tls_ca`; `tls_cert` and
/// `tls_key` go together; `zk://` takes none of them.
fn tls_files(
    secure: bool,
    ca: Option<String>,
    cert: Option<String>,
    key: Option<String>,
) -> std::result::Result<Option<TlsFiles>, String> {
    if !secure {
        if ca.is_some() || cert.is_some() || key.is_some() {
            return Err("tls_ca, tls_cert and tls_key need a zks:// URL".into());
        }
        return Ok(None);
    }
    // A path is percent-decoded, so that one holding `&`, `#`, `%` or a space can be given.
    let nonempty = |name: &str, value: Option<String>| match value {
        None => Ok(None),
        Some(v) if v.is_empty() => Err(format!("parameter `{name}` is empty")),
        Some(v) => percent_decode(&v)
            .map(|path| Some(PathBuf::from(path)))
            .ok_or_else(|| format!("parameter `{name}` is not valid percent-encoded UTF-8")),
    };
    let ca = nonempty("tls_ca", ca)?.ok_or_else(|| {
        "zks:// needs tls_ca=<PEM file of the CA that signed the servers' certificates>".to_string()
    })?;
    let identity =
        match (nonempty("tls_cert", cert)?, nonempty("tls_key", key)?) {
            (Some(cert), Some(key)) => Some((cert, key)),
            (None, None) => None,
            _ => return Err(
                "tls_cert and tls_key must be given together (a client certificate and its key)"
                    .into(),
            ),
        };
    Ok(Some(TlsFiles { ca, identity }))
}

/// The connect string handed to the client (`host:port,...`, port 2181 when omitted). With TLS
/// (`secure`), each host must also be a name a certificate can be checked against: a DNS name
/// or an IP address.
fn connect_string(hosts: &[UrlHost], secure: bool) -> std::result::Result<String, String> {
    if hosts.is_empty() {
        return Err("no hosts given; expected zk://host:2181[,host:2181...]".into());
    }
    let mut out = Vec::with_capacity(hosts.len());
    for host in hosts {
        if secure
            && !host.is_ipv6()
            && rustls::pki_types::ServerName::try_from(host.name()).is_err()
        {
            return Err(format!(
                "`{host}` is neither a DNS name nor an IP address, so a server certificate cannot be checked against it"
            ));
        }
        out.push(host.address(2181));
    }
    Ok(out.join(","))
}

/// Checks a ZooKeeper path: absolute, no empty, `.` or `..` components, no trailing `/`, and
/// no characters ZooKeeper refuses (controls, DEL, and what does not survive a URL).
pub(crate) fn validate_path(path: &str) -> std::result::Result<(), String> {
    if !path.starts_with('/') {
        return Err("it must start with `/`".into());
    }
    if path.len() > 1 && path.ends_with('/') {
        return Err("it must not end with `/`".into());
    }
    for part in path[1..].split('/') {
        if part.is_empty() {
            return Err("it has an empty component (`//`)".into());
        }
        if part == "." || part == ".." {
            return Err("`.` and `..` are not allowed".into());
        }
        if let Some(c) = part.chars().find(|c| !c.is_ascii_graphic()) {
            return Err(format!("{c:?} is not allowed"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold_conformance::kit::{ErrOrFail, OrFail, TestResult};

    #[test]
    fn parses_hosts_chroot_credentials_and_params() -> TestResult {
        let c = ZkConfig::from_url(
            "zk://app:hun%3Ater2@h1:2181,h2,[::1]:2182/locks/billing?epoch=2&timeout_ms=900",
        )
        .or_fail("the zk URL with credentials")?;
        assert_eq!(c.hosts(), "h1:2181,h2:2181,[::1]:2182");
        assert_eq!(c.chroot(), "/locks/billing");
        assert_eq!(c.acl(), AclMode::CreatorOnly);
        let (user, password) = c.credentials.as_ref().or_fail("the credentials")?;
        assert_eq!(user, "app");
        assert_eq!(password.expose(), "hun:ter2");
        assert_eq!(c.client.epoch.get(), 2);
        assert_eq!(c.client.request_timeout.as_millis(), 900);
        let shown = format!("{c:?}");
        assert!(!shown.contains("ter2"), "{shown}");

        let plain = ZkConfig::from_url("zk://127.0.0.1:2181").or_fail("the plain zk URL")?;
        assert_eq!(plain.chroot(), DEFAULT_CHROOT);
        assert_eq!(plain.acl(), AclMode::Open);
        assert_eq!(
            ZkConfig::from_url("zk://127.0.0.1:2181/")
                .or_fail("the zk URL with an empty chroot")?
                .chroot(),
            "/"
        );
        let open =
            ZkConfig::from_url("zk://u:p@h/x?acl=open").or_fail("the zk URL with acl=open")?;
        assert_eq!(open.acl(), AclMode::Open);
        assert_eq!(open.parent_mode(), ParentMode::Container);
        assert!(open.containers());
        let kazoo = ZkConfig::from_url("zk://h/x?parent=persistent")
            .or_fail("the zk URL with parent=persistent")?;
        assert_eq!(kazoo.parent_mode(), ParentMode::Persistent);
        assert!(!kazoo.containers());
        let old = ZkConfig::from_url("zk://h/x?parent=container")
            .or_fail("the zk URL with parent=container")?
            .with_server_version(3, 4, 14);
        assert!(!old.containers());
        Ok(())
    }

    #[test]
    fn zks_urls_carry_tls_files_and_always_a_ca() -> TestResult {
        let c = ZkConfig::from_url(
            "ZKS://app:hunter2@localhost:2281,127.0.0.1:2282,[::1]:2283/locks?tls_ca=/etc/zk/ca.pem&tls_cert=/etc/zk/my%20client.pem&tls_key=/etc/zk/client.key&timeout_ms=900",
        )
        .or_fail("the zks URL with TLS files")?;
        assert!(c.is_tls());
        assert_eq!(c.hosts(), "localhost:2281,127.0.0.1:2282,[::1]:2283");
        assert_eq!(c.chroot(), "/locks");
        assert_eq!(c.acl(), AclMode::CreatorOnly);
        assert_eq!(c.tls_ca(), Some(Path::new("/etc/zk/ca.pem")));
        assert_eq!(
            c.tls_identity(),
            Some((
                Path::new("/etc/zk/my client.pem"),
                Path::new("/etc/zk/client.key")
            ))
        );
        let shown = format!("{c:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("ca.pem"), "{shown}");

        let no_identity = ZkConfig::from_url("zks://h1/x?tls_ca=ca.pem")
            .or_fail("the zks URL without an identity")?;
        assert!(no_identity.is_tls());
        assert_eq!(no_identity.tls_identity(), None);
        let plain = ZkConfig::from_url("zk://h1/x").or_fail("the plain zk URL")?;
        assert!(!plain.is_tls());
        assert_eq!(plain.tls_ca(), None);
        // Host names a plain URL takes, which a certificate cannot name.
        assert!(ZkConfig::from_url("zk://bad_host!:2181/x").is_ok());
        Ok(())
    }

    #[test]
    fn rejects_what_it_cannot_honour_without_showing_the_password() -> TestResult {
        for bad in [
            "zk://u:hunter2@h1:2181/a//b",
            "zk://u:hunter2@h1:2181/a/",
            "zk://u:hunter2@h1:2181/a/./b",
            "zk://u:hunter2@h1:2181/a/../b",
            "zk://u:hunter2@h1:2181/x?acl=nobody",
            "zk://u:hunter2@h1:2181/x?parent=ephemeral",
            "zk://u:hunter2@h1:2181/x?bogus=1",
            "zk://u:hunter2@h1:99999/x",
            "zk://u:hunter2@h1:2181,,h2/x",
            "zk://u:hunter2@/x",
            "zk://someuser@h1/x",
            "zk://h1/x?acl=creator",
            "etcd://u:hunter2@h1:2181",
            "zk://u:hunter2@h1:2181/x?timeout_ms=0",
            // TLS parameters on a plain URL, and TLS without a CA to verify the server with.
            "zk://u:hunter2@h1:2181/x?tls_ca=/ca.pem",
            "zk://u:hunter2@h1:2181/x?tls_cert=/c.pem&tls_key=/c.key",
            "zks://u:hunter2@h1:2181/x",
            "zks://u:hunter2@h1:2181/x?tls_cert=/c.pem&tls_key=/c.key",
            // A certificate without its key, and the other way round.
            "zks://u:hunter2@h1:2181/x?tls_ca=/ca.pem&tls_cert=/c.pem",
            "zks://u:hunter2@h1:2181/x?tls_ca=/ca.pem&tls_key=/c.key",
            "zks://u:hunter2@h1:2181/x?tls_ca=",
            "zks://u:hunter2@h1:2181/x?tls_ca=%zz",
            "zks://u:hunter2@h1:2181/x?tls_ca=/ca.pem&tls_domain=zk.local",
            "zks://u:hunter2@h1:2181/x?tls_ca=/ca.pem&tls_ca=/other.pem",
            // A host a certificate cannot name (the client would panic on it).
            "zks://u:hunter2@bad_host!:2181/x?tls_ca=/ca.pem",
            "zks://u:hunter2@[zz]:2181/x?tls_ca=/ca.pem",
            "zkss://u:hunter2@h1:2181/x?tls_ca=/ca.pem",
        ] {
            let err = ZkConfig::from_url(bad).err_or_fail("a bad URL")?;
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
