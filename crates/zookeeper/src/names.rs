//! Node names: where a lock key lives, and how contender nodes are named and ordered.
//!
//! # Layout
//! ```text
//! <chroot>/<escaped key>                                   container node, one per key
//! <chroot>/<escaped key>/_c_<uuid>-lock-0000000042         a leasehold or Curator contender
//! <chroot>/<escaped key>/8f14e45fceea167a__lock__0000000043  a kazoo contender
//! ```
//! The contender with the lowest sequence number holds the lock. leasehold names its nodes the
//! way Apache Curator's `InterProcessMutex` does (the "protected" form, with a UUID), so a
//! Curator service and a leasehold service locking the same path exclude each other. It orders
//! every child that ends in a ZooKeeper sequence suffix, whatever its prefix, so kazoo's
//! `Lock` nodes (and any other sequential recipe's) exclude it too.
//!
//! # Data
//! A contender node is created empty. A holder that proclaims a value
//! ([`leasehold_core::Authority::proclaim`]) writes [`VALUE_TAG`] followed by the value's bytes
//! (see [`encode_value`]): a Curator node, named like ours, carries its client's address or a
//! participant id by default, and the tag keeps that from being shown as a proclaimed value.

use leasehold_core::{LockKey, OwnerId, OwnerToken};

/// What leasehold and Curator's `InterProcessMutex` put between the UUID and the sequence.
pub const LOCK_NAME: &str = "lock-";

/// What a proclaimed value's node data starts with: a line of text of its own, so `zkCli get`
/// shows the value readably below it, and Curator's or kazoo's data (an address, a participant
/// id, an identifier) is never taken for a value.
pub const VALUE_TAG: &[u8] = b"leasehold:value\n";

/// The node data that carries `value`: [`VALUE_TAG`], then the bytes as they are (any bytes:
/// the tag alone says where the value starts, and the node's data length where it ends).
pub fn encode_value(value: &[u8]) -> Vec<u8> {
    let mut data = Vec::with_capacity(VALUE_TAG.len() + value.len());
    data.extend_from_slice(VALUE_TAG);
    data.extend_from_slice(value);
    data
}

/// The value a node's data carries, if it was written by [`encode_value`]; `None` for an empty
/// node (a holder that proclaimed nothing) and for anyone else's data.
pub fn decode_value(data: &[u8]) -> Option<Vec<u8>> {
    data.strip_prefix(VALUE_TAG).map(<[u8]>::to_vec)
}

