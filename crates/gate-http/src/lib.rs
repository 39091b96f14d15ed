//! # leasehold-gate-http
//!
//! The fence across an HTTP call. A fence in a header protects nothing by itself: a service that
//! ignores it accepts a paused former holder's late request like any other. Both halves are
//! needed, and this crate ships both:
//!
//! * **The caller** sends its fence with every request it makes under a lease
//!   ([`FencedRequest::fence`] on a `reqwest::RequestBuilder`, feature `client`): the
//!   [`FENCE_HEADER`] carries the fence's value, [`FENCE_SAFETY_HEADER`] how far the authority
//!   promises it only grows.
//! * **The service** reads it ([`RequireFence`], an axum extractor, feature `server`) and checks
//!   it **atomically with its own write**, through a gate at its store: for a SQL table, the
//!   claim of `leasehold-gate-sql` as the first statement of the transaction that writes.
//!   A stale fence is answered with [`stale_response`]: `409 Conflict` and the newest fence in
//!   [`NEWEST_FENCE_HEADER`], which the caller reads back with [`newest_fence`]. A request
//!   without a fence is refused with `428 Precondition Required`: a fenced endpoint that took
//!   unfenced writes would let any caller past the gate.
//!
//! `examples/fenced_service.rs` is a whole service: accounts in SQLite, a `PUT` that claims the
//! account's row with the caller's fence and writes the balance in the same transaction.

#![deny(missing_docs)]

use http::{HeaderMap, HeaderValue, StatusCode};
use leasehold_core::{Fence, FenceSafety};

/// The request header with the caller's fence (its value, a decimal integer).
pub const FENCE_HEADER: &str = "leasehold-fence";

/// The request header with the fence's safety: `linearizable` or `failover-unsafe`.
pub const FENCE_SAFETY_HEADER: &str = "leasehold-fence-safety";

/// The response header with the newest fence the resource has accepted, on a `409 Conflict`.
pub const NEWEST_FENCE_HEADER: &str = "leasehold-newest-fence";

/// The fence in `headers`, if there is one: `Ok(None)` when the header is absent, an error
/// (for a `400 Bad Request`) when it is not a fence. Without a safety header, the fence is
/// taken as failover-unsafe: the weaker promise, never an overstatement.
pub fn fence_from_headers(headers: &HeaderMap) -> Result<Option<Fence>, String> {
    let Some(value) = headers.get(FENCE_HEADER) else {
        return Ok(None);
    };
    let value: u64 = value
        .to_str()
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| format!("the {FENCE_HEADER} header is not a fence"))?;
    let safety = match headers
        .get(FENCE_SAFETY_HEADER)
        .and_then(|s| s.to_str().ok())
    {
        Some("linearizable") => FenceSafety::Linearizable,
        Some("failover-unsafe") | None => FenceSafety::FailoverUnsafe,
        Some(other) => return Err(format!("unknown fence safety {other:?}")),
    };
    Fence::from_value(value, safety)
        .map(Some)
        .map_err(|e| e.to_string())
}

/// The newest fence a `409 Conflict` from a fenced service names, if it names one.
pub fn newest_fence(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(NEWEST_FENCE_HEADER)?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

/// The status and headers of the answer to a stale fence: `409 Conflict`, with the newest fence.
pub fn stale_parts(newest: u64) -> (StatusCode, HeaderMap) {
    let mut headers = HeaderMap::new();
    headers.insert(NEWEST_FENCE_HEADER, HeaderValue::from(newest));
    (StatusCode::CONFLICT, headers)
}

#[cfg(feature = "client")]
mod client {
    use leasehold_core::{Fence, FenceSafety};

    use super::{FENCE_HEADER, FENCE_SAFETY_HEADER};

    fn safety_name(safety: FenceSafety) -> &'static str {
        match safety {
            FenceSafety::Linearizable => "linearizable",
            _ => "failover-unsafe",
        }
    }

    /// Sends a fence with a request (feature `client`).
    pub trait FencedRequest {
        /// Adds `fence` to the request's headers.
        fn fence(self, fence: &Fence) -> Self;
    }

    impl FencedRequest for reqwest::RequestBuilder {
        fn fence(self, fence: &Fence) -> Self {
            self.header(FENCE_HEADER, fence.value())
                .header(FENCE_SAFETY_HEADER, safety_name(fence.safety()))
        }
    }
}

#[cfg(feature = "client")]
pub use client::FencedRequest;

#[cfg(feature = "server")]
mod server {
    use axum::extract::FromRequestParts;
    use axum::response::{IntoResponse, Response};
    use http::request::Parts;
    use http::StatusCode;
    use leasehold_core::Fence;

    use super::{fence_from_headers, stale_parts, FENCE_HEADER};

    /// The caller's fence, required (feature `server`): a request without one is refused with
    /// `428 Precondition Required`, one whose header is not a fence with `400 Bad Request`.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct RequireFence(pub Fence);

    impl<S: Send + Sync> FromRequestParts<S> for RequireFence {
        type Rejection = Response;

        async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
            match fence_from_headers(&parts.headers) {
                Ok(Some(fence)) => Ok(RequireFence(fence)),
                Ok(None) => Err((
                    StatusCode::PRECONDITION_REQUIRED,
                    format!("this endpoint takes writes only with a {FENCE_HEADER} header"),
                )
                    .into_response()),
                Err(why) => Err((StatusCode::BAD_REQUEST, why).into_response()),
            }
        }
    }

    /// The answer to a stale fence: `409 Conflict` with the newest fence in its header.
    pub fn stale_response(newest: u64) -> Response {
        let (status, headers) = stale_parts(newest);
        (
            status,
            headers,
            format!("stale fence: the resource has accepted fence {newest}"),
        )
            .into_response()
    }
}

#[cfg(feature = "server")]
pub use server::{stale_response, RequireFence};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fence_goes_through_headers_and_garbage_is_refused() -> Result<(), String> {
        let mut headers = HeaderMap::new();
        assert_eq!(fence_from_headers(&headers)?, None);
        headers.insert(FENCE_HEADER, HeaderValue::from(42u64));
        let fence = fence_from_headers(&headers)?.ok_or("no fence read")?;
        assert_eq!(fence.value(), 42);
        assert_eq!(fence.safety(), FenceSafety::FailoverUnsafe);
        headers.insert(
            FENCE_SAFETY_HEADER,
            HeaderValue::from_static("linearizable"),
        );
        let fence = fence_from_headers(&headers)?.ok_or("no fence read")?;
        assert_eq!(fence.safety(), FenceSafety::Linearizable);
        for bad in ["", "x", "-1", "1.5", "18446744073709551616"] {
            headers.insert(FENCE_HEADER, HeaderValue::from_static(bad));
            assert!(
                fence_from_headers(&headers).is_err(),
                "{bad:?} was read as a fence"
            );
        }
        let (status, answer) = stale_parts(9);
        assert_eq!(status, StatusCode::CONFLICT);
        assert_eq!(newest_fence(&answer), Some(9));
        Ok(())
    }
}
