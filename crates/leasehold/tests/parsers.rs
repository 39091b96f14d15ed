//! Property tests: the parsers and layouts a user's input reaches, fed arbitrary
//! input. Nothing panics; invalid input is a typed error; round trips are exact; distinct keys
//! never share a place at the authority.
//!
//! Runs with a fixed seed and 256 cases per property in `./scripts/test`; set `PROPTEST_CASES`
//! (and `PROPTEST_RNG_SEED`) for a longer or different run.
#![cfg(all(
    feature = "postgres",
    feature = "redis",
    feature = "etcd",
    feature = "zookeeper",
    feature = "sqlite"
))]

use leasehold::etcd::EtcdConfig;
use leasehold::postgres::PostgresConfig;
use leasehold::redis::{KeyLayout, RedisConfig};
use leasehold::sqlite::SqliteConfig;
use leasehold::zookeeper::{names, ZkConfig};
use leasehold::{Error, KeyPrefix, LockKey, MAX_KEY_LEN};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed, TestCaseError};

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

/// A valid key: 1 to MAX_KEY_LEN printable ASCII characters without spaces.
fn valid_key() -> impl Strategy<Value = String> {
    proptest::collection::vec(33u8..=126, 1..=MAX_KEY_LEN)
        .prop_map(|bytes| String::from_utf8(bytes).unwrap_or_default())
}

/// Anything: any characters (controls, non-ASCII), printable ASCII with spaces, and valid keys
/// with one character changed, at any length around the limit.
fn anything() -> impl Strategy<Value = String> {
    prop_oneof![
        proptest::collection::vec(any::<char>(), 0..=MAX_KEY_LEN + 20)
            .prop_map(|chars| chars.into_iter().collect::<String>()),
        "[ -~]{0,210}",
        (valid_key(), any::<char>(), any::<prop::sample::Index>()).prop_map(|(k, c, at)| {
            let mut chars: Vec<char> = k.chars().collect();
            let i = at.index(chars.len());
            chars[i] = c;
            chars.into_iter().collect()
        }),
        "[!-~]{195,205}",
    ]
}

/// A step of a property that must succeed: its error fails the case and says what was being
/// done, as `or_fail` does for a test that returns a `Result`.
fn must<T, E: std::fmt::Display>(result: Result<T, E>, what: &str) -> Result<T, TestCaseError> {
    result.map_err(|e| TestCaseError::fail(format!("{what}: {e}")))
}

