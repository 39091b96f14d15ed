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
use leasehold_core::{LossSignal, LostReason, OwnerToken};
use tokio::time::Instant;

use crate::keys;

/// What one contender key is doing.
#[derive(Clone, Debug)]
pub(crate) enum State {
    /// The request that writes it is in flight: it may or may not exist.
    Pending,
    /// Written at `revision`, waiting for the keys ahead of it to go.
    Waiting { revision: i64 },
    /// Holds the lock. The session withdraws it at `until` (the TTL counted from before the
    /// acquire or the last renewal) unless renewed first: a grant that is not renewed ends
    /// within its TTL even though the session's lease lives on for other locks. `loss` is the
    /// grant's loss signal, fired when the session ends or the key is deleted behind our back.
    Held {
        revision: i64,
        until: Instant,
        loss: LossSignal,
    },
    /// Must be deleted: by its `revision` when known, else by its owner token (the value every
    /// contender key stores). Retried from `retry_at` until etcd confirms. Without a revision
    /// (a write whose answer was lost), a delete that finds nothing confirms nothing: the write
    /// may still land later (held in a member that was paused or cut off), so the key stays
    /// booked and is deleted again, until it is found and deleted or the session's lease ends.
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

/// One booked key: which acquisition wrote it (its owner token, stored as the key's value) and
/// what it is doing. The owner token is the entry's identity: a late answer about an earlier
/// acquisition under the same name never touches a newer one's entry.
#[derive(Debug)]
struct Entry {
    owner: OwnerToken,
    state: State,
    /// Until when a delete of this key whose answer was lost may still reach etcd.
    delete_in_flight_until: Option<Instant>,
}

#[derive(Debug)]
struct Book {
    ended: bool,
    entries: HashMap<String, Entry>,
    /// Names not to reuse before the instant given: a delete for them may still be in flight.
    quarantined: HashMap<String, Instant>,
    next_suffix: u64,
    idle_since: Option<Instant>,
}

/// The book of one session's contender keys.
#[derive(Debug)]
pub(crate) struct Contenders {
    book: Mutex<Book>,
}

/// A key to delete: its name, the acquisition that wrote it, and its create revision when known.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Withdrawal {
    pub name: String,
    pub owner: OwnerToken,
    pub revision: Option<i64>,
}

impl Contenders {
    pub fn new() -> Self {
        Contenders {
            book: Mutex::new(Book {
                ended: false,
                entries: HashMap::new(),
                quarantined: HashMap::new(),
                next_suffix: 1,
                idle_since: Some(Instant::now()),
            }),
        }
    }

    fn book(&self) -> MutexGuard<'_, Book> {
        // Every critical section leaves the book consistent, so a poisoned lock is still usable.
        self.book.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reserves a fresh contender key under `prefix` for acquisition `owner` of a session on
    /// `lease`, or `None` once the session has ended. A name is never reused while a delete for
    /// it may still be in flight.
    pub fn reserve(&self, prefix: &str, lease: i64, owner: OwnerToken) -> Option<String> {
        let mut book = self.book();
        if book.ended {
            return None;
        }
        let now = Instant::now();
        book.quarantined.retain(|_, until| *until > now);
        let mut name = keys::contender(prefix, lease, 0);
        while book.entries.contains_key(&name) || book.quarantined.contains_key(&name) {
            let n = book.next_suffix;
            book.next_suffix += 1;
            name = keys::contender(prefix, lease, n);
        }
        book.entries.insert(
            name.clone(),
            Entry {
                owner,
                state: State::Pending,
                delete_in_flight_until: None,
            },
        );
        book.idle_since = None;
        Some(name)
    }

    /// The key was written at `revision` and waits for its turn.
    pub fn waiting(&self, name: &str, owner: OwnerToken, revision: i64) {
        self.set(name, owner, State::Waiting { revision });
    }

