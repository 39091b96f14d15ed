//! What an [`crate::ObjectStoreAuthority`] is configured with beyond its store.

use std::time::Duration;

use leasehold_core::ClientOptions;

/// The shortest pause between two polls of one waiter: a bound on the requests a waiter sends
/// per second (object stores bill per request).
pub const POLL_FLOOR: Duration = Duration::from_millis(50);

/// How an [`crate::ObjectStoreAuthority`] names its objects, times its requests and polls.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectStoreConfig {
    pub(crate) prefix: String,
    pub(crate) client: ClientOptions,
    pub(crate) poll_min: Duration,
    pub(crate) poll_max: Duration,
    pub(crate) durable_fences: bool,
}

impl Default for ObjectStoreConfig {
    fn default() -> Self {
        ObjectStoreConfig::new("leasehold")
    }
}

impl ObjectStoreConfig {
    /// Lease objects under `prefix` (`locks/prod`; empty for the bucket's root), the default
    /// client options, polling between 100 ms and 1 s.
    pub fn new(prefix: impl Into<String>) -> Self {
        ObjectStoreConfig {
            prefix: prefix.into().trim_matches('/').to_string(),
            client: ClientOptions::default(),
            poll_min: Duration::from_millis(100),
            poll_max: Duration::from_secs(1),
            durable_fences: true,
        }
    }

    /// The epoch, safety margin and request timeout.
    pub fn with_client(mut self, client: ClientOptions) -> Self {
        self.client = client;
        self
    }

    /// Waiters poll with jittered backoff from `min` up to `max` between reads; `min` is at
    /// least [`POLL_FLOOR`], `max` at least `min`.
    pub fn with_polling(mut self, min: Duration, max: Duration) -> Self {
        self.poll_min = min.max(POLL_FLOOR);
        self.poll_max = max.max(self.poll_min);
        self
    }

    /// Declares that the store loses its objects when it restarts (an in-memory test server
    /// such as moto's): fences then start again from 1, and
    /// [`leasehold_core::Capabilities::durable_fences`] says so. A real object store keeps
    /// them.
    pub fn store_forgets_on_restart(mut self) -> Self {
        self.durable_fences = false;
        self
    }

    /// The prefix lease objects are written under.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The client options.
    pub fn client(&self) -> &ClientOptions {
        &self.client
    }
}
