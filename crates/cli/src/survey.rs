//! A survey: the keys under a prefix (or one key), looked at again and again, and what changed
//! between two looks: a key taken, handed off to another holder, or freed.
//!
//! A survey sees only what two inspections show, so it can miss what happened between them (a
//! holder that took and released a key within one interval leaves no trace) and it cannot tell a
//! release from a revoke. It tells a lease that ran out from one that ended early by the time
//! the authority gave it at the last look: a key seen free after that time had passed was not
//! renewed by its holder.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use leasehold::{Authority, Fence, Inspection, KeyPrefix, LockKey, OwnerId};

/// Which keys a survey looks at.
enum Scope {
    Key(LockKey),
    Prefix(KeyPrefix, usize),
}

/// The keys under a prefix, polled; see the module docs.
pub(crate) struct Survey {
    authority: Arc<dyn Authority>,
    scope: Scope,
    backstop: Duration,
    /// The holders seen at the last look, by key.
    last: BTreeMap<LockKey, Holder>,
}

/// A holder as one look saw it.
struct Holder {
    owner: Option<OwnerId>,
    fence: Option<Fence>,
    /// When the holder's lease ends unless renewed: the authority's remaining time counted from
    /// the moment its answer arrived (the latest the lease could end), when the backend says.
    ends_by: Option<Instant>,
}

/// What one look found.
#[derive(Debug, Clone)]
pub(crate) struct Look {
    /// When the look began, on this machine's clock (for people; never compared with the
    /// authority's).
    pub at: SystemTime,
    /// Each key's inspection, in key order.
    pub keys: Vec<Inspection>,
    /// Whether there are more keys under the prefix than the limit let the look list.
    pub more: bool,
    /// What changed since the last look; none at the first.
    pub changes: Vec<Change>,
}

/// One change between two looks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Change {
    /// When the look that saw it began.
    pub at: SystemTime,
    pub key: LockKey,
    pub kind: ChangeKind,
}

/// How a key changed between two looks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ChangeKind {
    /// Free at the last look, held now.
    Taken {
        owner: Option<OwnerId>,
        fence: Option<Fence>,
    },
    /// Held at the last look, held now by another holder (another fence).
    HandedOff {
        from: Option<OwnerId>,
        from_fence: Option<Fence>,
        to: Option<OwnerId>,
        fence: Option<Fence>,
    },
    /// Held at the last look, free now, and the time its lease had then was over: its holder
    /// did not renew (it stopped, lost its connection, or was too slow).
    Expired {
        owner: Option<OwnerId>,
        fence: Option<Fence>,
    },
    /// Held at the last look, free now, before its lease's time was over: released or revoked.
    Ended {
        owner: Option<OwnerId>,
        fence: Option<Fence>,
    },
}

impl ChangeKind {
    /// The name scripts see (`status --watch --json`).
    pub(crate) fn name(&self) -> &'static str {
        match self {
            ChangeKind::Taken { .. } => "taken",
            ChangeKind::HandedOff { .. } => "handed_off",
            ChangeKind::Expired { .. } => "expired",
            ChangeKind::Ended { .. } => "ended",
        }
    }
}

/// `1a2b3c4d (fence 7)`, or what of it is known.
fn holder(owner: &Option<OwnerId>, fence: &Option<Fence>) -> String {
    let who = owner
        .as_ref()
        .map_or_else(|| "a holder".to_string(), |o| o.to_string());
    match fence {
        Some(fence) => format!("{who} (fence {})", fence.value()),
        None => who,
    }
}

impl Change {
    /// One line for people: `job:a handed off 1a2b3c4d (fence 7) -> 9f8e7d6c (fence 8)`.
    pub(crate) fn describe(&self) -> String {
        let key = &self.key;
        match &self.kind {
            ChangeKind::Taken { owner, fence } => {
                format!("{key} taken by {}", holder(owner, fence))
            }
            ChangeKind::HandedOff {
                from,
                from_fence,
                to,
                fence,
            } => format!(
                "{key} handed off {} -> {}",
                holder(from, from_fence),
                holder(to, fence)
            ),
            ChangeKind::Expired { owner, fence } => format!(
                "{key} expired: {} did not renew in time",
                holder(owner, fence)
            ),
            ChangeKind::Ended { owner, fence } => format!(
                "{key} freed early by {} (released or revoked)",
                holder(owner, fence)
            ),
        }
    }
}

impl Survey {
    /// A survey of the first `limit` keys under `prefix`; each request is bounded by `backstop`.
    pub(crate) fn new(
        authority: Arc<dyn Authority>,
        prefix: KeyPrefix,
        limit: usize,
        backstop: Duration,
    ) -> Self {
        Survey::of(authority, Scope::Prefix(prefix, limit), backstop)
    }

    /// A survey of one key.
    pub(crate) fn one(authority: Arc<dyn Authority>, key: LockKey, backstop: Duration) -> Self {
        Survey::of(authority, Scope::Key(key), backstop)
    }

    fn of(authority: Arc<dyn Authority>, scope: Scope, backstop: Duration) -> Self {
        Survey {
            authority,
            scope,
            backstop,
            last: BTreeMap::new(),
        }
    }

    /// The authority the survey asks.
    pub(crate) fn authority(&self) -> &Arc<dyn Authority> {
        &self.authority
    }

