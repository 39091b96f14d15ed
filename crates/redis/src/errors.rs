//! From the client library's errors to leasehold's, keeping "unreachable" apart from "refused".

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::backend::redact_url;
use leasehold_core::Error;
use redis::{ErrorKind, RedisError, ServerErrorKind};

pub(crate) const BACKEND: &str = "redis";

/// Whether the connection that produced `error` must be replaced: it failed below the protocol
/// (I/O, TLS, a reply that does not parse), as opposed to a server that answered with an error.
pub(crate) fn breaks_connection(error: &RedisError) -> bool {
    matches!(
        error.kind(),
        ErrorKind::Io | ErrorKind::Parse | ErrorKind::AuthenticationFailed
    )
}

/// Whether the server that answered `error` is not the primary (any more): `READONLY` from a
/// replica, `MASTERDOWN` from a replica that lost its primary. The connection is replaced, so
/// that the next request finds the primary again (through Sentinel, the one it names now).
pub(crate) fn not_the_primary(error: &RedisError) -> bool {
    matches!(
        error.kind(),
        ErrorKind::Server(ServerErrorKind::ReadOnly | ServerErrorKind::MasterDown)
    ) || matches!(error.code(), Some("READONLY" | "MASTERDOWN"))
}

/// Whether the connection that produced `error` must not be used for new requests: it broke
/// ([`breaks_connection`]) or reaches a server that is not the primary ([`not_the_primary`]).
pub(crate) fn replace_connection(error: &RedisError) -> bool {
    breaks_connection(error) || not_the_primary(error)
}

/// Whether `error` is a redirection (`MOVED`, `ASK`). Through the cluster client one only
/// reaches us when its slot map stayed stale through all its retries (a failover or a resharding
/// in progress): the connection is replaced, so that the next request reads the map afresh.
pub(crate) fn is_redirect(error: &RedisError) -> bool {
    matches!(
        error.kind(),
        ErrorKind::Server(ServerErrorKind::Moved | ServerErrorKind::Ask)
    ) || matches!(error.code(), Some("MOVED" | "ASK"))
}

/// Whether `error` may well go away by itself: the connection broke, or the server is loading,
/// a replica, or a cluster node whose slots are moving or whose cluster is down. As opposed to
/// a refusal that asking again would meet again (an ACL, an unknown command).
pub(crate) fn is_transient(error: &RedisError) -> bool {
    breaks_connection(error)
        || not_the_primary(error)
        || is_redirect(error)
        || matches!(
            error.kind(),
            ErrorKind::Server(
                ServerErrorKind::BusyLoading
                    | ServerErrorKind::TryAgain
                    | ServerErrorKind::ClusterDown
            )
        )
        || matches!(error.code(), Some("LOADING" | "TRYAGAIN" | "CLUSTERDOWN"))
}

/// Maps an error met on a connection, to a Redis Cluster if `cluster`: there a redirection is
/// the topology moving (retryable `Unavailable`); to one server it is a misconfiguration
/// ([`map`]).
pub(crate) fn map_on(error: RedisError, what: &str, cluster: bool) -> Error {
    if cluster && is_redirect(&error) {
        return Error::Unavailable {
            backend: BACKEND,
            message: redact_url(&format!(
                "{what}: {error} (the cluster's slots are moving; the next request reads the \
                 slot map again)"
            )),
            source: Some(Arc::new(error)),
        };
    }
    map(error, what)
}

/// Whether the server refused our credentials or permissions (`Unauthorized`, never retried).
pub(crate) fn is_refused(error: &RedisError) -> bool {
    matches!(
        error.kind(),
        ErrorKind::AuthenticationFailed | ErrorKind::Server(ServerErrorKind::NoPerm)
    ) || matches!(error.code(), Some("NOAUTH" | "WRONGPASS" | "NOPERM"))
        || refused_in_a_script(error)
}

/// Whether the ACL refused a command or a key inside one of our scripts: Redis answers that
/// with a plain error whose text says so, not with `NOPERM`. The script stopped at that
/// command, so what it would have written after it was not written.
fn refused_in_a_script(error: &RedisError) -> bool {
    error
        .detail()
        .is_some_and(|d| d.contains("The user executing the script can't"))
}

