//! One parser for every backend's connection URL.
//!
//! Two shapes:
//! * [`ConnectionUrl::parse`] reads `scheme://[user[:password]@]host[:port][,host[:port]...][/path][?query][#fragment]`,
//!   the shape of `postgres://`, `redis://`, `redis+sentinel://`, `redis+cluster://`, `etcd://`
//!   and `zk://` URLs. The `url` crate splits the user name from the password; the host list is
//!   split here (the `url` crate takes one host only) and each entry is read by the `url`
//!   crate's rules for the host of a URL like these ([`url::Host::parse_opaque`]), so
//!   `[::1]:2379` is an IPv6 address and port.
//! * [`ConnectionUrl::parse_opaque`] reads `scheme://text[?query][#fragment]`, where everything
//!   before the query is one piece: a `sqlite://` path (`sqlite://:memory:` and
//!   `sqlite://relative/path` have no host) or a `memory://` name.
//!
//! The path and the query are read from the text as written, never through the `url` crate: it
//! would resolve `.` and `..` segments (which a ZooKeeper chroot must refuse, and which a
//! percent-encoded Redis master name may spell) and re-encode query values that backends hand
//! on to their drivers unchanged.
//!
//! A backend then only checks values: which schemes it serves, how many hosts, their default
//! port, what its path means, and its own parameters.

use std::fmt;

use crate::backend::redact::{redact_url, Secret};
use crate::backend::url_params::{percent_decode, UrlParams};
use crate::contract::error::{Error, Result};

/// One `host[:port]` of a URL's host list, checked by the `url` crate's host rules.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UrlHost {
    name: String,
    ipv6: bool,
    port: Option<u16>,
}

impl UrlHost {
    /// The host as the URL gives it; an IPv6 address without its brackets (`::1`), in the
    /// `url` crate's canonical form.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether the host is an IPv6 address (written `[...]` in the URL).
    pub fn is_ipv6(&self) -> bool {
        self.ipv6
    }

    /// The port the URL names, if any (never 0).
    pub fn port(&self) -> Option<u16> {
        self.port
    }

    /// `host:port` with `default_port` when the URL names none; an IPv6 address in brackets.
    pub fn address(&self, default_port: u16) -> String {
        let port = self.port.unwrap_or(default_port);
        if self.ipv6 {
            format!("[{}]:{port}", self.name)
        } else {
            format!("{}:{port}", self.name)
        }
    }
}

impl fmt::Display for UrlHost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.ipv6 {
            write!(f, "[{}]", self.name)?;
        } else {
            f.write_str(&self.name)?;
        }
        match self.port {
            Some(port) => write!(f, ":{port}"),
            None => Ok(()),
        }
    }
}

/// A connection URL taken apart: scheme, user and password (percent-decoded; the password a
/// [`Secret`]), host list, path, strict query parameters ([`UrlParams`]) and fragment.
///
/// `Display` and `Debug` show the URL with every password masked ([`redact_url`]): the user
/// info's and that of every query parameter whose name says it is a secret (`?password=`).
pub struct ConnectionUrl {
    scheme: String,
    user: Option<String>,
    password: Option<Secret>,
    hosts: Vec<UrlHost>,
    path: String,
    fragment: Option<String>,
    params: UrlParams,
}

impl ConnectionUrl {
    /// The scheme of `url` in lower case (the text before `://`), without parsing the rest, so
    /// that a backend can refuse a URL that is not its own before anything else.
    pub fn scheme_of(url: &str) -> Option<String> {
        url.split_once("://").map(|(s, _)| s.to_ascii_lowercase())
    }