/// The node name of a lock key's parent: the key, with `%` and `/` percent-escaped (and `.`,
/// `..` and `zookeeper`, which ZooKeeper reserves, escaped too). Reversible with
/// [`key_from_node_name`].
///
/// Keys are printable ASCII (see [`LockKey`]), so nothing else needs escaping: ZooKeeper
/// refuses only `/`, control characters and some Unicode ranges in node names.
pub fn node_name_for_key(key: &LockKey) -> String {
    let key = key.as_str();
    match key {
        "." => return "%2E".into(),
        ".." => return "%2E%2E".into(),
        // Only reserved at the root, but escaping it everywhere keeps the mapping independent
        // of the chroot.
        "zookeeper" => return "%7Aookeeper".into(),
        _ => {}
    }
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

/// The lock key a parent node name stands for, or `None` if it is not a name
/// [`node_name_for_key`] produces.
pub fn key_from_node_name(name: &str) -> Option<LockKey> {
    let bytes = name.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = name.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    let key = LockKey::new(String::from_utf8(out).ok()?).ok()?;
    // Only the canonical escaping maps back, so the mapping is one-to-one.
    (node_name_for_key(&key) == name).then_some(key)
}

/// The owner token as a UUID (`8-4-4-4-12` hex digits), the form Curator's protected mode
/// expects after `_c_`: its tooling recognises a protected node by that length and the `-`
/// after it.
pub(crate) fn uuid_of(owner: OwnerToken) -> String {
    let hex = owner.to_hex();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// Who a contender node belongs to, as [`leasehold_core::Inspection`] shows it: the short id of
/// the UUID in a `_c_<uuid>-lock-` name (a leasehold owner token, or a Curator client's UUID:
/// the two cannot be told apart, and neither authorizes anything in ZooKeeper, where only the
/// session may delete its node), `peer:kazoo` for kazoo's `__lock__` nodes, and `peer:foreign`
/// for any other sequential recipe.
pub(crate) fn owner_of(node: &str) -> OwnerId {
    let protected = node
        .strip_prefix("_c_")
        .and_then(|rest| rest.get(..36))
        .filter(|_| {
            node.get(39..)
                .and_then(|r| r.strip_prefix('-'))
                .is_some_and(|r| r.starts_with(LOCK_NAME))
        })
        .map(|uuid| uuid.replace('-', ""))
        .and_then(|hex| hex.parse::<OwnerToken>().ok());
    match protected {
        Some(token) => OwnerId::of(&token),
        None if node.contains("__lock__") => OwnerId::peer("kazoo"),
        None => OwnerId::peer("foreign"),
    }
}

/// The name prefix of this owner's contender node, `_c_<uuid>-lock-`; ZooKeeper appends the
/// sequence. The UUID lets a client that lost the create's reply find its node again.
pub(crate) fn contender_prefix(owner: OwnerToken) -> String {
    format!("_c_{}-{LOCK_NAME}", uuid_of(owner))
}

/// The sequence number of a contender node as ZooKeeper made it, or `None` for a child that is
/// not a sequential node.
///
/// ZooKeeper appends `%010d` of the parent's child version, an `i32` that goes up with every
/// child created or deleted: `0000000042`, and past `i32::MAX` negative numbers (`-2147483648`
/// up to `-000000001`, the sign counting towards the ten characters), then `0000000000` again.
/// A negative suffix is recognised after a separator (`-lock--000000001`,
/// `__lock__-2147483648`); 19 digits are a 64-bit sequence (ZOOKEEPER-4706).
///
/// Every recipe that queues sequential nodes under the parent is ordered by this suffix alone,
/// never by the whole name (the prefixes are random UUIDs), and in the order ZooKeeper made
/// them, which past `i32::MAX` is not the numeric order: see [`queue`].
pub fn contender_sequence(name: &str) -> Option<i64> {
    let digits = name.bytes().rev().take_while(u8::is_ascii_digit).count();
    let start = name.len() - digits;
    let before = &name.as_bytes()[..start];
    let signed = matches!(before, [.., b'-' | b'_', b'-']);
    match (digits, signed) {
        (19, false) | (10, false) => name[start..].parse().ok(),
        // `%010d` pads a negative number to nine digits after the sign; one of ten digits has
        // no padding, and stops at i32::MIN.
        (9, true) | (10, true) => {
            let magnitude: i64 = name[start..].parse().ok()?;
            let fits = if digits == 9 {
                magnitude > 0
            } else {
                (1_000_000_000..=1 << 31).contains(&magnitude)
            };
            fits.then_some(-magnitude)
        }
        _ => None,
    }
}

/// A contender's place in the order ZooKeeper made them: the 32-bit counter read unsigned, so a
/// negative suffix (made after `2147483647`) comes after every positive one.
fn creation_key(sequence: i64) -> u64 {
    match i32::try_from(sequence) {
        Ok(s) => u64::from(s as u32),
        Err(_) => sequence as u64,
    }
}

/// The children that queue for the lock, in the order ZooKeeper made them: first the holder,
/// then the waiters.
///
/// The 32-bit counter also wraps from `-000000001` to `0000000000`. The contenders present at
/// once were all made within far less than 2^31 steps of each other, so when the gap between
/// two neighbours (in unsigned order) is more than half the counter's range, the counter wrapped
/// there: the ones after the gap are the older ones.
pub fn queue(children: &[String]) -> Vec<String> {
    ordered(children).into_iter().map(|c| c.name).collect()
}

fn ordered(children: &[String]) -> Vec<Contender> {
    let mut contenders: Vec<Contender> = children
        .iter()
        .filter_map(|name| {
            contender_sequence(name).map(|sequence| Contender {
                name: name.clone(),
                sequence,
            })
        })
        .collect();
    contenders.sort_by(|a, b| {
        (creation_key(a.sequence), &a.name).cmp(&(creation_key(b.sequence), &b.name))
    });
    const HALF: u64 = 1 << 31;
    let wrapped = contenders.windows(2).position(|pair| {
        let (a, b) = (
            creation_key(pair[0].sequence),
            creation_key(pair[1].sequence),
        );
        b <= u64::from(u32::MAX) && b - a > HALF
    });
    if let Some(gap) = wrapped {
        contenders.rotate_left(gap + 1);
    }
    contenders
}

/// One child of a lock's parent that queues for the lock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Contender {
    pub name: String,
    pub sequence: i64,
}

/// Where my node stands among the children of the lock's parent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Position {
    /// My node has the lowest sequence: the lock is mine.
    First {
        /// My node (the lowest of the nodes carrying my prefix).
        mine: Contender,
        /// Other nodes carrying my prefix: creates whose replies were lost and that the server
        /// applied anyway. They are mine to delete.
        extras: Vec<Contender>,
    },
    /// Someone is ahead: `predecessor` is the contender just before my node.
    Behind {
        /// My node.
        mine: Contender,
        /// The contender just ahead of mine, the only one to watch.
        predecessor: Contender,
        /// How many contenders are ahead of mine.
        ahead: usize,
        /// As in `First`.
        extras: Vec<Contender>,
    },
    /// No child carries my prefix: my node is gone (session expired, or deleted by an operator).
    Gone,
}

