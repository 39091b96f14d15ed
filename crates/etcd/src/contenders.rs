//! A session's contender keys, and what each one is doing.
//!
//! Every key a session writes under some lock prefix is recorded here before the request that
//! writes it leaves, and forgotten only once etcd confirmed it is gone. So the session always
//! knows which keys of its lease may exist, and a key whose request failed half-way is deleted
//! later instead of lingering on the session's kept-alive lease (an orphan that would block the
//! lock for as long as the process lives: etcd #9921, #19597).

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use leasehold_core::time::saturating_add;
use tokio::time::Instant;

use crate::keys;

/// What one contender key is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum State {
    /// The request that writes it is in flight: it may or may not exist.
    Pending,
    /// Written at `revision`, waiting for the keys ahead of it to go.
    Waiting { revision: i64 },
    /// Holds the lock. The session withdraws it at `until` (the TTL counted from before the
    /// acquire or the last renewal) unless renewed first: a grant that is not renewed ends
    /// within its TTL even though the session's lease lives on for other locks.
    Held { revision: i64, until: Instant },
    /// Must be deleted: by its `revision` when known, else only while it is on our lease.
    /// Retried from `retry_at` until etcd confirms.
    Withdrawing {
        revision: Option<i64>,
        retry_at: Instant,
    },
}

impl State {
    fn revision(&self) -> Option<i64> {
        match *self {
            State::Pending => None,
            State::Waiting { revision } | State::Held { revision, .. } => Some(revision),
            State::Withdrawing { revision, .. } => revision,
        }
    }
}

#[derive(Debug)]
struct Book {
    ended: bool,
    entries: HashMap<String, State>,
    next_suffix: u64,
    idle_since: Option<Instant>,
}

/// The book of one session's contender keys.
#[derive(Debug)]
pub(crate) struct Contenders {
    book: Mutex<Book>,
}

/// A key to delete now: its name and, when known, its create revision.
pub(crate) type Withdrawal = (String, Option<i64>);

impl Contenders {
    pub fn new() -> Self {
        Contenders {
            book: Mutex::new(Book {
                ended: false,
                entries: HashMap::new(),
                next_suffix: 1,
                idle_since: Some(Instant::now()),
            }),
        }
    }

    fn book(&self) -> MutexGuard<'_, Book> {
        // Every critical section leaves the book consistent, so a poisoned lock is still usable.
        self.book.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reserves a fresh contender key under `prefix` for a session on `lease`, or `None` once
    /// the session has ended.
    pub fn reserve(&self, prefix: &str, lease: i64) -> Option<String> {
        let mut book = self.book();
        if book.ended {
            return None;
        }
        let mut name = keys::contender(prefix, lease, 0);
        while book.entries.contains_key(&name) {
            let n = book.next_suffix;
            book.next_suffix += 1;
            name = keys::contender(prefix, lease, n);
        }
        book.entries.insert(name.clone(), State::Pending);
        book.idle_since = None;
        Some(name)
    }

    /// The key was written at `revision` and waits for its turn.
    pub fn waiting(&self, name: &str, revision: i64) {
        self.set(name, State::Waiting { revision });
    }

    /// The key holds the lock until `until` unless renewed.
    pub fn held(&self, name: &str, revision: i64, until: Instant) {
        self.set(name, State::Held { revision, until });
    }

    fn set(&self, name: &str, state: State) {
        let mut book = self.book();
        if let Some(entry) = book.entries.get_mut(name) {
            *entry = state;
        }
    }

    /// Extends a held key to `until`; false if it is not held at `revision` any more (withdrawn
    /// by the session, released, or forgotten).
    pub fn renew(&self, name: &str, revision: i64, until: Instant) -> bool {
        let mut book = self.book();
        match book.entries.get_mut(name) {
            Some(State::Held {
                revision: r,
                until: u,
            }) if *r == revision => {
                *u = (*u).max(until);
                true
            }
            _ => false,
        }
    }

    /// Whether `name` is held at `revision` right now (not yet withdrawn or released).
    #[cfg(test)]
    pub fn is_held(&self, name: &str, revision: i64) -> bool {
        matches!(
            self.book().entries.get(name),
            Some(State::Held { revision: r, .. }) if *r == revision
        )
    }

    /// Marks `name` for deletion, the session's task retrying from `retry_at`. With
    /// `revision` given, only the entry for that revision is marked. Returns what to compare
    /// when deleting, or `None` if there is no such entry.
    pub fn withdraw(
        &self,
        name: &str,
        revision: Option<i64>,
        retry_at: Instant,
    ) -> Option<Option<i64>> {
        let mut book = self.book();
        let entry = book.entries.get_mut(name)?;
        let known = entry.revision();
        if revision.is_some() && known.is_some() && known != revision {
            return None;
        }
        let revision = known.or(revision);
        *entry = State::Withdrawing { revision, retry_at };
        Some(revision)
    }

    /// Forgets `name` (etcd confirmed it is gone, or it was never written) if its entry is for
    /// `revision`; `None` forgets it whatever its revision.
    pub fn forget(&self, name: &str, revision: Option<i64>) {
        let mut book = self.book();
        if book
            .entries
            .get(name)
            .is_some_and(|e| e.revision() == revision || revision.is_none())
        {
            book.entries.remove(name);
            if book.entries.is_empty() {
                book.idle_since = Some(Instant::now());
            }
        }
    }