    /// Parses `scheme://[user[:password]@]host[:port][,host[:port]...][/path][?query][#fragment]`.
    ///
    /// The user info ends at the authority's last `@`, so a raw `@` in a password is read as
    /// part of it (as the `url` crate does); the user name ends at its first `:`. The host list
    /// may be empty (`postgres:///db?host=/run/postgresql`), but an entry of a list may not
    /// (`h1,,h2`). A port is 1 to 65535.
    ///
    /// # Errors
    /// [`Error::InvalidUrl`], with the password masked, for: no `scheme://`; a query parameter
    /// given twice; a user name or password that is not valid percent-encoded UTF-8; a host the
    /// `url` crate refuses, or would have to percent-encode (controls, non-ASCII); a bad port.
    pub fn parse(url: &str) -> Result<Self> {
        let (mut parsed, body) = Self::start(url)?;
        let (authority, path) = body.split_at(body.find('/').unwrap_or(body.len()));
        let hosts = match authority.rfind('@') {
            Some(at) => {
                let (user, password) =
                    split_user_info(&authority[..at]).map_err(|r| parsed.invalid(r))?;
                parsed.user = Some(user);
                parsed.password = password;
                &authority[at + 1..]
            }
            None => authority,
        };
        parsed.hosts = parse_hosts(hosts).map_err(|r| parsed.invalid(r))?;
        parsed.path = path.to_string();
        Ok(parsed)
    }

    /// Parses `scheme://text[?query][#fragment]`: the text before the query is the
    /// [`path`](Self::path), as written, with no user info or hosts taken out of it.
    ///
    /// # Errors
    /// [`Error::InvalidUrl`] for no `scheme://` or a query parameter given twice.
    pub fn parse_opaque(url: &str) -> Result<Self> {
        let (mut parsed, body) = Self::start(url)?;
        parsed.path = body.to_string();
        Ok(parsed)
    }

    /// The scheme, the query and the fragment; and the text between `://` and the query.
    fn start(url: &str) -> Result<(Self, &str)> {
        let Some((scheme, rest)) = url.split_once("://") else {
            return Err(Error::InvalidUrl {
                url: redact_url(url),
                reason: "expected `scheme://...`".into(),
            });
        };
        let params = UrlParams::parse(url)?;
        let body = rest.split(['?', '#']).next().unwrap_or("");
        let fragment = url.split_once('#').map(|(_, f)| f.to_string());
        let parsed = ConnectionUrl {
            scheme: scheme.to_ascii_lowercase(),
            user: None,
            password: None,
            hosts: Vec::new(),
            path: String::new(),
            fragment,
            params,
        };
        Ok((parsed, body))
    }

    /// The scheme, in lower case.
    pub fn scheme(&self) -> &str {
        &self.scheme
    }

    /// The user name, percent-decoded: `Some` whenever the URL has user info (an `@`), so
    /// `Some("")` for `:password@` or a bare `@`.
    pub fn user(&self) -> Option<&str> {
        self.user.as_deref()
    }

    /// The password, percent-decoded: `Some` whenever the user info has a `:`, so
    /// `Some("")` for `user:@`. A password given as a query parameter is read with
    /// [`UrlParams::take_secret`].
    pub fn password(&self) -> Option<&Secret> {
        self.password.as_ref()
    }

    /// The hosts, in the URL's order (duplicates kept); empty when the URL names none.
    pub fn hosts(&self) -> &[UrlHost] {
        &self.hosts
    }

    /// The path as written (still percent-encoded): empty, or starting with `/`. For a URL read
    /// by [`parse_opaque`](Self::parse_opaque), everything between `://` and the query.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The path, percent-decoded.
    ///
    /// # Errors
    /// [`Error::InvalidUrl`] when it is not valid percent-encoded UTF-8.
    pub fn decoded_path(&self) -> Result<String> {
        self.decode("path", &self.path)
    }

    /// `raw` (a part of this URL) percent-decoded; an error naming it `what` otherwise.
    ///
    /// # Errors
    /// [`Error::InvalidUrl`]: "the `what` is not valid percent-encoded UTF-8".
    pub fn decode(&self, what: &str, raw: &str) -> Result<String> {
        percent_decode(raw)
            .ok_or_else(|| self.invalid(format!("the {what} is not valid percent-encoded UTF-8")))
    }

