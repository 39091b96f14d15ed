//! The query parameters of a connection URL, read strictly: what every backend's URL shares.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use crate::backend::redact::{is_secret_param, redact_url, Secret};
use crate::contract::client_options::ClientOptions;
use crate::contract::error::{Error, Result};
use crate::contract::fence::Epoch;
use crate::contract::margin::SafetyMargin;

/// The query parameters of a connection URL, consumed one by one so that a parameter nobody
/// understood is an error instead of being silently ignored.
///
/// Values are kept as written (not percent-decoded: [`UrlParams::take_decoded`] decodes); the
/// value of a parameter whose name says it is a secret (`password`, `token`, ...) is never shown in
/// `Debug` or in an error.
pub struct UrlParams {
    redacted_url: String,
    params: BTreeMap<String, String>,
}

impl UrlParams {
    /// Splits the query part of `url` (after `?`) into parameters.
    pub fn parse(url: &str) -> Result<Self> {
        let redacted_url = redact_url(url);
        let mut params = BTreeMap::new();
        if let Some((_, query)) = url.split_once('?') {
            let query = query.split('#').next().unwrap_or("");
            for pair in query.split('&').filter(|p| !p.is_empty()) {
                let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                if params.insert(k.to_string(), v.to_string()).is_some() {
                    return Err(Error::InvalidUrl {
                        url: redacted_url,
                        reason: format!("parameter `{k}` is given twice"),
                    });
                }
            }
        }
        Ok(UrlParams {
            redacted_url,
            params,
        })
    }

    /// The URL with any password masked, for error messages.
    pub fn redacted_url(&self) -> &str {
        &self.redacted_url
    }

    /// The names of the parameters not taken yet, in byte order: for a backend that hands the
    /// rest to a client library's own configuration (an object store's builder keys).
    pub fn names_left(&self) -> Vec<String> {
        self.params.keys().cloned().collect()
    }

    /// Removes and returns parameter `name`.
    pub fn take(&mut self, name: &str) -> Option<String> {
        self.params.remove(name)
    }

    /// Removes parameter `name` and parses it as a `T`.
    pub fn take_parsed<T: std::str::FromStr>(&mut self, name: &str) -> Result<Option<T>> {
        match self.params.remove(name) {
            None => Ok(None),
            Some(v) => v.parse().map(Some).map_err(|_| Error::InvalidUrl {
                url: self.redacted_url.clone(),
                reason: match is_secret_param(name) {
                    true => format!("parameter `{name}` has an invalid value"),
                    false => format!("parameter `{name}` has an invalid value `{v}`"),
                },
            }),
        }
    }

    /// Removes parameter `name` and percent-decodes it (a path that holds `&`, `#` or `%`).
    pub fn take_decoded(&mut self, name: &str) -> Result<Option<String>> {
        match self.params.remove(name) {
            None => Ok(None),
            Some(v) => percent_decode(&v)
                .map(Some)
                .ok_or_else(|| Error::InvalidUrl {
                    url: self.redacted_url.clone(),
                    reason: format!("parameter `{name}` is not valid percent-encoded UTF-8"),
                }),
        }
    }

    /// Removes parameter `name` (`password`, `sentinel_password`), percent-decoded, as a
    /// [`Secret`]; an error names the parameter, never its value.
    pub fn take_secret(&mut self, name: &str) -> Result<Option<Secret>> {
        Ok(self.take_decoded(name)?.map(Secret::new))
    }

    /// Reads the [`ClientOptions`] parameters: `epoch`, `safety_margin_ms`,
    /// `clock_drift_per_mille` and `timeout_ms`.
    pub fn take_client_options(&mut self) -> Result<ClientOptions> {
        let mut options = ClientOptions::default();
        if let Some(epoch) = self.take_parsed::<u16>("epoch")? {
            options.epoch = Epoch::new(epoch)?;
        }
        let fixed = self.take_parsed::<u64>("safety_margin_ms")?;
        let drift = self.take_parsed::<u32>("clock_drift_per_mille")?;
        if fixed.is_some() || drift.is_some() {
            options.safety_margin = SafetyMargin::new(
                fixed.map_or(Duration::from_millis(5), Duration::from_millis),
                drift.unwrap_or(10),
            )?;
        }
        if let Some(ms) = self.take_parsed::<u64>("timeout_ms")? {
            if ms == 0 {
                return Err(Error::InvalidUrl {
                    url: self.redacted_url.clone(),
                    reason: "timeout_ms must be greater than zero".into(),
                });
            }
            options.request_timeout = Duration::from_millis(ms);
        }
        Ok(options)
    }

