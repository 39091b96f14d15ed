//! Keeping secrets out of Debug, Display and logs.

use std::fmt;

/// A secret (a password) that prints as `***` in `Debug` and `Display`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret.
    pub fn new(secret: impl Into<String>) -> Self {
        Secret(secret.into())
    }

    /// The secret itself, for handing to a client library. Never log it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// Query parameters whose names contain one of these are secrets (`?password=`, `sslpassword`,
/// `auth_token`, `client_secret`, ...).
const SECRET_PARAMS: [&str; 4] = ["pass", "secret", "token", "credential"];

/// Whether a URL query parameter of this name carries a secret.
pub fn is_secret_param(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    SECRET_PARAMS.iter().any(|s| name.contains(s))
}

/// `url` with any password replaced by `***`, safe for errors and logs: the user-info password,
/// and the value of every query parameter whose name says it is a secret (`?password=`).
///
/// Works on text that does not parse as a URL too: everything between `://` and the last `@`
/// of the authority part after the first `:` is masked.
pub fn redact_url(url: &str) -> String {
    mask_query(&redact_userinfo(url))
}

/// Masks the values of secret query parameters, working on the text alone.
fn mask_query(url: &str) -> String {
    let Some(q) = url.find('?') else {
        return url.to_string();
    };
    let (head, rest) = url.split_at(q + 1);
    let (query, fragment) = match rest.find('#') {
        Some(h) => rest.split_at(h),
        None => (rest, ""),
    };
    let masked: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((name, _)) if is_secret_param(name) => format!("{name}=***"),
            _ => pair.to_string(),
        })
        .collect();
    format!("{head}{}{fragment}", masked.join("&"))
}

fn redact_userinfo(url: &str) -> String {
    if let Ok(mut parsed) = url::Url::parse(url) {
        if parsed.password().is_some() && parsed.set_password(Some("***")).is_ok() {
            return parsed.to_string();
        }
        if parsed.password().is_none() && !url.contains('@') {
            return url.to_string();
        }
    }
    // Fallback for text `url` cannot parse (several hosts, odd schemes): mask user-info.
    match userinfo(url) {
        Some((start, userinfo)) => {
            let user = userinfo.split(':').next().unwrap_or("");
            let masked = if userinfo.contains(':') {
                format!("{user}:***")
            } else {
                user.to_string()
            };
            let end = start + userinfo.len();
            format!("{}{}{}", &url[..start], masked, &url[end..])
        }
        None => url.to_string(),
    }
}

/// Where `url`'s user info starts and what it says: the text between `://` and the last `@`
/// of the authority (the part before the first `/`, `?` or `#`), on the text alone.
fn userinfo(url: &str) -> Option<(usize, &str)> {
    let start = url.find("://")? + 3;
    let rest = &url[start..];
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    let at = authority.rfind('@')?;
    Some((start, &authority[..at]))
}

/// Every secret `url` carries, as written and percent-decoded: the user info's password and
/// the value of each query parameter whose name says it is a secret. For masking them in text
/// that quotes one apart from the URL (a driver's error that echoes a password); empty
/// secrets are left out.
pub fn url_secrets(url: &str) -> Vec<String> {
    let mut written: Vec<&str> = Vec::new();
    if let Some((_, userinfo)) = userinfo(url) {
        written.extend(userinfo.split_once(':').map(|(_, password)| password));
    }
    if let Some((_, query)) = url.split_once('?') {
        let query = query.split('#').next().unwrap_or("");
        written.extend(query.split('&').filter_map(|pair| {
            let (name, value) = pair.split_once('=')?;
            is_secret_param(name).then_some(value)
        }));
    }
    let mut secrets = Vec::new();
    for secret in written.into_iter().filter(|s| !s.is_empty()) {
        if let Some(decoded) = super::url_params::percent_decode(secret).filter(|d| d != secret) {
            secrets.push(decoded);
        }
        secrets.push(secret.to_string());
    }
    secrets
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_print() {
        for (url, want) in [
            ("redis://:hunter2@h:6379/0", "redis://:***@h:6379/0"),
            ("postgres://u:hunter2@h/db", "postgres://u:***@h/db"),
            (
                "etcd://u:hunter2@h1:2379,h2:2379",
                "etcd://u:***@h1:2379,h2:2379",
            ),
            (
                "zk://u:hunter2@h1:2181,h2:2181/locks",
                "zk://u:***@h1:2181,h2:2181/locks",
            ),
            ("memory://x", "memory://x"),
            ("not a url", "not a url"),
            (
                "postgres://u@h/db?password=hunter2&sslmode=require",
                "postgres://u@h/db?password=***&sslmode=require",
            ),
            (
                "postgres://u@h1,h2/db?sslmode=verify-full&SSLPassword=hunter2#x",
                "postgres://u@h1,h2/db?sslmode=verify-full&SSLPassword=***#x",
            ),
            (
                "etcd://h:2379?auth_token=hunter2",
                "etcd://h:2379?auth_token=***",
            ),
        ] {
            let got = redact_url(url);
            assert!(!got.contains("hunter2"), "{got}");
            assert_eq!(got, want);
        }
        let s = Secret::new("hunter2");
        assert_eq!(format!("{s} {s:?}"), "*** ***");
    }

    #[test]
    fn every_secret_of_a_url_is_found_as_written_and_decoded() {
        let url = "postgres://u:p%40ss@h1,h2/db?sslpassword=k%3Dey&sslmode=require&token=#frag";
        let found = url_secrets(url);
        for want in ["p%40ss", "p@ss", "k%3Dey", "k=ey"] {
            assert!(found.iter().any(|s| s == want), "{want} not in {found:?}");
        }
        assert_eq!(found.len(), 4, "{found:?}");
        assert!(url_secrets("redis://h:6379/0?db=1").is_empty());
        assert!(url_secrets("redis://user@h").is_empty());
        assert!(url_secrets("not a url").is_empty());
    }
}