    /// The text after the first `#`, if any.
    pub fn fragment(&self) -> Option<&str> {
        self.fragment.as_deref()
    }

    /// The query parameters, to be taken one by one; then [`finish_params`](Self::finish_params).
    pub fn params(&mut self) -> &mut UrlParams {
        &mut self.params
    }

    /// Fails naming the first parameter nobody took: a typo must not fall back to a default.
    ///
    /// # Errors
    /// [`Error::InvalidUrl`]: "unknown parameter `name`".
    pub fn finish_params(&self) -> Result<()> {
        self.params.check_all_taken()
    }

    /// The URL with every password masked, for messages.
    pub fn redacted(&self) -> &str {
        self.params.redacted_url()
    }

    /// An [`Error::InvalidUrl`] for this URL (password masked) with `reason`.
    pub fn invalid(&self, reason: impl Into<String>) -> Error {
        Error::InvalidUrl {
            url: self.redacted().to_string(),
            reason: reason.into(),
        }
    }
}

impl fmt::Display for ConnectionUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.redacted())
    }
}

impl fmt::Debug for ConnectionUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hosts: Vec<String> = self.hosts.iter().map(UrlHost::to_string).collect();
        f.debug_struct("ConnectionUrl")
            .field("url", &self.redacted())
            .field("scheme", &self.scheme)
            .field("user", &self.user)
            .field("password", &self.password)
            .field("hosts", &hosts)
            .field("path", &self.path)
            .field("params", &self.params)
            .field("fragment", &self.fragment)
            .finish()
    }
}

/// Splits `user[:password]` with the `url` crate and decodes both parts. The password is
/// `Some` whenever there is a `:`, even an empty one (the `url` crate drops an empty password).
fn split_user_info(info: &str) -> std::result::Result<(String, Option<Secret>), String> {
    // The `url` crate removes tabs and line breaks anywhere in its input; escaped, they stay
    // part of the name or password, as they are in the text.
    let escaped = info
        .replace('\t', "%09")
        .replace('\n', "%0A")
        .replace('\r', "%0D");
    let parsed = url::Url::parse(&format!("leasehold://{escaped}@host"))
        .map_err(|e| format!("the user info cannot be read: {e}"))?;
    let user = percent_decode(parsed.username())
        .ok_or("the user name is not valid percent-encoded UTF-8")?;
    let password = match info.contains(':') {
        false => None,
        true => Some(Secret::new(
            percent_decode(parsed.password().unwrap_or(""))
                .ok_or("the password is not valid percent-encoded UTF-8")?,
        )),
    };
    Ok((user, password))
}

/// Reads a comma-separated host list; an empty text is an empty list.
fn parse_hosts(text: &str) -> std::result::Result<Vec<UrlHost>, String> {
    if text.is_empty() {
        return Ok(Vec::new());
    }
    text.split(',').map(parse_host).collect()
}

