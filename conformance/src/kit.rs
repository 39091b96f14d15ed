//! A kit for binding a backend's tests to the suite in a few lines, in the manner of
//! tower-sessions' store tests: a [`Connector`] for any URL given the backend's connect
//! function, [`Faults`] for any server the harness runs, and [`OrFail`] on `Result` and `Option`
//! so that a test returns [`TestResult`] and says what failed instead of unwrapping.
//!
//! # Examples
//!
//! A backend's whole conformance test, against a server the harness starts (shown for the
//! in-memory reference, which needs no server, in [`UrlConnector`]):
//!
//! ```no_run
//! # use std::sync::Arc;
//! # use leasehold_conformance::kit::{self, OrFail, ServerFaults, TestResult, UrlConnector};
//! # use leasehold_conformance::servers::RedisServer;
//! # use leasehold_conformance::{scenarios::run_all, Context};
//! # async fn connect(url: &str) -> leasehold_core::Result<leasehold_memory::MemoryAuthority> {
//! #     unimplemented!("the backend's own connect, RedisAuthority::connect say")
//! # }
//! # async fn passes_the_suite() -> TestResult {
//! let server = kit::start("Redis", RedisServer::start).await?;
//! let clients = UrlConnector::new(server.url(), |url| async move { connect(&url).await });
//! let ctx = Context::new(Arc::new(clients))
//!     .await
//!     .or_fail("connect the first client")?
//!     .with_faults(Arc::new(ServerFaults::new(server)));
//! run_all("redis", &ctx).await.assert_passed();
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use leasehold_core::backend::redact_url;
use leasehold_core::{Authority, LockKey, Result};

use crate::context::Connector;
use crate::faults::{harness_call, unsupported, Faults};
use crate::servers;
use crate::verdict::Failure;

pub use crate::verdict::OrFail;

mod lease_table;
mod replicated;
mod revocation;
mod runs;

pub use lease_table::{
    a_timed_out_acquisition_is_given_back_when_it_lands,
    cancelled_acquisitions_leave_no_lease_behind, LeaseTable, LockedRow,
};
pub use replicated::{run_with_failover, FailoverFaults, FailoverRun, ReplicatedPair};
pub use revocation::{revoke_ends_the_holder, revoke_is_refused_and_the_holder_keeps_its_lease};
pub use runs::{passes_all_but_failover, stale_writes_are_refused};

/// What a test returns: `Ok`, or the [`Failure`] that says what failed.
pub type TestResult<T = ()> = std::result::Result<T, Failure>;

impl<T> OrFail<T> for Option<T> {
    /// `None` is a failure of `what`.
    fn or_fail(self, what: impl fmt::Display) -> std::result::Result<T, Failure> {
        self.ok_or_else(|| Failure::new(format!("{what}: got None")))
    }
}

/// The other way round from [`OrFail`]: for a step that must fail.
pub trait ErrOrFail<E> {
    /// The error, or a [`Failure`] of `what` that shows what came instead.
    fn err_or_fail(self, what: impl fmt::Display) -> std::result::Result<E, Failure>;
}

impl<T: fmt::Debug, E> ErrOrFail<E> for std::result::Result<T, E> {
    fn err_or_fail(self, what: impl fmt::Display) -> std::result::Result<E, Failure> {
        match self {
            Ok(value) => Err(Failure::new(format!(
                "{what}: succeeded with {value:?}, an error was expected"
            ))),
            Err(e) => Ok(e),
        }
    }
}

/// Starts a harness server (any `start` function of [`servers`]) off the runtime's workers, as
/// the harness's blocking API needs; `what` names it in the failure when it cannot start.
pub async fn start<S: Send + Sync + 'static>(
    what: &str,
    start: impl FnOnce() -> servers::Result<S> + Send + 'static,
) -> TestResult<Arc<S>> {
    harness_call(start)
        .await
        .map(Arc::new)
        .or_fail(format!("{what} must start for these tests"))
}

/// The server a test runs against: the one `external` names (a URL from the environment, as
/// [`servers::external`] reads it, e.g. docker compose's), or else one [`start`]ed here. The
/// address, and the started server, which the caller keeps for as long as it uses the address.
pub async fn external_or_start<S: Send + Sync + 'static>(
    external: Option<String>,
    what: &str,
    start_server: impl FnOnce() -> servers::Result<S> + Send + 'static,
    address: impl FnOnce(&S) -> String,
) -> TestResult<(String, Option<Arc<S>>)> {
    match external {
        Some(address) => Ok((address, None)),
        None => {
            let server = start(what, start_server).await?;
            Ok((address(&server), Some(server)))
        }
    }
}

