//! What a contender key stores as its value: the owner token, and the proclaimed value.
//!
//! Every contender key leasehold writes stores the 32 hex digits of its owner token: a delete of
//! a key whose write got no answer compares it, and `inspect` derives the holder's owner id from
//! it. A proclaimed value ([`leasehold_core::Authority::proclaim`]) goes after the token and one
//! newline, so the token stays where every reader expects it and the value needs no escaping
//! (it may hold any bytes, newlines included):
//!
//! ```text
//! <owner token, 32 lowercase hex digits>                  nothing proclaimed
//! <owner token, 32 lowercase hex digits>\n<value bytes>    proclaimed (possibly empty)
//! ```
//!
//! Peers that share the layout store something else: `etcdctl lock` and etcd's Mutex an empty
//! value, `etcdctl elect` and etcd's Election their proposal. A value of neither of our two forms
//! is a peer's, and its bytes are what that peer proclaimed.

use leasehold_core::{OwnerId, OwnerToken};

/// Between the owner token and the proclaimed value: not a hex digit, so the two forms cannot
/// be confused, and `etcdctl get` or `etcdctl elect --listen` show the value on its own line.
const SEPARATOR: u8 = b'\n';

/// The length of an owner token in hex.
const TOKEN_LEN: usize = 32;

/// The value of our contender key for `owner`, with `proclaimed` after it when there is one.
pub(crate) fn encode(owner: OwnerToken, proclaimed: Option<&[u8]>) -> Vec<u8> {
    let mut out = owner.to_hex().into_bytes();
    if let Some(value) = proclaimed {
        out.reserve(1 + value.len());
        out.push(SEPARATOR);
        out.extend_from_slice(value);
    }
    out
}

/// What a contender key's value says about its holder.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Decoded<'a> {
    /// The holder's owner id: from its token when it is ours, a peer's otherwise.
    pub owner: OwnerId,
    /// What the holder proclaimed, if it did.
    pub value: Option<&'a [u8]>,
}

/// Reads a contender key's value, ours or a peer's.
pub(crate) fn decode(stored: &[u8]) -> Decoded<'_> {
    if let Some((token, value)) = ours(stored) {
        return Decoded {
            owner: OwnerId::of(&token),
            value,
        };
    }
    if stored.is_empty() {
        Decoded {
            owner: OwnerId::peer("etcd-mutex"),
            value: None,
        }
    } else {
        // etcd's Election stores its proposal as the whole value.
        Decoded {
            owner: OwnerId::peer("etcd-election"),
            value: Some(stored),
        }
    }
}

/// The owner token and proclaimed value of a value leasehold wrote, or `None` for a peer's.
fn ours(stored: &[u8]) -> Option<(OwnerToken, Option<&[u8]>)> {
    let (token, rest) = stored.split_at_checked(TOKEN_LEN)?;
    let token = std::str::from_utf8(token)
        .ok()?
        .parse::<OwnerToken>()
        .ok()?;
    match rest.split_first() {
        None => Some((token, None)),
        Some((&SEPARATOR, value)) => Some((token, Some(value))),
        Some(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold_conformance::kit::{OrFail, TestResult};

    #[test]
    fn the_token_and_any_value_round_trip() -> TestResult {
        let owner = OwnerToken::generate().or_fail("a generated owner token")?;
        let bare = encode(owner, None);
        assert_eq!(bare, owner.to_hex().as_bytes(), "unchanged without a value");
        assert_eq!(
            decode(&bare),
            Decoded {
                owner: OwnerId::of(&owner),
                value: None
            }
        );
        let binary: Vec<u8> = (0..=255).chain([b'\n', 0, b'\n']).collect();
        for value in [&b""[..], b"10.0.0.1:7000", b"\n", &binary] {
            let stored = encode(owner, Some(value));
            let seen = decode(&stored);
            assert_eq!(seen.owner, OwnerId::of(&owner));
            assert_eq!(seen.value, Some(value), "{value:?}");
        }
        Ok(())
    }

    #[test]
    fn peers_values_are_theirs() {
        let mutex = decode(b"");
        assert_eq!(mutex.owner.as_str(), "peer:etcd-mutex");
        assert_eq!(mutex.value, None);
        for proposal in [
            &b"10.0.0.1:7000"[..],
            // A token's length, but not hex; hex, but followed by something else.
            &[b'g'; 32],
            b"0123456789abcdef0123456789abcdef:x",
            b"0123456789abcdef0123456789abcde",
        ] {
            let peer = decode(proposal);
            assert_eq!(peer.owner.as_str(), "peer:etcd-election", "{proposal:?}");
            assert_eq!(peer.value, Some(proposal));
        }
    }
}
