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

/// `url` with any password replaced by `***`, safe for errors and logs.
///
/// Works on text that does not parse as a URL too: everything between `://` and the last `@`
/// of the authority part after the first `:` is masked.
pub fn redact_url(url: &str) -> String {
    if let Ok(mut parsed) = url::Url::parse(url) {
        if parsed.password().is_some() && parsed.set_password(Some("***")).is_ok() {
            return parsed.to_string();
        }
        if parsed.password().is_none() && !url.contains('@') {
            return url.to_string();
        }
    }
    // Fallback for text `url` cannot parse (several hosts, odd schemes): mask user-info.
    let Some(start) = url.find("://").map(|i| i + 3) else {
        return url.to_string();
    };
    let rest = &url[start..];
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    match authority.rfind('@') {
        Some(at) => {
            let userinfo = &authority[..at];
            let user = userinfo.split(':').next().unwrap_or("");
            let masked = if userinfo.contains(':') {
                format!("{user}:***")
            } else {
                user.to_string()
            };
            format!("{}{}{}", &url[..start], masked, &rest[at..])
        }
        None => url.to_string(),
    }
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
        ] {
            let got = redact_url(url);
            assert!(!got.contains("hunter2"), "{got}");
            assert_eq!(got, want);
        }
        let s = Secret::new("hunter2");
        assert_eq!(format!("{s} {s:?}"), "*** ***");
    }
}
