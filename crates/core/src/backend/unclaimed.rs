//! An acquisition request whose win may go unclaimed: a caller who stops waiting (cancelled,
//! or out of time) never strands the lease the request took.
//!
//! The request runs on the caller's own task while the caller waits, which costs nothing
//! more than the request itself (measured on PostgreSQL: a task spawned for every attempt was
//! part of leasehold's client CPU per acquisition, see docs/performance-log.md). If the caller
//! stops waiting before the answer arrives, the request moves to a task of its own and runs to
//! its end there; a win it then takes was claimed by nobody and is given back. An answer that
//! arrived while the caller waited is the caller's.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Instant;

use crate::contract::error::Error;

/// Why no answer was claimed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unanswered {
    /// `give_up` passed first; a win that arrives later is given back.
    TimedOut,
    /// The request ended without an answer (it panicked).
    NoAnswer,
}

impl Unanswered {
    /// The error a caller gets for `operation` on `backend` whose request was given `after`:
    /// no answer in time is unavailable; a request that ended without one (it panicked) is a
    /// retryable backend error. Both say nothing about the lease: a win that arrives after the
    /// caller timed out is given back; one a panicking request took ends at its TTL.
    pub fn into_error(self, backend: &'static str, operation: &str, after: Duration) -> Error {
        match self {
            Unanswered::TimedOut => Error::request_timeout(backend, operation, after),
            Unanswered::NoAnswer => Error::Backend {
                backend,
                message: format!("{operation}: the request ended without an answer"),
                retryable: true,
                source: None,
            },
        }
    }
}

/// Whether the caller has stopped waiting: a request polls it between its steps, so that one
/// still queued (for a connection, for a lock) takes nothing for a caller who left.
#[derive(Clone, Debug, Default)]
pub struct Left(Arc<AtomicBool>);

impl Left {
    /// True once the caller stopped waiting.
    pub fn get(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }

    fn set(&self) {
        self.0.store(true, Ordering::Release);
    }
}

/// Runs `request(left)` and waits until `give_up` for its answer. `won` says whether an answer
/// took a lease (and returns what `give_back` needs to free it); `give_back` runs, in a task,
/// for a win nobody claimed.
///
/// The request is polled on the caller's task; dropped or timed out before it answers, it is
/// moved, as it is, to a task that finishes it (so it must be `Send + 'static`). A request that
/// panics is answered [`Unanswered::NoAnswer`] instead of taking the caller down with it.
pub async fn claim_or_give_back<T, W, R, Fut, G, GFut>(
    request: R,
    give_up: Instant,
    won: fn(&T) -> Option<W>,
    give_back: G,
) -> Result<T, Unanswered>
where
    T: Send + 'static,
    W: Send + 'static,
    R: FnOnce(Left) -> Fut,
    Fut: Future<Output = T> + Send + 'static,
    G: Fn(W) -> GFut + Send + Sync + 'static,
    GFut: Future<Output = ()> + Send + 'static,
{
    let left = Left::default();
    let on_leave = move |request: Pin<Box<Fut>>| {
        // Without a runtime nothing can run the request on; a lease it took ends at its TTL.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(async move {
            let answer = request.await;
            if let Some(win) = won(&answer) {
                give_back(win).await;
            }
        });
    };
    let mut pending = Pending {
        request: Some(Box::pin(request(left.clone()))),
        left,
        on_leave: Some(on_leave),
    };
    let answer = tokio::time::timeout_at(give_up, std::future::poll_fn(|cx| pending.poll(cx)));
    match answer.await {
        Err(_) => Err(Unanswered::TimedOut),
        Ok(None) => Err(Unanswered::NoAnswer),
        Ok(Some(answer)) => Ok(answer),
    }
    // `pending` drops here: answered (or panicked), it holds nothing; timed out, it hands the
    // request on to a task.
}

/// A request not yet answered, owned by the caller's future. Dropped while still pending (the
/// caller left or ran out of time), it tells the request the caller left and hands it to
/// `on_leave`, which runs it to its end in a task and gives back a win.
struct Pending<Fut: Future, L: FnOnce(Pin<Box<Fut>>)> {
    request: Option<Pin<Box<Fut>>>,
    left: Left,
    on_leave: Option<L>,
}

impl<Fut: Future, L: FnOnce(Pin<Box<Fut>>)> Pending<Fut, L> {
    /// Polls the request: `Some(answer)` once it answers, `None` if it panicked.
    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Option<Fut::Output>> {
        let Some(request) = self.request.as_mut() else {
            return Poll::Ready(None);
        };
        match std::panic::catch_unwind(AssertUnwindSafe(|| request.as_mut().poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(answer)) => {
                self.request = None;
                Poll::Ready(Some(answer))
            }
            Err(_) => {
                // A future that panicked must not be polled again: dropped here, with any
                // lease it took, which ends at its TTL (its destructor may panic too).
                let panicked = self.request.take();
                let _ = std::panic::catch_unwind(AssertUnwindSafe(|| drop(panicked)));
                Poll::Ready(None)
            }
        }
    }
}

