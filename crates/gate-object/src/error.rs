//! An object store's errors as leasehold's: retryable when the store may answer later, and
//! never with a credential in the message.

use std::error::Error as StdError;

use leasehold_core::Error;

const BACKEND: &str = "object gate";

/// The HTTP status a store's error reports, read from its text: object_store keeps the status in
/// a private type and shows it as `... status code: 503 ...`.
fn status_in(text: &str) -> Option<u16> {
    let (_, after) = text.split_once("status code: ")?;
    after.get(..3)?.parse().ok()
}

/// Whether a cause is a transport failure: no HTTP answer came back.
fn is_transport(cause: &(dyn StdError + 'static)) -> bool {
    #[cfg(any(feature = "aws", feature = "gcp", feature = "azure"))]
    if cause.is::<object_store::client::HttpError>() {
        return true;
    }
    cause.is::<std::io::Error>()
}

/// Whether the store may answer the same request later: the request never got an HTTP answer
/// (a refused or cut connection, a timeout), or the answer was a 5xx, 429 (throttled) or 408.
fn retryable(error: &object_store::Error) -> bool {
    use object_store::Error as E;
    if !matches!(error, E::Generic { .. }) {
        return false;
    }
    let mut transport = false;
    let mut cause: Option<&(dyn StdError + 'static)> = Some(error);
    while let Some(c) = cause {
        if let Some(status) = status_in(&c.to_string()) {
            return status >= 500 || matches!(status, 408 | 429);
        }
        transport |= is_transport(c);
        cause = c.source();
    }
    transport
}

/// Whether the store refused the credentials or their permissions: object_store's typed
/// `PermissionDenied`/`Unauthenticated`, or a 401 or 403 answer it left generic.
fn refused(error: &object_store::Error) -> bool {
    use object_store::Error as E;
    match error {
        E::PermissionDenied { .. } | E::Unauthenticated { .. } => true,
        E::Generic { .. } => {
            let mut cause: Option<&(dyn StdError + 'static)> = Some(error);
            while let Some(c) = cause {
                if let Some(status) = status_in(&c.to_string()) {
                    return matches!(status, 401 | 403);
                }
                cause = c.source();
            }
            false
        }
        _ => false,
    }
}

/// Cuts every URL's query string out of `text` (`?` up to the next whitespace): an Azure SAS
/// token or a presigned signature travels there, and a store's error may quote its URL.
pub fn redact(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut in_query = false;
    for c in text.chars() {
        if in_query {
            if c.is_whitespace() || c == '"' || c == ')' {
                in_query = false;
                out.push(c);
            }
        } else if c == '?' {
            in_query = true;
            out.push_str("?<redacted>");
        } else {
            out.push(c);
        }
    }
    out
}

/// A store error from `operation` on `path` as leasehold's [`Error`]: [`Error::Unavailable`]
/// when [retryable](Error::is_retryable) (nobody knows whether a write landed),
/// [`Error::Unauthorized`] when the store refused the credentials or their permissions (a 401 or
/// 403), else a permanent [`Error::Backend`] (a missing bucket, a store that cannot do
/// conditional writes). The message has every URL's query string cut out, and the source is not
/// kept, since its text may quote a signed URL; the message keeps the rest of its text.
pub fn map_error(error: object_store::Error, operation: &str, path: &str) -> Error {
    map_error_for(BACKEND, error, operation, path)
}

/// [`map_error`] for another user of an object store (the object-store authority), whose errors
/// name it as their `backend`.
pub fn map_error_for(
    backend: &'static str,
    error: object_store::Error,
    operation: &str,
    path: &str,
) -> Error {
    let message = format!("{operation} {path}: {}", redact(&error.to_string()));
    if refused(&error) {
        Error::Unauthorized {
            backend,
            message,
            source: None,
        }
    } else if retryable(&error) {
        Error::Unavailable {
            backend,
            message,
            source: None,
        }
    } else {
        Error::Backend {
            backend,
            message,
            retryable: false,
            source: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_strings_are_cut_out() {
        assert_eq!(
            redact("PUT http://h/c/b?sv=2021&sig=SECRET failed (status 500)"),
            "PUT http://h/c/b?<redacted> failed (status 500)"
        );
        assert_eq!(redact("no url here"), "no url here");
    }

    #[test]
    fn permanent_and_retryable_errors_are_told_apart() {
        let refused = map_error(
            object_store::Error::PermissionDenied {
                path: "p".into(),
                source: "denied".into(),
            },
            "write",
            "p",
        );
        assert!(!refused.is_retryable(), "{refused}");
        assert!(matches!(refused, Error::Unauthorized { .. }), "{refused:?}");
        let io = map_error(
            object_store::Error::Generic {
                store: "S3",
                source: Box::new(std::io::Error::other("connection reset")),
            },
            "write",
            "p",
        );
        assert!(io.is_retryable(), "{io}");
        let parse = map_error(
            object_store::Error::Generic {
                store: "S3",
                source: "unexpected body".into(),
            },
            "write",
            "p",
        );
        assert!(!parse.is_retryable(), "{parse}");
        for (status, retry) in [
            (503, true),
            (500, true),
            (429, true),
            (400, false),
            (403, false),
        ] {
            let text = format!("Server returned non-2xx status code: {status} Whatever: body");
            let mapped = map_error(
                object_store::Error::Generic {
                    store: "S3",
                    source: text.into(),
                },
                "write",
                "p",
            );
            assert_eq!(mapped.is_retryable(), retry, "{mapped}");
            assert_eq!(
                matches!(mapped, Error::Unauthorized { .. }),
                status == 403,
                "{mapped:?}"
            );
        }
    }
}
