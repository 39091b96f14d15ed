//! Where a lock lives in Redis: the key layout.

use leasehold_core::{Error, KeyPrefix, LockKey, Result};

/// The prefix used when the URL names none.
pub const DEFAULT_PREFIX: &str = "leasehold:";

/// The channel releases are announced on when the URL names none.
pub const DEFAULT_CHANNEL: &str = "leasehold:released";

/// The longest prefix, so that prefix + key stays a short key.
const MAX_PREFIX_LEN: usize = 100;

/// Maps a [`LockKey`] to the Redis keys of its lock.
///
/// For the key `invoice:72` under the prefix `leasehold:`:
///
/// | Redis key | type | holds |
/// |---|---|---|
/// | `{leasehold:invoice:72}` | string, with a TTL | exactly the owner token (32 hex digits) |
/// | `{leasehold:invoice:72}:fence` | string, no TTL | the fence counter (`INCR`) |
/// | `{leasehold:invoice:72}:value` | hash, no TTL | the proclaimed value: fields `fence` and `value` |
/// | `{leasehold:invoice:72}:waiters` | sorted set, expires with its last place | the waiting authorities' ids, scored by when their place runs out |
///
/// * The braces are a Redis Cluster hash tag: all three keys hash to the same slot, so the
///   scripts, which touch several, are valid on a cluster too.
/// * The value key exists once a grant proclaimed a value. It carries the fence of that grant,
///   and counts only while that fence is the holder's, so it needs no TTL: a later grant (a
///   greater fence) never sees an earlier grant's value. Release deletes it.
/// * The lock key's value is exactly the owner token, so any client that follows the plain
///   convention (`SET {leasehold:invoice:72} <random> NX PX <ms>`, then a compare-and-delete
///   script) on the same key excludes leasehold and is excluded by it.
/// * The counter never expires and release never deletes it, so fences grow across release and
///   expiry. It costs one small key per lock name ever used.
/// * A lock key always ends in `}`, a counter key in `:fence` and a value key in `:value`, so no
///   lock key is ever some other lock's counter or value.
///
/// Nothing is escaped: keys are printable ASCII already. The prefix may be empty but may not
/// contain braces (they would move the hash tag). One corner remains: with an empty prefix, a key
/// that starts with `}` makes an empty hash tag, so on a Redis Cluster its two keys land in
/// different slots and every script on it fails with `CROSSSLOT` (a permanent error, never a
/// wrong answer). Use a prefix on clusters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyLayout {
    prefix: String,
}

impl Default for KeyLayout {
    fn default() -> Self {
        KeyLayout {
            prefix: DEFAULT_PREFIX.to_string(),
        }
    }
}

impl KeyLayout {
    /// A layout under `prefix`: up to 100 bytes of printable ASCII without spaces or braces;
    /// empty is allowed.
    pub fn new(prefix: &str) -> Result<Self> {
        if prefix.len() > MAX_PREFIX_LEN {
            return Err(Error::InvalidConfig {
                reason: format!(
                    "the key prefix is {} bytes long; at most {MAX_PREFIX_LEN} are allowed",
                    prefix.len()
                ),
            });
        }
        if let Some(c) = prefix
            .chars()
            .find(|c| !c.is_ascii_graphic() || *c == '{' || *c == '}')
        {
            return Err(Error::InvalidConfig {
                reason: format!(
                    "the key prefix contains {c:?}; only printable ASCII without spaces and \
                     braces is allowed"
                ),
            });
        }
        Ok(KeyLayout {
            prefix: prefix.to_string(),
        })
    }

    /// The prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The Redis key that holds the lease: `{<prefix><key>}`.
    pub fn lock_key(&self, key: &LockKey) -> String {
        let mut lock_key = String::with_capacity(self.prefix.len() + key.as_str().len() + 8);
        lock_key.push('{');
        lock_key.push_str(&self.prefix);
        lock_key.push_str(key.as_str());
        lock_key.push('}');
        lock_key
    }

    /// The Redis key of the fence counter: `{<prefix><key>}:fence`.
    pub fn fence_key(&self, key: &LockKey) -> String {
        Self::fence_key_of(&self.lock_key(key))
    }

    /// The fence counter's key for a lock key made by [`KeyLayout::lock_key`].
    pub(crate) fn fence_key_of(lock_key: &str) -> String {
        let mut fence_key = String::with_capacity(lock_key.len() + 6);
        fence_key.push_str(lock_key);
        fence_key.push_str(":fence");
        fence_key
    }

    /// The Redis key of the proclaimed value: `{<prefix><key>}:value`.
    pub fn value_key(&self, key: &LockKey) -> String {
        Self::value_key_of(&self.lock_key(key))
    }

    /// The value key for a lock key made by [`KeyLayout::lock_key`].
    pub(crate) fn value_key_of(lock_key: &str) -> String {
        let mut value_key = String::with_capacity(lock_key.len() + 6);
        value_key.push_str(lock_key);
        value_key.push_str(":value");
        value_key
    }

    /// The waiter queue's key for a lock key made by [`KeyLayout::lock_key`]:
    /// `{<prefix><key>}:waiters`.
    pub(crate) fn waiters_key_of(lock_key: &str) -> String {
        let mut waiters_key = String::with_capacity(lock_key.len() + 8);
        waiters_key.push_str(lock_key);
        waiters_key.push_str(":waiters");
        waiters_key
    }