type Connect = dyn Fn(String) -> Pin<Box<dyn Future<Output = Result<Arc<dyn Authority>>> + Send>>
    + Send
    + Sync;

/// A URL that [`Faults`] may move (to a promoted replica, say) while clients keep being made
/// through it. Its `Debug` hides passwords.
#[derive(Clone)]
pub struct SharedUrl(Arc<Mutex<String>>);

impl SharedUrl {
    /// A URL to share.
    pub fn new(url: impl Into<String>) -> Self {
        SharedUrl(Arc::new(Mutex::new(url.into())))
    }

    /// The URL now.
    pub fn get(&self) -> String {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Moves every later client to `url`.
    pub fn set(&self, url: impl Into<String>) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = url.into();
    }
}

impl fmt::Debug for SharedUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("SharedUrl")
            .field(&redact_url(&self.get()))
            .finish()
    }
}

/// A [`Connector`] for a URL: each client is the backend's connect function called with the
/// URL as it is at that moment (see [`UrlConnector::url`]).
///
/// # Examples
///
/// ```
/// # use std::sync::Arc;
/// # use leasehold_conformance::kit::{TestResult, OrFail, UrlConnector};
/// # use leasehold_conformance::{scenarios, Context, Verdict};
/// use leasehold_memory::MemoryServer;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> TestResult {
/// let server = MemoryServer::new();
/// let clients = UrlConnector::new("memory://kit", move |_url| {
///     let server = server.clone();
///     async move { Ok(server.authority(Default::default())) }
/// });
/// let ctx = Context::new(Arc::new(clients)).await.or_fail("connect")?;
/// assert_eq!(scenarios::fences_increase(&ctx).await, Ok(Verdict::Passed));
/// # Ok(())
/// # }
/// ```
pub struct UrlConnector {
    url: SharedUrl,
    connect: Box<Connect>,
}

impl UrlConnector {
    /// Clients made by `connect` from `url`: `|url| async move { X::connect(&url).await }`
    /// for a backend's authority `X`, or anything that makes an [`Authority`] (a wrapper that
    /// lies about its capabilities, a client that is remembered for a fault to close).
    pub fn new<A, F, Fut>(url: impl Into<String>, connect: F) -> Self
    where
        A: Authority + 'static,
        F: Fn(String) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<A>> + Send + 'static,
    {
        UrlConnector {
            url: SharedUrl::new(url),
            connect: Box::new(move |url| {
                let made = connect(url);
                Box::pin(async move { Ok(Arc::new(made.await?) as Arc<dyn Authority>) })
            }),
        }
    }

    /// The URL clients are made from, to move them (for a failover) or to look at the server
    /// they reach.
    pub fn url(&self) -> SharedUrl {
        self.url.clone()
    }
}

impl fmt::Debug for UrlConnector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UrlConnector")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl Connector for UrlConnector {
    async fn connect(&self) -> Result<Arc<dyn Authority>> {
        (self.connect)(self.url.get()).await
    }
}

/// A server the harness runs, as the faults see it: blocking calls that crash and restart it
/// on its data, freeze it and let it go on. Every server of [`servers`] is one; a test's own
/// server (one started with settings the harness does not offer) can be one too.
pub trait HarnessServer: Send + Sync + 'static {
    /// SIGKILL, then the same command line on the same data; returns once it serves.
    fn restart(&self) -> servers::Result<()>;
    /// SIGSTOP: the server keeps its sockets and answers nothing.
    fn pause(&self) -> servers::Result<()>;
    /// SIGCONT.
    fn resume(&self) -> servers::Result<()>;
}

macro_rules! harness_servers {
    ($($ty:ty),+) => {$(
        impl HarnessServer for $ty {
            fn restart(&self) -> servers::Result<()> {
                <$ty>::restart(self)
            }
            fn pause(&self) -> servers::Result<()> {
                <$ty>::pause(self)
            }
            fn resume(&self) -> servers::Result<()> {
                <$ty>::resume(self)
            }
        }
    )+};
}

