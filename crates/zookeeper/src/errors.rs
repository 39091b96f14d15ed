//! From the client's errors to leasehold's, keeping "unreachable" apart from "refused".

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::Error;
use zookeeper_client::Error as ZkError;

pub(crate) const BACKEND: &str = "zookeeper";

/// Whether the server answered `error` about the request itself, so the request's effect is
/// known (it did not happen). Anything else (a lost connection, a timeout) leaves open whether
/// the server applied it.
pub(crate) fn is_definite(error: &ZkError) -> bool {
    matches!(
        error,
        ZkError::NoNode
            | ZkError::NoAuth
            | ZkError::BadVersion
            | ZkError::NoChildrenForEphemerals
            | ZkError::NodeExists
            | ZkError::NotEmpty
            | ZkError::InvalidAcl
            | ZkError::BadArguments(_)
            | ZkError::QuotaExceeded
            | ZkError::Throttled
            | ZkError::Unimplemented
            | ZkError::NotReadOnly
            | ZkError::UnexpectedErrorCode(_)
            | ZkError::MarshallingError
    )
}

/// Whether the session is over for good: every ephemeral node it created is gone (or will be,
/// within the session timeout, at the server).
pub(crate) fn is_session_end(error: &ZkError) -> bool {
    matches!(
        error,
        ZkError::SessionExpired | ZkError::ClientClosed | ZkError::AuthFailed
    )
}

/// Maps a client error met while doing `what`.
pub(crate) fn map(error: ZkError, what: &str) -> Error {
    let message = format!("{what}: {error}");
    match error {
        ZkError::NoAuth | ZkError::AuthFailed | ZkError::InvalidAcl => Error::Unauthorized {
            backend: BACKEND,
            message,
            source: Some(Arc::new(error)),
        },
        ZkError::NoHosts
        | ZkError::Timeout
        | ZkError::ConnectionLoss
        | ZkError::SessionExpired
        | ZkError::SessionMoved
        | ZkError::NotReadOnly
        | ZkError::ClientClosed
        | ZkError::Custom(_) => Error::Unavailable {
            backend: BACKEND,
            message,
            source: Some(Arc::new(error)),
        },
        ZkError::Throttled => Error::Backend {
            backend: BACKEND,
            message,
            retryable: true,
            source: Some(Arc::new(error)),
        },
        ZkError::Unimplemented => Error::Backend {
            backend: BACKEND,
            message: format!(
                "{message} (a server older than 3.5.3? see ZkConfig::with_server_version)"
            ),
            retryable: false,
            source: Some(Arc::new(error)),
        },
        ZkError::BadArguments(_) => Error::InvalidConfig { reason: message },
        _ => Error::Backend {
            backend: BACKEND,
            message,
            retryable: false,
            source: Some(Arc::new(error)),
        },
    }
}

/// The request got no answer within the timeout.
pub(crate) fn timed_out(what: &str, after: Duration) -> Error {
    Error::request_timeout(BACKEND, what, after)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outages_are_retryable_and_refusals_are_not() {
        for e in [ZkError::ConnectionLoss, ZkError::NoHosts, ZkError::Timeout] {
            let mapped = map(e, "x");
            assert!(matches!(mapped, Error::Unavailable { .. }) && mapped.is_retryable());
        }
        let denied = map(ZkError::NoAuth, "create");
        assert!(matches!(denied, Error::Unauthorized { .. }) && !denied.is_retryable());
        assert!(map(ZkError::Throttled, "x").is_retryable());
        assert!(!map(ZkError::NoChildrenForEphemerals, "x").is_retryable());
        assert!(is_definite(&ZkError::NoNode) && !is_definite(&ZkError::ConnectionLoss));
        assert!(is_session_end(&ZkError::SessionExpired));
    }
}
