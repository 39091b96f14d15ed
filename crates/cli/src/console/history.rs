//! What the console has seen since it started: the keys as the last look found them, the last
//! look's error, the hand-offs and losses newest first, each key's fence history, and the longest
//! time left seen for each holder (the full length of its time-left bar).

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, SystemTime};

use leasehold::{Inspection, LockKey};

use crate::survey::{Change, ChangeKind, Look};

/// How many hand-offs and losses the index page keeps.
const LOG_LIMIT: usize = 100;
/// How many changes each key's page keeps (the oldest go first).
const KEY_HISTORY_LIMIT: usize = 500;
/// How many keys' histories are kept: keys that come and go under a busy prefix must not grow
/// the console's memory without bound; past this, the key changed least recently is forgotten.
const KEYS_REMEMBERED: usize = 4096;

/// One change the survey saw, as the pages show it.
#[derive(Debug, Clone)]
pub(crate) struct Seen {
    pub at: SystemTime,
    pub key: LockKey,
    /// `held` (at the first look), `taken`, `handed off`, `expired`, `ended` or `revoked`.
    pub what: &'static str,
    /// The fence the key had after the change (the new holder's), or the one that ended.
    pub fence: Option<u64>,
    /// The survey's one-line description.
    pub line: String,
}

impl Seen {
    fn of(change: &Change) -> Seen {
        let (what, fence) = match &change.kind {
            ChangeKind::Taken { fence, .. } => ("taken", fence),
            ChangeKind::HandedOff { fence, .. } => ("handed off", fence),
            ChangeKind::Expired { fence, .. } => ("expired", fence),
            ChangeKind::Ended { fence, .. } => ("ended", fence),
        };
        Seen {
            at: change.at,
            key: change.key.clone(),
            what,
            fence: fence.map(|f| f.value()),
            line: change.describe(),
        }
    }

    /// Whether a holder lost the key without letting it go: its lease ran out, or this console
    /// revoked it. (A key freed early may have been released, which is no loss.)
    pub fn is_loss(&self) -> bool {
        matches!(self.what, "expired" | "revoked")
    }

    /// A holder the first look found, so that a key's page starts from what the console saw
    /// first.
    fn at_start(at: SystemTime, key: &Inspection) -> Seen {
        let who = key
            .owner
            .as_ref()
            .map_or_else(|| "a holder".to_string(), |o| o.to_string());
        let fence = key.fence.map(|f| f.value());
        let line = match fence {
            Some(n) => format!(
                "{} held by {who} (fence {n}) when the console started",
                key.key
            ),
            None => format!("{} held by {who} when the console started", key.key),
        };
        Seen {
            at,
            key: key.key.clone(),
            what: "held",
            fence,
            line,
        }
    }
}

/// The console's memory of the authority.
#[derive(Debug, Default)]
pub(crate) struct History {
    /// When the last successful look was made; `None` before the first.
    pub at: Option<SystemTime>,
    /// The keys the last successful look found, in order.
    pub keys: Vec<Inspection>,
    /// Whether there were more keys than the limit.
    pub more: bool,
    /// The last look's error (its text, secrets redacted), cleared by a successful look.
    pub error: Option<String>,
    /// Every change seen (takes, hand-offs and losses), newest first.
    pub log: VecDeque<Seen>,
    /// Every change seen on each key, oldest first, and when it last changed.
    per_key: HashMap<LockKey, (SystemTime, VecDeque<Seen>)>,
    /// The longest time left seen for each (key, holder, fence): the full length of its bar.
    longest: HashMap<(LockKey, Option<u64>), Duration>,
}

impl History {
    /// Takes in a successful look.
    pub fn seen(&mut self, look: Look) {
        if self.at.is_none() {
            for key in look.keys.iter().filter(|k| k.held) {
                self.remember(Seen::at_start(look.at, key));
            }
        }
        for change in &look.changes {
            let seen = Seen::of(change);
            self.log.push_front(seen.clone());
            self.log.truncate(LOG_LIMIT);
            self.remember(seen);
        }
        // Only the holders shown now keep their bar's length.
        let mut longest = HashMap::with_capacity(look.keys.len());
        for key in look.keys.iter().filter(|k| k.held) {
            let id = (key.key.clone(), key.fence.map(|f| f.value()));
            let before = self.longest.get(&id).copied().unwrap_or_default();
            longest.insert(id, before.max(key.remaining.unwrap_or_default()));
        }
        self.longest = longest;
        self.at = Some(look.at);
        self.keys = look.keys;
        self.more = look.more;
        self.error = None;
    }

    /// Takes in a revoke this console made: the survey would see only a key freed early.
    pub fn revoked(&mut self, at: SystemTime, key: &LockKey, fence: u64) {
        let seen = Seen {
            at,
            key: key.clone(),
            what: "revoked",
            fence: Some(fence),
            line: format!("{key} revoked by this console (fence {fence})"),
        };
        self.log.push_front(seen.clone());
        self.log.truncate(LOG_LIMIT);
        self.remember(seen);
    }

    /// Takes in a failed look: the banner says why; what was seen before stays shown.
    pub fn failed(&mut self, why: String) {
        self.error = Some(why);
    }

    fn remember(&mut self, seen: Seen) {
        if !self.per_key.contains_key(&seen.key) && self.per_key.len() >= KEYS_REMEMBERED {
            let stalest = self
                .per_key
                .iter()
                .min_by_key(|(_, (last, _))| *last)
                .map(|(key, _)| key.clone());
            if let Some(key) = stalest {
                self.per_key.remove(&key);
            }
        }
        let (last, changes) = self
            .per_key
            .entry(seen.key.clone())
            .or_insert_with(|| (seen.at, VecDeque::new()));
        *last = seen.at;
        changes.push_back(seen);
        if changes.len() > KEY_HISTORY_LIMIT {
            changes.pop_front();
        }
    }

