//! From etcd-client's errors to leasehold's, keeping "unreachable" apart from "refused".

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::backend::{redact_url, Backoff};
use leasehold_core::Error;

pub(crate) const BACKEND: &str = "etcd";

/// gRPC status codes (tonic's `Code` as numbers, so this crate needs no direct tonic dependency).
mod code {
    pub const CANCELLED: i32 = 1;
    pub const UNKNOWN: i32 = 2;
    pub const INVALID_ARGUMENT: i32 = 3;
    pub const DEADLINE_EXCEEDED: i32 = 4;
    pub const NOT_FOUND: i32 = 5;
    pub const PERMISSION_DENIED: i32 = 7;
    pub const RESOURCE_EXHAUSTED: i32 = 8;
    pub const FAILED_PRECONDITION: i32 = 9;
    pub const ABORTED: i32 = 10;
    pub const UNAVAILABLE: i32 = 14;
    pub const UNAUTHENTICATED: i32 = 16;
}

/// Maps a client error met while doing `what`.
pub(crate) fn map(error: etcd_client::Error, what: &str) -> Error {
    use etcd_client::Error as E;
    match &error {
        E::GRpcStatus(status) => {
            let code = i32::from(status.code());
            let message = format!("{what}: {}", redact_url(status.message()));
            let lower = status.message().to_ascii_lowercase();
            // etcd answers a wrong password with InvalidArgument, a missing permission with
            // PermissionDenied, an expired or invalid token with Unauthenticated.
            let auth = lower.contains("authentication failed")
                || lower.contains("user name is empty")
                || lower.contains("invalid auth token")
                || lower.contains("permission denied");
            match code {
                code::UNAUTHENTICATED | code::PERMISSION_DENIED => unauthorized(message, error),
                code::INVALID_ARGUMENT if auth => unauthorized(message, error),
                // No leader, leader changed, request timed out inside the cluster, server
                // stopping, connection refused or reset: nobody answered for the cluster.
                code::UNAVAILABLE | code::DEADLINE_EXCEEDED | code::CANCELLED | code::UNKNOWN => {
                    unavailable(message, error)
                }
                // "etcdserver: not leader" from a member that lost its leader.
                code::FAILED_PRECONDITION if lower.contains("leader") => {
                    unavailable(message, error)
                }
                // Too many requests, or an auth revision race: the same call may succeed later.
                code::RESOURCE_EXHAUSTED | code::ABORTED => Error::Backend {
                    backend: BACKEND,
                    message,
                    retryable: true,
                    source: Some(Arc::new(error)),
                },
                code::INVALID_ARGUMENT if lower.contains("revision of auth store is old") => {
                    Error::Backend {
                        backend: BACKEND,
                        message,
                        retryable: true,
                        source: Some(Arc::new(error)),
                    }
                }
                _ => Error::Backend {
                    backend: BACKEND,
                    message,
                    retryable: false,
                    source: Some(Arc::new(error)),
                },
            }
        }
        E::TransportError(_) | E::IoError(_) | E::WatchError(_) | E::LeaseKeepAliveError(_) => {
            let message = redact_url(&format!("{what}: {error}"));
            unavailable(message, error)
        }
        E::InvalidUri(_) | E::InvalidArgs(_) | E::EndpointError(_) => Error::InvalidConfig {
            reason: redact_url(&format!("{what}: {error}")),
        },
        _ => Error::Backend {
            backend: BACKEND,
            message: redact_url(&format!("{what}: {error}")),
            retryable: false,
            source: Some(Arc::new(error)),
        },
    }
}

fn unauthorized(message: String, error: etcd_client::Error) -> Error {
    Error::Unauthorized {
        backend: BACKEND,
        message,
        source: Some(Arc::new(error)),
    }
}

fn unavailable(message: String, error: etcd_client::Error) -> Error {
    Error::Unavailable {
        backend: BACKEND,
        message,
        source: Some(Arc::new(error)),
    }
}

/// Whether etcd said the lease a request named does not exist (it expired or was revoked).
pub(crate) fn is_lease_not_found(error: &etcd_client::Error) -> bool {
    match error {
        etcd_client::Error::GRpcStatus(status) => {
            i32::from(status.code()) == code::NOT_FOUND
                && status.message().contains("lease not found")
        }
        etcd_client::Error::LeaseKeepAliveError(message) => message.contains("lease not found"),
        _ => false,
    }
}

/// Whether a watch or read failed because the revision asked for was compacted away.
pub(crate) fn is_compacted(error: &etcd_client::Error) -> bool {
    matches!(error, etcd_client::Error::GRpcStatus(s) if s.message().contains("compacted"))
}

/// Runs one request, bounded by `timeout`; the client's error mapped, a timeout as
/// [`Error::Unavailable`].
pub(crate) async fn bounded<T>(
    what: &str,
    timeout: Duration,
    request: impl Future<Output = Result<T, etcd_client::Error>>,
) -> leasehold_core::Result<T> {
    match tokio::time::timeout(timeout, request).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(error)) => Err(map(error, what)),
        Err(_) => Err(Error::request_timeout(BACKEND, what, timeout)),
    }
}