    /// Lists the keys, inspects each, and compares with the last look. A failed look changes
    /// nothing: the next one compares with the last that succeeded.
    pub(crate) async fn look(&mut self) -> leasehold::Result<Look> {
        let at = SystemTime::now();
        let began = Instant::now();
        let backend = self.authority.capabilities().backend;
        let (keys, more) = match &self.scope {
            Scope::Key(key) => (vec![key.clone()], false),
            Scope::Prefix(prefix, limit) => {
                let mut keys = within(
                    backend,
                    "list keys",
                    self.backstop,
                    self.authority.list_keys(prefix, limit.saturating_add(1)),
                )
                .await?;
                let more = keys.len() > *limit;
                keys.truncate(*limit);
                (keys, more)
            }
        };
        let mut seen = Vec::with_capacity(keys.len());
        let mut now = BTreeMap::new();
        for key in &keys {
            let inspection = within(
                backend,
                "inspect",
                self.backstop,
                self.authority.inspect(key),
            )
            .await?;
            let answered = Instant::now();
            if inspection.held {
                now.insert(
                    key.clone(),
                    Holder {
                        owner: inspection.owner.clone(),
                        fence: inspection.fence,
                        // A time too long to count never runs out.
                        ends_by: inspection.remaining.and_then(|r| answered.checked_add(r)),
                    },
                );
            }
            seen.push(inspection);
        }
        // A key past the limit is not listed: only keys within the listed range can be said to
        // be free.
        let last_listed = if more { keys.last().cloned() } else { None };
        let changes = compare(&self.last, &now, began, at, |key| {
            last_listed.as_ref().is_none_or(|last| key <= last)
        });
        self.last = now;
        Ok(Look {
            at,
            keys: seen,
            more,
            changes,
        })
    }
}

/// The changes from `before` to `after`, for a look that began at `began`; `listed` says
/// whether a key missing from `after` was within the look's reach (and so is free).
fn compare(
    before: &BTreeMap<LockKey, Holder>,
    after: &BTreeMap<LockKey, Holder>,
    began: Instant,
    at: SystemTime,
    listed: impl Fn(&LockKey) -> bool,
) -> Vec<Change> {
    let mut changes = Vec::new();
    let mut change = |key: &LockKey, kind| {
        changes.push(Change {
            at,
            key: key.clone(),
            kind,
        })
    };
    for (key, new) in after {
        match before.get(key) {
            None => change(
                key,
                ChangeKind::Taken {
                    owner: new.owner.clone(),
                    fence: new.fence,
                },
            ),
            Some(old) if old.fence != new.fence || old.owner != new.owner => change(
                key,
                ChangeKind::HandedOff {
                    from: old.owner.clone(),
                    from_fence: old.fence,
                    to: new.owner.clone(),
                    fence: new.fence,
                },
            ),
            Some(_) => {}
        }
    }
    for (key, old) in before {
        if after.contains_key(key) || !listed(key) {
            continue;
        }
        let (owner, fence) = (old.owner.clone(), old.fence);
        let ran_out = old.ends_by.is_some_and(|end| began >= end);
        change(
            key,
            if ran_out {
                ChangeKind::Expired { owner, fence }
            } else {
                ChangeKind::Ended { owner, fence }
            },
        );
    }
    changes.sort_by(|a, b| a.key.cmp(&b.key));
    changes
}

/// Awaits one request within `backstop`; a request that outlasts it is an unanswered one.
async fn within<T>(
    backend: &'static str,
    operation: &str,
    backstop: Duration,
    request: impl Future<Output = leasehold::Result<T>>,
) -> leasehold::Result<T> {
    match tokio::time::timeout(backstop, request).await {
        Ok(done) => done,
        Err(_) => Err(leasehold::Error::request_timeout(
            backend, operation, backstop,
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold::{Epoch, FenceSafety};

    fn fence(n: u64) -> Option<Fence> {
        Fence::compose("t", Epoch::ZERO, n, FenceSafety::Linearizable).ok()
    }

    fn held(owner: &str, n: u64, ends_by: Option<Instant>) -> Holder {
        Holder {
            owner: Some(OwnerId::peer(owner)),
            fence: fence(n),
            ends_by,
        }
    }

    fn key(k: &str) -> LockKey {
        LockKey::new(k).expect("a valid key")
    }

    #[test]
    fn names_each_kind_of_change() {
        let began = Instant::now();
        let later = began.checked_sub(Duration::from_secs(1));
        let sooner = began.checked_add(Duration::from_secs(5));
        let before = BTreeMap::from([
            (key("a"), held("x", 1, sooner)),
            (key("b"), held("x", 2, sooner)),
            (key("c"), held("x", 3, later)),
            (key("d"), held("x", 4, sooner)),
            (key("z"), held("x", 9, later)),
        ]);
        let after = BTreeMap::from([
            (key("a"), held("x", 1, sooner)),
            (key("b"), held("y", 5, sooner)),
            (key("e"), held("y", 6, sooner)),
        ]);
        let at = SystemTime::now();
        let changes = compare(&before, &after, began, at, |k| k.as_str() < "y");
        let kinds: Vec<(&str, &str)> = changes
            .iter()
            .map(|c| (c.key.as_str(), c.kind.name()))
            .collect();
        // a: renewed, no change; z: past the listed range, not called free.
        assert_eq!(
            kinds,
            [
                ("b", "handed_off"),
                ("c", "expired"),
                ("d", "ended"),
                ("e", "taken")
            ]
        );
        assert_eq!(
            changes[0].describe(),
            "b handed off peer:x (fence 2) -> peer:y (fence 5)"
        );
    }

    #[test]
    fn a_lease_of_unknown_length_that_vanishes_ended_early() {
        let before = BTreeMap::from([(key("a"), held("x", 1, None))]);
        let changes = compare(
            &before,
            &BTreeMap::new(),
            Instant::now(),
            SystemTime::now(),
            |_| true,
        );
        assert_eq!(changes.len(), 1);
        assert_eq!(changes[0].kind.name(), "ended");
    }
}
