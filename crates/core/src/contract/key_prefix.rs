//! A prefix of lock keys, for listing what an authority holds under it.

use std::fmt;
use std::sync::Arc;

use crate::contract::error::{Error, Result};
use crate::contract::key::{LockKey, MAX_KEY_LEN};

/// The start of lock keys, as `leasehold status --prefix` and [`crate::Authority::list_keys`]
/// take it: `invoice:` lists `invoice:72` and `invoice:73`.
///
/// The same characters as a [`LockKey`] (printable ASCII without spaces, at most
/// [`MAX_KEY_LEN`] bytes), except that it may be empty, which lists every key. It is a plain
/// byte prefix: no wildcards, and nothing in it is special to any backend (each escapes it as it
/// escapes keys, so `a*` lists keys that start with `a*`, not every key after `a`).
///
/// ```
/// use leasehold_core::{KeyPrefix, LockKey};
/// let prefix = KeyPrefix::new("invoice:").unwrap();
/// assert!(prefix.matches(&LockKey::new("invoice:72").unwrap()));
/// assert!(!prefix.matches(&LockKey::new("payout:72").unwrap()));
/// assert!(KeyPrefix::new("has space").is_err());
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyPrefix(Arc<str>);

impl KeyPrefix {
    /// Validates `prefix` and wraps it.
    pub fn new(prefix: impl AsRef<str>) -> Result<Self> {
        let prefix = prefix.as_ref();
        if prefix.len() > MAX_KEY_LEN {
            return Err(Error::InvalidKey {
                reason: format!(
                    "the key prefix is {} bytes long; at most {MAX_KEY_LEN} are allowed",
                    prefix.len()
                ),
            });
        }
        if !prefix.is_empty() {
            // A non-empty prefix is exactly a key's start: check it as a key.
            LockKey::new(prefix).map_err(|e| match e {
                Error::InvalidKey { reason } => Error::InvalidKey {
                    reason: format!("in the key prefix: {reason}"),
                },
                other => other,
            })?;
        }
        Ok(KeyPrefix(Arc::from(prefix)))
    }

    /// The empty prefix: every key.
    pub fn all() -> Self {
        KeyPrefix(Arc::from(""))
    }

    /// The prefix as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether `key` starts with this prefix.
    pub fn matches(&self, key: &LockKey) -> bool {
        key.as_str().starts_with(self.as_str())
    }

    /// The smallest text above every text that starts with this prefix, for a range scan
    /// (`key >= prefix AND key < upper`); `None` for the empty prefix (no upper bound).
    ///
    /// The prefix is ASCII, so its last byte plus one is still a single-byte character (at most
    /// `0x7F`, which no key contains).
    pub fn upper_bound(&self) -> Option<String> {
        let mut upper = self.0.to_string();
        let last = upper.pop()?;
        upper.push(char::from(last as u8 + 1));
        Some(upper)
    }
}

impl fmt::Display for KeyPrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for KeyPrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeyPrefix({:?})", &*self.0)
    }
}

/// Keeps the `limit` smallest keys seen, for backends that can only scan in no useful order.
#[derive(Debug)]
pub struct SmallestKeys {
    keys: std::collections::BTreeSet<LockKey>,
    limit: usize,
}

impl SmallestKeys {
    /// Room for `limit` keys.
    pub fn new(limit: usize) -> Self {
        SmallestKeys {
            keys: std::collections::BTreeSet::new(),
            limit,
        }
    }

    /// Offers a key: kept if it is among the `limit` smallest so far.
    pub fn offer(&mut self, key: LockKey) {
        if self.limit == 0 || self.keys.contains(&key) {
            return;
        }
        if self.keys.len() == self.limit {
            match self.keys.last() {
                Some(largest) if *largest > key => {
                    self.keys.pop_last();
                }
                _ => return,
            }
        }
        self.keys.insert(key);
    }

    /// The keys kept, in ascending order.
    pub fn into_sorted(self) -> Vec<LockKey> {
        self.keys.into_iter().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type TestResult<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

    fn key(s: &str) -> LockKey {
        LockKey::new(s).expect("the key")
    }

    #[test]
    fn prefixes_are_key_starts_or_empty() -> TestResult {
        assert!(KeyPrefix::new("")
            .map_err(|e| format!("the empty prefix: {e}"))?
            .matches(&key("a")));
        assert!(KeyPrefix::new("a/")
            .map_err(|e| format!("the prefix a/: {e}"))?
            .matches(&key("a/b")));
        assert!(!KeyPrefix::new("a/")
            .map_err(|e| format!("the prefix a/: {e}"))?
            .matches(&key("a")));
        for bad in ["a b", "é", "\n", &"x".repeat(MAX_KEY_LEN + 1)] {
            let e = KeyPrefix::new(bad)
                .err()
                .ok_or("an invalid prefix: it succeeded")?;
            assert!(matches!(e, Error::InvalidKey { .. }), "{bad:?}: {e}");
            assert!(e.to_string().contains("prefix"), "{e}");
        }
        Ok(())
    }

    #[test]
    fn the_upper_bound_is_above_every_matching_key_and_below_the_rest() -> TestResult {
        assert_eq!(KeyPrefix::all().upper_bound(), None);
        let p = KeyPrefix::new("a~").map_err(|e| format!("the prefix a~: {e}"))?;
        let upper = p.upper_bound().ok_or("the upper bound of a~")?;
        assert_eq!(upper, "a\u{7f}");
        for k in ["a~", "a~~~", "a~!"] {
            assert!(k >= p.as_str() && k < upper.as_str(), "{k}");
        }
        for k in ["b", "a}", "a"] {
            assert!(!(k >= p.as_str() && k < upper.as_str()), "{k}");
        }
        Ok(())
    }

    #[test]
    fn smallest_keys_keeps_the_first_in_order() {
        let mut s = SmallestKeys::new(2);
        for k in ["d", "b", "e", "a", "c", "b", "a"] {
            s.offer(key(k));
        }
        assert_eq!(s.into_sorted(), vec![key("a"), key("b")]);
        // A key offered twice (Redis lists a lock key and its counter) is kept once, and does
        // not push out another.
        let mut twice = SmallestKeys::new(2);
        for k in ["b", "a", "a"] {
            twice.offer(key(k));
        }
        assert_eq!(twice.into_sorted(), vec![key("a"), key("b")]);
        let mut none = SmallestKeys::new(0);
        none.offer(key("a"));
        assert!(none.into_sorted().is_empty());
    }
}