    /// The key holds the lock until `until` unless renewed; `loss` fires when it is lost.
    pub fn held(
        &self,
        name: &str,
        owner: OwnerToken,
        revision: i64,
        until: Instant,
        loss: LossSignal,
    ) {
        self.set(
            name,
            owner,
            State::Held {
                revision,
                until,
                loss,
            },
        );
    }

    fn set(&self, name: &str, owner: OwnerToken, state: State) {
        let mut book = self.book();
        if let Some(entry) = book.entries.get_mut(name).filter(|e| e.owner == owner) {
            entry.state = state;
        }
    }

    /// Extends a held key to `until`; false if it is not held at `revision` any more (withdrawn
    /// by the session, released, or forgotten).
    pub fn renew(&self, name: &str, revision: i64, until: Instant) -> bool {
        let mut book = self.book();
        match book.entries.get_mut(name).map(|e| &mut e.state) {
            Some(State::Held {
                revision: r,
                until: u,
                ..
            }) if *r == revision => {
                *u = (*u).max(until);
                true
            }
            _ => false,
        }
    }

    /// Whether `name` is held at `revision` right now (not yet withdrawn or released).
    pub fn is_held(&self, name: &str, revision: i64) -> bool {
        matches!(
            self.book().entries.get(name).map(|e| &e.state),
            Some(State::Held { revision: r, .. }) if *r == revision
        )
    }

    /// Marks `owner`'s key `name` for deletion, the session's task retrying from `retry_at`.
    /// With `revision` given, only the entry for that revision is marked. Returns what to
    /// delete, or `None` if there is no such entry.
    pub fn withdraw(
        &self,
        name: &str,
        owner: OwnerToken,
        revision: Option<i64>,
        retry_at: Instant,
    ) -> Option<Withdrawal> {
        let mut book = self.book();
        let entry = book.entries.get_mut(name).filter(|e| e.owner == owner)?;
        let known = entry.state.revision();
        if revision.is_some() && known.is_some() && known != revision {
            return None;
        }
        let revision = known.or(revision);
        entry.state = State::Withdrawing { revision, retry_at };
        Some(Withdrawal {
            name: name.to_string(),
            owner,
            revision,
        })
    }

    /// A delete of `owner`'s key `name` got no answer: it may still reach etcd until
    /// `in_flight_until`, so the name must not be reused before then.
    pub fn delete_unanswered(&self, name: &str, owner: OwnerToken, in_flight_until: Instant) {
        let mut book = self.book();
        if let Some(entry) = book.entries.get_mut(name).filter(|e| e.owner == owner) {
            entry.delete_in_flight_until = Some(
                entry
                    .delete_in_flight_until
                    .map_or(in_flight_until, |u| u.max(in_flight_until)),
            );
        }
    }

    /// A delete of `owner`'s key `name`, whose write got no answer, found nothing: the write may
    /// still land, so the key stays booked, to be deleted again from `retry_at`.
    pub fn doubt(&self, name: &str, owner: OwnerToken, retry_at: Instant) {
        let mut book = self.book();
        if let Some(entry) = book.entries.get_mut(name).filter(|e| e.owner == owner) {
            if let State::Withdrawing {
                revision: None,
                retry_at: at,
            } = &mut entry.state
            {
                *at = retry_at;
            }
        }
    }

    /// Ends the session if all it books are writes whose outcome is unknown: revoking the
    /// session's lease is then the one way to make sure they never land, and it costs no lock.
    /// (A key being released is waited for, so its release is answered as it happened.)
    /// Returns whether it ended.
    pub fn end_if_only_doubts(&self) -> bool {
        let mut book = self.book();
        let only_doubts = !book.ended
            && !book.entries.is_empty()
            && book
                .entries
                .values()
                .all(|e| matches!(e.state, State::Withdrawing { revision: None, .. }));
        if only_doubts {
            book.ended = true;
        }
        only_doubts
    }

