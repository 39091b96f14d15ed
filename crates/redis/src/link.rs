//! One multiplexed connection to the server, opened on demand and replaced when it breaks.

use std::fmt;
use std::sync::Mutex;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, ErrorKind, RedisError, RedisResult};

/// Opens a connection in a task of its own, so that a panic inside the client library turns
/// into an error instead of unwinding through the caller.
///
/// The one such panic known: `rediss://` in a build where rustls has no process-wide crypto
/// provider (neither its `ring` nor its `aws-lc-rs` feature is enabled by any crate in the
/// build, and the application did not install one). The client library then panics while
/// building its TLS configuration; here that becomes a configuration error.
pub(crate) async fn connect(
    client: Client,
    config: AsyncConnectionConfig,
) -> RedisResult<MultiplexedConnection> {
    ensure_crypto_provider();
    let task = tokio::spawn(async move {
        client
            .get_multiplexed_async_connection_with_config(&config)
            .await
    });
    match task.await {
        Ok(result) => result,
        Err(join) => {
            let detail = match join.try_into_panic() {
                Ok(payload) => payload
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| payload.downcast_ref::<String>().cloned())
                    .unwrap_or_default(),
                Err(join) => join.to_string(),
            };
            let detail = detail.trim().lines().next().unwrap_or_default().to_string();
            Err(RedisError::from((
                ErrorKind::InvalidClientConfig,
                "the Redis client failed while connecting (for rediss://: rustls needs a crypto \
                 provider, see docs/redis.md)",
                detail,
            )))
        }
    }
}

/// Installs rustls's `ring` provider as the process default unless the application installed one
/// (or another crate did): `rediss://` needs one, and ring is already part of the build.
fn ensure_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Err means another thread installed one first: exactly what we wanted.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// A connection with an identity, so that a failure on it only discards *that* connection and
/// not the one another task opened meanwhile.
#[derive(Clone)]
pub(crate) struct Conn {
    pub(crate) id: u64,
    pub(crate) con: MultiplexedConnection,
}

/// The connection every request of an authority shares (Redis pipelines them).
///
/// Why not the library's `ConnectionManager`: it retries a failed reconnect several times with
/// backoff whatever the error, so a wrong password shows up as a timeout instead of
/// `Unauthorized`; it keeps a connection whose server stopped answering; and it answers the
/// first request after an outage with the stale failure. Here each request either uses the
/// current connection or opens one (one attempt, bounded by the request timeout), and a
/// connection is dropped as soon as it fails below the protocol or a request on it times out.
pub(crate) struct Link {
    client: Client,
    config: AsyncConnectionConfig,
    current: Mutex<Option<Conn>>,
    /// Serialises connecting, so a crowd of requests after an outage opens one connection.
    connecting: tokio::sync::Mutex<u64>,
}

impl fmt::Debug for Link {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The client's connection info holds the password: never print it.
        f.debug_struct("Link").finish_non_exhaustive()
    }
}

impl Link {
    pub(crate) fn new(client: Client, config: AsyncConnectionConfig) -> Self {
        Link {
            client,
            config,
            current: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(0),
        }
    }

    fn cached(&self) -> Option<Conn> {
        self.current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The current connection, or a new one. The caller bounds the wait.
    pub(crate) async fn get(&self) -> RedisResult<Conn> {
        if let Some(conn) = self.cached() {
            return Ok(conn);
        }
        let mut next_id = self.connecting.lock().await;
        if let Some(conn) = self.cached() {
            return Ok(conn);
        }
        let con = connect(self.client.clone(), self.config.clone()).await?;
        *next_id += 1;
        let conn = Conn { id: *next_id, con };
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = Some(conn.clone());
        Ok(conn)
    }

    /// Stops using connection `id` for new requests (requests already sent on it keep their
    /// place in its pipeline).
    pub(crate) fn discard(&self, id: u64) {
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        if current.as_ref().is_some_and(|c| c.id == id) {
            *current = None;
        }
    }
}
