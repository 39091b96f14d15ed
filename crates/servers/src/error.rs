//! The harness's error type.

use std::fmt;
use std::io;
use std::time::Duration;

/// What the Debian packages are called, for the "not installed" hint.
const PACKAGES: &str =
    "etcd-server etcd-client zookeeper redis-server postgresql pgbouncer mariadb-server";

/// Why a server could not be started, probed or faulted.
///
/// Every variant that concerns a running server carries the tail of that server's log, so a
/// failing test shows the server's own explanation. A server that cannot start is always an
/// error: the harness never skips.
#[derive(Debug)]
#[non_exhaustive]
pub enum HarnessError {
    /// A program the server needs is not installed.
    MissingProgram {
        /// The server that needed it, e.g. `etcd`.
        server: String,
        /// The program or file that was not found.
        program: String,
    },
    /// An operating-system call of the harness itself failed.
    Io {
        /// What the harness was doing.
        action: String,
        /// The underlying error.
        source: io::Error,
    },
    /// The server process exited while the harness waited for it to serve.
    Exited {
        /// The server, e.g. `etcd-2`.
        server: String,
        /// How it exited.
        status: String,
        /// The last lines of its log.
        log_tail: String,
    },
    /// The server could not bind one of its ports (another process took it first).
    ///
    /// Starts retry on fresh ports when they see this; restarts retry on the same ports.
    PortInUse {
        /// The server.
        server: String,
        /// The last lines of its log.
        log_tail: String,
    },
    /// The server did not serve within the bound.
    NotReady {
        /// The server.
        server: String,
        /// How long the harness waited.
        waited: Duration,
        /// The last failed check.
        last_check: String,
        /// The last lines of its log.
        log_tail: String,
    },
    /// The server answered, but not as expected (an error reply, no leader, bad output).
    Server {
        /// The server.
        server: String,
        /// What went wrong.
        message: String,
    },
}

impl HarnessError {
    /// An [`HarnessError::Io`] with a description of the action that failed.
    pub(crate) fn io(action: impl Into<String>, source: io::Error) -> Self {
        HarnessError::Io {
            action: action.into(),
            source,
        }
    }

    /// An [`HarnessError::Server`].
    pub(crate) fn server(server: impl Into<String>, message: impl Into<String>) -> Self {
        HarnessError::Server {
            server: server.into(),
            message: message.into(),
        }
    }

    /// A [`HarnessError::MissingProgram`].
    pub(crate) fn missing(server: impl Into<String>, program: impl Into<String>) -> Self {
        HarnessError::MissingProgram {
            server: server.into(),
            program: program.into(),
        }
    }

    /// Whether this is a bind failure, which a start answers by retrying on fresh ports.
    pub fn is_port_in_use(&self) -> bool {
        matches!(self, HarnessError::PortInUse { .. })
    }
}

impl fmt::Display for HarnessError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HarnessError::MissingProgram { server, program } => write!(
                f,
                "cannot start {server}: `{program}` is not installed; install the Debian packages \
                 {PACKAGES} (`./scripts/test` installs them)"
            ),
            HarnessError::Io { action, source } => write!(f, "{action}: {source}"),
            HarnessError::Exited {
                server,
                status,
                log_tail,
            } => write!(f, "{server} exited while starting ({status})\n{log_tail}"),
            HarnessError::PortInUse { server, log_tail } => write!(
                f,
                "{server} could not bind its port (address already in use)\n{log_tail}"
            ),
            HarnessError::NotReady {
                server,
                waited,
                last_check,
                log_tail,
            } => write!(
                f,
                "{server} did not serve within {waited:?} (last check: {last_check})\n{log_tail}"
            ),
            HarnessError::Server { server, message } => write!(f, "{server}: {message}"),
        }
    }
}

impl std::error::Error for HarnessError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            HarnessError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// The harness's result type.
pub type Result<T, E = HarnessError> = std::result::Result<T, E>;