/// Reads one `host`, `host:port`, `[v6]` or `[v6]:port`.
fn parse_host(entry: &str) -> std::result::Result<UrlHost, String> {
    if entry.is_empty() {
        return Err("an empty entry in the host list".into());
    }
    let (host, port) = if entry.starts_with('[') {
        let close = entry
            .find(']')
            .ok_or_else(|| format!("`{entry}`: a `[` without `]`"))?;
        let port = match &entry[close + 1..] {
            "" => None,
            after => Some(
                after
                    .strip_prefix(':')
                    .ok_or_else(|| format!("`{entry}`: expected `:port` after `]`"))?,
            ),
        };
        (&entry[..=close], port)
    } else {
        match entry.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (entry, None),
        }
    };
    if host.is_empty() {
        return Err(format!("`{entry}` has no host name"));
    }
    let (name, ipv6) = match url::Host::parse_opaque(host) {
        Ok(url::Host::Ipv6(addr)) => (addr.to_string(), true),
        Ok(url::Host::Ipv4(addr)) => (addr.to_string(), false),
        // A host the `url` crate had to percent-encode (controls, non-ASCII) would reach the
        // client as other text than the user wrote.
        Ok(url::Host::Domain(name)) if name == host => (name, false),
        Ok(url::Host::Domain(_)) => {
            return Err(format!(
                "`{entry}` is not a valid host: only printable ASCII is allowed (write an \
                 international name in its xn-- form)"
            ))
        }
        Err(e) => return Err(format!("`{entry}` is not a valid host: {e}")),
    };
    let port = match port {
        None => None,
        Some(p) => Some(
            p.parse::<u16>()
                .ok()
                .filter(|port| *port > 0 && p.bytes().all(|b| b.is_ascii_digit()))
                .ok_or_else(|| format!("`{entry}`: `{p}` is not a port (1 to 65535)"))?,
        ),
    };
    Ok(UrlHost { name, ipv6, port })
}

#[cfg(test)]
mod tests {
    use super::*;

    type TestResult = std::result::Result<(), String>;

    fn parse(url: &str) -> std::result::Result<ConnectionUrl, String> {
        ConnectionUrl::parse(url).map_err(|e| format!("{url}: {e}"))
    }

    fn hosts(url: &ConnectionUrl) -> Vec<String> {
        url.hosts().iter().map(UrlHost::to_string).collect()
    }

    fn expect<T: PartialEq + fmt::Debug>(what: &str, got: T, want: T) -> TestResult {
        if got == want {
            Ok(())
        } else {
            Err(format!("{what}: got {got:?}, want {want:?}"))
        }
    }

    /// The error for `url`, which must be refused as `InvalidUrl` with `says` in its message and
    /// without `hunter2` anywhere it prints.
    fn refused(url: &str, says: &str) -> TestResult {
        let err = match ConnectionUrl::parse(url) {
            Ok(parsed) => return Err(format!("{url} was accepted: {parsed:?}")),
            Err(err) => err,
        };
        let shown = format!("{err} {err:?}");
        if !matches!(err, Error::InvalidUrl { .. }) {
            return Err(format!("{url}: not InvalidUrl: {shown}"));
        }
        if !shown.contains(says) {
            return Err(format!("{url}: `{says}` is not in {shown}"));
        }
        if shown.contains("hunter2") {
            return Err(format!("{url}: the password is shown: {shown}"));
        }
        Ok(())
    }

    #[test]
    fn user_info_keeps_at_signs_and_colons_in_the_password() -> TestResult {
        for (url, user, password) in [
            ("etcd://root:hun%40ter%3A2@h", "root", Some("hun@ter:2")),
            ("etcd://root:hun@ter:2@h", "root", Some("hun@ter:2")),
            ("zk://a%3Ab:p@h", "a:b", Some("p")),
            ("redis://:pw@h", "", Some("pw")),
            ("redis://u:@h", "u", Some("")),
            ("redis://u@h", "u", None),
            ("redis://@h", "", None),
            ("postgres://us%20er:p%20w@h/db", "us er", Some("p w")),
            ("etcd://u:p\tw@h", "u", Some("p\tw")),
        ] {
            let parsed = parse(url)?;
            expect(url, parsed.user(), Some(user))?;
            expect(url, parsed.password().map(Secret::expose), password)?;
            expect(url, hosts(&parsed), vec!["h".to_string()])?;
        }
        let plain = parse("etcd://h:2379")?;
        expect(
            "no user info",
            (plain.user(), plain.password()),
            (None, None),
        )?;
        refused(
            "etcd://u:hunter2%zz@h",
            "password is not valid percent-encoded",
        )?;
        refused(
            "etcd://u%zz:hunter2@h",
            "user name is not valid percent-encoded",
        )?;
        refused(
            "etcd://u:hunter2%ff@h",
            "password is not valid percent-encoded",
        )
    }

