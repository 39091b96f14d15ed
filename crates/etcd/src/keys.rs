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
    use leasehold_conformance::kit::{OrFail, TestResult};

    fn key(s: &str) -> LockKey {
        LockKey::new(s).expect("the key")
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
    fn listing_ranges_hold_exactly_the_keys_under_a_prefix() -> TestResult {
        let space = KeySpace::new("leasehold");
        let (start, end) = space.range(&KeyPrefix::new("a/").or_fail("the prefix a/")?);
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
        Ok(())
    }

    #[test]
    fn contender_keys_are_unique_per_session_and_acquisition() {
        assert_eq!(contender("ns/k/", 0x694d, 0), "ns/k/694d");
        assert_eq!(contender("ns/k/", 0x694d, 3), "ns/k/694d_3");
        // A suffixed name is never another lease's plain name: hex has no `_`.
        assert_ne!(contender("ns/k/", 0x69, 4), contender("ns/k/", 0x694, 0));
    }

    mod properties {
        use leasehold_core::MAX_KEY_LEN;
        use proptest::prelude::*;
        use proptest::test_runner::{Config, RngSeed};

        use super::super::*;

        /// A fixed seed, so `./scripts/test` runs the same cases every time; `PROPTEST_CASES` and
        /// `PROPTEST_RNG_SEED` run more or others.
        fn config() -> Config {
            let mut config = Config {
                failure_persistence: None,
                ..Config::default()
            };
            if std::env::var_os("PROPTEST_RNG_SEED").is_none() {
                config.rng_seed = RngSeed::Fixed(2026);
            }
            config
        }

        /// Valid lock keys, rich in the two characters escaping changes.
        fn valid_key() -> impl Strategy<Value = String> {
            prop_oneof![
                proptest::collection::vec(33u8..=126, 1..=MAX_KEY_LEN)
                    .prop_map(|b| String::from_utf8(b).unwrap_or_default()),
                "[a%/]{1,12}",
            ]
        }

        proptest! {
            #![proptest_config(config())]

            /// Escaping round-trips exactly, for any text, and its output holds no
            /// `/`, so a lock key is always one path segment.
            #[test]
            fn escaping_round_trips_and_never_leaves_a_slash(s in any::<String>()) {
                let escaped = escape(&s);
                prop_assert!(!escaped.contains('/'));
                prop_assert_eq!(unescape(&escaped), Some(s));
            }

            /// Every contender key of a lock key maps back to exactly that key.
            #[test]
            fn contender_keys_map_back_to_their_lock_key(
                k in valid_key(),
                lease in any::<i64>(),
                n in any::<u64>(),
            ) {
                let space = KeySpace::new("ns");
                let key = LockKey::new(&k)?;
                let c = contender(&space.prefix(&key), lease, n);
                prop_assert_eq!(space.key_of(c.as_bytes()), Some(key.clone()));
                prop_assert!(space.after(&key) > c);
            }

            /// Two distinct keys never share a queue: neither's prefix starts the other's.
            #[test]
            fn distinct_keys_never_nest(a in valid_key(), b in valid_key()) {
                prop_assume!(a != b);
                let space = KeySpace::new("ns");
                let (pa, pb) = (
                    space.prefix(&LockKey::new(&a)?),
                    space.prefix(&LockKey::new(&b)?),
                );
                prop_assert!(!pa.starts_with(&pb) && !pb.starts_with(&pa));
            }

            /// A key's contenders lie in a prefix's listing range exactly when the key starts
            /// with the prefix.
            #[test]
            fn listing_ranges_hold_exactly_the_keys_with_the_prefix(
                k in valid_key(),
                p in "[a%/]{0,6}",
            ) {
                let space = KeySpace::new("ns");
                let Ok(prefix) = KeyPrefix::new(&p) else {
                    return Ok(());
                };
                let (start, end) = space.range(&prefix);
                let c = contender(&space.prefix(&LockKey::new(&k)?), 1, 0);
                let inside = start <= c && c < end;
                prop_assert_eq!(inside, k.starts_with(&p), "{} in [{}, {})", c, start, end);
            }

            /// Any bytes under the namespace: a key or `None`, never a panic.
            #[test]
            fn any_etcd_key_reads_without_panicking(
                bytes in proptest::collection::vec(any::<u8>(), 0..64),
            ) {
                let space = KeySpace::new("ns");
                let mut key = b"ns/".to_vec();
                key.extend_from_slice(&bytes);
                if let Some(found) = space.key_of(&key) {
                    // What it reads is what the layout would write for that key.
                    prop_assert!(key.starts_with(space.prefix(&found).as_bytes()));
                }
            }
        }
    }
}
