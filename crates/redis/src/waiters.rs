//! The waiters of an authority, by lock key, and how a release wakes them: one waiter in
//! `acquire` at a time (the turn), every waiter in `wait_for_change`.
//!
//! Only one client can take a released key, so waking every waiter of it in `acquire` costs one
//! attempt per waiter per hand-off for one grant (measured: 50 waiters, about 25 `EVALSHA`
//! per hand-off). A release instead hands the key's turn to one waiter. The waiter holding the
//! turn tries; if it wins, or finds the key held by a client that beat it, the turn ends there.
//! A wake-up that arrives while the turn is out (its attempt in flight) is kept for the waiter
//! holding it, which tries again at once if its attempt found the key held: that release may
//! have come after its attempt reached the server. A waiter that leaves while holding the turn
//! without an answer (its attempt failed, it timed out with a wake-up kept, or its future was
//! dropped) passes the turn on to the next waiter. Waiters still retry on their own timers,
//! bounded by the holder's PTTL, for the releases nobody announces.
//!
//! Across processes the same holds: a release's announcement names one waiting authority (see
//! the queue in [`crate::scripts::RELEASE`]) and goes to that authority's own channel, where it
//! hands out a turn; its copy on the release channel, which only authorities with observers
//! read, wakes observers alone.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::futures::Notified;
use tokio::sync::Notify;

/// Waiters of this authority, by Redis lock key.
#[derive(Debug, Default)]
pub(crate) struct Waiters {
    by_key: Mutex<HashMap<String, Arc<KeyWaiters>>>,
    /// This authority's id in the keys' waiter queues.
    me: String,
}

impl Waiters {
    /// The waiters of an authority that queues as `me` (printable ASCII without spaces).
    pub(crate) fn new(me: String) -> Self {
        Waiters {
            by_key: Mutex::default(),
            me,
        }
    }

    /// This authority's id in the keys' waiter queues.
    pub(crate) fn me(&self) -> &str {
        &self.me
    }

    /// An announcement on the release channel, which every release and proclaim goes to: its
    /// payload is the lock key, or the lock key, a space and the waiter the release named. One
    /// that names a waiter wakes only the observers here: the named authority hears it on its
    /// own channel ([`Waiters::announced`]), this one included. One that names nobody (a
    /// proclaim, a release with nobody queued, or a release by an older version) also hands out
    /// a turn.
    pub(crate) fn observed(&self, payload: &str) {
        match payload.split_once(' ') {
            None => self.wake(payload),
            Some((lock_key, _)) => {
                let map = self.by_key.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(waiters) = map.get(lock_key) {
                    waiters.observers.notify_waiters();
                }
            }
        }
    }

    /// Wakes every observer: the release channel was just subscribed, and what it carried
    /// before was missed.
    pub(crate) fn wake_observers(&self) {
        let map = self.by_key.lock().unwrap_or_else(|e| e.into_inner());
        for waiters in map.values() {
            waiters.observers.notify_waiters();
        }
    }

    /// An announcement on this authority's own channel: its payload is the lock key, a space
    /// and the waiter the release named, which is this authority (a payload that names another,
    /// or nobody, is treated as on the release channel).
    pub(crate) fn announced(&self, payload: &str) {
        match payload.split_once(' ') {
            None => self.wake(payload),
            Some((lock_key, named)) if named == self.me => self.wake(lock_key),
            Some((lock_key, _)) => {
                let map = self.by_key.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(waiters) = map.get(lock_key) {
                    waiters.observers.notify_waiters();
                }
            }
        }
    }

    /// The waiters of `lock_key`; hold the `Arc` while waiting.
    pub(crate) fn for_key(&self, lock_key: &str) -> Arc<KeyWaiters> {
        let mut map = self.by_key.lock().unwrap_or_else(|e| e.into_inner());
        // Forget keys nobody waits on any more, so the map does not grow with every key.
        map.retain(|_, n| Arc::strong_count(n) > 1);
        map.entry(lock_key.to_string()).or_default().clone()
    }

    /// `lock_key` was released or proclaimed: every observer, and one waiter in `acquire`.
    pub(crate) fn wake(&self, lock_key: &str) {
        let map = self.by_key.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(waiters) = map.get(lock_key) {
            waiters.wake();
        }
    }

    /// Whether anyone waits on `lock_key` now.
    pub(crate) fn waited_on(&self, lock_key: &str) -> bool {
        let map = self.by_key.lock().unwrap_or_else(|e| e.into_inner());
        map.get(lock_key).is_some_and(|n| Arc::strong_count(n) > 1)
    }

    /// The keys someone waits on now.
    pub(crate) fn waited_keys(&self) -> Vec<String> {
        let map = self.by_key.lock().unwrap_or_else(|e| e.into_inner());
        map.iter()
            .filter(|(_, n)| Arc::strong_count(n) > 1)
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Wakes every key: while the subscription was down, releases may have been missed. One
    /// waiter in `acquire` per key is enough to find a missed release of it.
    pub(crate) fn wake_all(&self) {
        let map = self.by_key.lock().unwrap_or_else(|e| e.into_inner());
        for waiters in map.values() {
            waiters.wake();
        }
    }
}

/// The waiters of one lock key.
#[derive(Debug, Default)]
pub(crate) struct KeyWaiters {
    /// Waiters in `acquire`, woken one at a time, oldest registration first.
    acquirers: Notify,
    /// Waiters in `wait_for_change`: each wants to see the change, so all are woken.
    observers: Notify,
    turn: Mutex<TurnState>,
}

#[derive(Debug, Default)]
struct TurnState {
    /// A waiter was handed the turn and has not finished with it (or the wake-up is stored in
    /// `acquirers` for the next waiter to register).
    out: bool,
    /// A release was announced while the turn was out: the waiter holding it tries again if
    /// its attempt found the key held.
    again: bool,
}

impl KeyWaiters {
    fn wake(&self) {
        self.observers.notify_waiters();
        let mut turn = self.turn.lock().unwrap_or_else(|e| e.into_inner());
        if turn.out {
            turn.again = true;
        } else {
            turn.out = true;
            // Stored for the next waiter that registers if none is registered now; a woken
            // future dropped before it is polled passes it on (tokio's `notify_one`).
            self.acquirers.notify_one();
        }
    }