/// Whether `error` proves the request never reached any etcd member, so that sending it again
/// (to another member) cannot apply it twice, whatever it is: the connection to the member the
/// balancer picked could not be made (a member that is down: "connection refused"), or the
/// member refused it before doing anything because it has no leader (`require_leader`).
pub(crate) fn not_sent(error: &etcd_client::Error) -> bool {
    let status = match error {
        etcd_client::Error::GRpcStatus(status) => status,
        etcd_client::Error::TransportError(e) => return refused(e),
        _ => return false,
    };
    if i32::from(status.code()) != code::UNAVAILABLE {
        return false;
    }
    status.message().contains("etcdserver: no leader")
        || status.message().contains("tcp connect error")
        || refused(status)
}

/// Whether a connection refusal is somewhere in `error`'s chain of sources.
fn refused(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut source = Some(error);
    while let Some(e) = source {
        if e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused)
        {
            return true;
        }
        source = e.source();
    }
    false
}

/// Runs one request through the balanced client, bounded by `timeout` in all: a request that
/// provably never left (see [`not_sent`]: the balancer picked a member that is down) is sent
/// again, after a short pause, and the balancer picks again among the members, so a client given
/// several endpoints carries the call to a live one. Anything else is returned as it is: a
/// request that may have been applied is never sent twice here.
pub(crate) async fn call<T, F, Fut>(
    what: &str,
    timeout: Duration,
    request: F,
) -> leasehold_core::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, etcd_client::Error>>,
{
    send(what, timeout, Resend::NotSent, request).await
}

/// Which failed requests [`send`] sends again.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Resend {
    /// Only those that provably never left: safe for any request.
    NotSent,
    /// Any that found the cluster unavailable: only for requests that change nothing.
    Unavailable,
}

/// The loop behind [`call`] and [`read_with_retry`]: send, and send again after a short,
/// growing pause while `resend` allows it and `timeout` has time left.
async fn send<T, F, Fut>(
    what: &str,
    timeout: Duration,
    resend: Resend,
    mut request: F,
) -> leasehold_core::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, etcd_client::Error>>,
{
    let give_up = leasehold_core::time::deadline_in(timeout);
    let mut pause = match resend {
        Resend::NotSent => Backoff::new(Duration::from_millis(2), Duration::from_millis(100)),
        Resend::Unavailable => Backoff::new(Duration::from_millis(10), Duration::from_millis(200)),
    };
    loop {
        let left = give_up.saturating_duration_since(tokio::time::Instant::now());
        let raw = match tokio::time::timeout(left, request()).await {
            Ok(Ok(value)) => return Ok(value),
            Ok(Err(raw)) => raw,
            Err(_) => return Err(Error::request_timeout(BACKEND, what, timeout)),
        };
        let never_left = not_sent(&raw);
        let error = map(raw, what);
        let again = never_left
            || (resend == Resend::Unavailable && matches!(error, Error::Unavailable { .. }));
        let delay = pause.next_delay();
        if !again || leasehold_core::time::deadline_in(delay) >= give_up {
            return Err(error);
        }
        tracing::debug!(%error, "{what}: sending again");
        tokio::time::sleep(delay).await;
    }
}

/// One transaction through [`call`].
pub(crate) async fn txn(
    client: &etcd_client::Client,
    what: &str,
    timeout: Duration,
    txn: etcd_client::Txn,
) -> leasehold_core::Result<etcd_client::TxnResponse> {
    call(what, timeout, || {
        let (mut kv, txn) = (client.kv_client(), txn.clone());
        async move { kv.txn(txn).await }
    })
    .await
}

/// Revokes `lease` through [`call`]; a lease etcd does not know (any more) counts as revoked.
pub(crate) async fn revoke(
    client: &etcd_client::Client,
    lease: i64,
    timeout: Duration,
) -> leasehold_core::Result<()> {
    let revoked = call("revoke a lease", timeout, || {
        let mut leases = client.lease_client();
        async move { leases.revoke(lease).await }
    })
    .await;
    match revoked {
        Err(e) if !is_lease_gone(&e) => Err(e),
        _ => Ok(()),
    }
}

/// Whether a mapped error came from etcd saying the lease a request named does not exist.
pub(crate) fn is_lease_gone(error: &Error) -> bool {
    let source = match error {
        Error::Backend { source, .. } | Error::Unavailable { source, .. } => source,
        _ => return false,
    };
    source
        .as_deref()
        .and_then(|s| s.downcast_ref::<etcd_client::Error>())
        .is_some_and(is_lease_not_found)
}

/// Runs an idempotent read until it succeeds, retrying (after a short, growing pause) while the
/// cluster is unavailable — a member that died, an election under way — for at most `timeout`
/// in all. Only for requests that change nothing: a write with an unknown outcome must never be
/// sent twice.
pub(crate) async fn read_with_retry<T, F, Fut>(
    what: &str,
    timeout: Duration,
    request: F,
) -> leasehold_core::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, etcd_client::Error>>,
{
    send(what, timeout, Resend::Unavailable, request).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clone_still_says_the_lease_is_gone() -> Result<(), String> {
        let keep_alive =
            etcd_client::Error::LeaseKeepAliveError("etcdserver: requested lease not found".into());
        let error = map(keep_alive, "keep-alive");
        // A failed batch hands every member a clone; each must still find etcd's own error.
        for e in vec![error.clone(); 2].iter().chain([&error]) {
            if !is_lease_gone(e) {
                return Err(format!("{e:?} is not taken for a lease that is gone"));
            }
        }
        let refused = map(
            etcd_client::Error::LeaseKeepAliveError("connection reset".into()),
            "keep-alive",
        );
        if is_lease_gone(&refused.clone()) {
            return Err(format!("{refused:?} is taken for a lease that is gone"));
        }
        Ok(())
    }
}