    /// Whether `name` is one of this session's keys that may exist.
    pub fn knows(&self, name: &str) -> bool {
        self.book().entries.contains_key(name)
    }

    /// Turns held keys past their `until` into withdrawals, and returns the withdrawals due at
    /// `now` (marking them to be retried after `retry_after`) and when the next one is due.
    pub fn due(&self, now: Instant, retry_after: Duration) -> (Vec<Withdrawal>, Option<Instant>) {
        let mut book = self.book();
        let mut due = Vec::new();
        let mut next: Option<Instant> = None;
        for (name, state) in book.entries.iter_mut() {
            let at = match *state {
                State::Held { revision, until } if until <= now => {
                    *state = State::Withdrawing {
                        revision: Some(revision),
                        retry_at: now,
                    };
                    now
                }
                State::Held { until, .. } => until,
                State::Withdrawing { retry_at, .. } => retry_at,
                State::Pending | State::Waiting { .. } => continue,
            };
            if at <= now {
                if let State::Withdrawing { revision, retry_at } = state {
                    *retry_at = saturating_add(now, retry_after);
                    due.push((name.clone(), *revision));
                }
            } else {
                next = Some(next.map_or(at, |n| n.min(at)));
            }
        }
        (due, next)
    }

    /// Since when the session has had no contender key, if it has none now.
    pub fn idle_since(&self) -> Option<Instant> {
        let book = self.book();
        if book.ended {
            return None;
        }
        book.idle_since
    }

    /// Ends the session if it has been idle since at least `since` (no reservation came in
    /// meanwhile). Returns whether it ended.
    pub fn end_if_idle_since(&self, since: Instant) -> bool {
        let mut book = self.book();
        match book.idle_since {
            Some(idle) if idle <= since && book.entries.is_empty() => {
                book.ended = true;
                true
            }
            _ => false,
        }
    }

    /// Whether the session has ended.
    pub fn is_ended(&self) -> bool {
        self.book().ended
    }

    /// Ends the session: no key is reserved any more. Returns whether it had ended before.
    pub fn end(&self) -> bool {
        std::mem::replace(&mut self.book().ended, true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: i64 = 0xabc;

    #[tokio::test(start_paused = true)]
    async fn reserves_distinct_names_and_reuses_freed_ones() {
        let c = Contenders::new();
        let a = c.reserve("p/", LEASE).unwrap();
        let b = c.reserve("p/", LEASE).unwrap();
        assert_eq!(a, "p/abc");
        assert_eq!(b, "p/abc_1");
        c.waiting(&a, 10);
        c.forget(&a, Some(10));
        assert_eq!(c.reserve("p/", LEASE).unwrap(), "p/abc");
        assert!(!c.end());
        assert!(c.reserve("p/", LEASE).is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn held_keys_are_withdrawn_at_their_ttl_unless_renewed() {
        let c = Contenders::new();
        let name = c.reserve("p/", LEASE).unwrap();
        let start = Instant::now();
        c.held(&name, 7, start + Duration::from_secs(1));
        let (due, next) = c.due(start, Duration::from_secs(1));
        assert!(due.is_empty());
        assert_eq!(next, Some(start + Duration::from_secs(1)));
        assert!(c.renew(&name, 7, start + Duration::from_secs(2)));
        assert!(
            !c.renew(&name, 8, start + Duration::from_secs(3)),
            "wrong revision"
        );
        let (due, _) = c.due(start + Duration::from_secs(2), Duration::from_millis(100));
        assert_eq!(due, vec![(name.clone(), Some(7))]);
        assert!(
            !c.renew(&name, 7, start + Duration::from_secs(9)),
            "withdrawn"
        );
        // Not due again until the retry time.
        let (again, next) = c.due(start + Duration::from_secs(2), Duration::from_millis(100));
        assert!(again.is_empty());
        assert_eq!(next, Some(start + Duration::from_millis(2100)));
        c.forget(&name, Some(7));
        assert!(!c.knows(&name));
        assert!(c.idle_since().is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn a_stale_withdrawal_leaves_a_newer_entry_alone() {
        let c = Contenders::new();
        let name = c.reserve("p/", LEASE).unwrap();
        c.held(&name, 20, Instant::now() + Duration::from_secs(5));
        assert_eq!(c.withdraw(&name, Some(19), Instant::now()), None);
        c.forget(&name, Some(19));
        assert!(c.is_held(&name, 20));
        assert_eq!(c.withdraw(&name, Some(20), Instant::now()), Some(Some(20)));
    }

    #[tokio::test(start_paused = true)]
    async fn idle_sessions_end_only_when_still_idle() {
        let c = Contenders::new();
        let since = c.idle_since().unwrap();
        let name = c.reserve("p/", LEASE).unwrap();
        assert!(!c.end_if_idle_since(since + Duration::from_secs(60)));
        c.forget(&name, None);
        let since = c.idle_since().unwrap();
        assert!(c.end_if_idle_since(since));
        assert!(c.end(), "already ended");
        assert!(c.reserve("p/", LEASE).is_none());
    }
}