    #[test]
    fn host_lists_take_ipv6_ports_and_reject_what_url_refuses() -> TestResult {
        let url = parse("etcd://u:hunter2@h1:2379,h2,[::1]:2381,[0:0::2],10.0.0.1:1/ns")?;
        expect(
            "hosts",
            hosts(&url),
            ["h1:2379", "h2", "[::1]:2381", "[::2]", "10.0.0.1:1"]
                .map(String::from)
                .to_vec(),
        )?;
        let v6 = &url.hosts()[2];
        expect(
            "v6",
            (v6.name(), v6.is_ipv6(), v6.port()),
            ("::1", true, Some(2381)),
        )?;
        expect(
            "address",
            url.hosts()[1].address(2379),
            "h2:2379".to_string(),
        )?;
        expect(
            "v6 address",
            url.hosts()[3].address(7),
            "[::2]:7".to_string(),
        )?;
        expect("path", url.path(), "/ns")?;
        // Names that a URL of these schemes takes as they are.
        let odd = parse("zk://bad_host!:2181,%2Fvar%2Frun/x")?;
        expect(
            "odd",
            hosts(&odd),
            vec!["bad_host!:2181".into(), "%2Fvar%2Frun".into()],
        )?;
        // No host at all is for the backend to judge.
        for url in ["postgres:///db", "etcd://u:hunter2@", "redis+sentinel:///m"] {
            expect(url, parse(url)?.hosts().len(), 0)?;
        }

        refused("etcd://u:hunter2@h1,,h2", "empty entry")?;
        refused("etcd://u:hunter2@h1,", "empty entry")?;
        refused("etcd://u:hunter2@,h1", "empty entry")?;
        refused("etcd://u:hunter2@:2379", "no host name")?;
        refused("etcd://u:hunter2@[::1:2379", "without `]`")?;
        refused("etcd://u:hunter2@[::1]2379", "after `]`")?;
        refused("etcd://u:hunter2@[zz]:2379", "not a valid host")?;
        refused("etcd://u:hunter2@h h:2379", "not a valid host")?;
        refused("etcd://u:hunter2@h<h", "not a valid host")?;
        refused("etcd://u:hunter2@hôst", "printable ASCII")?;
        refused("etcd://u:hunter2@::1", "not a valid host")?;
        for port in ["0", "65536", "99999", "x", "", "+1", "-1"] {
            refused(&format!("etcd://u:hunter2@h:{port}"), "is not a port")?;
        }
        refused("etcd://u:hunter2@h:2379:1", "not a valid host")
    }

    #[test]
    fn paths_queries_and_fragments_are_read_as_written() -> TestResult {
        let mut url = parse("zk://h/a/../b%20c?tls_ca=/my%20ca.pem&x=a+b#frag")?;
        expect("path", url.path(), "/a/../b%20c")?;
        expect(
            "decoded",
            url.decoded_path().map_err(|e| e.to_string())?,
            "/a/../b c".into(),
        )?;
        expect("fragment", url.fragment(), Some("frag"))?;
        expect(
            "raw value",
            url.params().take("tls_ca"),
            Some("/my%20ca.pem".into()),
        )?;
        expect(
            "no form decoding",
            url.params().take("x"),
            Some("a+b".into()),
        )?;
        url.finish_params().map_err(|e| e.to_string())?;

        let bad = parse("sqlite:///a%zz.db")?;
        match bad.decoded_path() {
            Err(e)
                if e.to_string()
                    .contains("the path is not valid percent-encoded") => {}
            other => return Err(format!("decoded a bad path: {other:?}")),
        }

        // An opaque URL keeps everything before the query in its path.
        for (url, path) in [
            ("sqlite://:memory:", ":memory:"),
            ("sqlite://state/locks.db?table=t", "state/locks.db"),
            ("sqlite:///var/lib/l.db#x", "/var/lib/l.db"),
            ("memory://", ""),
            ("memory://a@b:c", "a@b:c"),
        ] {
            let parsed = ConnectionUrl::parse_opaque(url).map_err(|e| e.to_string())?;
            expect(url, parsed.path(), path)?;
            expect(url, (parsed.user(), parsed.hosts().len()), (None, 0))?;
        }
        expect("scheme", parse("ETCDS://h")?.scheme(), "etcds")?;
        expect(
            "scheme_of",
            ConnectionUrl::scheme_of("Redis+Sentinel://x"),
            Some("redis+sentinel".into()),
        )?;
        expect("scheme_of", ConnectionUrl::scheme_of("sqlite:a.db"), None)?;
        refused("nonsense", "scheme://")
    }