fn is_valid(s: &str) -> bool {
    !s.is_empty() && s.len() <= MAX_KEY_LEN && s.bytes().all(|b| (33..=126).contains(&b))
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn lock_keys_accept_exactly_the_documented_set(s in anything()) {
        match LockKey::new(s.clone()) {
            Ok(key) => {
                prop_assert!(is_valid(&s), "accepted {s:?}");
                prop_assert_eq!(key.as_str(), s.as_str());
            }
            Err(Error::InvalidKey { .. }) => prop_assert!(!is_valid(&s), "refused {s:?}"),
            Err(other) => prop_assert!(false, "{s:?}: not InvalidKey: {other}"),
        }
    }

    #[test]
    fn valid_keys_round_trip(s in valid_key()) {
        let key = must(LockKey::new(s.clone()), "a valid key")?;
        prop_assert_eq!(key.as_str(), s.as_str());
        prop_assert_eq!(key.to_string(), s.clone());
        let prefix = must(KeyPrefix::new(&s[..s.len() / 2]), "half a valid key as a prefix")?;
        prop_assert!(prefix.matches(&key));
    }

    #[test]
    fn key_prefixes_never_panic(s in anything()) {
        let _ = KeyPrefix::new(s);
    }

    /// ZooKeeper node names: leasehold's escaping round-trips every key, and distinct keys get
    /// distinct names.
    #[test]
    fn zookeeper_node_names_round_trip(a in valid_key(), b in valid_key()) {
        let (ka, kb) = (must(LockKey::new(a), "key a")?, must(LockKey::new(b), "key b")?);
        let (na, nb) = (names::node_name_for_key(&ka), names::node_name_for_key(&kb));
        prop_assert!(!na.contains('/'), "{na}");
        prop_assert_eq!(names::key_from_node_name(&na), Some(ka.clone()));
        prop_assert_eq!(ka == kb, na == nb);
    }

    /// Any child name a ZooKeeper server can hand back (leasehold's, kazoo's, Curator's, or
    /// garbage) is parsed without a panic.
    #[test]
    fn zookeeper_child_names_never_panic(s in anything(), n in any::<i64>()) {
        let _ = names::key_from_node_name(&s);
        let _ = names::contender_sequence(&s);
        let _ = names::contender_sequence(&format!("{s}{n:010}"));
        let _ = names::contender_sequence(&format!("{s}{n}"));
        let _ = names::queue(&[s.clone(), format!("{s}{n}")]);
    }

    /// The sequence ZooKeeper appends (`%010d` of a 32-bit counter, so every width
    /// of positive number and, past `i32::MAX`, negative ones with the sign among the ten
    /// characters; or 19 digits of a 64-bit one) reads back exactly, after leasehold's prefix
    /// and after kazoo's and Curator's.
    #[test]
    fn zookeeper_sequences_of_every_width_and_sign_read_back(
        n in any::<i32>(),
        wide in 0..=i64::MAX,
        uuid in "[0-9a-f]{32}",
    ) {
        for prefix in [
            format!("_c_{uuid}-lock-"),
            format!("{uuid}__lock__"),
            format!("_c_{uuid}-lock-").replace("-lock-", "-lease-"),
        ] {
            let name = format!("{prefix}{n:010}");
            prop_assert_eq!(names::contender_sequence(&name), Some(i64::from(n)), "{}", name);
            let name = format!("{prefix}{wide:019}");
            prop_assert_eq!(names::contender_sequence(&name), Some(wide), "{}", name);
        }
        // A suffix of another width is no ZooKeeper sequence.
        let odd = format!("_c_{uuid}-lock-{}", n.unsigned_abs() % 1_000_000);
        prop_assert_eq!(names::contender_sequence(&odd), None, "{}", odd);
    }

    #[test]
    fn zookeeper_values_round_trip(value in proptest::collection::vec(any::<u8>(), 0..512)) {
        prop_assert_eq!(names::decode_value(&names::encode_value(&value)), Some(value));
    }

    /// Redis: distinct keys never share a lock key, and every lock key names its key.
    #[test]
    fn redis_lock_keys_are_distinct(a in valid_key(), b in valid_key()) {
        let layout = KeyLayout::default();
        let (ka, kb) = (must(LockKey::new(a.clone()), "key a")?, must(LockKey::new(b), "key b")?);
        let (la, lb) = (layout.lock_key(&ka), layout.lock_key(&kb));
        prop_assert_eq!(ka == kb, la == lb);
        prop_assert!(la.contains(a.as_str()), "{la}");
        prop_assert_ne!(layout.value_key(&ka), la);
    }

    /// Redis Sentinel URLs: any list of sentinels and any printable master name
    /// (percent-encoded) come back as given, duplicates once, in order.
    #[test]
    fn redis_sentinel_urls_round_trip(
        ports in proptest::collection::vec(1u16..=65535, 1..6),
        name in "[!-~]{1,40}",
        db in proptest::option::of(0u32..100),
    ) {
        let hosts: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let encoded: String = name
            .bytes()
            .map(|b| if b.is_ascii_alphanumeric() { (b as char).to_string() } else { format!("%{b:02X}") })
            .collect();
        let db_path = db.map(|d| format!("/{d}")).unwrap_or_default();
        let url = format!("redis+sentinel://{}/{encoded}{db_path}", hosts.join(","));
        let config = must(RedisConfig::from_url(&url), "the sentinel URL parses")?;
        let mut expected: Vec<String> = Vec::new();
        for h in hosts {
            if !expected.contains(&h) {
                expected.push(h);
            }
        }
        prop_assert_eq!(config.sentinels(), expected);
        prop_assert_eq!(config.sentinel_master_name(), Some(name.as_str()));
    }

    /// Redis Cluster URLs: any list of seed nodes comes back as given, duplicates once, in
    /// order; the database is 0 or absent, and `wait_replicas` is refused with a typed error.
    #[test]
    fn redis_cluster_urls_round_trip(
        ports in proptest::collection::vec(1u16..=65535, 1..7),
        db in proptest::option::of(0u32..100),
        wait in proptest::bool::ANY,
    ) {
        let hosts: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let db_path = db.map(|d| format!("/{d}")).unwrap_or_default();
        let query = if wait { "?wait_replicas=1" } else { "" };
        let url = format!("redis+cluster://u:pw@{}{db_path}{query}", hosts.join(","));
        match RedisConfig::from_url(&url) {
            Ok(config) => {
                prop_assert!(db.unwrap_or(0) == 0 && !wait, "{} was accepted", url);
                let mut expected: Vec<String> = Vec::new();
                for h in hosts {
                    if !expected.contains(&h) {
                        expected.push(h);
                    }
                }
                prop_assert!(config.is_cluster());
                prop_assert_eq!(config.cluster_seeds(), expected);
                let shown = format!("{config:?}");
                prop_assert!(!shown.contains(":pw@"), "{}", shown);
            }
            Err(e) => {
                prop_assert!(db.unwrap_or(0) != 0 || wait, "{}: {}", url, e);
                prop_assert!(matches!(e, Error::InvalidUrl { .. }), "{}: {}", url, e);
            }
        }
    }

    /// Every backend's URL parser, on any text and on its own scheme with any query: a value or
    /// a typed error, never a panic.
    #[test]
    fn urls_never_panic(s in anything(), query in "[ -~]{0,60}") {
        for url in [
            s.clone(),
            format!("postgres://u:p@127.0.0.1:5432/db?{query}"),
            format!("redis://u:p@127.0.0.1:6379/0?{query}"),
            format!("redis+sentinel://u:p@127.0.0.1:26379,[::1]:26380/mymaster/0?{query}"),
            format!("redis+sentinel://{s}"),
            format!("redis+sentinel://h:26379/{s}"),
            format!("redis+sentinel://{s}/mymaster?sentinel_password={query}"),
            format!("redis+cluster://u:p@127.0.0.1:7000,[::1]:7001/0?{query}"),
            format!("redis+cluster://{s}"),
            format!("redis+cluster://{s}:7000,h/{query}"),
            format!("etcd://127.0.0.1:2379?{query}"),
            format!("zk://127.0.0.1:2181/locks?{query}"),
            format!("zks://127.0.0.1:2181/locks?tls_ca=ca.pem&{query}"),
            format!("zks://{s}/locks?tls_ca=ca.pem"),
            format!("sqlite:///tmp/locks.db?{query}"),
        ] {
            let _ = PostgresConfig::from_url(&url);
            let _ = RedisConfig::from_url(&url);
            let _ = EtcdConfig::from_url(&url);
            let _ = ZkConfig::from_url(&url);
            let _ = SqliteConfig::from_url(&url);
        }
    }
}
