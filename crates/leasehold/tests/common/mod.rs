//! What the hostile-server test binaries share: a small fake server per protocol, the checks
//! every call goes through, and `or_fail`, the way a test says what failed.
//!
//! For every call: it ends within the time its backend's configuration allows (so many requests,
//! each bounded by the request timeout, plus slack for a loaded machine), it ends with a typed
//! [`leasehold::Error`] and not a panic (each call runs in a task of its own), and a `Grant` (or
//! a renewal) is returned only when the fake really granted it. A reply just under the timeout
//! is read and acted on; just over, the call is a retryable timeout. None of these tests is
//! ignored: a defect a fake finds is fixed, and its test runs in `./scripts/test`.
//!
//! These fakes are hostile peers, not models of a backend: they implement only as much of each
//! protocol as it takes to get the client to the place where they misbehave.
#![allow(dead_code)]

pub mod etcd;
pub mod fake;
pub mod pg;
pub mod pgq;
pub mod resp;
pub mod zk;

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use leasehold::{Authority, Error, LockKey};

// ---------------------------------------------------------------------------------------------
// The checks every call goes through.

/// The request timeout every URL here configures (`timeout_ms`).
pub const T: Duration = Duration::from_millis(300);
/// The request timeout of the slow tests, where a reply must make it in half of it.
pub const SLOW_T: Duration = Duration::from_millis(600);

/// What a loaded 2-core machine may add to a call on top of its requests' timeouts: the
/// timeout itself once more (a timer that fires late, a task scheduled late), and half a second.
pub fn slack(timeout: Duration) -> Duration {
    timeout + Duration::from_millis(500)
}

/// How long a hang is given before the test stops waiting for it (then it fails).
pub const HANG: Duration = Duration::from_secs(20);

/// Panics on threads that are not a test's own (tokio's workers, where the clients' tasks
/// run): a client library that panics in a background task would otherwise go unseen, the
/// caller only meeting a closed channel.
pub static STRAY_PANICS: AtomicUsize = AtomicUsize::new(0);

/// Counts stray panics from now on (once per process; the default hook still prints them).
pub fn watch_for_stray_panics() {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let thread = std::thread::current();
            let name = thread.name().unwrap_or("");
            if name.starts_with("tokio-runtime-worker") || name.is_empty() {
                STRAY_PANICS.fetch_add(1, Ordering::SeqCst);
            }
            default(info);
        }));
    });
}

/// Fails if any background task panicked so far (in any test of this binary: the count is
/// per process, and the panic message printed above names the place).
pub fn no_stray_panics() {
    let n = STRAY_PANICS.load(Ordering::SeqCst);
    assert_eq!(
        n, 0,
        "{n} panics in background tasks (see the messages above)"
    );
}

/// Runs `call` in a task of its own, and checks that it ended within `requests` request
/// timeouts of `timeout` plus [`slack`], and did not panic. Returns its result and duration.
pub async fn bounded<T, F>(
    what: &str,
    timeout: Duration,
    requests: u32,
    call: F,
) -> (leasehold::Result<T>, Duration)
where
    T: Send + 'static,
    F: Future<Output = leasehold::Result<T>> + Send + 'static,
{
    watch_for_stray_panics();
    let budget = timeout
        .saturating_mul(requests)
        .saturating_add(slack(timeout));
    let started = Instant::now();
    let task = tokio::spawn(call);
    let abort = task.abort_handle();
    let joined = match tokio::time::timeout(budget.saturating_add(HANG), task).await {
        Ok(joined) => joined,
        Err(_) => {
            abort.abort();
            panic!(
                "{what}: hung for more than {:?}",
                budget.saturating_add(HANG)
            );
        }
    };
    let took = started.elapsed();
    let result = match joined {
        Ok(result) => result,
        Err(e) if e.is_panic() => panic!("{what}: the call panicked: {e}"),
        Err(e) => panic!("{what}: the call's task failed: {e}"),
    };
    no_stray_panics();
    println!(
        "{what}: {:?} in {took:?} (budget {budget:?})",
        result.as_ref().map(|_| "ok").map_err(|e| e.to_string())
    );
    assert!(
        took <= budget,
        "{what}: took {took:?}, more than {requests} x {timeout:?} + {:?}",
        slack(timeout)
    );
    (result, took)
}

/// The error of a call that must fail, with its type checked: one of the kinds a server can
/// cause (never a configuration or input error, which would mean the fake was not reached).
pub fn failed<T: std::fmt::Debug>(what: &str, result: leasehold::Result<T>) -> Error {
    let error = match result {
        Ok(v) => panic!("{what}: succeeded against a misbehaving server: {v:?}"),
        Err(e) => e,
    };
    assert!(
        matches!(
            error,
            Error::Unavailable { .. }
                | Error::Backend { .. }
                | Error::Unauthorized { .. }
                | Error::FenceOutOfRange { .. }
                | Error::LeaseLost { .. }
        ),
        "{what}: not an error a server causes: {error:?}"
    );
    error
}

/// Waits for every run, passing on the first failure, or the first panic (an assertion that
/// failed in it).
pub async fn join_all(mut runs: tokio::task::JoinSet<Result>) -> Result {
    while let Some(run) = runs.join_next().await {
        match run {
            Ok(outcome) => outcome?,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => return Err(format!("a run's task failed: {e}").into()),
        }
    }
    no_stray_panics();
    Ok(())
}

/// The error of a call that must fail, of any kind.
pub fn failed_any<T: std::fmt::Debug>(what: &str, result: leasehold::Result<T>) -> Error {
    match result {
        Ok(v) => panic!("{what}: succeeded against a misbehaving server: {v:?}"),
        Err(e) => e,
    }
}

/// A timeout: retryable and unavailable.
pub fn timed_out(what: &str, error: &Error) {
    assert!(
        matches!(error, Error::Unavailable { .. }) && error.is_retryable(),
        "{what}: not a retryable unavailability: {error:?}"
    );
}

pub async fn connect(url: String) -> leasehold::Result<Arc<dyn Authority>> {
    watch_for_stray_panics();
    leasehold::connect(&url).await
}

/// The key every call here takes; its error is a `leasehold::Error`, as the calls' are.
pub fn key() -> leasehold::Result<LockKey> {
    LockKey::new("hostile/inv_72")
}

pub const TTL: Duration = Duration::from_secs(5);

/// What a test fails with, and `.or_fail("what was being done")?` instead of `unwrap()`: the
/// conformance kit's, shared by every backend's tests.
pub use leasehold_conformance::kit::OrFail;
pub use leasehold_conformance::Failure;

/// A test's outcome, and what its helpers return: the value, or the [`Failure`] that ends it.
pub type Result<T = (), E = Failure> = std::result::Result<T, E>;