/// Maps a client error met while doing `what`.
pub(crate) fn map(error: RedisError, what: &str) -> Error {
    // The library's messages carry no credentials, but a URL could appear in an I/O error text
    // from a resolver; mask anything that looks like one.
    let message = redact_url(&format!("{what}: {error}"));
    let code = error.code().unwrap_or_default().to_string();
    let unauthorized = |message: String, error: RedisError| Error::Unauthorized {
        backend: BACKEND,
        message,
        source: Some(Arc::new(error)),
    };
    let unavailable = |message: String, error: RedisError| Error::Unavailable {
        backend: BACKEND,
        message,
        source: Some(Arc::new(error)),
    };
    let backend = |message: String, retryable: bool, error: RedisError| Error::Backend {
        backend: BACKEND,
        message,
        retryable,
        source: Some(Arc::new(error)),
    };
    match (error.kind(), code.as_str()) {
        // WRONGPASS during the handshake, NOAUTH when no password was given, NOPERM when the ACL
        // user may not run a command or touch a key or channel.
        (ErrorKind::AuthenticationFailed, _)
        | (ErrorKind::Server(ServerErrorKind::NoPerm), _)
        | (_, "NOAUTH" | "WRONGPASS" | "NOPERM") => unauthorized(message, error),
        _ if refused_in_a_script(&error) => unauthorized(message, error),
        // Not reachable, or not serving writes right now: loading a dataset after a restart,
        // a replica (READONLY: this connection reaches a node that is no longer the primary),
        // a cluster in flux. Nobody knows who holds the lock.
        (ErrorKind::Io | ErrorKind::Parse, _)
        | (
            ErrorKind::Server(
                ServerErrorKind::BusyLoading
                | ServerErrorKind::ReadOnly
                | ServerErrorKind::MasterDown
                | ServerErrorKind::TryAgain
                | ServerErrorKind::ClusterDown,
            ),
            _,
        ) => unavailable(message, error),
        (
            ErrorKind::Server(
                ServerErrorKind::Moved | ServerErrorKind::Ask | ServerErrorKind::CrossSlot,
            ),
            _,
        ) => backend(
            format!(
                "{message} (a redis:// authority talks to one Redis server; for a Redis Cluster \
                 use redis+cluster://host:port,...)"
            ),
            false,
            error,
        ),
        // A long script of someone else's (BUSY), out of memory, or a failed snapshot that
        // stops writes (MISCONF): the same call may work later.
        (_, "BUSY" | "OOM" | "MISCONF") => backend(message, true, error),
        (ErrorKind::InvalidClientConfig, _) => Error::InvalidConfig { reason: message },
        _ => backend(message, false, error),
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
    fn connection_failures_are_unavailable_and_break_the_connection() {
        let io = RedisError::from(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "refused",
        ));
        assert!(breaks_connection(&io));
        let e = map(io, "connect");
        assert!(
            matches!(e, Error::Unavailable { .. }) && e.is_retryable(),
            "{e:?}"
        );
    }

    #[test]
    fn replies_of_a_replica_replace_the_connection() {
        let e = RedisError::from((
            ErrorKind::Server(ServerErrorKind::ReadOnly),
            "You can't write against a read only replica.",
        ));
        assert!(not_the_primary(&e) && replace_connection(&e) && !breaks_connection(&e));
        assert!(matches!(map(e, "acquire"), Error::Unavailable { .. }));
        let e = RedisError::from((ErrorKind::AuthenticationFailed, "no"));
        assert!(is_refused(&e) && !not_the_primary(&e));
    }

    #[test]
    fn refused_credentials_are_unauthorized() {
        let e = RedisError::from((
            ErrorKind::AuthenticationFailed,
            "Password authentication failed",
        ));
        assert!(matches!(map(e, "connect"), Error::Unauthorized { .. }));
        let e = RedisError::from((ErrorKind::InvalidClientConfig, "bad"));
        assert!(matches!(map(e, "connect"), Error::InvalidConfig { .. }));
    }
}
