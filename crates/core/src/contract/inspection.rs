//! What [`crate::Authority::inspect`] reports: a read-only snapshot of one key.

use std::fmt;
use std::time::Duration;

use crate::contract::fence::Fence;
use crate::contract::key::LockKey;
use crate::contract::owner::OwnerToken;

/// A short, non-secret name for whoever holds a key.
///
/// Owner tokens are 128-bit random values, and several backends (PostgreSQL, SQLite, Redis)
/// compare them, with the fence, to authorize renew and release. So an inspection never shows a
/// whole token: only its first [`OwnerId::HEX_DIGITS`] hex digits (32 bits). That is enough to
/// tell holders apart in a status line or a log, and useless as a credential: the 96 bits left
/// out still make the token impossible to guess, and every renew and release also compares the
/// fence. A holder that is not a leasehold client (a kazoo, Curator or etcdctl peer sharing the
/// key) is named by its kind, as [`OwnerId::peer`].
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct OwnerId(String);

impl OwnerId {
    /// How many hex digits of an owner token are shown.
    pub const HEX_DIGITS: usize = 8;

    /// The short id of a leasehold owner token.
    pub fn of(token: &OwnerToken) -> Self {
        let mut hex = token.to_hex();
        hex.truncate(Self::HEX_DIGITS);
        OwnerId(hex)
    }

    /// The short id of an owner stored as text: a leasehold token (32 hex digits) shows its
    /// prefix; anything else is named `peer` (it is not ours to interpret, and may be a secret).
    pub fn from_stored(stored: &str) -> Self {
        match stored.parse::<OwnerToken>() {
            Ok(token) => Self::of(&token),
            Err(_) => Self::peer("foreign"),
        }
    }

    /// A holder that is not a leasehold client: `peer:<kind>` (`peer:kazoo`, `peer:curator`).
    pub fn peer(kind: &str) -> Self {
        OwnerId(format!("peer:{kind}"))
    }

    /// Whether the holder is not a leasehold client.
    pub fn is_peer(&self) -> bool {
        self.0.starts_with("peer:")
    }

    /// The id as shown.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for OwnerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for OwnerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OwnerId({})", self.0)
    }
}

/// What an authority says about one key at one moment (see [`crate::Authority::inspect`]).
///
/// # Contract
/// * `held` and `remaining` are the authority's own reckoning, on the authority's clock (the
///   database's, the Redis server's, the etcd leader's), not the caller's.
/// * It is a snapshot: it can be stale the moment it returns. Never use it to decide to act on
///   the protected resource (a free key may be taken an instant later; a holder may have
///   expired): only a grant's lease and its fence decide that. It is for operators, status
///   commands and diagnostics.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Inspection {
    /// Which backend answered.
    pub backend: &'static str,
    /// The inspected key.
    pub key: LockKey,
    /// Whether the key is held now, by the authority's own reckoning (an expired lease the
    /// authority has not yet cleaned up counts as free).
    pub held: bool,
    /// How long the holder's lease has left, as the authority counts it. `None` when the key is
    /// free, or when the backend cannot tell (ZooKeeper does not expose another session's
    /// remaining timeout).
    pub remaining: Option<Duration>,
    /// The current holder's fence, when held (a peer holder's, where its node maps to one).
    pub fence: Option<Fence>,
    /// The last fence the authority issued for this key, held or not, when the backend can tell.
    pub last_fence: Option<Fence>,
    /// A short, non-secret id of the holder, when held.
    pub owner: Option<OwnerId>,
    /// The value the holder proclaimed ([`crate::Authority::proclaim`]), when held and one was.
    pub value: Option<Vec<u8>>,
    /// How many contenders wait for the key, where the backend can count them (those that queue
    /// in the authority, as etcd's and ZooKeeper's lock recipes do); `None` where waiting leaves
    /// no trace in the authority (polling or notification on a free key).
    pub waiters: Option<u32>,
}

impl Inspection {
    /// A key that is free now.
    pub fn free(backend: &'static str, key: LockKey) -> Self {
        Inspection {
            backend,
            key,
            held: false,
            remaining: None,
            fence: None,
            last_fence: None,
            owner: None,
            value: None,
            waiters: None,
        }
    }

    /// A key held now by `owner`.
    pub fn held(backend: &'static str, key: LockKey, owner: OwnerId) -> Self {
        Inspection {
            held: true,
            owner: Some(owner),
            ..Inspection::free(backend, key)
        }
    }

    /// Sets the holder's fence.
    pub fn with_fence(mut self, fence: Option<Fence>) -> Self {
        self.fence = fence;
        self
    }

    /// Sets the remaining TTL.
    pub fn with_remaining(mut self, remaining: Option<Duration>) -> Self {
        self.remaining = remaining;
        self
    }

    /// Sets the holder's proclaimed value.
    pub fn with_value(mut self, value: Option<Vec<u8>>) -> Self {
        self.value = value;
        self
    }

    /// Sets how many contenders wait for the key.
    pub fn with_waiters(mut self, waiters: Option<u32>) -> Self {
        self.waiters = waiters;
        self
    }

    /// Sets the last fence issued for the key.
    pub fn with_last_fence(mut self, last: Option<Fence>) -> Self {
        self.last_fence = last;
        self
    }
}

impl fmt::Display for Inspection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} on {}: ", self.key, self.backend)?;
        if self.held {
            f.write_str("held")?;
            if let Some(owner) = &self.owner {
                write!(f, " by {owner}")?;
            }
            if let Some(fence) = self.fence {
                write!(f, " with fence {fence}")?;
            }
            if let Some(left) = self.remaining {
                write!(f, ", {left:?} left")?;
            }
        } else {
            f.write_str("free")?;
        }
        if let Some(waiters) = self.waiters {
            write!(f, ", {waiters} waiting")?;
        }
        if let Some(last) = self.last_fence {
            write!(f, " (last fence {last})")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::fence::{Epoch, FenceSafety};

    type TestResult<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

    #[test]
    fn owner_id_shows_only_a_prefix() -> TestResult {
        let token = OwnerToken::generate().map_err(|e| format!("a generated owner token: {e}"))?;
        let id = OwnerId::of(&token);
        assert_eq!(id.as_str().len(), OwnerId::HEX_DIGITS);
        assert!(token.to_hex().starts_with(id.as_str()));
        assert_eq!(OwnerId::from_stored(&token.to_hex()), id);
        assert!(!id.is_peer());
        let foreign = OwnerId::from_stored("some-peer's-secret");
        assert!(foreign.is_peer());
        assert!(!foreign.as_str().contains("secret"));
        Ok(())
    }

    #[test]
    fn displays_what_an_operator_needs() -> TestResult {
        let key = LockKey::new("k").map_err(|e| format!("the key `k`: {e}"))?;
        let fence = Fence::compose("t", Epoch::ZERO, 7, FenceSafety::Linearizable)
            .map_err(|e| format!("fence 7: {e}"))?;
        let held = Inspection::held("t", key.clone(), OwnerId::peer("kazoo"))
            .with_fence(Some(fence))
            .with_remaining(Some(Duration::from_millis(1500)))
            .with_last_fence(Some(fence));
        assert_eq!(
            held.to_string(),
            "k on t: held by peer:kazoo with fence 7, 1.5s left (last fence 7)"
        );
        assert_eq!(Inspection::free("t", key).to_string(), "k on t: free");
        Ok(())
    }
}
