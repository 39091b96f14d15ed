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

use tokio::sync::oneshot;
use tokio::time::Instant;

/// Why no answer was claimed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unanswered {
    /// `give_up` passed first; a win that arrives later is given back.
    TimedOut,
    /// The task ended without an answer (it panicked, or the runtime is shutting down).
    NoAnswer,
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