impl<Fut: Future, L: FnOnce(Pin<Box<Fut>>)> Drop for Pending<Fut, L> {
    fn drop(&mut self) {
        let (Some(request), Some(on_leave)) = (self.request.take(), self.on_leave.take()) else {
            return;
        };
        self.left.set();
        on_leave(request);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::Duration;

    type TestResult<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

    use super::*;

    #[test]
    fn unanswered_is_a_retryable_error() {
        let after = std::time::Duration::from_millis(300);
        let timed_out = Unanswered::TimedOut.into_error("t", "acquire", after);
        assert!(
            matches!(timed_out, Error::Unavailable { .. }),
            "{timed_out}"
        );
        assert_eq!(
            timed_out.to_string(),
            "t authority unavailable: acquire got no answer within 300ms"
        );
        let none = Unanswered::NoAnswer.into_error("t", "acquire", after);
        assert!(
            matches!(
                none,
                Error::Backend {
                    retryable: true,
                    ..
                }
            ),
            "{none}"
        );
    }

    type Given = Arc<Mutex<Vec<u32>>>;

    fn recorder(given: &Given) -> impl Fn(u32) -> std::future::Ready<()> + Send + Sync + 'static {
        let given = given.clone();
        move |win| {
            given.lock().expect("recording a given-back win").push(win);
            std::future::ready(())
        }
    }

    fn won(answer: &Option<u32>) -> Option<u32> {
        *answer
    }

    #[tokio::test(start_paused = true)]
    async fn a_claimed_win_is_the_callers_and_a_late_one_is_given_back() -> TestResult {
        let given = Given::default();
        let now = Instant::now();
        let claimed = claim_or_give_back(
            |_| async { Some(1) },
            now + Duration::from_secs(1),
            won,
            recorder(&given),
        )
        .await;
        assert_eq!(claimed, Ok(Some(1)));
        let late = claim_or_give_back(
            |_| async {
                tokio::time::sleep(Duration::from_secs(2)).await;
                Some(2)
            },
            now + Duration::from_secs(1),
            won,
            recorder(&given),
        )
        .await;
        assert_eq!(late, Err(Unanswered::TimedOut));
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(
            *given
                .lock()
                .map_err(|e| format!("the given-back wins: {e}"))?,
            vec![2],
            "only the unclaimed win"
        );
        Ok(())
    }

    #[tokio::test]
    async fn the_request_runs_on_the_callers_task_until_the_caller_leaves() -> TestResult {
        // The happy path spawns nothing: the request is polled by the task that waits for it.
        let on_task = tokio::spawn(async {
            let caller = tokio::task::id();
            let answer = claim_or_give_back(
                |_| async { Some(tokio::task::id()) },
                Instant::now() + Duration::from_secs(1),
                |_: &Option<tokio::task::Id>| None::<u32>,
                |_| std::future::ready(()),
            )
            .await;
            (caller, answer)
        });
        let (caller, answer) = on_task
            .await
            .map_err(|e| format!("the caller's task: {e}"))?;
        assert_eq!(answer, Ok(Some(caller)));
        Ok(())
    }

    #[tokio::test]
    async fn a_request_that_panics_is_no_answer_not_a_panic_in_the_caller() -> TestResult {
        let given = Given::default();
        let answer = claim_or_give_back(
            |_| async {
                if given_up() {
                    panic!("a request's bug");
                }
                Some(4)
            },
            Instant::now() + Duration::from_secs(1),
            won,
            recorder(&given),
        )
        .await;
        assert_eq!(answer, Err(Unanswered::NoAnswer));
        assert!(given
            .lock()
            .map_err(|e| format!("the given-back wins: {e}"))?
            .is_empty());
        Ok(())
    }

    /// True, in a way the compiler cannot see through (so the panic above is reachable).
    fn given_up() -> bool {
        std::hint::black_box(true)
    }

    #[tokio::test(start_paused = true)]
    async fn a_caller_dropped_mid_request_gets_the_win_given_back_and_is_seen_gone() -> TestResult {
        let given = Given::default();
        let seen_left = Arc::new(AtomicBool::new(false));
        let saw = seen_left.clone();
        let request = claim_or_give_back(
            move |left: Left| async move {
                tokio::time::sleep(Duration::from_millis(10)).await;
                saw.store(left.get(), Ordering::SeqCst);
                Some(3)
            },
            Instant::now() + Duration::from_secs(1),
            won,
            recorder(&given),
        );
        assert!(tokio::time::timeout(Duration::from_millis(5), request)
            .await
            .is_err());
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            seen_left.load(Ordering::SeqCst),
            "the request saw the caller leave"
        );
        assert_eq!(
            *given
                .lock()
                .map_err(|e| format!("the given-back wins: {e}"))?,
            vec![3]
        );
        Ok(())
    }
}