    /// The `SCAN ... MATCH` pattern of every lock key and counter key of the keys that start
    /// with `prefix`: `{<prefix><key prefix>*`, with the glob's special characters escaped.
    pub(crate) fn scan_pattern(&self, prefix: &KeyPrefix) -> String {
        let mut pattern = String::from("{");
        for c in self.prefix.chars().chain(prefix.as_str().chars()) {
            if matches!(c, '*' | '?' | '[' | ']' | '\\') {
                pattern.push('\\');
            }
            pattern.push(c);
        }
        pattern.push('*');
        pattern
    }

    /// The lock key a Redis key of this layout belongs to (a lock key or a counter key), or
    /// `None` for any other key (a value key among them: it exists only beside a counter, which
    /// is listed). Exact: a lock key ends in `}` and a counter key in `}:fence`, and
    /// [`KeyLayout::lock_key`] of the answer gives the key (or its counter) back.
    pub(crate) fn key_of(&self, redis_key: &str) -> Option<LockKey> {
        let inner = redis_key
            .strip_prefix('{')?
            .strip_prefix(self.prefix.as_str())?;
        let name = inner
            .strip_suffix("}:fence")
            .or_else(|| inner.strip_suffix('}'))?;
        LockKey::new(name).ok()
    }
}

/// Checks a pub/sub channel name: 1 to 200 bytes of printable ASCII without spaces.
pub(crate) fn check_channel(channel: &str) -> Result<()> {
    if channel.is_empty() || channel.len() > 200 || !channel.chars().all(|c| c.is_ascii_graphic()) {
        return Err(Error::InvalidConfig {
            reason: format!(
                "the channel {channel:?} is not 1 to 200 bytes of printable ASCII without spaces"
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold_conformance::kit::{OrFail, TestResult};

    /// The part of a key Redis Cluster hashes (its hash tag rule).
    fn hashed(key: &str) -> &str {
        if let Some(open) = key.find('{') {
            if let Some(len) = key[open + 1..].find('}') {
                if len > 0 {
                    return &key[open + 1..open + 1 + len];
                }
            }
        }
        key
    }

    #[test]
    fn all_keys_share_a_hash_slot_and_never_collide() -> TestResult {
        for prefix in ["leasehold:", "app/", ""] {
            let layout = KeyLayout::new(prefix).or_fail("the key layout")?;
            for key in ["invoice:72", "a}b", "{x}", "x{", "~!", "a:fence", "a:value"] {
                let key = LockKey::new(key).or_fail("the key")?;
                let (lock, fence, value) = (
                    layout.lock_key(&key),
                    layout.fence_key(&key),
                    layout.value_key(&key),
                );
                assert_eq!(hashed(&lock), hashed(&fence), "{lock} / {fence}");
                assert_eq!(hashed(&lock), hashed(&value), "{lock} / {value}");
                assert!(lock.ends_with('}') && fence.ends_with(":fence"));
                assert!(value.ends_with(":value"));
                assert!(lock != fence && lock != value && fence != value);
                assert_eq!(layout.key_of(&value), None, "{value}");
            }
        }
        let layout = KeyLayout::default();
        let key = LockKey::new("invoice:72").or_fail("the key invoice:72")?;
        assert_eq!(layout.lock_key(&key), "{leasehold:invoice:72}");
        assert_eq!(layout.fence_key(&key), "{leasehold:invoice:72}:fence");
        assert_eq!(layout.value_key(&key), "{leasehold:invoice:72}:value");
        Ok(())
    }

    #[test]
    fn scanned_keys_map_back_to_their_lock_keys() -> TestResult {
        for prefix in ["leasehold:", "a*[?]\\", ""] {
            let layout = KeyLayout::new(prefix).or_fail("the key layout")?;
            for key in ["invoice:72", "a}b", "x}:fence", "{x}", "a:fence", "*"] {
                let key = LockKey::new(key).or_fail("the key")?;
                assert_eq!(layout.key_of(&layout.lock_key(&key)), Some(key.clone()));
                assert_eq!(layout.key_of(&layout.fence_key(&key)), Some(key.clone()));
            }
            assert_eq!(layout.key_of(&format!("{prefix}x")), None);
            assert_eq!(layout.key_of(&format!("{{{prefix}}}")), None);
        }
        let layout = KeyLayout::new("p*").or_fail("the key layout p*")?;
        let prefix = KeyPrefix::new("a?[b]\\").or_fail("the prefix with glob characters")?;
        assert_eq!(layout.scan_pattern(&prefix), "{p\\*a\\?\\[b\\]\\\\*");
        assert_eq!(
            KeyLayout::default().scan_pattern(&KeyPrefix::all()),
            "{leasehold:*"
        );
        Ok(())
    }

    #[test]
    fn prefixes_are_checked() -> TestResult {
        for bad in ["a b", "{a", "a}", "é", &"p".repeat(101)] {
            assert!(matches!(
                KeyLayout::new(bad),
                Err(Error::InvalidConfig { .. })
            ));
        }
        assert_eq!(
            KeyLayout::new("").or_fail("the empty key layout")?.prefix(),
            ""
        );
        assert!(check_channel("leasehold:released").is_ok());
        assert!(check_channel("").is_err() && check_channel("a b").is_err());
        Ok(())
    }
}