    /// Resolves when this waiter in `acquire` is handed the turn; then take it with
    /// [`KeyWaiters::take_turn`]. Enable it before the attempt it follows.
    pub(crate) fn turn_handed(&self) -> Notified<'_> {
        self.acquirers.notified()
    }

    /// Resolves on the next release or proclaim of the key (for `wait_for_change`).
    pub(crate) fn changed(&self) -> Notified<'_> {
        self.observers.notified()
    }

    /// The turn [`KeyWaiters::turn_handed`] handed to this waiter.
    pub(crate) fn take_turn(self: &Arc<Self>) -> Turn {
        Turn {
            waiters: self.clone(),
            done: false,
        }
    }
}

/// The turn to act on a key's release. Dropped without [`Turn::won`] or a final
/// [`Turn::held`], it passes to the next waiter: a waiter that errs, times out with a wake-up
/// kept, or is cancelled does not swallow the release it was woken for.
#[derive(Debug)]
pub(crate) struct Turn {
    waiters: Arc<KeyWaiters>,
    done: bool,
}

impl Turn {
    /// The holder of the turn took the key: wake-ups kept meanwhile announced releases that
    /// came before its grant, so they end here too.
    pub(crate) fn won(mut self) {
        let mut turn = self.waiters.turn.lock().unwrap_or_else(|e| e.into_inner());
        *turn = TurnState::default();
        self.done = true;
    }

    /// The holder's attempt found the key held. `true`: a release was announced meanwhile,
    /// perhaps after the attempt reached the server, so try again at once, still holding the
    /// turn. `false`: the turn ends (the next release hands out the next one).
    pub(crate) fn held(&mut self) -> bool {
        let mut turn = self.waiters.turn.lock().unwrap_or_else(|e| e.into_inner());
        if std::mem::take(&mut turn.again) {
            return true;
        }
        turn.out = false;
        self.done = true;
        false
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut turn = self.waiters.turn.lock().unwrap_or_else(|e| e.into_inner());
        turn.again = false;
        turn.out = true;
        self.waiters.acquirers.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;
    use std::pin::pin;
    use std::task::{Context, Poll, Waker};

    fn ready<F: Future>(f: std::pin::Pin<&mut F>) -> bool {
        matches!(
            f.poll(&mut Context::from_waker(Waker::noop())),
            Poll::Ready(_)
        )
    }

    /// One waiter per release; a release during the turn is kept for its holder; a turn
    /// dropped unfinished goes to the next waiter; observers all see every release.
    #[test]
    fn a_release_hands_one_turn() {
        let waiters = Waiters::default();
        let key = waiters.for_key("k");
        let mut first = pin!(key.turn_handed());
        let mut second = pin!(key.turn_handed());
        let mut watching = pin!(key.changed());
        let mut watching_too = pin!(key.changed());
        for f in [first.as_mut(), second.as_mut()] {
            f.enable();
        }
        assert!(!ready(watching.as_mut()) && !ready(watching_too.as_mut()));
        waiters.wake("k");
        assert!(ready(watching.as_mut()) && ready(watching_too.as_mut()));
        assert!(ready(first.as_mut()), "the oldest waiter gets the turn");
        assert!(!ready(second.as_mut()), "only one waiter per release");
        let mut turn = key.take_turn();
        // Announced while the first waiter's attempt was in flight: kept for it.
        waiters.wake("k");
        assert!(!ready(second.as_mut()));
        assert!(turn.held(), "a release during the attempt: try again");
        assert!(!turn.held(), "nothing new: the turn ends");
        drop(turn);
        assert!(!ready(second.as_mut()));
        // The next release goes to the second waiter, which leaves without an answer: the
        // turn passes on to whoever registers next.
        waiters.wake("k");
        assert!(ready(second.as_mut()));
        drop(key.take_turn());
        let mut third = pin!(key.turn_handed());
        assert!(ready(third.as_mut()), "a dropped turn passes on");
        key.take_turn().won();
        let mut fourth = pin!(key.turn_handed());
        fourth.as_mut().enable();
        assert!(!ready(fourth.as_mut()), "a won turn ends");
        waiters.wake("k");
        assert!(ready(fourth.as_mut()));
    }

    /// An announcement that names another authority's waiter wakes observers only; one that
    /// names this authority, or nobody, hands out a turn.
    #[test]
    fn an_announcement_for_another_waiter_wakes_observers_only() {
        let waiters = Waiters::new("me".to_string());
        let key = waiters.for_key("k");
        let mut acquirer = pin!(key.turn_handed());
        let mut watching = pin!(key.changed());
        acquirer.as_mut().enable();
        watching.as_mut().enable();
        waiters.announced("k other");
        assert!(ready(watching.as_mut()), "observers see every change");
        assert!(!ready(acquirer.as_mut()), "another authority's turn");
        waiters.announced("k me");
        assert!(ready(acquirer.as_mut()), "this authority's turn");
        key.take_turn().won();
        let mut next = pin!(key.turn_handed());
        next.as_mut().enable();
        waiters.announced("k");
        assert!(
            ready(next.as_mut()),
            "a release that names nobody wakes a waiter"
        );
    }
}