/// Orders `children` and finds the node(s) named with `prefix`.
pub(crate) fn position(children: &[String], prefix: &str) -> Position {
    let contenders = ordered(children);
    let Some(at) = contenders.iter().position(|c| c.name.starts_with(prefix)) else {
        return Position::Gone;
    };
    let mut ahead = contenders;
    let mut rest = ahead.split_off(at).into_iter();
    let Some(me) = rest.next() else {
        return Position::Gone;
    };
    let extras: Vec<Contender> = rest.filter(|c| c.name.starts_with(prefix)).collect();
    match ahead.pop() {
        None => Position::First { mine: me, extras },
        Some(predecessor) => Position::Behind {
            mine: me,
            predecessor,
            ahead: ahead.len() + 1,
            extras,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold_conformance::kit::{OrFail, TestResult};

    #[test]
    fn owners_are_short_ids_or_peers() -> TestResult {
        let owner = OwnerToken::generate().or_fail("a generated owner token")?;
        let ours = format!("{}0000000042", contender_prefix(owner));
        assert_eq!(owner_of(&ours), OwnerId::of(&owner));
        assert_eq!(
            owner_of("8f14e45fceea167a8f14e45fceea167a__lock__0000000043").as_str(),
            "peer:kazoo"
        );
        assert_eq!(owner_of("x-0000000044").as_str(), "peer:foreign");
        assert_eq!(
            owner_of("_c_short-lock-0000000045").as_str(),
            "peer:foreign"
        );
        Ok(())
    }

    #[test]
    fn values_round_trip_and_foreign_data_is_no_value() {
        for value in [&b""[..], b"10.0.0.1:7000", b"\0\xff\n", VALUE_TAG] {
            assert_eq!(decode_value(&encode_value(value)).as_deref(), Some(value));
        }
        // An empty node, Curator's default data (its client's address), kazoo's identifier.
        for data in [&b""[..], b"127.0.1.1", b"worker-1", b"leasehold:value"] {
            assert_eq!(decode_value(data), None, "{data:?}");
        }
    }

    #[test]
    fn keys_map_to_node_names_and_back() -> TestResult {
        for (key, name) in [
            ("invoice:inv_72", "invoice:inv_72"),
            ("a/b/c", "a%2Fb%2Fc"),
            ("100%", "100%25"),
            ("%2F", "%252F"),
            (".", "%2E"),
            ("..", "%2E%2E"),
            ("...", "..."),
            ("zookeeper", "%7Aookeeper"),
            ("zookeeper2", "zookeeper2"),
            ("!~@#$^&*()", "!~@#$^&*()"),
        ] {
            let k = LockKey::new(key).or_fail("the key")?;
            assert_eq!(node_name_for_key(&k), name, "{key}");
            assert_eq!(key_from_node_name(name), Some(k), "{name}");
        }
        // Names that no key maps to.
        for name in ["a/b", "%2f", "%zz", "%", "%2", ".", "..", "zookeeper", ""] {
            assert_eq!(key_from_node_name(name), None, "{name}");
        }
        let long = LockKey::new("/".repeat(200)).or_fail("the long key")?;
        assert_eq!(node_name_for_key(&long).len(), 600);
        Ok(())
    }

    #[test]
    fn sequences_of_curator_kazoo_and_others() -> TestResult {
        let owner = OwnerToken::generate().or_fail("a generated owner token")?;
        let prefix = contender_prefix(owner);
        assert_eq!(prefix.len(), 3 + 36 + 1 + LOCK_NAME.len());
        assert_eq!(&prefix[39..40], "-", "Curator's protected-name check");
        assert_eq!(contender_sequence(&format!("{prefix}0000000042")), Some(42));
        assert_eq!(
            contender_sequence("8f14e45fceea167a5a36dedd4bea2543__lock__0000000007"),
            Some(7)
        );
        assert_eq!(contender_sequence("x__rlock__0000000008"), Some(8));
        assert_eq!(contender_sequence("n-0000000009"), Some(9));
        assert_eq!(
            contender_sequence("_c_x-lock-0000000000000000011"),
            Some(11)
        );
        assert_eq!(
            contender_sequence("_c_x-lock--2147483648"),
            Some(-2147483648)
        );
        assert_eq!(
            contender_sequence("k__lock__-2147483647"),
            Some(-2147483647)
        );
        for not in ["leader", "lock-", "lock-123", "x0000000001x", "12345678901"] {
            assert_eq!(contender_sequence(not), None, "{not}");
        }
        Ok(())
    }

    /// ZooKeeper names a sequential node with `%010d` of the parent's child version, an `i32`
    /// that goes negative past `i32::MAX` (`-2147483648`, ..., `-000000001`) and then wraps to
    /// `0000000000`. Those names must parse, and order as they were made.
    #[test]
    fn sequences_past_i32_max_parse_and_order_as_zookeeper_makes_them() -> TestResult {
        let c = |seq: &str| format!("_c_00000000-0000-0000-0000-00000000000c-lock-{seq}");
        let k = |seq: &str| format!("0123456789abcdef__lock__{seq}");
        assert_eq!(contender_sequence(&c("-000000001")), Some(-1));
        assert_eq!(contender_sequence(&k("-000000042")), Some(-42));
        assert_eq!(contender_sequence(&c("-999999999")), Some(-999_999_999));
        assert_eq!(contender_sequence(&c("-1000000000")), Some(-1_000_000_000));
        assert_eq!(contender_sequence(&k("-2147483648")), Some(i32::MIN as i64));
        assert_eq!(contender_sequence(&c("2147483647")), Some(i32::MAX as i64));
        // Not what `%010d` of an i32 makes.
        for not in [
            c("-2147483649"),
            c("-00000001"),
            k("-0000000001"),
            c("000000001"),
        ] {
            assert_eq!(contender_sequence(&not), None, "{not}");
        }

        let me = "_c_ffffffff-0000-0000-0000-000000000000-lock-";
        // (mine, others): in each case the others were made before mine.
        for (mine, others) in [
            // Past i32::MAX: the negative one is the later.
            ("-2147483648", vec![k("2147483646"), c("2147483647")]),
            (
                "-000000001",
                vec![c("2147483000"), k("-2147483648"), c("-000000002")],
            ),
            // Past -1 the counter wraps to 0: still later.
            ("0000000000", vec![k("-000000003"), c("-000000001")]),
            ("0000000005", vec![c("-000000001"), k("0000000002")]),
        ] {
            let mut children = others.clone();
            children.push(format!("{me}{mine}"));
            match position(&children, me) {
                Position::Behind {
                    predecessor, ahead, ..
                } => {
                    assert_eq!(ahead, others.len(), "{mine} behind {others:?}");
                    assert_eq!(
                        predecessor.name,
                        *others.last().or_fail("the last other contender")?,
                        "{mine} behind {others:?}"
                    );
                }
                other => panic!("{mine} behind {others:?}: {other:?}"),
            }
            let mut made = others.clone();
            made.push(format!("{me}{mine}"));
            let mut shuffled = made.clone();
            shuffled.reverse();
            shuffled.push("leader".into());
            assert_eq!(queue(&shuffled), made, "the holder is the earliest made");
        }
        Ok(())
    }

    #[test]
    fn position_orders_by_sequence_not_by_name() {
        let me = "_c_ffffffff-0000-0000-0000-000000000000-lock-";
        let children: Vec<String> = [
            "zzzz__lock__0000000003",
            "_c_00000000-0000-0000-0000-000000000000-lock-0000000005",
            "not-a-contender",
            &format!("{me}0000000004"),
            "aaaa__lock__0000000001",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        match position(&children, me) {
            Position::Behind {
                mine,
                predecessor,
                ahead,
                ..
            } => {
                assert_eq!(mine.sequence, 4);
                assert_eq!(predecessor.name, "zzzz__lock__0000000003");
                assert_eq!(ahead, 2);
            }
            other => panic!("{other:?}"),
        }
        let first = vec![
            format!("{me}0000000009"),
            format!("{me}0000000002"),
            "x__lock__0000000003".to_string(),
        ];
        match position(&first, me) {
            Position::First { mine, extras } => {
                assert_eq!(mine.sequence, 2);
                assert_eq!(extras.len(), 1);
                assert_eq!(extras[0].sequence, 9);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            position(&["a__lock__0000000001".into()], me),
            Position::Gone
        );
    }
}