    /// The changes seen on `key` since the console started, oldest first.
    pub fn of_key(&self, key: &LockKey) -> impl Iterator<Item = &Seen> {
        self.per_key
            .get(key)
            .into_iter()
            .flat_map(|(_, changes)| changes.iter())
    }

    /// `key` as the last look found it, if it was listed.
    pub fn key(&self, key: &LockKey) -> Option<&Inspection> {
        self.keys.iter().find(|k| &k.key == key)
    }

    /// The full length of `seen`'s time-left bar: the longest time left seen for its holder.
    pub fn bar_length(&self, seen: &Inspection) -> Option<Duration> {
        let id = (seen.key.clone(), seen.fence.map(|f| f.value()));
        self.longest
            .get(&id)
            .copied()
            .or(seen.remaining)
            .filter(|d| !d.is_zero())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold::{Epoch, Fence, FenceSafety, OwnerId};
    use leasehold_conformance::kit::{OrFail, TestResult};

    fn fence(n: u64) -> Fence {
        Fence::compose("t", Epoch::ZERO, n, FenceSafety::Linearizable).expect("fence n")
    }

    fn held(key: &LockKey, n: u64, left_ms: u64) -> Inspection {
        Inspection::held("redis", key.clone(), OwnerId::peer("p"))
            .with_fence(Some(fence(n)))
            .with_remaining(Some(Duration::from_millis(left_ms)))
    }

    fn look(keys: Vec<Inspection>, changes: Vec<Change>) -> Look {
        Look {
            at: SystemTime::now(),
            keys,
            more: false,
            changes,
        }
    }

    #[test]
    fn the_bar_is_the_longest_time_left_of_the_same_holder() -> TestResult {
        let key = LockKey::new("job:a").or_fail("the key job:a")?;
        let mut history = History::default();
        history.seen(look(vec![held(&key, 1, 9_000)], vec![]));
        history.seen(look(vec![held(&key, 1, 4_000)], vec![]));
        let now = held(&key, 1, 4_000);
        assert_eq!(history.bar_length(&now), Some(Duration::from_secs(9)));
        // Another holder (another fence) starts a bar of its own.
        history.seen(look(vec![held(&key, 2, 3_000)], vec![]));
        assert_eq!(
            history.bar_length(&held(&key, 2, 3_000)),
            Some(Duration::from_secs(3))
        );
        Ok(())
    }

    #[test]
    fn changes_go_to_the_log_newest_first_and_to_the_key() -> TestResult {
        let key = LockKey::new("job:a").or_fail("the key job:a")?;
        let other = LockKey::new("job:b").or_fail("the key job:b")?;
        let change = |key: &LockKey, kind| Change {
            at: SystemTime::now(),
            key: key.clone(),
            kind,
        };
        let mut history = History::default();
        history.failed("down".into());
        let taken = ChangeKind::Taken {
            owner: None,
            fence: Some(fence(1)),
        };
        let handed = ChangeKind::HandedOff {
            from: None,
            from_fence: Some(fence(1)),
            to: None,
            fence: Some(fence(2)),
        };
        history.seen(look(vec![], vec![change(&key, taken)]));
        assert_eq!(history.error, None, "a look that works clears the banner");
        history.seen(look(
            vec![],
            vec![
                change(&key, handed),
                change(
                    &other,
                    ChangeKind::Ended {
                        owner: None,
                        fence: None,
                    },
                ),
            ],
        ));
        let log: Vec<_> = history.log.iter().map(|s| (s.what, s.fence)).collect();
        assert_eq!(
            log,
            [("ended", None), ("handed off", Some(2)), ("taken", Some(1))]
        );
        let fences: Vec<_> = history.of_key(&key).map(|s| s.fence).collect();
        assert_eq!(fences, [Some(1), Some(2)]);
        for _ in 0..LOG_LIMIT {
            history.seen(look(
                vec![],
                vec![change(
                    &other,
                    ChangeKind::Ended {
                        owner: None,
                        fence: None,
                    },
                )],
            ));
        }
        assert_eq!(history.log.len(), LOG_LIMIT);
        assert_eq!(history.of_key(&other).count(), LOG_LIMIT + 1);
        Ok(())
    }

    #[test]
    fn a_key_page_starts_from_the_first_look_and_a_revoke_is_a_loss() -> TestResult {
        let key = LockKey::new("job:a").or_fail("the key job:a")?;
        let mut history = History::default();
        history.seen(look(vec![held(&key, 3, 1_000)], vec![]));
        history.seen(look(vec![held(&key, 3, 900)], vec![]));
        let first: Vec<_> = history.of_key(&key).map(|s| (s.what, s.fence)).collect();
        assert_eq!(first, [("held", Some(3))], "only the first look seeds it");
        assert!(history.log.is_empty(), "a holder at start is no change");
        history.revoked(SystemTime::now(), &key, 3);
        let newest = history.log.front().or_fail("the newest history entry")?;
        assert_eq!((newest.what, newest.fence), ("revoked", Some(3)));
        assert!(newest.is_loss());
        let ended = Seen::of(&Change {
            at: SystemTime::now(),
            key: key.clone(),
            kind: ChangeKind::Ended {
                owner: None,
                fence: None,
            },
        });
        assert!(!ended.is_loss(), "a key freed early may have been released");
        Ok(())
    }
}