    /// Forgets `owner`'s key `name` (etcd confirmed it is gone, or it was never written). An
    /// entry of another acquisition under the same name is left alone.
    pub fn forget(&self, name: &str, owner: OwnerToken) {
        let mut book = self.book();
        let Some(entry) = book.entries.get(name).filter(|e| e.owner == owner) else {
            return;
        };
        let in_flight = entry.delete_in_flight_until;
        book.entries.remove(name);
        if let Some(until) = in_flight.filter(|u| *u > Instant::now()) {
            book.quarantined.insert(name.to_string(), until);
        }
        if book.entries.is_empty() {
            book.idle_since = Some(Instant::now());
        }
    }

    /// Whether the key `name` with `value` and `create_revision`, found on this session's lease,
    /// is one the session knows (booked for that acquisition) and still wants; if not, it is an
    /// orphan of a request whose answer was lost, which nobody but us will ever delete. A write
    /// booked for withdrawal with no known revision (its answer was lost) is not wanted: whoever
    /// meets it deletes it at once rather than waiting behind it for the session's next attempt.
    /// A release in flight (a known revision) is left to the release: a second delete racing it
    /// would make the holder's release report the key already gone.
    pub fn knows(&self, name: &str, value: &[u8], create_revision: i64) -> bool {
        self.book().entries.get(name).is_some_and(|e| {
            !matches!(e.state, State::Withdrawing { revision: None, .. })
                && (e.state.revision() == Some(create_revision)
                    || (e.state.revision().is_none() && e.owner.to_hex().as_bytes() == value))
        })
    }

