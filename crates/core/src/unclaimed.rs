//! An acquisition request whose win may go unclaimed: run it in a task of its own, so that a
//! caller who stops waiting (cancelled, or out of time) never strands the lease it took.
//!
//! The request runs to its end in the task whatever the caller does. Exactly one side sees a
//! win nobody claimed: this side, when it leaves after the answer arrived (its drop looks into
//! the closed channel), or the task, when the answer arrives after this side left (the send
//! fails). That side gives the lease back; an answer that was claimed is the caller's.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::error::Error;

/// Why no answer was claimed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unanswered {
    /// `give_up` passed first; a win that arrives later is given back.
    TimedOut,
    /// The task ended without an answer (it panicked, or the runtime is shutting down).
    NoAnswer,
}

impl Unanswered {
    /// The error a caller gets for `operation` on `backend` whose request was given `after`:
    /// no answer in time is unavailable; a task that ended without one is a retryable backend
    /// error. Both say nothing about the lease, which is given back if it was won.
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

/// Runs `request(left)` in its own task and waits until `give_up` for its answer. `won` says
/// whether an answer took a lease (and returns what `give_back` needs to free it); `give_back`
/// runs, in a task, for a win nobody claimed.
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
    let give_back: GiveBack<W> = Arc::new(move |win| Box::pin(give_back(win)));
    let left = Left::default();
    let (tx, rx) = oneshot::channel();
    let running = request(left.clone());
    let late = give_back.clone();
    tokio::spawn(async move {
        if let Err(answer) = tx.send(running.await) {
            if let Some(win) = won(&answer) {
                late(win).await;
            }
        }
    });
    let mut waiting = Waiting {
        rx,
        claimed: false,
        left,
        won,
        give_back,
    };
    let answer = match tokio::time::timeout_at(give_up, &mut waiting.rx).await {
        Err(_) => Err(Unanswered::TimedOut),
        Ok(Err(_)) => Err(Unanswered::NoAnswer),
        Ok(Ok(answer)) => Ok(answer),
    };
    // Claimed: the answer is the caller's now, nothing is left to give back on drop.
    waiting.claimed = answer.is_ok();
    answer
}

type GiveBack<W> = Arc<dyn Fn(W) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// This side's end of the channel while no answer is claimed; dropped unclaimed, it closes the
/// channel and gives back a win that arrived already.
struct Waiting<T, W> {
    rx: oneshot::Receiver<T>,
    claimed: bool,
    left: Left,
    won: fn(&T) -> Option<W>,
    give_back: GiveBack<W>,
}

impl<T, W> Drop for Waiting<T, W> {
    fn drop(&mut self) {
        if self.claimed {
            return;
        }
        self.left.set();
        self.rx.close();
        let Ok(answer) = self.rx.try_recv() else {
            return;
        };
        let Some(win) = (self.won)(&answer) else {
            return;
        };
        // Without a runtime nothing can run the give-back; the lease ends at its TTL.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn((self.give_back)(win));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::Duration;

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
            given.lock().unwrap().push(win);
            std::future::ready(())
        }
    }

    fn won(answer: &Option<u32>) -> Option<u32> {
        *answer
    }

    #[tokio::test(start_paused = true)]
    async fn a_claimed_win_is_the_callers_and_a_late_one_is_given_back() {
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
        assert_eq!(*given.lock().unwrap(), vec![2], "only the unclaimed win");
    }

    #[tokio::test(start_paused = true)]
    async fn a_caller_dropped_mid_request_gets_the_win_given_back_and_is_seen_gone() {
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
        assert_eq!(*given.lock().unwrap(), vec![3]);
    }
}
