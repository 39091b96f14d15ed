//! Where lock keys live in etcd's keyspace: the layout of etcd's own lock recipe.

use leasehold_core::{KeyPrefix, LockKey};

/// Maps lock keys to etcd prefixes under one namespace.
///
/// # Layout
/// Lock key `k` is the prefix `<namespace>/<escape(k)>/`. Every contender (a lock holder or a
/// waiter) writes its own key under that prefix, attached to its session's lease, and the
/// contender with the lowest `create_revision` holds the lock. This is the layout of etcd's
/// `client/v3/concurrency` Mutex and of `etcdctl lock`, so `etcdctl lock <namespace>/<k>` and
/// leasehold exclude each other.
///
/// `escape` replaces `%` by `%25` and `/` by `%2F`, so the prefix of `a` (`ns/a/`) is never a
/// prefix of `a/b`'s keys (`ns/a%2Fb/...`): without it, a holder of `a/b` would sit inside
/// `a`'s queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct KeySpace {
    namespace: String,
}

impl KeySpace {
    /// Keys under `namespace` (already validated by the configuration).
    pub fn new(namespace: &str) -> Self {
        KeySpace {
            namespace: namespace.to_string(),
        }
    }

    /// The prefix every contender of `key` writes under, ending in `/`.
    pub fn prefix(&self, key: &LockKey) -> String {
        format!("{}/{}/", self.namespace, escape(key.as_str()))
    }

    /// The etcd key range `[start, end)` that holds every contender of every lock key starting
    /// with `prefix`. Escaping maps each character to a code no other code starts, so a key
    /// starts with `prefix` exactly when its escaped form starts with the escaped prefix.
    pub fn range(&self, prefix: &KeyPrefix) -> (String, String) {
        let start = format!("{}/{}", self.namespace, escape(prefix.as_str()));
        let mut end = start.clone();
        // Namespaces and escaped keys are ASCII: the last byte plus one is a character.
        if let Some(last) = end.pop() {
            end.push(char::from(last as u8 + 1));
        }
        (start, end)
    }

    /// The lock key a contender's etcd key belongs to, or `None` for a key in the namespace
    /// that is not a contender of a valid lock key.
    pub fn key_of(&self, etcd_key: &[u8]) -> Option<LockKey> {
        let text = std::str::from_utf8(etcd_key).ok()?;
        let rest = text
            .strip_prefix(self.namespace.as_str())?
            .strip_prefix('/')?;
        let (escaped, _contender) = rest.split_once('/')?;
        LockKey::new(unescape(escaped)?).ok()
    }

    /// The first etcd key after every contender of `key`: its prefix with the final `/`
    /// replaced by `0`, the next character. Escaped keys hold no `/`, so nothing of another
    /// lock key lies between the two.
    pub fn after(&self, key: &LockKey) -> String {
        let mut next = self.prefix(key);
        next.pop();
        next.push('0');
        next
    }
}

/// The inverse of [`escape`]; `None` for text `escape` never makes.
fn unescape(escaped: &str) -> Option<String> {
    let mut out = String::with_capacity(escaped.len());
    let mut rest = escaped;
    while let Some(at) = rest.find('%') {
        out.push_str(&rest[..at]);
        let code = rest.get(at..at + 3)?;
        out.push(match code {
            "%25" => '%',
            "%2F" => '/',
            _ => return None,
        });
        rest = &rest[at + 3..];
    }
    out.push_str(rest);
    Some(out)
}

/// The `etcdctl lock` name that shares `key`'s queue (the prefix without its trailing `/`).
pub(crate) fn lock_name(space: &KeySpace, key: &LockKey) -> String {
    let mut prefix = space.prefix(key);
    prefix.pop();
    prefix
}

/// The contender key a session writes for its `n`-th concurrent contender under `prefix`:
/// `<prefix><lease id in lowercase hex>` like etcd's Mutex for the first, with `_<n>` appended for
/// the others, so two acquisitions through one session are two contenders that exclude each other
/// (etcd's Mutex gives both the same key, and both believe they hold the lock).
pub(crate) fn contender(prefix: &str, lease: i64, n: u64) -> String {
    if n == 0 {
        format!("{prefix}{lease:x}")
    } else {
        format!("{prefix}{lease:x}_{n}")
    }
}

fn escape(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for c in key.chars() {
        match c {
            '%' => out.push_str("%25"),
            '/' => out.push_str("%2F"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(s: &str) -> LockKey {
        LockKey::new(s).unwrap()
    }

    #[test]
    fn slashes_cannot_nest_one_lock_inside_another() {
        let space = KeySpace::new("leasehold");
        let a = space.prefix(&key("a"));
        let ab = space.prefix(&key("a/b"));
        assert_eq!(a, "leasehold/a/");
        assert_eq!(ab, "leasehold/a%2Fb/");
        assert!(!ab.starts_with(&a));
        // `%` is escaped too, so an escaped-looking key cannot collide with a real slash.
        assert_eq!(space.prefix(&key("a%2Fb")), "leasehold/a%252Fb/");
        assert_eq!(lock_name(&space, &key("a/b")), "leasehold/a%2Fb");
    }

    #[test]
    fn listing_ranges_hold_exactly_the_keys_under_a_prefix() {
        let space = KeySpace::new("leasehold");
        let (start, end) = space.range(&KeyPrefix::new("a/").unwrap());
        assert_eq!(
            (start.as_str(), end.as_str()),
            ("leasehold/a%2F", "leasehold/a%2G")
        );
        let inside = |k: &str| {
            let c = contender(&space.prefix(&key(k)), 0x69, 0);
            c >= start && c < end
        };
        assert!(inside("a/") && inside("a/b") && inside("a/%"));
        assert!(!inside("a") && !inside("a%2F") && !inside("b/"));
        let (all, end) = space.range(&KeyPrefix::all());
        assert_eq!((all.as_str(), end.as_str()), ("leasehold/", "leasehold0"));
        for k in ["a", "a/b", "a%2Fb", "%", "x/y/z%"] {
            let c = contender(&space.prefix(&key(k)), 0x69, 2);
            assert_eq!(space.key_of(c.as_bytes()), Some(key(k)), "{c}");
            assert!(space.after(&key(k)) > c);
        }
        // The next lock key in order sorts after `after`, the contenders of this one before.
        assert!(space.prefix(&key("a!")) < space.prefix(&key("a")));
        assert!(space.after(&key("a")) < space.prefix(&key("a0")));
        for stray in [
            "leasehold/a",
            "other/a/1",
            "leasehold/%zz/1",
            "leasehold//1",
        ] {
            assert_eq!(space.key_of(stray.as_bytes()), None, "{stray}");
        }
    }

    #[test]
    fn contender_keys_are_unique_per_session_and_acquisition() {
        assert_eq!(contender("ns/k/", 0x694d, 0), "ns/k/694d");
        assert_eq!(contender("ns/k/", 0x694d, 3), "ns/k/694d_3");
        // A suffixed name is never another lease's plain name: hex has no `_`.
        assert_ne!(contender("ns/k/", 0x69, 4), contender("ns/k/", 0x694, 0));
    }
}