harness_servers!(
    servers::EtcdServer,
    servers::ZkServer,
    servers::RedisServer,
    servers::RedisSentinel,
    servers::ClusterNode,
    servers::PostgresServer,
    servers::PgBouncer,
    servers::MariaDbServer
);

type Revoke = dyn Fn(LockKey) -> Pin<Box<dyn Future<Output = Result<()>> + Send>> + Send + Sync;

/// [`Faults`] on one harness server: restart, pause and resume are the server's own, run off
/// the runtime's workers; revoke is the backend's, given with [`ServerFaults::with_revoke`].
/// Failover needs a second server, so it stays unsupported here.
///
/// # Examples
///
/// ```no_run
/// # use std::sync::Arc;
/// # use leasehold_conformance::harness_call;
/// # use leasehold_conformance::kit::{self, ServerFaults, TestResult};
/// # use leasehold_conformance::servers::RedisServer;
/// # async fn faults() -> TestResult {
/// let server = kit::start("Redis", RedisServer::start).await?;
/// // An operator deletes the lock key.
/// let faults = ServerFaults::new(server.clone()).with_revoke(move |key| {
///     let server = server.clone();
///     let lock_key = format!("{{leasehold:{}}}", key.as_str());
///     harness_call(move || server.command(&["DEL", &lock_key]).map(drop))
/// });
/// # Ok(())
/// # }
/// ```
pub struct ServerFaults<S> {
    server: Arc<S>,
    revoke: Option<Box<Revoke>>,
}

impl<S: HarnessServer> ServerFaults<S> {
    /// Restart, pause and resume of `server`.
    pub fn new(server: Arc<S>) -> Self {
        ServerFaults {
            server,
            revoke: None,
        }
    }

    /// Ends the lease on a key behind its holder's back, as an operator or a session expiry
    /// would, so that the holder's next renewal is refused.
    pub fn with_revoke<F, Fut>(mut self, revoke: F) -> Self
    where
        F: Fn(LockKey) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<()>> + Send + 'static,
    {
        self.revoke = Some(Box::new(move |key| Box::pin(revoke(key))));
        self
    }

    /// The server.
    pub fn server(&self) -> &Arc<S> {
        &self.server
    }

    async fn call(&self, f: fn(&S) -> servers::Result<()>) -> Result<()> {
        let server = self.server.clone();
        harness_call(move || f(&server)).await
    }
}

impl<S> fmt::Debug for ServerFaults<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerFaults")
            .field("server", &std::any::type_name::<S>())
            .field("revoke", &self.revoke.is_some())
            .finish()
    }
}

#[async_trait]
impl<S: HarnessServer> Faults for ServerFaults<S> {
    async fn restart(&self) -> Result<()> {
        self.call(S::restart).await
    }

    async fn pause(&self) -> Result<()> {
        self.call(S::pause).await
    }

    async fn resume(&self) -> Result<()> {
        self.call(S::resume).await
    }

    async fn revoke(&self, key: &LockKey) -> Result<()> {
        match &self.revoke {
            Some(revoke) => revoke(key.clone()).await,
            None => Err(unsupported("revoke")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_say_what_failed() {
        assert_eq!(
            None::<u8>.or_fail("the key is free"),
            Err(Failure::new("the key is free: got None"))
        );
        assert_eq!(Some(7).or_fail("the key is free"), Ok(7));
        assert_eq!(
            Ok::<u8, String>(7).err_or_fail("a stale release"),
            Err(Failure::new(
                "a stale release: succeeded with 7, an error was expected"
            ))
        );
        assert_eq!(Err::<u8, _>("refused").err_or_fail("x"), Ok("refused"));
    }

    #[test]
    fn a_shared_url_moves_and_hides_its_password() {
        let url = SharedUrl::new("redis://app:s3cret@127.0.0.1:1/?timeout_ms=1");
        let moved = url.clone();
        moved.set("redis://app:s3cret@127.0.0.1:2/");
        assert_eq!(url.get(), "redis://app:s3cret@127.0.0.1:2/");
        let shown = format!(
            "{url:?} {:?}",
            UrlConnector::new(url.get(), |_| async {
                Err::<leasehold_memory::MemoryAuthority, _>(unsupported("connect"))
            })
        );
        assert!(!shown.contains("s3cret"), "{shown}");
    }
}