    #[test]
    fn parameters_are_strict() -> TestResult {
        refused("etcd://u:hunter2@h?a=1&a=2", "parameter `a` is given twice")?;
        let mut url =
            parse("etcd://u:hunter2@h?timeout_ms=250&epoch=2&bogus=1&password=hun%40ter2")?;
        let options = url
            .params()
            .take_client_options()
            .map_err(|e| e.to_string())?;
        expect("epoch", options.epoch.get(), 2)?;
        let secret = url
            .params()
            .take_secret("password")
            .map_err(|e| e.to_string())?;
        expect(
            "query password",
            secret.as_ref().map(Secret::expose),
            Some("hun@ter2"),
        )?;
        let err = match url.finish_params() {
            Ok(()) => return Err("an unknown parameter was accepted".into()),
            Err(err) => err,
        };
        let shown = format!("{err} {err:?}");
        if !matches!(err, Error::InvalidUrl { .. }) || !shown.contains("unknown parameter `bogus`")
        {
            return Err(shown);
        }
        if shown.contains("hunter2") || shown.contains("hun%40ter2") {
            return Err(format!("the password is shown: {shown}"));
        }

        // A secret parameter that does not parse or decode is named, its value never shown.
        let mut url = parse("redis+sentinel://h/m?sentinel_password=hunter2%zz&token=hunter2")?;
        for err in [
            url.params().take_secret("sentinel_password").err(),
            url.params().take_parsed::<u32>("token").err(),
        ] {
            let shown = format!("{err:?}");
            if err.is_none() || shown.contains("hunter2") {
                return Err(format!("a bad secret parameter: {shown}"));
            }
        }
        Ok(())
    }

    #[test]
    fn neither_password_is_ever_shown() -> TestResult {
        for (text, masked) in [
            (
                "etcd://u:hunter2@h1:2379,[::1]:2380/ns",
                "etcd://u:***@h1:2379,[::1]:2380/ns",
            ),
            ("zk://u:hun@ter2@h/x", "zk://u:***@h/x"),
            (
                "postgres://u@h/db?password=hunter2&sslmode=require",
                "postgres://u@h/db?password=***&sslmode=require",
            ),
            (
                "redis+sentinel://:hunter2@h1,h2/m?sentinel_password=hunter2",
                "redis+sentinel://:***@h1,h2/m?sentinel_password=***",
            ),
        ] {
            let mut url = parse(text)?;
            expect(text, url.to_string(), masked.to_string())?;
            expect(text, url.redacted(), masked)?;
            let _ = url.params().take("sslmode");
            let shown = format!("{url} {url:?} {url:#?}");
            if shown.contains("hunter2") || shown.contains("ter2") {
                return Err(format!("{text}: the password is shown: {shown}"));
            }
            match url
                .params()
                .take_secret("password")
                .map_err(|e| e.to_string())?
            {
                Some(p) if !format!("{p} {p:?}").contains("hunter2") => {}
                Some(p) => return Err(format!("a secret prints: {p}")),
                None => {}
            }
        }
        Ok(())
    }
}
