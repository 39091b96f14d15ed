//! Who may use the console, and protection against other sites: the access token (a header, a
//! cookie set from `?token=` once), the per-process CSRF token of the revoke form, the checks of
//! `Host`, `Origin` and `Sec-Fetch-Site`, and the headers that keep pages out of frames and
//! scripts out of pages.

use std::fmt;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::header::{self, HeaderMap, HeaderValue};
use axum::http::{Method, StatusCode, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rand::TryRngCore;
use subtle::ConstantTimeEq;

use super::routes::Shared;

/// The environment variable that may hold the token (never the command line, where `ps` shows it).
pub(crate) const TOKEN_ENV: &str = "LEASEHOLD_CONSOLE_TOKEN";
/// The cookie that carries the token after `?token=`.
const COOKIE: &str = "leasehold_console_token";

/// A secret compared in constant time, never shown in Debug.
#[derive(Clone)]
pub(crate) struct Secret(Arc<str>);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

impl Secret {
    /// Whether `given` is this secret, in time that does not depend on where they differ.
    pub fn matches(&self, given: &str) -> bool {
        bool::from(self.0.as_bytes().ct_eq(given.as_bytes()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// 128 bits from the operating system's CSPRNG, as 32 hex digits.
    pub fn generate() -> Result<Secret, String> {
        let mut bytes = [0u8; 16];
        rand::rngs::OsRng
            .try_fill_bytes(&mut bytes)
            .map_err(|e| format!("no randomness from the operating system: {e}"))?;
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        Ok(Secret(hex.into()))
    }
}

/// The access token: the first line of `file`, else `$LEASEHOLD_CONSOLE_TOKEN`, else none. An
/// empty token is refused: it would let everyone in while looking like protection.
pub(crate) fn access_token(
    file: Option<&Path>,
    env: Option<String>,
) -> Result<Option<Secret>, String> {
    let (token, from) = match (file, env) {
        (Some(file), _) => {
            let text = std::fs::read_to_string(file)
                .map_err(|e| format!("cannot read the token file {}: {e}", file.display()))?;
            let line = text.lines().next().unwrap_or("").trim().to_string();
            (line, format!("the token file {}", file.display()))
        }
        (None, Some(env)) => (env.trim().to_string(), format!("${TOKEN_ENV}")),
        (None, None) => return Ok(None),
    };
    if token.is_empty() {
        return Err(format!("{from} holds an empty token"));
    }
    if !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!(
            "{from}: the token must be printable ASCII without spaces (it travels in a header \
             and a cookie)"
        ));
    }
    Ok(Some(Secret(token.into())))
}

/// Refuses to listen beyond loopback without a token: anyone on the network could read the
/// keys, and with `--allow-revoke` end leases.
pub(crate) fn check_listen(addr: SocketAddr, token: Option<&Secret>) -> Result<(), String> {
    if addr.ip().is_loopback() || token.is_some() {
        return Ok(());
    }
    Err(format!(
        "--listen {addr} is not a loopback address: anyone who can reach it could use the \
         console, so it needs a token (--token-file FILE, or ${TOKEN_ENV}); or listen on \
         127.0.0.1"
    ))
}

/// The `Host` values the console answers to. On loopback, only its own address and
/// `localhost`, so that a page of another site whose name is made to resolve to 127.0.0.1 (DNS
/// rebinding) cannot read it; beyond loopback a token is required, which such a page lacks.
pub(crate) fn allowed_hosts(addr: SocketAddr) -> Option<Vec<String>> {
    if !addr.ip().is_loopback() {
        return None;
    }
    let port = addr.port();
    Some(vec![
        addr.to_string(),
        format!("localhost:{port}"),
        format!("127.0.0.1:{port}"),
        format!("[::1]:{port}"),
    ])
}

/// Every request: the `Host` check, the token, and for anything but GET and HEAD the
/// cross-site checks; every answer gets the headers that keep it out of frames.
pub(crate) async fn guard(
    State(shared): State<Arc<Shared>>,
    request: Request,
    next: Next,
) -> Response {
    let mut response = match admit(&shared, &request) {
        None => next.run(request).await,
        Some(answer) => answer,
    };
    let headers = response.headers_mut();
    for (name, value) in [
        (header::X_FRAME_OPTIONS, "DENY"),
        (
            header::CONTENT_SECURITY_POLICY,
            "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
             img-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'",
        ),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::CACHE_CONTROL, "no-store"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

/// `None`: let the request through; `Some(_)`: answer this instead (a refusal, or the redirect
/// that follows `?token=`).
fn admit(shared: &Shared, request: &Request) -> Option<Response> {
    let headers = request.headers();
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("");
    if let Some(hosts) = &shared.hosts {
        if !hosts.iter().any(|h| h.eq_ignore_ascii_case(host)) {
            return Some(refuse(
                StatusCode::MISDIRECTED_REQUEST,
                "this console answers only to its own address",
            ));
        }
    }
    if let Some(token) = &shared.token {
        if let Some(given) = query_token(request.uri()) {
            if !token.matches(&given) {
                return Some(refuse(StatusCode::UNAUTHORIZED, "wrong token"));
            }
            return Some(remember_token(token, request.uri()));
        }
        if !carries(token, headers) {
            return Some(refuse(
                StatusCode::UNAUTHORIZED,
                "this console needs its token: open it with ?token=... once, or send \
                 Authorization: Bearer ...",
            ));
        }
    }
    if request.method() != Method::GET && request.method() != Method::HEAD {
        return cross_site(headers, host);
    }
    None
}

/// Refuses a request that another site's page made: `Sec-Fetch-Site: cross-site`, or an
/// `Origin` other than the console's own (`http://` and the `Host` it was reached at, checked
/// above; or `null` from a same-origin page). A request without `Origin` (an HTTP client, not a browser) passes these checks; the
/// CSRF token still stands in its way.
fn cross_site(headers: &HeaderMap, host: &str) -> Option<Response> {
    let site = headers
        .get("sec-fetch-site")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if site.eq_ignore_ascii_case("cross-site") {
        return Some(refuse(
            StatusCode::FORBIDDEN,
            "refused: the request came from another site",
        ));
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let own = format!("http://{host}");
        // Under `Referrer-Policy: no-referrer` a browser sends `Origin: null` with the
        // console's own form; it is the console's only when the browser also says
        // same-origin (a header no page can set).
        let ours = origin.to_str().is_ok_and(|o| {
            o.eq_ignore_ascii_case(&own)
                || (o == "null" && site.eq_ignore_ascii_case("same-origin"))
        });
        if !ours {
            return Some(refuse(
                StatusCode::FORBIDDEN,
                "refused: the request's Origin is not this console",
            ));
        }
    }
    None
}

/// Whether the request carries the token: `Authorization: Bearer T`, or the cookie.
fn carries(token: &Secret, headers: &HeaderMap) -> bool {
    let bearer = headers
        .get_all(header::AUTHORIZATION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .filter_map(|v| v.strip_prefix("Bearer "))
        .any(|t| token.matches(t.trim()));
    let cookie = headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .any(|(name, value)| name == COOKIE && token.matches(value));
    bearer || cookie
}

/// The `token` query parameter, decoded.
fn query_token(uri: &Uri) -> Option<String> {
    let query = uri.query()?;
    query.split('&').find_map(|pair| {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        (name == "token").then(|| {
            percent_encoding::percent_decode_str(&value.replace('+', " "))
                .decode_utf8_lossy()
                .into_owned()
        })
    })
}

/// The answer to a right `?token=`: the cookie, and a redirect to the same path without the
/// token, so that it leaves the address bar and the history.
fn remember_token(token: &Secret, uri: &Uri) -> Response {
    let rest: Vec<&str> = uri
        .query()
        .unwrap_or("")
        .split('&')
        .filter(|pair| !pair.is_empty() && pair.split('=').next() != Some("token"))
        .collect();
    let mut location = uri.path().to_string();
    if !rest.is_empty() {
        location.push('?');
        location.push_str(&rest.join("&"));
    }
    let cookie = format!(
        "{COOKIE}={}; HttpOnly; SameSite=Strict; Path=/",
        token.as_str()
    );
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::SEE_OTHER;
    let headers = response.headers_mut();
    if let (Ok(location), Ok(cookie)) = (
        HeaderValue::from_str(&location),
        HeaderValue::from_str(&cookie),
    ) {
        headers.insert(header::LOCATION, location);
        headers.insert(header::SET_COOKIE, cookie);
    }
    response
}

/// A refusal: the status and one line of text.
pub(crate) fn refuse(status: StatusCode, why: &'static str) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        why,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold_conformance::kit::{ErrOrFail, OrFail, TestResult};

    #[test]
    fn tokens_match_only_themselves() -> TestResult {
        let token = Secret("s3cret".into());
        assert!(token.matches("s3cret"));
        assert!(!token.matches("s3cre"));
        assert!(!token.matches("s3cret "));
        assert!(!format!("{token:?}").contains("s3cret"));
        let one = Secret::generate().or_fail("a generated secret")?;
        assert_eq!(one.as_str().len(), 32);
        assert_ne!(
            one.as_str(),
            Secret::generate()
                .or_fail("a second generated secret")?
                .as_str()
        );
        Ok(())
    }

    #[test]
    fn a_token_comes_from_the_file_first_and_is_never_empty() -> TestResult {
        let dir = tempfile::tempdir().or_fail("a temporary directory")?;
        let file = dir.path().join("t");
        std::fs::write(&file, "abc\nrest").or_fail("writing the token file")?;
        let t = access_token(Some(&file), Some("env".into()))
            .or_fail("reading the token file")?
            .or_fail("a token from the file")?;
        assert_eq!(t.as_str(), "abc");
        assert_eq!(
            access_token(None, Some("env".into()))
                .or_fail("reading the token from the environment")?
                .or_fail("a token from the environment")?
                .as_str(),
            "env"
        );
        assert!(access_token(None, None)
            .or_fail("access_token with neither file nor environment")?
            .is_none());
        assert!(access_token(None, Some(" ".into())).is_err());
        Ok(())
    }

    #[test]
    fn only_loopback_listens_without_a_token() -> TestResult {
        let token = Secret("t".into());
        assert!(check_listen("127.0.0.1:0".parse().or_fail("the loopback address")?, None).is_ok());
        assert!(check_listen(
            "[::1]:0".parse().or_fail("the IPv6 loopback address")?,
            None
        )
        .is_ok());
        let refused = check_listen("0.0.0.0:80".parse().or_fail("the wildcard address")?, None)
            .err_or_fail("check_listen on a wildcard address without a token")?;
        assert!(refused.contains("token"), "{refused}");
        assert!(check_listen(
            "0.0.0.0:80".parse().or_fail("the wildcard address")?,
            Some(&token)
        )
        .is_ok());
        Ok(())
    }

    #[test]
    fn the_token_leaves_the_query() -> TestResult {
        let uri: Uri = "/key/a?x=1&token=t&y=2"
            .parse()
            .or_fail("the request URI")?;
        assert_eq!(query_token(&uri).as_deref(), Some("t"));
        let answer = remember_token(&Secret("t".into()), &uri);
        assert_eq!(answer.status(), StatusCode::SEE_OTHER);
        assert_eq!(answer.headers()[header::LOCATION], "/key/a?x=1&y=2");
        let cookie = answer.headers()[header::SET_COOKIE]
            .to_str()
            .or_fail("the Set-Cookie header as text")?;
        assert!(
            cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
            "{cookie}"
        );
        Ok(())
    }
}