    /// Fails if any parameter was not consumed: a typo must not silently fall back to a default.
    pub fn finish(self) -> Result<()> {
        self.check_all_taken()
    }

    /// [`UrlParams::finish`] without giving the parameters up.
    pub(crate) fn check_all_taken(&self) -> Result<()> {
        match self.params.keys().next() {
            None => Ok(()),
            Some(k) => Err(Error::InvalidUrl {
                url: self.redacted_url.clone(),
                reason: format!("unknown parameter `{k}`"),
            }),
        }
    }
}

impl fmt::Debug for UrlParams {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown = self
            .params
            .iter()
            .map(|(name, value)| match is_secret_param(name) {
                true => (name, "***"),
                false => (name, value.as_str()),
            });
        f.debug_struct("UrlParams")
            .field("url", &self.redacted_url)
            .field("params", &BTreeMap::from_iter(shown))
            .finish()
    }
}

/// Decodes the `%XX` escapes of a URL part (a user name, a password, a path); `None` for a
/// malformed escape or bytes that are not UTF-8.
pub fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    type TestResult<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

    #[test]
    fn reads_common_options_and_rejects_unknown() -> TestResult {
        let mut p = UrlParams::parse("memory://x?epoch=3&timeout_ms=250&safety_margin_ms=1")
            .map_err(|e| format!("parsing the URL with client options: {e}"))?;
        let o = p
            .take_client_options()
            .map_err(|e| format!("take_client_options: {e}"))?;
        assert_eq!(o.epoch.get(), 3);
        assert_eq!(o.request_timeout, Duration::from_millis(250));
        assert_eq!(
            o.safety_margin.for_ttl(Duration::from_secs(1)),
            Duration::from_millis(11)
        );
        p.finish()
            .map_err(|e| format!("finish after every parameter was taken: {e}"))?;

        let mut p = UrlParams::parse("memory://x?epoc=3")
            .map_err(|e| format!("parsing the URL with a misspelt parameter: {e}"))?;
        p.take_client_options()
            .map_err(|e| format!("take_client_options ignoring the misspelt parameter: {e}"))?;
        assert!(matches!(p.finish(), Err(Error::InvalidUrl { .. })));

        for bad in [
            "m://?epoch=99999",
            "m://?epoch=x",
            "m://?timeout_ms=0",
            "m://?a=1&a=2",
        ] {
            let r = UrlParams::parse(bad).and_then(|mut p| p.take_client_options());
            assert!(r.is_err(), "{bad}");
        }
        Ok(())
    }

    #[test]
    fn percent_decoding_is_strict() {
        assert_eq!(
            percent_decode("hun%3Ater%402").as_deref(),
            Some("hun:ter@2")
        );
        assert_eq!(percent_decode("plain").as_deref(), Some("plain"));
        for bad in ["%", "%4", "%zz", "%ff"] {
            assert_eq!(percent_decode(bad), None, "{bad}");
        }
    }

    #[test]
    fn errors_never_show_the_password() -> TestResult {
        let mut p = UrlParams::parse("redis://:hunter2@h/?bogus=1")
            .map_err(|e| format!("parsing the URL with an unknown parameter: {e}"))?;
        let err = p
            .take_client_options()
            .and_then(|_| p.finish())
            .err()
            .ok_or("the unknown parameter: it succeeded")?;
        assert!(!format!("{err} {err:?}").contains("hunter2"));
        let p = UrlParams::parse("postgres://u@h/db?password=hunter2&sslmode=require")
            .map_err(|e| format!("parsing the URL with a query password: {e}"))?;
        let shown = format!("{p:?}");
        assert!(
            !shown.contains("hunter2") && shown.contains("require"),
            "{shown}"
        );
        Ok(())
    }
}