    /// Turns held keys past their `until` into withdrawals, and returns the withdrawals due at
    /// `now` (marking them to be retried after `retry_after`) and when the next one is due.
    pub fn due(&self, now: Instant, retry_after: Duration) -> (Vec<Withdrawal>, Option<Instant>) {
        let mut book = self.book();
        let mut due = Vec::new();
        let mut next: Option<Instant> = None;
        for (name, entry) in book.entries.iter_mut() {
            let at = match entry.state {
                State::Held {
                    revision, until, ..
                } if until <= now => {
                    entry.state = State::Withdrawing {
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
                if let State::Withdrawing { revision, retry_at } = &mut entry.state {
                    *retry_at = saturating_add(now, retry_after);
                    due.push(Withdrawal {
                        name: name.clone(),
                        owner: entry.owner,
                        revision: *revision,
                    });
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

    /// Ends the session: no key is reserved any more, and every held key's loss signal fires
    /// with `reason`. Returns whether it had ended before.
    pub fn end(&self, reason: LostReason) -> bool {
        let mut book = self.book();
        for entry in book.entries.values() {
            if let State::Held { loss, .. } = &entry.state {
                loss.fire(reason.clone());
            }
        }
        std::mem::replace(&mut book.ended, true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold_conformance::kit::{OrFail, TestResult};

    const LEASE: i64 = 0xabc;

    fn owner() -> OwnerToken {
        OwnerToken::generate().expect("a generated owner token")
    }

    #[tokio::test(start_paused = true)]
    async fn reserves_distinct_names_and_reuses_freed_ones() -> TestResult {
        let c = Contenders::new();
        let (o1, o2) = (owner(), owner());
        let a = c
            .reserve("p/", LEASE, o1)
            .or_fail("reserving a name for o1")?;
        let b = c
            .reserve("p/", LEASE, o2)
            .or_fail("reserving a name for o2")?;
        assert_eq!(a, "p/abc");
        assert_eq!(b, "p/abc_1");
        c.waiting(&a, o1, 10);
        c.forget(&a, o1);
        assert_eq!(
            c.reserve("p/", LEASE, owner())
                .or_fail("reserving a name again")?,
            "p/abc"
        );
        assert!(!c.end(LostReason::SessionEnded));
        assert!(c.reserve("p/", LEASE, owner()).is_none());
        Ok(())
    }

    #[tokio::test(start_paused = true)]
    async fn held_keys_are_withdrawn_at_their_ttl_unless_renewed() -> TestResult {
        let c = Contenders::new();
        let o = owner();
        let name = c.reserve("p/", LEASE, o).or_fail("reserving a name")?;
        let start = Instant::now();
        c.held(
            &name,
            o,
            7,
            start + Duration::from_secs(1),
            LossSignal::new(),
        );
        let (due, next) = c.due(start, Duration::from_secs(1));
        assert!(due.is_empty());
        assert_eq!(next, Some(start + Duration::from_secs(1)));
        assert!(c.renew(&name, 7, start + Duration::from_secs(2)));
        assert!(
            !c.renew(&name, 8, start + Duration::from_secs(3)),
            "wrong revision"
        );
        let (due, _) = c.due(start + Duration::from_secs(2), Duration::from_millis(100));
        let expected = Withdrawal {
            name: name.clone(),
            owner: o,
            revision: Some(7),
        };
        assert_eq!(due, vec![expected]);
        assert!(
            !c.renew(&name, 7, start + Duration::from_secs(9)),
            "withdrawn"
        );
        // Not due again until the retry time.
        let (again, next) = c.due(start + Duration::from_secs(2), Duration::from_millis(100));
        assert!(again.is_empty());
        assert_eq!(next, Some(start + Duration::from_millis(2100)));
        c.forget(&name, o);
        assert!(!c.knows(&name, o.to_hex().as_bytes(), 7));
        assert!(c.idle_since().is_some());
        Ok(())
    }

    #[tokio::test(start_paused = true)]
    async fn a_stale_withdrawal_leaves_a_newer_entry_alone() -> TestResult {
        let c = Contenders::new();
        let o = owner();
        let name = c.reserve("p/", LEASE, o).or_fail("reserving a name")?;
        c.held(
            &name,
            o,
            20,
            Instant::now() + Duration::from_secs(5),
            LossSignal::new(),
        );
        assert_eq!(c.withdraw(&name, o, Some(19), Instant::now()), None);
        assert!(c.is_held(&name, 20));
        assert_eq!(
            c.withdraw(&name, o, Some(20), Instant::now())
                .map(|w| w.revision),
            Some(Some(20))
        );
        Ok(())
    }

    /// A late confirmation for an earlier acquisition under a reused name must not
    /// erase the newer acquisition's booking (its key would then look like an orphan and be
    /// deleted), and a name whose delete may still be in flight is not reused at all.
    #[tokio::test(start_paused = true)]
    async fn a_late_forget_spares_the_next_acquisition_under_the_same_name() -> TestResult {
        let c = Contenders::new();
        let (first, second) = (owner(), owner());
        let name = c
            .reserve("p/", LEASE, first)
            .or_fail("reserving a name for the first owner")?;
        let w = c
            .withdraw(&name, first, None, Instant::now())
            .or_fail("withdrawing the first owner's name")?;
        assert_eq!(
            w.revision, None,
            "an unanswered write is deleted by its owner"
        );
        c.forget(&name, first);
        let again = c
            .reserve("p/", LEASE, second)
            .or_fail("reserving a name for the second owner")?;
        assert_eq!(again, name, "confirmed gone: the name is free");
        c.waiting(&again, second, 30);
        // The earlier acquisition's (late, duplicate) confirmation arrives now.
        c.forget(&name, first);
        assert!(c.knows(&name, second.to_hex().as_bytes(), 30));
        assert!(c.withdraw(&name, first, None, Instant::now()).is_none());

        // A delete that got no answer may still be in flight: the name waits that long.
        let third = owner();
        c.forget(&name, second);
        let name = c
            .reserve("p/", LEASE, third)
            .or_fail("reserving a name for the third owner")?;
        c.withdraw(&name, third, None, Instant::now())
            .or_fail("withdrawing the third owner's name")?;
        c.delete_unanswered(&name, third, Instant::now() + Duration::from_secs(1));
        c.forget(&name, third);
        let other = c
            .reserve("p/", LEASE, owner())
            .or_fail("reserving a name for another owner")?;
        assert_ne!(other, name, "reused while a delete may be in flight");
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(
            c.reserve("p/", LEASE, owner())
                .or_fail("reserving the name again")?,
            name
        );
        Ok(())
    }

    #[tokio::test(start_paused = true)]
    async fn a_session_booking_only_doubtful_writes_ends() -> TestResult {
        let c = Contenders::new();
        let (held, doubtful) = (owner(), owner());
        let h = c
            .reserve("a/", LEASE, held)
            .or_fail("reserving a name for the held owner")?;
        c.held(
            &h,
            held,
            5,
            Instant::now() + Duration::from_secs(5),
            LossSignal::new(),
        );
        let d = c
            .reserve("b/", LEASE, doubtful)
            .or_fail("reserving a name for the doubtful owner")?;
        c.withdraw(&d, doubtful, None, Instant::now())
            .or_fail("withdrawing the doubtful owner's name")?;
        // A doubtful key is not one the session wants: whoever meets it deletes it.
        assert!(!c.knows(&d, doubtful.to_hex().as_bytes(), 9));
        c.doubt(&d, doubtful, Instant::now() + Duration::from_secs(1));
        assert_eq!(c.due(Instant::now(), Duration::from_secs(1)).0, vec![]);
        assert!(!c.end_if_only_doubts(), "a held key keeps the session");
        // A release in flight is waited for, so it is answered as it happened.
        c.withdraw(&h, held, Some(5), Instant::now())
            .or_fail("withdrawing the held owner's name at revision 5")?;
        assert!(
            !c.end_if_only_doubts(),
            "a release in flight keeps the session"
        );
        c.forget(&h, held);
        assert!(c.end_if_only_doubts());
        assert!(c.reserve("a/", LEASE, owner()).is_none(), "ended");
        Ok(())
    }

    #[tokio::test(start_paused = true)]
    async fn ending_the_session_fires_every_held_keys_signal() -> TestResult {
        let c = Contenders::new();
        let (o1, o2) = (owner(), owner());
        let (s1, s2) = (LossSignal::new(), LossSignal::new());
        let a = c
            .reserve("a/", LEASE, o1)
            .or_fail("reserving a name under a/")?;
        let b = c
            .reserve("b/", LEASE, o2)
            .or_fail("reserving a name under b/")?;
        c.held(
            &a,
            o1,
            5,
            Instant::now() + Duration::from_secs(5),
            s1.clone(),
        );
        c.held(
            &b,
            o2,
            6,
            Instant::now() + Duration::from_secs(5),
            s2.clone(),
        );
        assert!(s1.fired().is_none());
        c.end(LostReason::SessionEnded);
        assert!(matches!(s1.fired(), Some(LostReason::SessionEnded)));
        assert!(matches!(s2.fired(), Some(LostReason::SessionEnded)));
        Ok(())
    }

    #[tokio::test(start_paused = true)]
    async fn idle_sessions_end_only_when_still_idle() -> TestResult {
        let c = Contenders::new();
        let since = c
            .idle_since()
            .or_fail("the idle time before any reservation")?;
        let o = owner();
        let name = c.reserve("p/", LEASE, o).or_fail("reserving a name")?;
        assert!(!c.end_if_idle_since(since + Duration::from_secs(60)));
        c.forget(&name, o);
        let since = c
            .idle_since()
            .or_fail("the idle time after the withdrawal")?;
        assert!(c.end_if_idle_since(since));
        assert!(c.end(LostReason::SessionEnded), "already ended");
        assert!(c.reserve("p/", LEASE, owner()).is_none());
        Ok(())
    }
}
